"""The experiment builder of the library (nbg_builder): errors raised from the context's message, with nothing
printed (no file descriptor is redirected, the library prints nothing); a value left out, an unknown keyword or
attribute; values readable as attributes."""
import pytest

import nbgrad
from conftest import BASE


def test_errors_come_from_the_library_without_output(capfd, tmp_path):
    with pytest.raises(nbgrad.InvalidError, match=r"unknown flag '-distanse': did you mean '-distance'\?"):
        nbgrad.Experiment.from_flags("-cell 70 80 90 90 90 90 -distanse 100")
    with pytest.raises(ValueError, match="-pivot expects beam or sample, got 'x'"):
        nbgrad.Experiment.from_flags("-cell 70 80 90 90 90 90 -pivot x")
    with pytest.raises(nbgrad.FileError, match="-hkl: cannot open") as err:
        nbgrad.Experiment(hkl=str(tmp_path / "missing.hkl"), **BASE)
    assert isinstance(err.value, OSError)
    (tmp_path / "bad.hkl").write_text("1 2 3 4\n1 2 x 4\n")
    with pytest.raises(nbgrad.FormatError, match="-hkl: .*bad.hkl"):
        nbgrad.Experiment(hkl=str(tmp_path / "bad.hkl"), **BASE)
    with pytest.raises(ValueError, match="-h asks for the program's help"):
        nbgrad.Experiment.from_flags("-h")
    # the notes are the experiment's log, not the process's output
    with pytest.warns(UserWarning, match="-density is accepted and ignored"):
        e = nbgrad.Experiment.from_flags(nbgrad.kwargs_to_flags(**BASE) + ["-density", "3", "-default_F", "1"])
    assert "nbgrad: note: -density is accepted and ignored" in e.log
    out, err_text = capfd.readouterr()
    assert out == "" and err_text == ""


def test_partial_cell_is_an_error():
    flags = dict(BASE)
    for cell in [(70, 80, 90, 90, 90), (70,)]:
        flags["cell"] = cell
        with pytest.raises(ValueError, match="cell.*6 values"):
            nbgrad.Experiment(default_F=1, **flags)
    with pytest.raises(ValueError, match=r"-cell needs a b c alpha beta gamma \(6 values\), got 5"):
        nbgrad.Experiment.from_flags("-cell 70 80 90 90 90 -default_F 1")
    with pytest.raises(ValueError, match=r"-cell needs a b c alpha beta gamma \(6 values\), got 1"):
        nbgrad.Experiment.from_flags("-cell 70")


def test_unknown_keywords_and_attributes(exp):
    with pytest.raises(TypeError, match="did you mean 'distance'"):
        nbgrad.Experiment(distanse=100, **BASE)
    with pytest.raises(AttributeError, match="did you mean 'distance'"):
        exp.distanse = 5
    with pytest.raises(AttributeError, match="did you mean 'distance'"):
        exp.distanse
    with pytest.raises(AttributeError, match="is set when the Experiment is made"):
        exp.detpixels = 64
    with pytest.raises(ValueError, match=r"-detpixels takes 1 value"):
        nbgrad.Experiment(default_F=1, detpixels=(64, 64), **{k: v for k, v in BASE.items() if k != "detpixels"})


def test_values_read_as_attributes(exp):
    assert exp.cell == pytest.approx((70, 80, 90, 75, 85, 95))
    assert exp.misset == pytest.approx((10, 5, 3))
    assert exp.N == (5, 5, 5)
    exp.N = 7
    assert (exp.Na, exp.Nb, exp.Nc) == (7, 7, 7)
    exp.cell = (71, 80, 90, 75, 85, 95)
    assert exp.a == 71
    with pytest.raises(ValueError, match="6 values"):
        exp.cell = (71, 80)
    flags = dict(BASE, N=(5, 6, 7))
    e = nbgrad.Experiment(default_F=1, **flags)
    assert e.N == (5, 6, 7)
