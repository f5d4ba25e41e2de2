"""Gradients: grad and loss_grad against the program's (the C library's) numbers, jvp against finite
differences and against grad, refine, gradcheck, and the array checks."""
import json
import subprocess

import numpy as np
import pytest

import nbgrad
from conftest import BASE
from conftest import same_as_cli

CELL_ORIENT = ["a", "b", "c", "alpha", "beta", "gamma", "rotx", "roty", "rotz"]


def cli_json(cli, args, tmp_path):
    out = tmp_path / "g.json"
    subprocess.run([cli, *args, "-json", str(out)], cwd=tmp_path, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def test_grad_equals_cli(exp_hkl, cli, tmp_path):
    ones = np.ones(exp_hkl.shape, dtype=np.float32)
    g = nbgrad.grad(exp_hkl, ones, CELL_ORIENT + ["Na", "distance", "F"])
    ref = cli_json(cli, ["grad", *exp_hkl.flags, "-nodump", "-params", ",".join(CELL_ORIENT + ["Na", "distance", "F"])],
                   tmp_path)
    for name, value in ref["gradient"].items():
        assert same_as_cli(g[name], value), name  # the same library call: bit for bit
    assert g["F"].shape == exp_hkl.F.shape
    assert same_as_cli(g["F"].ravel(), np.array(ref["dF"]))
    assert np.count_nonzero(g["F"]) > 10
    assert ref["loss"] == pytest.approx(float(g.image.astype(np.float64).sum()), rel=1e-12)


def test_loss_grad_equals_cli_and_chain_rule(exp, cli, tmp_path):
    obs = nbgrad.simulate(exp)
    # the program gets the same experiment through its flags (set_param does not rewrite an experiment's flags)
    e = nbgrad.Experiment.from_flags(exp.flags, cell=(70.2, 80, 90, 75, 85, 95))
    assert e.a == 70.2
    obs_path = tmp_path / "obs.bin"
    nbgrad.write_float(obs_path, obs)
    for loss in ("poisson", "lsq"):
        g = nbgrad.loss_grad(e, obs, loss=loss, params=["a", "rotz"])
        ref = cli_json(cli, ["grad", *e.flags, "-params", "a,rotz", "-observed", str(obs_path), "-loss", loss],
                       tmp_path)
        assert same_as_cli(g.loss, ref["loss"]) and same_as_cli({"a": g["a"], "rotz": g["rotz"]}, ref["gradient"])
        I = g.image.astype(np.float64)
        o = obs.astype(np.float64)
        if loss == "poisson":
            L = np.sum(I - o * np.log(I))
            dLdI = 1 - o / I
        else:
            L = np.sum((I - o) ** 2)
            dLdI = 2 * (I - o)
        assert g.loss == pytest.approx(L, rel=1e-9)
        chain = nbgrad.grad(e, dLdI, ["a", "rotz"])
        assert chain["a"] == pytest.approx(g["a"], rel=1e-5)
        assert chain["rotz"] == pytest.approx(g["rotz"], rel=1e-5)


def test_jvp_against_finite_differences_and_grad(exp):
    params = ["a", "rotx", "distance"]
    t, image = nbgrad.jvp(exp, params, return_image=True)
    assert t.shape == (3, 96, 96) and t.dtype == np.float64
    assert np.array_equal(image, nbgrad.simulate(exp))
    for j, (name, h) in enumerate(zip(params, (1e-3, 1e-3, 1e-2))):
        lo, hi = exp.copy(), exp.copy()
        v = exp.get_param(name)
        lo.set_param(name, v - h)
        hi.set_param(name, v + h)
        fd = (nbgrad.simulate(hi).astype(np.float64) - nbgrad.simulate(lo)) / (2 * h)
        scale = np.abs(t[j]).max()
        assert scale > 0
        assert np.abs(fd - t[j]).max() < 2e-3 * scale, name
    w = np.random.default_rng(3).uniform(0.5, 1.5, exp.shape)
    g = nbgrad.grad(exp, w, params)
    for j, name in enumerate(params):
        assert np.sum(w.astype(np.float32) * t[j]) == pytest.approx(g[name], rel=1e-6)


def test_refine_recovers_a_perturbed_cell(exp):
    observed = nbgrad.simulate(exp)
    start = exp.copy()
    start.a, start.b, start.c = 70.3, 79.8, 90.2
    res = nbgrad.refine(start, observed, params="a,b,c", method="lm")
    assert res.converged
    assert res.values["a"] == pytest.approx(70, abs=1e-3)
    assert res.values["b"] == pytest.approx(80, abs=1e-3)
    assert res.values["c"] == pytest.approx(90, abs=1e-3)
    assert start.a == pytest.approx(70, abs=1e-3)  # the experiment is updated
    assert res.loss < 1e-6 * res.start_loss
    assert res.corr.shape == (3, 3) and np.allclose(np.diag(res.corr), 1)
    assert set(res.sigmas) == {"a", "b", "c"} and res.iterations >= 1


def test_refine_under_a_space_group():
    """A tetragonal crystal: the cell group fits a and c, b follows a, the angles are held."""
    base = dict(BASE, cell=(70, 70, 90, 90, 90, 90))
    truth = nbgrad.Experiment(default_F=100, space_group="P 43 21 2", **base)
    observed = nbgrad.simulate(truth)
    start = truth.copy()
    start.a, start.b, start.c = 70.3, 70.3, 89.8
    res = nbgrad.refine(start, observed, params="cell,orientation", method="lm")
    assert res.converged
    assert "tetragonal" in res.constraint
    assert res.tied == {"b": "a", "alpha": None, "beta": None, "gamma": None}
    assert res.values["a"] == pytest.approx(70, abs=1e-3) and res.values["b"] == res.values["a"]
    assert res.values["c"] == pytest.approx(90, abs=1e-3) and res.values["gamma"] == 90
    assert res.sigmas["b"] == res.sigmas["a"] and res.sigmas["alpha"] == 0
    bad = truth.copy()
    bad.b = 75
    with pytest.raises(nbgrad.InvalidError, match="not tetragonal"):
        nbgrad.refine(bad, observed, params="cell")


def test_refine_with_per_reflection_scales(hkl_file):
    """'F' fits the table's measured entries with the crystal: from a table 30 % off entry by entry and a turned
    crystal, the orientation and the cell come back, the fitted entries with them (spots of 10 cells: the matrix's
    structure-factor rows come from pixels that see one reflection, which broad spots of 5 cells on pixels of 0.5 mm
    leave few of: there the fit stops at its iteration limit, not converged)."""
    truth = nbgrad.Experiment(hkl=str(hkl_file), default_F=10, **dict(BASE, N=10, detpixels=128, pixel=0.1,
                                                                         oversample=1))
    observed = nbgrad.simulate(truth)
    truth_F = truth.F.copy()
    start = truth.copy()
    rng = np.random.default_rng(11)
    start.set_hkl(truth_F * rng.uniform(0.7, 1.3, truth_F.shape), truth.hkl_origin)
    start.a = 70.1
    start.orient_x = 0.03
    res = nbgrad.refine(start, observed, params="orientation,a,F")
    assert res.converged
    assert start.a == pytest.approx(70, abs=1e-5) and abs(start.orient_x) < 1e-5
    fitted = [p for p in res.params if p.startswith("F(")]
    assert len(fitted) > 20 and res.params[:4] == ["orient_x", "orient_y", "orient_z", "a"]
    h0 = truth.hkl_origin
    for name in fitted:
        h, k, l = (int(v) for v in name[2:-1].split(","))
        assert start.F[h - h0[0], k - h0[1], l - h0[2]] == pytest.approx(res.values[name])
    big = max(fitted, key=lambda p: res.values[p])
    h, k, l = (int(v) for v in big[2:-1].split(","))
    assert res.values[big] == pytest.approx(truth_F[h - h0[0], k - h0[1], l - h0[2]], rel=1e-4)
    with pytest.raises(ValueError, match="as a whole"):
        nbgrad.refine(start.copy(), observed, params="a,F(1,2,3)")
    with pytest.raises(ValueError, match="besides"):
        nbgrad.refine(start.copy(), observed, params="F")


def test_refine_progress_and_errors(exp):
    observed = nbgrad.simulate(exp)
    start = exp.copy()
    start.a = 70.2
    seen = []
    nbgrad.refine(start, observed, ["a"], method="bfgs", loss="poisson", progress=lambda *a: seen.append(a))
    assert seen and seen[-1][1] <= seen[0][1]

    def boom(*a):
        raise KeyError("from the callback")

    other = exp.copy()
    other.a = 70.2
    with pytest.raises(KeyError, match="callback"):
        nbgrad.refine(other, observed, ["a"], progress=boom)
    with pytest.raises(ValueError, match="method"):
        nbgrad.refine(exp, observed, ["a"], method="newton")


def test_gradcheck_passes_and_catches(exp_hkl):
    res = nbgrad.gradcheck(exp_hkl, ["a", "rotx", "Na", "distance", "F"])
    assert [r.param for r in res] == ["a", "rotx", "Na", "distance", "F"]
    assert all(r.passed for r in res), [(r.param, r.relerr, r.reason) for r in res]
    assert all(abs(r.order - 2) < 0.6 for r in res if r.param != "F")


def test_bad_arrays(exp):
    S, F = exp.shape
    good = np.ones((S, F), dtype=np.float32)
    with pytest.raises(ValueError, match=r"dLdI.*\(96, 96\)"):
        nbgrad.grad(exp, np.ones((S, F + 1)), ["a"])
    with pytest.raises(ValueError, match="dLdI"):
        nbgrad.grad(exp, np.ones((S, F), dtype=complex), ["a"])
    with pytest.raises(ValueError, match="dLdI"):
        nbgrad.grad(exp, "not an array", ["a"])
    with pytest.raises(ValueError, match="observed"):
        nbgrad.loss_grad(exp, np.ones(7), params=["a"])
    # any real dtype, any layout: converted once, the same answer
    ref = nbgrad.grad(exp, good, ["a"])["a"]
    assert nbgrad.grad(exp, np.ones((S, F), dtype=np.int64), ["a"])["a"] == ref
    fortran = np.asfortranarray(np.arange(S * F, dtype=np.float64).reshape(S, F))
    strided = np.arange(S * F * 2, dtype=np.float32).reshape(S, 2 * F)[:, ::2]
    assert nbgrad.grad(exp, fortran, ["a"])["a"] == nbgrad.grad(exp, np.ascontiguousarray(fortran), ["a"])["a"]
    assert nbgrad.grad(exp, strided, ["a"])["a"] == nbgrad.grad(exp, strided.copy(), ["a"])["a"]
    assert nbgrad.grad(exp, good.ravel().tolist(), ["a"])["a"] == ref
    # the library's own checks
    bad = nbgrad.simulate(exp)
    bad[3, 4] = np.nan
    with pytest.raises(ValueError):
        nbgrad.loss_grad(exp, bad, params=["a"])
    with pytest.raises(ValueError, match="bogus"):
        nbgrad.grad(exp, good, ["bogus"])
    # a name listed twice (or in two groups) is one parameter
    assert list(nbgrad.grad(exp, good, ["a", "cell", "a"])) == ["a", "b", "c", "alpha", "beta", "gamma"]
    with pytest.raises(nbgrad.UnsupportedError):
        nbgrad.grad(exp, good, ["mosaic"])


def test_progress_callback_reads_the_experiment(exp):
    """A progress callback may read (and render) the experiment being refined; changing it is refused, not a
    deadlock."""
    observed = nbgrad.simulate(exp)
    start = exp.copy()
    start.a = 70.2
    seen, refused = [], []

    def look(*args):
        seen.append(start.a)
        nbgrad.simulate(start)
        try:
            start.b = 81
        except RuntimeError as e:
            refused.append(str(e))

    res = nbgrad.refine(start, observed, ["a"], progress=look)
    assert res.converged and seen and all(np.isfinite(seen))
    assert refused and "in use" in refused[0]
    assert start.b == pytest.approx(80)  # unchanged by the callback


def test_detector_response_keywords(exp):
    """pedestal, gain and read_noise as keywords and attributes: the losses read the observed counts through
    them, and a pickled experiment keeps them."""
    import pickle

    truth = nbgrad.simulate(exp)
    e = nbgrad.Experiment(default_F=100, pedestal=40, gain=2.0, **BASE)
    assert (e.pedestal, e.gain, e.read_noise) == (40, 2.0, 0)
    counts = 2.0 * truth + 40
    L = nbgrad.loss_grad(e, counts, loss="lsq").loss
    assert L == pytest.approx(0, abs=1e-6 * float((truth ** 2).sum()))
    e.pedestal = 0
    assert nbgrad.loss_grad(e, counts, loss="lsq").loss > 1
    e.read_noise = 3
    f = pickle.loads(pickle.dumps(e))
    assert (f.pedestal, f.gain, f.read_noise) == (0, 2.0, 3)
    with pytest.raises(ValueError, match="gain"):
        e.gain = 0
