"""Parameter names and lists: the names, groups and aliases come from the library's table (nbg_param_info), and a
list is parsed by the library as the program's -params is ("all", groups, aliases, panel motions, "F(h,k,l)")."""
import json
import subprocess

import numpy as np
import pytest

import nbgrad
from conftest import same_as_cli


def cli_json(cli, args, tmp_path):
    out = tmp_path / "g.json"
    subprocess.run([cli, *args, "-json", str(out)], cwd=tmp_path, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def test_params_are_the_library_table():
    info = nbgrad._ext.param_info()
    assert nbgrad.PARAMS == tuple(p["name"] for p in info)
    assert len(nbgrad.PARAMS) == len(set(nbgrad.PARAMS)) > 20
    assert nbgrad.PARAMS[:3] == ("a", "b", "c")  # the library's order (nbg_param ids)
    for p in info:
        assert p["help"].strip(), p["name"]
        assert isinstance(p["groups"], list) and isinstance(p["optional"], bool)
        assert p["lo"] <= p["hi"] and p["bound_lo"] <= p["bound_hi"], p["name"]
    lam = info[nbgrad.PARAMS.index("lambda")]
    assert lam["alias"] == "wavelength" and lam["unit"] == "A" and "beam" in lam["groups"]
    # every group of the table, and "all", and nothing else
    groups = nbgrad._ext.param_groups()
    assert set(nbgrad.GROUPS) == set(groups)
    assert {"all", "cell", "orientation", "background"} <= set(nbgrad.GROUPS)
    assert {g for p in info for g in p["groups"]} <= set(groups)
    assert nbgrad.GROUPS["all"] == nbgrad.PARAMS
    assert nbgrad.GROUPS["cell"] == ("a", "b", "c", "alpha", "beta", "gamma")
    assert nbgrad.GROUPS["background"] == ("bg", "bg_fast", "bg_slow")


def test_background_group(exp):
    w = np.random.default_rng(5).uniform(0.5, 1.5, exp.shape).astype(np.float32)
    g = nbgrad.grad(exp, w, ["background"])
    assert list(g) == ["bg", "bg_fast", "bg_slow"]
    # dM/dbg = 1 on every pixel: the sum of the weights
    assert g["bg"] == pytest.approx(float(w.astype(np.float64).sum()), rel=1e-12)
    assert g["bg_fast"] != 0 and g["bg_slow"] != 0
    assert nbgrad.grad(exp, w, "bg,background") == g


def test_all_is_every_free_parameter(exp, cli, tmp_path):
    w = np.ones(exp.shape, dtype=np.float32)
    g = nbgrad.grad(exp, w, "all")
    assert set(g) <= set(nbgrad.PARAMS)
    assert set(nbgrad.GROUPS["cell"]) | {"orient_x", "Na", "lambda", "distance", "bg"} <= set(g)
    assert "mosaic" not in g  # no mosaic spread: not free
    assert "fluence" not in g  # an overall factor, as the scale: named alone only
    assert "rotx" not in g and "beam_tilt1" not in g  # the same changes as orient_x and the detector's: named alone
    assert list(g) == [p for p in nbgrad.PARAMS if p in g]
    assert nbgrad.grad(exp, w, ["all"]) == g
    ref = cli_json(cli, ["grad", *exp.flags, "-params", "all"], tmp_path)
    assert same_as_cli(dict(g), ref["gradient"])  # the same list, the same library call: bit for bit


def test_wavelength_is_lambda(exp):
    w = np.ones(exp.shape, dtype=np.float32)
    g = nbgrad.grad(exp, w, ["wavelength"])
    assert list(g) == ["lambda"]
    assert g["lambda"] == nbgrad.grad(exp, w, ["lambda"])["lambda"]
    assert list(nbgrad.grad(exp, w, ["lambda", "wavelength"])) == ["lambda"]
    assert exp.wavelength == exp.lambda_ == exp.get_param("wavelength") == 1.0
    e = exp.copy()
    e.wavelength = 1.1
    assert e.get_param("lambda") == 1.1 and exp.wavelength == 1.0
    e.set_param("polarization", 0.5)
    assert e.polar == 0.5
    assert np.array_equal(nbgrad.jvp(exp, ["wavelength"]), nbgrad.jvp(exp, ["lambda"]))


def test_one_structure_factor(exp_hkl):
    w = np.random.default_rng(6).uniform(0.5, 1.5, exp_hkl.shape).astype(np.float32)
    full = nbgrad.grad(exp_hkl, w, ["F"])["F"]
    h0, k0, l0 = exp_hkl.hkl_origin
    # the strongest entry's gradient alone, by its Miller indices
    i, j, k = np.unravel_index(np.argmax(np.abs(full)), full.shape)
    name = f"F({i + h0},{j + k0},{k + l0})"
    one = nbgrad.grad(exp_hkl, w, ["a", name])
    assert list(one) == ["a", name] and full[i, j, k] != 0
    assert one[name] == full[i, j, k]
    assert nbgrad.grad(exp_hkl, w, f"a,{name}") == one
    with pytest.raises(ValueError, match="F"):
        nbgrad.grad(exp_hkl, w, ["F(99,0,0)"])


def test_unknown_and_flat_panels(exp):
    w = np.ones(exp.shape, dtype=np.float32)
    with pytest.raises(ValueError, match="bogus"):
        nbgrad.grad(exp, w, ["a", "bogus"])
    with pytest.raises(TypeError):
        nbgrad.grad(exp, w, ["a", 3])
    # panel parameters on a detector without panels
    with pytest.raises(ValueError):
        nbgrad.grad(exp, w, ["panel_shift"])
    with pytest.raises(ValueError):
        exp.get_param("g0.shift_x")


PIL = dict(layout="pilatus6m", cell=(70, 80, 90, 90, 90, 90), misset=(10, 20, 30), default_F=100, N=5, wavelength=1,
           distance=250, oversample=1)


def test_panel_motions():
    e = nbgrad.Experiment(**PIL)
    img = nbgrad.simulate(e)
    assert img.shape == e.shape and e.shape[0] == 1  # the panels' concatenation
    w = np.random.default_rng(8).uniform(0.5, 1.5, e.shape).astype(np.float32)
    g = nbgrad.grad(e, w, ["g7.shift_x", "panel_rot_z", "distance"])
    assert list(g)[:3] == ["g7.shift_x", "g0.rot_z", "g1.rot_z"] and list(g)[-1] == "distance"
    assert len(g) == 2 + 60 and g["g7.shift_x"] != 0
    assert np.array_equal(g.image, img)  # naming a motion leaves the image as it was (no motion)
    t = nbgrad.jvp(e, ["g7.shift_x", "g7.rot_z"])
    assert t.shape == (2,) + e.shape
    assert float(np.sum(w * t[0])) == pytest.approx(g["g7.shift_x"], rel=1e-6)
    assert float(np.sum(w * t[1])) == pytest.approx(g["g7.rot_z"], rel=1e-6)
    # a motion as a value: its own copy, the image moves
    m = e.copy()
    assert m.get_param("g7.shift_x") == 0
    m.set_param("g7.shift_x", 0.2)
    assert m.get_param("g7.shift_x") == 0.2 and e.get_param("g7.shift_x") == 0
    moved = nbgrad.simulate(m)
    assert not np.array_equal(moved, img) and np.array_equal(nbgrad.simulate(e), img)
    with pytest.raises(ValueError, match="g60"):
        nbgrad.grad(e, w, ["g60.shift_x"])


def test_domain_turns(tmp_path):
    """A crystal of three blocks: each mosaic domain turned by its own angles (-domain_rot), the turns named as
    parameters ("d1.rot_x" ...), their gradients against the tangents, a turn set on a copy moving its image alone."""
    turns = tmp_path / "turns.txt"
    turns.write_text("1 0.3 -0.2 0.25\n2 -0.25 0.4 -0.1\n")
    e = nbgrad.Experiment(cell=(70, 80, 90, 75, 85, 95), misset=(10, 5, 3), default_F=100, N=8, wavelength=1,
                          distance=100, detpixels=64, oversample=1, mosaic_domains=3, domain_rot=str(turns))
    img = nbgrad.simulate(e)
    assert e.get_param("d2.rot_y") == 0.4
    w = np.random.default_rng(3).uniform(0.5, 1.5, e.shape).astype(np.float32)
    g = nbgrad.grad(e, w, ["domain_rot", "a"])
    assert list(g) == ["d1.rot_x", "d1.rot_y", "d1.rot_z", "d2.rot_x", "d2.rot_y", "d2.rot_z", "a"]
    t = nbgrad.jvp(e, ["d1.rot_z", "d2.rot_x"])
    assert float(np.sum(w * t[0])) == pytest.approx(g["d1.rot_z"], rel=1e-6) and g["d1.rot_z"] != 0
    assert float(np.sum(w * t[1])) == pytest.approx(g["d2.rot_x"], rel=1e-6) and g["d2.rot_x"] != 0
    m = e.copy()
    m.set_param("d1.rot_x", 0.5)
    assert m.get_param("d1.rot_x") == 0.5 and e.get_param("d1.rot_x") == 0.3
    assert not np.array_equal(nbgrad.simulate(m), img) and np.array_equal(nbgrad.simulate(e), img)
    with pytest.raises(ValueError, match="d3.rot_x"):
        e.get_param("d3.rot_x")
