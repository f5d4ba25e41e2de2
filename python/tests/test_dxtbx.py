"""dxtbx interop (Debian's /usr/bin/python3 with DIALS): an experiment list written by nbgrad, loaded by dxtbx
and converted back with Experiment.from_dxtbx, renders the same image."""
import numpy as np
import pytest

import nbgrad

pytest.importorskip("dxtbx")
from dxtbx.model.experiment_list import ExperimentListFactory  # noqa: E402


def test_from_dxtbx_round_trip(exp, tmp_path):
    path = tmp_path / "e.expt"
    exp.to_expt(path)
    elist = ExperimentListFactory.from_json_file(str(path), check_format=False)
    assert len(elist) == 1
    ours = nbgrad.Experiment.from_expt(path, default_F=100, N=5, oversample=2)
    theirs = nbgrad.Experiment.from_dxtbx(elist[0], default_F=100, N=5, oversample=2)
    g1, g2 = ours.geometry(), theirs.geometry()
    for key in ("fast", "slow", "origin", "direction", "axis"):
        assert np.allclose(g1[key], g2[key], atol=1e-9), key
    assert np.allclose(g1["real_space"], g2["real_space"], atol=1e-6)
    img, img2 = nbgrad.simulate(ours), nbgrad.simulate(theirs)
    assert img.max() > 0 and np.abs(img - img2).max() <= 1e-4 * img.max()
    # and back out: dxtbx reads what to_expt writes of the converted experiment
    theirs.to_expt(tmp_path / "back.expt")
    again = ExperimentListFactory.from_json_file(str(tmp_path / "back.expt"), check_format=False)[0]
    assert np.allclose(again.crystal.get_A(), elist[0].crystal.get_A(), atol=1e-9)
