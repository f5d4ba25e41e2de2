"""The PyTorch adapter: its backward is the library's adjoint, checked by torch.autograd.gradcheck.

The image comes from the library as float32 (computed in double, rounded once), so gradcheck's finite differences
see float32 rounding: checked in float64 on a weighted sum of the image, with eps = 1e-3 (parameter units) and
rtol = atol = 1e-3 (the differences' truncation and rounding error is about 1e-5 relative here)."""
import numpy as np
import pytest

import nbgrad

torch = pytest.importorskip("torch")
import nbgrad.torch as nbt  # noqa: E402


def test_backward_equals_grad(exp_hkl):
    w = np.random.default_rng(1).uniform(0.5, 1.5, exp_hkl.shape).astype(np.float32)
    a = torch.tensor(70.0, requires_grad=True)
    rx = torch.tensor(10.0, requires_grad=True)
    F = torch.tensor(exp_hkl.F, requires_grad=True)
    img = nbt.simulate(exp_hkl, {"a": a, "rotx": rx, "F": F})
    assert img.dtype == torch.float32 and tuple(img.shape) == exp_hkl.shape
    assert np.array_equal(img.detach().numpy(), nbgrad.simulate(exp_hkl))
    (img * torch.from_numpy(w)).sum().backward()
    g = nbgrad.grad(exp_hkl, w, ["a", "rotx", "F"])
    assert a.grad.item() == pytest.approx(g["a"], rel=1e-6)
    assert rx.grad.item() == pytest.approx(g["rotx"], rel=1e-6)
    assert F.grad.shape == F.shape and np.allclose(F.grad.numpy(), g["F"], rtol=1e-12, atol=0)
    assert exp_hkl.a == 70  # the caller's experiment is not changed


def test_gradcheck_float64(exp):
    W = torch.rand(exp.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def f(a, rx, dist):
        return (nbt.simulate(exp, {"a": a, "rotx": rx, "distance": dist}) * W).sum()

    inputs = tuple(torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (70.0, 10.0, 100.0))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-3, atol=1e-3, rtol=1e-3)


def test_gradcheck_catches_a_wrong_gradient(exp):
    # the same check on a function whose backward is deliberately scaled must fail: the check can fail
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 1.01 * g

    W = torch.rand(exp.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def f(a):
        return (nbt.simulate(exp, {"a": Wrong.apply(a)}) * W).sum()

    a = torch.tensor(70.0, dtype=torch.float64, requires_grad=True)
    assert not torch.autograd.gradcheck(f, (a,), eps=1e-3, atol=1e-3, rtol=1e-3, raise_exception=False)


def test_optimisation_loop(exp):
    target = torch.from_numpy(nbgrad.simulate(exp))
    a = torch.tensor(70.15, dtype=torch.float64, requires_grad=True)
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
