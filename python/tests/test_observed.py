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
