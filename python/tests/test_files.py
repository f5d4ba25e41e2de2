"""Readers and writers: round trips through the library's formats."""
import json
import numpy as np
import pytest

import nbgrad
from conftest import BASE


def test_hkl_and_fdump_round_trip(hkl_file, tmp_path):
    F, origin = nbgrad.read_hkl(hkl_file)
    # the file's first entry (h = k = l = -12) and a spot check against the text
    first = [ln for ln in open(hkl_file) if not ln.startswith("#")][0].split()
    assert F[0, 0, 0] == pytest.approx(float(first[3]))
    nbgrad.write_fdump(tmp_path / "F.bin", F, origin)
    F2, origin2 = nbgrad.read_fdump(tmp_path / "F.bin")
    assert origin2 == origin and np.array_equal(F, F2)
    with pytest.raises(nbgrad.FileError):
        nbgrad.read_hkl(tmp_path / "missing.hkl")
    (tmp_path / "bad.hkl").write_text("1 2 3 4\n1 2 x 4\n")
    with pytest.raises(nbgrad.FormatError, match="bad.hkl"):
        nbgrad.read_hkl(tmp_path / "bad.hkl")


def test_smv_round_trip(exp, tmp_path):
    img = nbgrad.simulate(exp)
    path = tmp_path / "img.smv"
    nbgrad.write_smv(path, img, exp)
    data, header = nbgrad.read_smv(path)
    assert data.shape == img.shape and data.dtype == np.uint16
    assert np.array_equal(data, nbgrad.int_image(img))
    assert header["distance"] == pytest.approx(100) and header["pixel"] == pytest.approx(0.5)
    assert header["fpixels"] == 96
    nbgrad.write_smv(tmp_path / "again.smv", data, header)
    assert np.array_equal(nbgrad.read_smv(tmp_path / "again.smv")[0], data)
    # read_image knows SMV by its content
    photons, geom = nbgrad.read_image(path)
    assert photons.shape == img.shape and geom is not None and not geom.complete
    assert np.array_equal(photons, data.astype(np.float32))


def test_float_round_trip(exp, tmp_path):
    img = nbgrad.simulate(exp)
    nbgrad.write_float(tmp_path / "f.bin", img)
    back, geom = nbgrad.read_image(tmp_path / "f.bin", shape=img.shape)
    assert geom is None and np.array_equal(back, img)
    with pytest.raises(nbgrad.Error):
        nbgrad.read_image(tmp_path / "f.bin", shape=(10, 10))


def test_noise_is_seeded(exp):
    img = nbgrad.simulate(exp)
    a, photons, _ = nbgrad.noise_image(img, seed=5)
    b, _, _ = nbgrad.noise_image(img, seed=5)
    c, _, _ = nbgrad.noise_image(img, seed=6)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert photons == pytest.approx(img.sum(), rel=0.02)


def test_expt_round_trip(exp, tmp_path):
    g = exp.geometry()
    assert g["fpixels"] == 96 and "real_space" in g
    exp.to_expt(tmp_path / "e.expt")
    back = nbgrad.read_expt(tmp_path / "e.expt")
    for key in ("fast", "slow", "origin", "direction", "axis"):
        assert np.allclose(back[key], g[key], atol=1e-9), key
    assert np.allclose(back["real_space"], g["real_space"], atol=1e-9)
    # the experiment read back renders the same image (the same physics in DIALS's frame), the still's one
    # orientation as the experiment's (a scan of width 0 had rendered two steps of 0 deg)
    again = nbgrad.Experiment.from_expt(tmp_path / "e.expt", default_F=100, N=5, oversample=2)
    (img, r), (img2, r2) = nbgrad.simulate(exp, report=True), nbgrad.simulate(again, report=True)
    assert np.abs(img2 - img).max() <= 1e-6 * img.max()
    assert r["phisteps"] == r2["phisteps"] == 1 and r2["steps"] == r["steps"]
    via_dict = nbgrad.Experiment.from_geometry(back, default_F=100, N=5, oversample=2)
    assert np.array_equal(nbgrad.simulate(via_dict), img2)
    with pytest.raises(ValueError, match="unknown key"):
        nbgrad.write_expt(tmp_path / "x.expt", {**g, "colour": 1})


_KAPPA_LIST = """{"__id__": "ExperimentList", "experiment": [{"beam": 0, "detector": 0, "goniometer": 0, "scan": 0,
 "crystal": 0}], "beam": [{"direction": [0, 0, 1], "wavelength": 1.0}],
 "detector": [{"panels": [{"fast_axis": [1, 0, 0], "slow_axis": [0, -1, 0], "origin": [-5, 6, -100],
 "pixel_size": [0.1, 0.1], "image_size": [100, 120]}]}],
 "goniometer": [{"axes": [[1, 0, 0], [0.64278761, -0.76604444, 0], [1, 0, 0]], "angles": [30, -40, 12.5],
 "names": ["PHI", "KAPPA", "OMEGA"], "scan_axis": 1}],
 "scan": [{"image_range": [1, 2], "oscillation": [0, 0.1], "exposure_time": [1, 1]}],
 "crystal": [{"__id__": "crystal", "real_space_a": [51.2, 3.1, -2.4], "real_space_b": [7.5, 62.3, 4.4],
 "real_space_c": [-6.1, 9.8, 83.7], "space_group_hall_symbol": " P 1"}]}"""


def test_expt_multi_axis_goniometer(tmp_path):
    """A DIALS MultiAxisGoniometer in the geometry dict: its axes, angles, names and scan axis, and the fixed and
    setting rotations they give; written back as one, from the dict and from an experiment."""
    src = tmp_path / "kappa.expt"
    src.write_text(_KAPPA_LIST)
    g = nbgrad.read_expt(src)
    gon = g["goniometer"]
    assert gon["names"] == ("PHI", "KAPPA", "OMEGA") and gon["scan_axis"] == 1
    assert gon["axes"][1] == (0.64278761, -0.76604444, 0.0) and gon["angles"] == (30.0, -40.0, 12.5)
    S, F = np.array(gon["setting_rotation"]), np.array(gon["fixed_rotation"])
    assert not np.allclose(S, np.eye(3)) and not np.allclose(F, np.eye(3))
    u = np.array(gon["axes"][1]) / np.linalg.norm(gon["axes"][1])
    assert np.allclose(g["axis"], S @ u, atol=1e-14)
    nbgrad.write_expt(tmp_path / "back.expt", g)
    back = nbgrad.read_expt(tmp_path / "back.expt")
    for key in ("axes", "angles", "names", "scan_axis"):
        assert back["goniometer"][key] == gon[key], key
    assert np.allclose(back["real_space"], g["real_space"], atol=1e-12)
    # through an experiment (Experiment.geometry hands the goniometer back)
    exp = nbgrad.Experiment.from_expt(src, default_F=100, N=5, oversample=1)
    eg = exp.geometry(2)
    assert eg["goniometer"]["axes"] == gon["axes"] and eg["goniometer"]["names"] == gon["names"]
    exp.to_expt(tmp_path / "exp.expt")
    import json
    doc = json.loads((tmp_path / "exp.expt").read_text())
    assert doc["goniometer"][0]["names"] == ["PHI", "KAPPA", "OMEGA"] and doc["goniometer"][0]["scan_axis"] == 1
    # malformed: named
    with pytest.raises(ValueError, match="goniometer.*angles"):
        nbgrad.write_expt(tmp_path / "x.expt", {**g, "goniometer": {**gon, "angles": (1.0, 2.0)}})
    with pytest.raises(ValueError, match="goniometer.*unknown key"):
        nbgrad.write_expt(tmp_path / "x.expt", {**g, "goniometer": {**gon, "colour": 1}})
    bad = {**gon, "axes": ((1.0, 0.0, 0.0), (2.0, 0.0, 0.0), (1.0, 0.0, 0.0))}
    with pytest.raises(Exception, match=r"goniometer.axes\[1\]"):
        nbgrad.write_expt(tmp_path / "x.expt", {**g, "goniometer": bad})


def _supported(call):
    try:
        call()
    except nbgrad.UnsupportedError as e:
        pytest.skip(f"this build does not write the format: {e}")


def test_nxmx_round_trip(exp, tmp_path):
    img = nbgrad.simulate(exp)
    g = exp.geometry(nframes=2)
    frames = np.stack([img, 2 * img])
    _supported(lambda: nbgrad.write_nxmx(tmp_path / "s.nxs", g, frames))
    back, geom = nbgrad.read_image(tmp_path / "s.nxs", frame=1)
    assert geom.complete and np.allclose(back, 2 * img)
    assert np.allclose(geom["origin"], g["origin"])


def test_cbf_round_trip(exp, tmp_path):
    counts = nbgrad.int_image(nbgrad.simulate(exp)).astype(np.int32)
    g = exp.geometry()
    _supported(lambda: nbgrad.write_cbf(tmp_path / "s.cbf", g, counts))
    back, geom = nbgrad.read_image(tmp_path / "s.cbf")
    assert geom.complete and np.array_equal(back, counts.astype(np.float32))
    # a float image with fractions, or a count beyond int32, is refused rather than truncated (issue 29)
    for bad in (counts + 0.5, counts.astype(np.float64) * 0 + 3e9):
        with pytest.raises(ValueError, match="not an integer"):
            nbgrad.write_cbf(tmp_path / "t.cbf", g, bad)
    assert not (tmp_path / "t.cbf").exists()
    nbgrad.write_cbf(tmp_path / "u.cbf", g, counts.astype(np.float64))  # integral floats are integers
    assert np.array_equal(nbgrad.read_image(tmp_path / "u.cbf")[0], back)


def test_scan_varying_frames(tmp_path, cli):
    """Experiment.frame(k): image k of a scan with a scan-varying crystal (A_at_scan_points) gets its own crystal, the
    mean of the A matrices at its start and end, as the program renders it."""
    import json
    import subprocess

    r0 = np.array([[51.2, 3.1, -2.4], [7.5, 62.3, 4.4], [-6.1, 9.8, 83.7]])
    bases = []
    for k in range(5):  # the crystal turns by 0.1 deg a scan point about y
        t = np.radians(0.1 * k)
        ry = np.array([[np.cos(t), 0, np.sin(t)], [0, 1, 0], [-np.sin(t), 0, np.cos(t)]])
        bases.append(r0 @ ry.T)
    doc = {"__id__": "ExperimentList",
           "experiment": [{"beam": 0, "detector": 0, "goniometer": 0, "scan": 0, "crystal": 0}],
           "beam": [{"direction": [0, 0, 1], "wavelength": 1.0}],
           "detector": [{"panels": [{"fast_axis": [1, 0, 0], "slow_axis": [0, -1, 0], "origin": [-6.4, 6.4, -80],
                                     "pixel_size": [0.1, 0.1], "image_size": [128, 128]}]}],
           "goniometer": [{"rotation_axis": [1, 0, 0]}],
           "scan": [{"image_range": [1, 4], "oscillation": [0, 0.5], "exposure_time": [1, 1, 1, 1]}],
           "crystal": [{"__id__": "crystal", "real_space_a": list(r0[0]), "real_space_b": list(r0[1]),
                        "real_space_c": list(r0[2]), "space_group_hall_symbol": " P 1",
                        "A_at_scan_points": [list(np.linalg.inv(b).ravel()) for b in bases]}]}
    path = tmp_path / "sv.expt"
    path.write_text(json.dumps(doc))
    e = nbgrad.Experiment.from_expt(path, default_F=100, N=3, oversample=1)
    f2 = e.frame(2)
    mean = np.linalg.inv(0.5 * (np.linalg.inv(bases[2]) + np.linalg.inv(bases[3])))
    d = f2.describe()
    assert np.abs(np.array(d["real_vectors"]).reshape(3, 3) - mean).max() < 1e-8
    # its image: the program's image 3, bit for bit; and not the static crystal's at the same angle
    out = tmp_path / "sv.bin"
    subprocess.run([cli, "-expt", str(path), "-default_F", "100", "-N", "3", "-oversample", "1", "-floatfile",
                    str(out)], check=True, capture_output=True)
    prog = np.fromfile(tmp_path / "sv_00003.bin", dtype=np.float32).reshape(f2.shape)
    img = nbgrad.simulate(f2)
    assert np.array_equal(img, prog) and img.sum() > 0
    del doc["crystal"][0]["A_at_scan_points"]  # the static crystal, image 3's angles
    (tmp_path / "static.expt").write_text(json.dumps(doc))
    static = nbgrad.Experiment.from_expt(tmp_path / "static.expt", default_F=100, N=3, oversample=1).frame(2)
    assert static.describe()["phi0"] == d["phi0"] == 1.0
    assert np.abs(nbgrad.simulate(static) - img).sum() > 1e-3 * img.sum()
    with pytest.raises(nbgrad.InvalidError, match="image 4 of a series of 4"):
        e.frame(4)


def test_nxmx_of_a_tilted_beam(tmp_path):
    """A geometry whose beam is 2 deg off -z (as from a DIALS list) is written as NXmx turned as a whole: the beam
    along -z, the detector where it was relative to the beam."""
    g = nbgrad.Experiment(cell=(50, 50, 50, 90, 90, 90), default_F=1, N=2, detpixels=32, distance=100).geometry()
    t = np.radians(2.0)
    R = np.array([[1, 0, 0], [0, np.cos(t), -np.sin(t)], [0, np.sin(t), np.cos(t)]])
    turned = dict(g)
    for k in ("direction", "fast", "slow", "origin", "axis", "polarization_normal"):
        turned[k] = list(R @ np.asarray(g[k], float))
    path = tmp_path / "tilted.nxs"
    nbgrad.write_nxmx(path, turned, np.ones((32, 32), np.float32))
    _, back = nbgrad.read_image(path)
    assert np.allclose(back["direction"], [0, 0, 1], atol=1e-12)
    for k in ("fast", "slow", "origin"):
        assert np.allclose(back[k], g[k], atol=1e-9)


def test_sensor_model(tmp_path):
    """The sensor's model: nanoBragg's for the sensor flags, physical with sensor="physical" (the sensor's capture,
    1 - exp(-T mu) at normal incidence, where nanoBragg's weights every layer by a slab beyond the last), and for
    a list as DIALS writes it; a list nbgrad writes keeps the model it rendered."""
    kw = dict(default_F=100, cell=(100, 100, 100, 90, 90, 90), N=5, distance=100, detpixels=64, pixel=0.1,
              oversample=1)
    sensor = dict(detector_thick=450, detector_abs=261, thicksteps=4)
    thin = nbgrad.simulate(nbgrad.Experiment(**kw))
    nb, rn = nbgrad.simulate(nbgrad.Experiment(**kw, **sensor), report=True)
    ph, rp = nbgrad.simulate(nbgrad.Experiment(**kw, **sensor, sensor="physical"), report=True)
    assert rn["sensor_model"] == "nanobragg" and rp["sensor_model"] == "physical"
    capture = -np.expm1(-450 / 261)
    assert abs(ph.sum() / thin.sum() - capture) < 0.01 * capture
    assert nb.sum() / thin.sum() < 0.5 * capture
    nbgrad.Experiment(**kw, **sensor).to_expt(tmp_path / "s.expt")
    back, rb = nbgrad.simulate(nbgrad.Experiment.from_expt(tmp_path / "s.expt", default_F=100, N=5, oversample=1),
                               report=True)
    assert rb["sensor_model"] == "nanobragg" and np.abs(back - nb).max() <= 1e-6 * nb.max()
    doc = json.loads((tmp_path / "s.expt").read_text())
    del doc["detector"][0]["nbgrad_sensor"]
    (tmp_path / "d.expt").write_text(json.dumps(doc))
    dials, rd = nbgrad.simulate(nbgrad.Experiment.from_expt(tmp_path / "d.expt", default_F=100, N=5, oversample=1,
                                                            thicksteps=4), report=True)
    assert rd["sensor_model"] == "physical" and np.abs(dials - ph).max() <= 1e-6 * ph.max()
