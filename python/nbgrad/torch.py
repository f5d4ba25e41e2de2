"""PyTorch: nbgrad's image as a differentiable function of its parameters.

    import torch, nbgrad, nbgrad.torch
    a = torch.tensor(70.0, requires_grad=True)
    img = nbgrad.torch.simulate(exp, {"a": a, "rotx": rx, "F": F})   # F: a tensor of exp.F's shape
    loss = ((img - observed) ** 2).sum(); loss.backward()              # a.grad, rx.grad, F.grad

The backward pass is nbgrad's adjoint (nbg_simulate_grad with dL/dI = the incoming gradient): one reverse pass
for every parameter, the structure-factor table included, never finite differences.  The image is computed in
double and rounded to float32 by the library; it is returned in the parameters' dtype (float64 parameters give a
float64 image, for torch.autograd.gradcheck).  The computation runs on the CPU; tensors on another device are
brought back there.
"""
import re

import numpy as np
import torch

import nbgrad

__all__ = ["simulate", "Simulate"]

_MOTION = re.compile(r"g[0-9]+\.(shift|rot)_[xyz]")


def _with_values(exp, names, values):
    """A copy of exp with the parameters set (the caller's experiment is left as it was)."""
    e = exp.copy()
    for name, v in zip(names, values):
        if name == "F":
            if e.F is None:
                raise ValueError("'F' needs an experiment with a structure-factor table (hkl=...)")
            e.F = v.detach().to("cpu", torch.float64).numpy()
        else:
            if v.numel() != 1:
                raise ValueError(f"parameter '{name}' must be a scalar tensor, got shape {tuple(v.shape)}")
            e.set_param(name, float(v.detach()))
    return e


class Simulate(torch.autograd.Function):
    """forward(exp, names, *values) -> image (slow, fast); backward: nbgrad.grad."""

    @staticmethod
    def forward(ctx, exp, names, *values):
        e = _with_values(exp, names, values)
        image = nbgrad.simulate(e)
        ctx.exp, ctx.names = e, names
        ctx.meta = [(v.dtype, v.device, v.shape) for v in values]
        dtype = torch.promote_types(torch.float32, values[0].dtype) if values else torch.float32
        return torch.from_numpy(image).to(device=values[0].device if values else "cpu", dtype=dtype)

    @staticmethod
    def backward(ctx, grad_output):
        wanted = [n for n, need in zip(ctx.names, ctx.needs_input_grad[2:]) if need]
        if not wanted:
            return (None, None) + (None,) * len(ctx.names)
        dLdI = grad_output.detach().to("cpu", torch.float32).contiguous().numpy()
        g = nbgrad.grad(ctx.exp, dLdI, wanted)
        out = []
        for name, (dtype, device, shape), need in zip(ctx.names, ctx.meta, ctx.needs_input_grad[2:]):
            if not need:
                out.append(None)
                continue
            v = np.asarray(g[name], dtype=np.float64)
            out.append(torch.from_numpy(v.copy()).to(device=device, dtype=dtype).reshape(shape))
        return (None, None) + tuple(out)


def simulate(exp: "nbgrad.Experiment", params: dict) -> torch.Tensor:
    """The image of exp with params {name: tensor} (names as nbgrad.PARAMS or their aliases, panel motions such
    as "g3.shift_x", and "F" for the whole table) set, differentiable in every tensor given."""
    names = tuple(nbgrad._PARAM_ALIASES.get(n, n) for n in params)
    for n in names:
        if n != "F" and n not in nbgrad.PARAMS and not _MOTION.fullmatch(n):
            raise ValueError(f"unknown parameter '{n}' (known: {' '.join(nbgrad.PARAMS)} g<k>.shift_x ... F)")
    if len(set(names)) != len(names):
        raise ValueError(f"a parameter is given twice: {', '.join(params)}")
    values = tuple(v if isinstance(v, torch.Tensor) else torch.as_tensor(v, dtype=torch.float64)
                   for v in params.values())
    return Simulate.apply(exp, names, *values)
