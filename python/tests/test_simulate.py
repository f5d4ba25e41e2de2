"""The Experiment and simulate: the same images as the program, the keyword mapping, attribute access,
ownership, and refusals."""
import subprocess
import warnings

import numpy as np
import pytest

import nbgrad
from conftest import BASE, base_flags


def cli_float_image(cli, flags, tmp_path, shape):
    out = tmp_path / "cli.bin"
    subprocess.run([cli, *flags, "-floatfile", str(out)], cwd=tmp_path, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return np.fromfile(out, dtype=np.float32).reshape(shape)


def test_simulate_matches_cli_bitwise(exp, cli, tmp_path):
    img = nbgrad.simulate(exp)
    assert img.dtype == np.float32 and img.shape == (96, 96)
    assert img.max() > 10 * img.mean() > 0  # spots, not a blank or uniform image
    ref = cli_float_image(cli, exp.flags, tmp_path, img.shape)
    assert np.array_equal(img.view(np.uint32), ref.view(np.uint32))


def test_simulate_hkl_matches_cli_bitwise(exp_hkl, cli, tmp_path):
    img = nbgrad.simulate(exp_hkl)
    ref = cli_float_image(cli, exp_hkl.flags + ["-nodump"], tmp_path, img.shape)
    assert np.array_equal(img, ref)


def test_package_writes_no_fdump(hkl_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nbgrad.Experiment(hkl=str(hkl_file), **BASE)
    assert not (tmp_path / "Fdump.bin").exists()


def test_kwargs_equal_flags(exp):
    other = nbgrad.Experiment.from_flags("nbgrad -cell 70 80 90 75 85 95 -misset 10 5 3 -N 5 -lambda 1 "
                                         "-distance 100 -detpixels 96 -pixel 0.5 -oversample 2 -default_F 100")
    assert np.array_equal(nbgrad.simulate(exp), nbgrad.simulate(other))
    # the spellings: lambda_ and wavelength; N sets Na Nb Nc; detpixels sets both counts
    e2 = nbgrad.Experiment(**{**BASE, "wavelength": None}, lambda_=1.0, default_F=100)
    assert e2.wavelength == 1.0 and e2.Na == e2.Nb == e2.Nc == 5
    assert np.array_equal(nbgrad.simulate(e2), nbgrad.simulate(exp))


def test_kwargs_change_the_image(exp):
    base = nbgrad.simulate(exp)
    for kw in ({"distance": 110}, {"convention": "xds"}, {"phi": 1.0, "osc": 0.5, "phisteps": 2},
               {"mosaic": 0.5, "mosaic_domains": 3}, {"polar": 0.5}, {"thick": 100}, {"Xbeam": 20, "Ybeam": 22},
               {"shape": "gauss"}, {"fluence": 2e29}):
        img = nbgrad.simulate(nbgrad.Experiment(**{**BASE, **kw}, default_F=100))
        assert img.shape == base.shape
        assert not np.array_equal(img, base), kw


def test_attributes(exp):
    assert exp.a == 70 and exp.gamma == 95 and exp.rotx == 10 and exp.distance == 100 and exp.wavelength == 1
    before = nbgrad.simulate(exp)
    exp.a = 71
    assert exp.a == 71 and exp.get_param("a") == 71
    assert not np.array_equal(nbgrad.simulate(exp), before)
    exp.a = 70
    assert np.array_equal(nbgrad.simulate(exp), before)
    with pytest.raises(ValueError, match="out of range"):
        exp.a = -3
    with pytest.raises(ValueError):
        exp.distance = float("nan")
    with pytest.raises(AttributeError):
        exp.no_such_thing


def test_copy_is_independent(exp_hkl):
    c = exp_hkl.copy()
    c.a = 72
    F = c.F
    F[:] = 1
    c.F = F
    assert exp_hkl.a == 70 and exp_hkl.F.max() > 1
    assert not np.array_equal(nbgrad.simulate(c), nbgrad.simulate(exp_hkl))
    del exp_hkl  # the copy owns its own table
    assert np.isfinite(nbgrad.simulate(c)).all()


def test_table_from_array(hkl_file, exp_hkl):
    F, origin = nbgrad.read_hkl(hkl_file, default_F=10)
    assert F.shape == (25, 25, 25) and origin == (-12, -12, -12)
    e = nbgrad.Experiment(hkl=(F, origin), default_F=10, **BASE)
    assert np.array_equal(nbgrad.simulate(e), nbgrad.simulate(exp_hkl))
    assert e.hkl_origin == (-12, -12, -12)
    with pytest.raises(ValueError, match="shape"):
        e.F = np.ones((3, 3, 3))


def test_refusals():
    with pytest.raises(TypeError, match="no_such_flag"):
        nbgrad.Experiment(no_such_flag=1)
    with pytest.raises(ValueError, match="finite"):
        nbgrad.Experiment(distance=float("nan"))
    with pytest.raises(ValueError, match="Na"):
        nbgrad.Experiment(N=0.5, default_F=1)
    with pytest.raises(ValueError, match="unknown flag"):
        nbgrad.Experiment.from_flags("-cell 70 80 90 90 90 90 -bogus 3")
    with pytest.raises(ValueError, match="convention"):
        nbgrad.Experiment(convention="nope")
    with pytest.raises(nbgrad.Error):
        nbgrad.Experiment(hkl="/nonexistent/file.hkl")
    # an experiment without structure factors is valid, but rendering it says why it cannot
    e = nbgrad.Experiment(**BASE)
    with pytest.raises(nbgrad.InvalidError, match="structure factors"):
        nbgrad.simulate(e)
    with pytest.raises(TypeError):
        nbgrad.simulate("not an experiment")


def test_parser_notes_become_warnings():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        nbgrad.Experiment(default_F=1, coherent=True, **BASE)
    assert any("ignored" in str(x.message) for x in w)


def test_report_and_describe(exp):
    img, rep = nbgrad.simulate(exp, report=True)
    d = exp.describe()
    assert rep["fpixels"] == d["fpixels"] == 96 and rep["oversample"] == 2
    assert d["cell"][0] == pytest.approx(70)


def test_simulate_into_out(exp):
    ref = nbgrad.simulate(exp)
    buf = np.zeros(exp.shape, dtype=np.float32)
    assert nbgrad.simulate(exp, out=buf) is buf and np.array_equal(buf, ref)
    flat = np.zeros(exp.shape[0] * exp.shape[1], dtype=np.float32)
    assert nbgrad.simulate(exp, out=flat) is flat and np.array_equal(flat, ref.ravel())
    # the same number of pixels in another shape is refused, as grad refuses it (issue 29)
    other = (exp.shape[0] // 2, exp.shape[1] * 2)
    for bad in (np.zeros(exp.shape), np.zeros((96, 95), np.float32), np.zeros((96, 192), np.float32)[:, ::2],
                np.zeros(other, np.float32), np.zeros((1,) + exp.shape, np.float32)):
        with pytest.raises(ValueError, match="out"):
            nbgrad.simulate(exp, out=bad)
