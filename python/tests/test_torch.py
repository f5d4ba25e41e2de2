"""The PyTorch adapter (nbgrad.torch): batch, torch.func (vmap, grad, jvp, jacfwd, jacrev), forward mode through
the library's tangent kernel, the float64 image, and torch.autograd.gradcheck at its default tolerances.

gradcheck runs in float64, where the image is the library's double image before its rounding to float
(nbg_simulate_tangents), so that its finite differences (eps = 1e-6) see the double computation."""
import numpy as np
import pytest

import nbgrad

torch = pytest.importorskip("torch")
import nbgrad.torch as nbt  # noqa: E402

f64 = torch.float64


def t(v, grad=False):
    return torch.tensor(v, dtype=f64, requires_grad=grad)


@pytest.fixture
def small_table(exp):
    """An experiment with a 5 x 5 x 5 table (-2..2) of distinct F, so that gradcheck can perturb every entry."""
    F = np.random.default_rng(3).uniform(50, 150, (5, 5, 5))
    return nbgrad.Experiment(hkl=(F, (-2, -2, -2)), **{k: v for k, v in _base().items()}, default_F=80)


def _base():
    from conftest import BASE

    return dict(BASE, N=3)


def weights(exp):
    return torch.rand(exp.shape, dtype=f64, generator=torch.Generator().manual_seed(2))


def test_backward_equals_grad(exp_hkl):
    w = np.random.default_rng(1).uniform(0.5, 1.5, exp_hkl.shape).astype(np.float32)
    a = torch.tensor(70.0, requires_grad=True)
    rx = torch.tensor(10.0, requires_grad=True)
    F = torch.tensor(exp_hkl.F, requires_grad=True)
    img = nbt.simulate(exp_hkl, {"a": a, "rotx": rx, "F": F})
    assert img.dtype == torch.float64  # F is float64
    img32 = nbt.simulate(exp_hkl, {"a": a, "rotx": rx, "F": F}, dtype=torch.float32)
    assert img32.dtype == torch.float32 and tuple(img32.shape) == exp_hkl.shape
    assert np.array_equal(img32.detach().numpy(), nbgrad.simulate(exp_hkl))  # bit for bit
    (img32 * torch.from_numpy(w)).sum().backward()
    g = nbgrad.grad(exp_hkl, w, ["a", "rotx", "F"])
    # a and rotx through the forward's tangent images, F through the adjoint
    assert a.grad.item() == pytest.approx(g["a"], rel=1e-6)
    assert rx.grad.item() == pytest.approx(g["rotx"], rel=1e-6)
    assert F.grad.shape == F.shape and np.allclose(F.grad.numpy(), g["F"], rtol=1e-12, atol=0)
    assert exp_hkl.a == 70  # the caller's experiment is not changed


def test_float64_image(exp):
    img64 = nbt.simulate(exp, {"a": t(70.0)})
    img32 = nbt.simulate(exp, {"a": torch.tensor(70.0)})
    ref = nbgrad.simulate(exp)
    assert img64.dtype == torch.float64 and img32.dtype == torch.float32
    assert np.array_equal(img32.numpy(), ref)
    # the double image rounds to the library's float image, and carries the bits the rounding drops
    assert np.array_equal(img64.numpy().astype(np.float32), ref)
    assert not np.array_equal(img64.numpy(), ref.astype(np.float64))
    assert nbt.simulate(exp, {"a": torch.tensor(70.0)}, dtype=f64).dtype == f64


@pytest.mark.parametrize("names", [("a", "gamma"), ("rotx", "roty"), ("Na",), ("distance",), ("a", "rotz", "Nb")])
def test_gradcheck_default_tolerances(exp, names):
    W = weights(exp)
    start = {"a": 70.0, "gamma": 95.0, "rotx": 10.0, "roty": 5.0, "rotz": 3.0, "Na": 5.0, "Nb": 5.0,
             "distance": 100.0}

    def f(*vals):
        return (nbt.simulate(exp, dict(zip(names, vals))) * W).sum()

    assert torch.autograd.gradcheck(f, tuple(t(start[n], True) for n in names))


def test_gradcheck_adjoint_path(exp):
    # more parameters than TANGENT_MAX: backward is the library's adjoint
    names = ("a", "b", "rotx", "distance", "Nc")
    assert len(names) > nbt.TANGENT_MAX
    W = weights(exp)

    def f(*vals):
        return (nbt.simulate(exp, dict(zip(names, vals))) * W).sum()

    assert torch.autograd.gradcheck(f, tuple(t(v, True) for v in (70.0, 80.0, 10.0, 100.0, 5.0)))


def test_gradcheck_F(small_table):
    W = weights(small_table)

    def f(F, a):
        return (nbt.simulate(small_table, {"F": F, "a": a}) * W).sum()

    F = torch.tensor(small_table.F, requires_grad=True)
    assert torch.autograd.gradcheck(f, (F, t(70.0, True)))


def test_gradcheck_catches_a_wrong_gradient(exp):
    # the same check on a function whose backward is deliberately scaled must fail: the check can fail
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 1.001 * g

    W = weights(exp)

    def f(a):
        return (nbt.simulate(exp, {"a": Wrong.apply(a)}) * W).sum()

    assert not torch.autograd.gradcheck(f, (t(70.0, True),), raise_exception=False)


def test_batch(exp_hkl):
    a = t([70.0, 70.5, 71.0])
    rx = t(10.0)
    img = nbt.simulate(exp_hkl, {"a": a, "rotx": rx})
    assert tuple(img.shape) == (3,) + exp_hkl.shape
    for k in range(3):
        e = exp_hkl.copy()
        e.a = float(a[k])
        assert np.array_equal(img[k].numpy().astype(np.float32), nbgrad.simulate(e))
    # two batch dimensions broadcast; F batched alongside
    F = torch.tensor(exp_hkl.F)
    Fb = torch.stack([F, 1.1 * F])
    img2 = nbt.simulate(exp_hkl, {"a": a[None, :], "F": Fb[:, None]}, dtype=torch.float32)
    assert tuple(img2.shape) == (2, 3) + exp_hkl.shape
    e = exp_hkl.copy()
    e.a = 70.5
    e.F = 1.1 * exp_hkl.F
    assert np.array_equal(img2[1, 1].numpy(), nbgrad.simulate(e))
    # gradients of a batch: one per element
    ab = t([70.0, 70.5], True)
    W = weights(exp_hkl)
    (nbt.simulate(exp_hkl, {"a": ab}) * W).sum().backward()
    for k in range(2):
        e = exp_hkl.copy()
        e.a = float(ab[k].detach())
        assert ab.grad[k].item() == pytest.approx(nbgrad.grad(e, W.numpy(), ["a"])["a"], rel=1e-6)
    with pytest.raises(ValueError, match="broadcast"):
        nbt.simulate(exp_hkl, {"a": t([70.0, 71.0]), "b": t([80.0, 81.0, 82.0])})


def test_vmap(exp):
    a = t([70.0, 70.5, 71.0])
    f = lambda x: nbt.simulate(exp, {"a": x, "rotx": t(10.0)})  # noqa: E731
    assert torch.equal(torch.vmap(f)(a), nbt.simulate(exp, {"a": a}))
    # vmap of a gradient: per-element gradients, as the batch's backward gives them
    W = weights(exp)
    g = torch.vmap(torch.func.grad(lambda x: (nbt.simulate(exp, {"a": x}) * W).sum()))(a)
    ab = a.clone().requires_grad_()
    (nbt.simulate(exp, {"a": ab}) * W).sum().backward()
    assert torch.allclose(g, ab.grad, rtol=1e-12, atol=0)


def test_vmap_of_gradient_on_the_adjoint_path(exp, small_table):
    # more scalar parameters than TANGENT_MAX: the gradient is the library's adjoint, under vmap too; each vmapped
    # element's gradient equals the one nbgrad.grad gives for that element's parameters and weights
    names = ("a", "b", "rotx", "distance", "Nc")
    assert len(names) > nbt.TANGENT_MAX
    start = (70.0, 80.0, 10.0, 100.0, 5.0)
    a = t([70.0, 70.4, 70.8])
    Ws = torch.stack([weights(exp), weights(exp).flip(0), weights(exp).flip(1)])

    def loss(x, W, *rest):
        return (nbt.simulate(exp, dict(zip(names, (x,) + rest))) * W).sum()

    rest = tuple(t(v) for v in start[1:])
    g = torch.vmap(torch.func.grad(loss, argnums=(0, 2, 3, 4, 5)), in_dims=(0, 0) + (None,) * 4)(a, Ws, *rest)
    for k in range(3):
        e = exp.copy()
        for n, v in zip(names, (float(a[k]),) + start[1:]):
            e.set_param(n, v)
        r = nbgrad.grad(e, Ws[k].to(torch.float32).numpy(), list(names))
        for j, n in enumerate(names):
            assert float(g[j][k]) == pytest.approx(float(r[n]), rel=1e-12, abs=0), (k, n)
    # F (always the adjoint) under vmap over the weights
    W3 = torch.stack([weights(small_table), 2 * weights(small_table)])
    F = torch.tensor(small_table.F)
    gF = torch.vmap(torch.func.grad(lambda F, W: (nbt.simulate(small_table, {"F": F}) * W).sum()),
                    in_dims=(None, 0))(F, W3)
    assert gF.shape == (2,) + tuple(small_table.F.shape)
    for k in range(2):
        r = nbgrad.grad(small_table, W3[k].to(torch.float32).numpy(), ["F"])
        assert np.allclose(gF[k].numpy(), np.asarray(r["F"]), rtol=1e-12, atol=0)
    assert float(gF[0].abs().max()) > 0


def test_jvp_and_jacfwd_agree_with_backward(exp):
    a, rx = t(70.0), t(10.0)
    f = lambda a, rx: nbt.simulate(exp, {"a": a, "rotx": rx})  # noqa: E731
    _, tangent = torch.func.jvp(f, (a, rx), (t(1.0), t(0.5)))
    T = nbgrad.jvp(exp, ["a", "rotx"])
    assert torch.allclose(tangent, torch.from_numpy(T[0] + 0.5 * T[1]), rtol=1e-12, atol=0)
    jf = torch.func.jacfwd(f, argnums=(0, 1))(a, rx)
    jr = torch.func.jacrev(f, argnums=(0, 1))(a, rx)
    for x, y in zip(jf, jr):
        assert torch.allclose(x, y, rtol=1e-12, atol=1e-12 * float(y.abs().max()))
    # the forward-mode derivative of a loss equals the reverse-mode gradient
    W = weights(exp)
    loss = lambda a: (nbt.simulate(exp, {"a": a}) * W).sum()  # noqa: E731
    _, d = torch.func.jvp(loss, (a,), (t(1.0),))
    assert d.item() == pytest.approx(torch.func.grad(loss)(a).item(), rel=1e-10)
    # forward mode in F: no tangent kernel
    with pytest.raises(NotImplementedError, match="structure factors"):
        from torch.autograd import forward_ad

        e = nbgrad.Experiment(hkl=(np.full((3, 3, 3), 100.0), (-1, -1, -1)), **_base())
        F = torch.tensor(e.F)
        with forward_ad.dual_level():
            nbt.simulate(e, {"F": forward_ad.make_dual(F, torch.ones_like(F))})


def test_optimisation_loop(exp):
    target = torch.from_numpy(nbgrad.simulate(exp)).double()
    a = t(70.15, True)
    opt = torch.optim.Adam([a], lr=0.02)
    for _ in range(40):
        opt.zero_grad()
        loss = ((nbt.simulate(exp, {"a": a}) - target) ** 2).sum()
        loss.backward()
        opt.step()
    assert abs(a.item() - 70) < 0.03


def test_refusals(exp):
    with pytest.raises(ValueError, match="unknown parameter"):
        nbt.simulate(exp, {"bogus": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="table"):
        nbt.simulate(exp, {"F": torch.ones(3, 3, 3)})
    with pytest.raises(ValueError, match="dtype"):
        nbt.simulate(exp, {"a": t(70.0)}, dtype=torch.float16)
