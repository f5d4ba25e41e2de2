"""PyTorch: nbgrad's image as a differentiable function of its parameters.

    import torch, nbgrad, nbgrad.torch
    a = torch.tensor(70.0, dtype=torch.float64, requires_grad=True)
    img = nbgrad.torch.simulate(exp, {"a": a, "rotx": rx, "F": F})   # F: a tensor of exp.F's shape
    loss = ((img - observed) ** 2).sum(); loss.backward()              # a.grad, rx.grad, F.grad

What the op is:

- **Batch.**  Every parameter may carry leading batch dimensions: a scalar parameter of shape ``(B,)`` (or any
  ``batch_shape``), ``F`` of shape ``batch_shape + exp.F.shape``; the shapes broadcast against each other and the
  image is ``batch_shape + (slow, fast)``.  Each batch element is one render of a copy of ``exp`` (the caller's
  experiment is never changed).
- **torch.func.**  ``Simulate`` is a forward/``setup_context`` Function with a ``vmap`` rule (which hands the
  vmapped dimension to the batch dimension above) and a ``jvp`` rule, so ``torch.vmap``, ``torch.func.grad``,
  ``vjp``, ``jvp``, ``jacrev`` and ``jacfwd`` work on it.
- **Forward mode.**  ``jvp`` uses the library's tangent kernel (nbg_simulate_tangents): dI/dtheta images of the
  scalar parameters (not of ``F``: structure factors have no tangent kernel; forward mode in ``F`` raises).
- **dtype.**  The image has the parameters' promoted dtype, at least float32.  A float64 image is the library's
  double image before its rounding to float (nbg_simulate_tangents' image_d), so float64 finite differences (and
  ``torch.autograd.gradcheck`` at its default tolerances) see the double computation; a float32 image is
  ``nbgrad.simulate``'s, bit for bit.
- **Cost.**  When few scalar parameters are differentiated (at most ``TANGENT_MAX``) the forward computes their
  tangent images in the same render as the image, and backward and jvp are contractions with them: no second
  render.  Otherwise (more parameters, or ``F``) backward is the library's adjoint (nbg_simulate_grad with dL/dI =
  the incoming gradient), which renders the image again: measured cheaper than that many tangents (bench/
  bench_python.py prints both ratios to nbgrad.grad).  The adjoint is a Function with a vmap rule of its own, so
  ``torch.vmap`` of a gradient works on either path; it has no second derivative.

The computation runs on the CPU; tensors on another device are brought back there and the image is returned on
the parameters' device.
"""
import re

import numpy as np
import torch

import nbgrad

__all__ = ["simulate", "Simulate", "TANGENT_MAX"]

#: the most scalar parameters whose tangent images the forward computes (one render for forward and backward);
#: with more, backward is the adjoint (a second render, cheaper than the tangents then: bench/bench_python.py)
TANGENT_MAX = 3

_MOTION = re.compile(r"g[0-9]+\.(shift|rot)_[xyz]")


def _tracked(v):
    """Whether a gradient or a tangent may be asked of v: it requires grad, is a torch.func grad/jvp level's
    tensor, or is a forward-mode dual tensor."""
    if not isinstance(v, torch.Tensor):
        return False
    if v.requires_grad and torch.is_grad_enabled():
        return True
    f = getattr(torch._C, "_functorch", None)
    if f is not None:
        while f.is_functorch_wrapped_tensor(v):
            if not f.is_batchedtensor(v):
                return True  # a grad or jvp transform's level
            v = f.get_unwrapped(v)
        if v.requires_grad and torch.is_grad_enabled():
            return True
    try:
        from torch.autograd import forward_ad

        return forward_ad.unpack_dual(v).tangent is not None
    except Exception:  # no forward-mode level open
        return False


def _batch_shape(names, values, fshape):
    shapes = []
    for name, v in zip(names, values):
        if name == "F":
            if fshape is None:
                raise ValueError("'F' needs an experiment with a structure-factor table (hkl=...)")
            if tuple(v.shape[v.dim() - len(fshape):]) != tuple(fshape) or v.dim() < len(fshape):
                raise ValueError(f"'F': expected a tensor of shape (..., {', '.join(map(str, fshape))}) (the "
                                 f"experiment's table), got {tuple(v.shape)}")
            shapes.append(tuple(v.shape[:v.dim() - len(fshape)]))
        else:
            shapes.append(tuple(v.shape))
    try:
        return tuple(torch.broadcast_shapes(*shapes)) if shapes else ()
    except RuntimeError:
        raise ValueError("the parameters' batch shapes do not broadcast: " +
                         ", ".join(f"{n} {s}" for n, s in zip(names, shapes))) from None


def _element(name, v, batch, b, fshape):
    """Batch element b (a multi-index into batch) of parameter v, as float64 on the CPU."""
    tail = len(fshape) if name == "F" else 0
    v = v.detach().to("cpu", torch.float64)
    v = v.expand(tuple(batch) + tuple(v.shape[v.dim() - tail:]))
    return v[b] if batch else v


def _with_values(exp, names, values):
    """A copy of exp with the parameters set (the caller's experiment is left as it was)."""
    e = exp.copy()
    for name, v in zip(names, values):
        if name == "F":
            e.F = v.numpy()
        else:
            e.set_param(name, float(v))
    return e


def _experiments(exp, names, values):
    """(batch shape, [copy of exp per batch element, in row-major order])."""
    fshape = exp.F.shape if "F" in names and exp.F is not None else None
    batch = _batch_shape(names, values, fshape)
    out = []
    for b in np.ndindex(*batch) if batch else [()]:
        out.append(_with_values(exp, names, [_element(n, v, batch, b, fshape) for n, v in zip(names, values)]))
    return batch, out


def _sum_to(g, shape):
    """g summed over the dimensions broadcasting added to a tensor of shape."""
    shape = tuple(shape)
    lead = g.dim() - len(shape)
    if lead > 0:
        g = g.sum(dim=tuple(range(lead)))
    keep = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(dim=keep, keepdim=True) if keep else g


class Simulate(torch.autograd.Function):
    """Simulate.apply(exp, names, tnames, double, *values) -> (image, tangents).

    names: the parameters, one per value; tnames: those of them (scalars) whose tangent images the forward
    computes (tangents: batch + (len(tnames), slow, fast), float64, non-differentiable); double: the image in
    float64 (else float32).  nbgrad.torch.simulate chooses tnames and double; use it rather than apply."""

    @staticmethod
    def forward(exp, names, tnames, double, *values):
        batch, exps = _experiments(exp, names, values)
        S, F = exp.shape
        images = np.empty((len(exps), S, F), np.float64 if double else np.float32)
        tangents = np.empty((len(exps), len(tnames), S, F), np.float64)
        for i, e in enumerate(exps):
            tangents[i], images[i] = nbgrad._ext._tangents(e, list(tnames), bool(double))
        device = values[0].device if values else torch.device("cpu")
        image = torch.from_numpy(images).reshape(tuple(batch) + (S, F)).to(device)
        tan = torch.from_numpy(tangents).reshape(tuple(batch) + (len(tnames), S, F)).to(device)
        return image, tan

    @staticmethod
    def setup_context(ctx, inputs, output):
        exp, names, tnames, double, *values = inputs
        image, tan = output
        ctx.mark_non_differentiable(tan)
        ctx.exp, ctx.names, ctx.tnames = exp, names, tnames
        ctx.save_for_backward(tan, *values)
        ctx.save_for_forward(tan)

    @staticmethod
    def backward(ctx, g_image, g_tan):
        tan, *values = ctx.saved_tensors
        names, tnames = ctx.names, ctx.tnames
        need = ctx.needs_input_grad[4:]
        out = [None] * len(names)
        adjoint = []
        for i, (name, v) in enumerate(zip(names, values)):
            if not need[i]:
                continue
            if name in tnames:
                j = tnames.index(name)
                g = (tan[..., j, :, :] * g_image.to(tan.dtype)).sum(dim=(-2, -1))
                out[i] = _sum_to(g, v.shape).reshape(v.shape).to(v.dtype)
            else:
                adjoint.append(i)
        if adjoint:
            # the library's adjoint, one reverse pass per batch element (it renders the image again); a Function of
            # its own so that it also runs under vmap (a vmapped gradient on the adjoint path)
            grads = _Adjoint.apply(ctx.exp, names, tuple(adjoint), g_image, *values)
            for i, g in zip(adjoint, grads):
                v = values[i]
                out[i] = _sum_to(g, v.shape).reshape(v.shape).to(v.dtype)
        return (None, None, None, None) + tuple(out)

    @staticmethod
    def jvp(ctx, g_exp, g_names, g_tnames, g_double, *g_values):
        (tan,) = ctx.saved_tensors
        names, tnames = ctx.names, ctx.tnames
        out = None
        for name, dv in zip(names, g_values):
            if dv is None:
                continue
            if name not in tnames:
                raise NotImplementedError(
                    f"forward mode in '{name}': " + ("structure factors have no tangent kernel (use backward)"
                                                     if name == "F" else "its tangent was not computed"))
            j = tnames.index(name)
            term = tan[..., j, :, :] * dv.to(tan.dtype)[..., None, None]
            out = term if out is None else out + term
        if out is None:
            out = torch.zeros_like(tan[..., 0, :, :]) if tan.shape[-3] > 0 else None
        return out, None

    @staticmethod
    def vmap(info, in_dims, exp, names, tnames, double, *values):
        # the vmapped dimension becomes the leading batch dimension of the output: moved to the front of each
        # batched value, with singleton dimensions after it so that the values' own batch dimensions (which
        # broadcast from the right) line up; the unbatched values broadcast against it
        nF = len(exp.F.shape) if "F" in names else 0
        dims = in_dims[4:]
        own = [v.dim() - (d is not None) - (nF if n == "F" else 0) for n, v, d in zip(names, values, dims)]
        top = max(own, default=0)
        moved = []
        for v, d, k in zip(values, dims, own):
            if d is not None:
                v = v.movedim(d, 0)
                v = v.reshape(v.shape[:1] + (1,) * (top - k) + v.shape[1:])
            moved.append(v)
        image, tan = Simulate.apply(exp, names, tnames, double, *moved)
        return (image, tan), (0, 0)


class _Adjoint(torch.autograd.Function):
    """_Adjoint.apply(exp, names, which, g_image, *values) -> one gradient per index in which: dL/d values[i] for
    dL/dI = g_image, by the library's adjoint (nbgrad.grad), per element of the batch that g_image's and the values'
    batch shapes broadcast to; each gradient has that batch shape followed by the parameter's own shape (() for a
    scalar, exp.F's for F).  Its vmap rule makes the vmapped dimension a batch dimension, so that torch.vmap of a
    gradient works on the adjoint path; it is not differentiable again (no second-order adjoint)."""

    @staticmethod
    def forward(exp, names, which, g_image, *values):
        fshape = tuple(exp.F.shape) if "F" in names and exp.F is not None else None
        S, F = exp.shape
        full = tuple(torch.broadcast_shapes(tuple(g_image.shape[:-2]), _batch_shape(names, values, fshape)))
        own = [fshape if n == "F" else () for n in names]
        vals = [v.detach().expand(full + tuple(o)) for v, o in zip(values, own)]
        _, exps = _experiments(exp, names, vals)
        g_flat = g_image.detach().to("cpu", torch.float32).expand(full + (S, F)).reshape((-1, S, F))
        want = [names[i] for i in which]
        per = [nbgrad.grad(e, g_flat[k].contiguous().numpy(), want) for k, e in enumerate(exps)]
        device = values[0].device if values else torch.device("cpu")
        return tuple(torch.from_numpy(np.stack([np.asarray(r[names[i]], np.float64) for r in per]))
                     .reshape(full + tuple(own[i])).to(device) for i in which)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(*output)

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("a second derivative through the adjoint path (differentiate at most "
                                  "TANGENT_MAX scalar parameters to use the tangent path)")

    @staticmethod
    def vmap(info, in_dims, exp, names, which, g_image, *values):
        # the vmapped dimension moved to the front of every batched input, with singleton dimensions after it so
        # that the inputs' own batch dimensions (which broadcast from the right) line up
        nF = len(exp.F.shape) if "F" in names else 0
        items = [(g_image, in_dims[3], 2)] + [(v, d, nF if n == "F" else 0)
                                               for n, v, d in zip(names, values, in_dims[4:])]
        top = max(t.dim() - (d is not None) - k for t, d, k in items)
        moved = []
        for t, d, k in items:
            if d is not None:
                t = t.movedim(d, 0)
                t = t.reshape(t.shape[:1] + (1,) * (top - (t.dim() - 1 - k)) + t.shape[1:])
            moved.append(t)
        out = _Adjoint.apply(exp, names, which, *moved)
        # an input without the vmapped dimension broadcast against it: every output has it in front
        return out, tuple(0 for _ in out)


def _names(params):
    names = tuple(nbgrad._PARAM_ALIASES.get(n, n) for n in params)
    for n in names:
        if n != "F" and n not in nbgrad.PARAMS and not _MOTION.fullmatch(n):
            raise ValueError(f"unknown parameter '{n}' (known: {' '.join(nbgrad.PARAMS)} g<k>.shift_x ... F)")
    if len(set(names)) != len(names):
        raise ValueError(f"a parameter is given twice: {', '.join(params)}")
    return names


def simulate(exp: "nbgrad.Experiment", params: dict, dtype=None, tangents=None) -> torch.Tensor:
    """The image of exp with params {name: tensor} set (names as nbgrad.PARAMS or their aliases, panel motions
    such as "g3.shift_x", and "F" for the whole table), differentiable in every tensor given, forward and reverse.

    Shapes: a scalar parameter is a 0-d tensor or carries leading batch dimensions, "F" is exp.F's shape with the
    same; the image is batch_shape + (slow, fast).  dtype: the image's, float32 or float64 (default: the
    parameters' promoted dtype, at least float32).  tangents: the scalar parameters whose tangent images the forward
    computes (default: those that require grad or are transformed by torch.func, when at most TANGENT_MAX)."""
    names = _names(params)
    values = tuple(v if isinstance(v, torch.Tensor) else torch.as_tensor(v, dtype=torch.float64)
                   for v in params.values())
    if dtype is None:
        dtype = torch.float32
        for v in values:
            dtype = torch.promote_types(dtype, v.dtype) if v.is_floating_point() else dtype
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype: float32 or float64, got {dtype}")
    if tangents is None:
        tracked = [n for n, v in zip(names, values) if n != "F" and _tracked(v)]
        tangents = tracked if len(tracked) <= TANGENT_MAX else []
    tnames = tuple(nbgrad._PARAM_ALIASES.get(n, n) for n in tangents)
    for n in tnames:
        if n not in names or n == "F":
            raise ValueError(f"tangents: '{n}' is not one of the scalar parameters given")
    image, _ = Simulate.apply(exp, names, tnames, dtype == torch.float64, *values)
    return image
