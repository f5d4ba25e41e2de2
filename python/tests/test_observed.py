"""read_observed: the program's observed-image policy (nbg_observed_read) from Python: the detector response
(given, else the file's, else nanoBragg's ADC offset for SMV without the key), the pixels left out (overloads, the
file's mask, the experiment's -mask), the refusals; the loss it gives equals the program's."""
import json
import subprocess

import numpy as np
import pytest

import nbgrad


def test_smv_adc_default_and_overload(exp, tmp_path):
    img = nbgrad.simulate(exp)
    data = nbgrad.int_image(img)  # nanoBragg's counts: scale, then + 40, no ADC_OFFSET key
    data[3, 5] = 65535
    path = tmp_path / "nb.img"
    nbgrad.write_smv(path, data, exp)
    obs, mask, info = nbgrad.read_observed(exp, path, with_info=True)
    assert obs.shape == exp.shape and obs.dtype == np.float32 and mask.dtype == bool and mask.shape == exp.shape
    assert np.array_equal(obs, data.astype(np.float32))
    assert (exp.pedestal, exp.gain, exp.read_noise) == (40.0, 1.0, 0.0)
    assert info["response"] == (40.0, 1.0, 0.0) and info["from"] == ("default", "file", "default")
    assert not mask[3, 5] and mask.sum() == mask.size - 1 and info["left_overload"] == 1
    assert info["left_out"].startswith(f"left out 1 of {mask.size} pixels: 0 in the file's mask, 1 overloaded")
    assert info["response_text"].endswith("(an SMV file without ADC_OFFSET: nanoBragg's ADC offset (-adc)), gain 1 "
                                          "counts/photon, read noise 0 counts")
    assert info["geometry"]["fpixels"] == exp.shape[1] and info["file"] == str(path)
    # the experiment's -adc is the default's offset; given values win over everything
    e2 = nbgrad.Experiment.from_flags(exp.flags, adc=10)
    nbgrad.read_observed(e2, path)
    assert e2.pedestal == 10
    nbgrad.read_observed(exp, path, pedestal=12, gain=2, read_noise=1.5)
    assert (exp.pedestal, exp.gain, exp.read_noise) == (12.0, 2.0, 1.5)


def test_file_pedestal_and_mask(exp, tmp_path):
    img = nbgrad.simulate(exp)
    data = nbgrad.int_image(img, adc=7)
    path = tmp_path / "own.img"
    h = exp.smv_header()
    h["adc_offset"] = 7.0
    nbgrad.write_smv(path, data, h)
    _, _, info = nbgrad.read_observed(exp, path, with_info=True)
    assert exp.pedestal == 7 and info["from"][0] == "file"
    # the experiment's mask (-mask) joins the file's
    m = np.ones(exp.shape, np.float32)
    m[0, :4] = 0
    mpath = tmp_path / "mask.img"
    nbgrad.write_smv(mpath, m.astype(np.uint16), exp)
    em = nbgrad.Experiment.from_flags(exp.flags, mask=str(mpath))
    _, mask, info = nbgrad.read_observed(em, path, with_info=True)
    assert not mask[0, :4].any() and mask.sum() == mask.size - 4 and info["left_mask"] == 4


def test_refusals(exp, tmp_path):
    with pytest.raises(nbgrad.FileError, match="missing"):
        nbgrad.read_observed(exp, tmp_path / "missing.img")
    raw = np.zeros(exp.shape, np.float32)
    nbgrad.write_float(tmp_path / "short.bin", raw.ravel()[:-1])
    with pytest.raises(nbgrad.Error):
        nbgrad.read_observed(exp, tmp_path / "short.bin")
    raw[2, 2] = np.nan
    nbgrad.write_float(tmp_path / "nan.bin", raw)
    with pytest.raises(nbgrad.InvalidError, match="must be finite"):
        nbgrad.read_observed(exp, tmp_path / "nan.bin")
    with pytest.raises(nbgrad.InvalidError):
        nbgrad.read_observed(exp, tmp_path / "nan.bin", gain=-1)
    # raw floats carry no pedestal; a count below 0 is data
    raw[2, 2] = -3
    nbgrad.write_float(tmp_path / "neg.bin", raw)
    obs, mask, info = nbgrad.read_observed(exp, tmp_path / "neg.bin", with_info=True)
    assert exp.pedestal == 0 and mask.all() and obs[2, 2] == -3 and info["negative"] == 1 and info["note"]


def test_loss_equals_cli(exp, cli, tmp_path):
    """The program's grad -observed on a nanoBragg SMV file (pedestal 40 unstated) and loss_grad after
    read_observed give the same loss and gradient: the same policy."""
    e = nbgrad.Experiment.from_flags(exp.flags, cell=(70.2, 80, 90, 75, 85, 95))
    img = nbgrad.simulate(exp)
    path = tmp_path / "nb.img"
    nbgrad.write_smv(path, nbgrad.int_image(img, scale=1.0), exp)
    obs, mask = nbgrad.read_observed(e, path)
    assert mask.all()
    g = nbgrad.loss_grad(e, obs, loss="poisson", params=["a"])
    out = tmp_path / "g.json"
    subprocess.run([cli, "grad", *e.flags, "-params", "a", "-observed", str(path), "-loss", "poisson", "-json",
                    str(out)], cwd=tmp_path, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ref = json.loads(out.read_text())
    assert g.loss == pytest.approx(ref["loss"], rel=1e-9)
    assert g["a"] == pytest.approx(ref["gradient"]["a"], rel=1e-9)


def test_spot_pixels(exp, tmp_path):
    whole = nbgrad.simulate(exp)
    pix = nbgrad.spot_pixels(exp, half=2)
    assert pix.dtype == np.uint32 and 0 < pix.size < whole.size and np.all(np.diff(pix.astype(np.int64)) > 0)
    # around every pixel above the floor by 5% of the range: the brightest is in, the faintest far from spots not
    assert int(np.argmax(whole)) in set(pix.tolist())
    assert np.array_equal(nbgrad.spot_pixels(exp, whole, half=2), pix)  # the model given = the model rendered
    exp.pixels = pix
    assert np.array_equal(exp.pixels, pix)
    img = nbgrad.simulate(exp).ravel()
    assert np.array_equal(img[pix], whole.ravel()[pix]) and not np.any(np.delete(img, pix))
    # drawn from the whole model even with a list set; kept by copies and pickles
    assert np.array_equal(nbgrad.spot_pixels(exp, half=2), pix)
    import copy
    import pickle
    assert np.array_equal(copy.copy(exp).pixels, pix) and np.array_equal(pickle.loads(pickle.dumps(exp)).pixels, pix)
    exp.pixels = None
    assert exp.pixels is None and np.array_equal(nbgrad.simulate(exp), whole)
    # centres (as -spotlist): one box; a flat image is refused; a bad index is refused
    box = nbgrad.spot_pixels(exp, centres=[(10, 20)], half=1)
    assert box.tolist() == [19 * 96 + 9, 19 * 96 + 10, 19 * 96 + 11, 20 * 96 + 9, 20 * 96 + 10, 20 * 96 + 11,
                            21 * 96 + 9, 21 * 96 + 10, 21 * 96 + 11]
    with pytest.raises(ValueError, match="flat"):
        nbgrad.spot_pixels(exp, np.ones(exp.shape, np.float32))
    with pytest.raises(ValueError):
        exp.pixels = [whole.size]


def test_spot_refine_equals_cli(exp, cli, tmp_path):
    """refine -spots 3 in the program and a Python refine on spot_pixels' list: the same pixels, the same loss."""
    obs = nbgrad.simulate(exp)
    path = tmp_path / "obs.bin"
    nbgrad.write_float(path, obs)
    e = nbgrad.Experiment.from_flags(exp.flags, cell=(70.2, 80, 90, 75, 85, 95))
    image, mask = nbgrad.read_observed(e, path)
    e.pixels = nbgrad.spot_pixels(e, mask=mask)
    r = nbgrad.refine(e, image, ["a"], loss="poisson", weights=mask.astype(np.float32))
    out = tmp_path / "r.json"
    subprocess.run([cli, "refine", *exp.flags, "-cell", "70.2", "80", "90", "75", "85", "95", "-observed", str(path),
                    "-params", "a", "-loss", "poisson", "-spots", "3", "-json", str(out)], cwd=tmp_path, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ref = json.loads(out.read_text())
    assert ref["pixels"] == e.pixels.size
    assert r.start_loss == pytest.approx(ref["start_loss"], rel=1e-9)
    assert r.values["a"] == pytest.approx(ref["parameters"]["a"]["value"], rel=1e-6)
    assert r.values["a"] == pytest.approx(70, abs=0.01)


def test_panel_response(tmp_path):
    """Each panel its own pedestal and gain (as -panel_pedestal, -panel_gain): the experiment's panels carry them,
    and the loss reads every pixel through its own panel's."""
    e = nbgrad.Experiment(layout="cspad", cell=(70, 80, 90, 90, 90, 90), misset=(10, 20, 30), default_F=100, N=5,
                          wavelength=1, distance=100, oversample=1)
    img = nbgrad.simulate(e).ravel()
    n = 64
    assert img.size % n == 0 and img.max() > 0
    per = img.size // n  # the CSPAD's 64 sensors are of one size
    ped = np.arange(n, dtype=np.float64) * 3.0
    gain = 0.5 + np.arange(n) / 64.0
    counts = (img.reshape(n, per) * gain[:, None] + ped[:, None]).astype(np.float32)
    path = tmp_path / "obs.bin"
    nbgrad.write_float(path, counts.ravel())
    obs, mask, info = nbgrad.read_observed(e, path, with_info=True, panel_pedestal=ped, panel_gain=gain,
                                           read_noise=2)
    assert len(info["panel_response"]) == n
    assert info["panel_response"][5] == (15.0, 0.5 + 5 / 64.0, 2.0)
    assert "the panels' own detector response" in info["response_text"]
    # the loss through each panel's response: the model explains the counts exactly (least squares 0)
    g = nbgrad.loss_grad(e, obs, loss="lsq", params=["a"])
    assert g.loss == pytest.approx(0.0, abs=1e-6 * float(np.sum(img * img)))
    with pytest.raises(nbgrad.InvalidError, match="the detector has 64 panels"):
        nbgrad.read_observed(e, path, panel_gain=gain[:3])
    with pytest.raises(ValueError, match="differ in length"):
        nbgrad.read_observed(e, path, panel_gain=gain, panel_pedestal=ped[:3])
