"""Shot lists, batch and ensemble through the library (nbg_shots_read, nbg_shots_make, nbg_shot_experiment_make,
nbg_ensemble): the same lists, images, files and refined values as the program's nbgrad shots, batch and ensemble,
bit for bit, and its error messages."""
import json
import subprocess

import numpy as np
import pytest

import nbgrad
from conftest import CLI_RTOL, same_as_cli

# a small still-shot experiment: 8 shots of 48 x 48 pixels, a table over -2..2
SMALL = ["-cell", "100", "100", "100", "90", "90", "90", "-N", "5", "-lambda", "1", "-detpixels", "48", "-pixel",
         "0.1", "-distance", "100", "-oversample", "1"]


def run(cli, args, cwd, check=True):
    return subprocess.run([cli, *args], cwd=cwd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def cli_error(r):
    """The program's error message (its last "nbgrad: error: " line, without the prefix)."""
    lines = [line for line in r.stderr.splitlines() if line.startswith("nbgrad: error: ")]
    return lines[-1][len("nbgrad: error: "):] if lines else ""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """truth.hkl, start.hkl (F off by 15 %), shots.jsonl (nbgrad shots) and the noisy observed images obs/{id}.img
    (nbgrad batch), made by the program."""
    from conftest import NBG_BIN

    if not NBG_BIN.exists():
        pytest.skip(f"{NBG_BIN} is not built")
    d = tmp_path_factory.mktemp("shots")
    rng = np.random.default_rng(5)
    with open(d / "truth.hkl", "w") as t, open(d / "start.hkl", "w") as s:
        for h in range(-2, 3):
            for k in range(-2, 3):
                for l in range(-2, 3):
                    F = rng.uniform(50, 150)
                    t.write(f"{h} {k} {l} {F:.6f}\n")
                    s.write(f"{h} {k} {l} {F * (1 + 0.15 * rng.standard_normal()):.6f}\n")
    (d / "obs").mkdir()
    cli = str(NBG_BIN)
    run(cli, ["shots", "-n", "8", "-seed", "3", "-o", "shots.jsonl"], d)
    run(cli, ["batch", *SMALL, "-hkl", "truth.hkl", "-default_F", "0", "-shots", "shots.jsonl", "-noisefile",
              "obs/{id}.img", "-seed", "7", "-quiet"], d)
    return d


def test_read_shots(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text('# a list\n{"id": "a", "misset": [1, 2, 3], "N": 4}\n\n{"id": 7, "scale": 0.5, "seed": 9}\n')
    shots = nbgrad.read_shots(p)
    assert len(shots) == 2 and shots.ids == ("a", "7") and shots.path == str(p)
    assert set(shots[0]) == {"id", "misset", "N", "line"} and shots[0]["line"] == 2
    assert list(shots[0]["misset"]) == [1.0, 2.0, 3.0] and list(shots[0]["N"]) == [4.0, 4.0, 4.0]
    assert shots[1]["scale"] == 0.5 and shots[1]["seed"] == 9 and shots[1]["line"] == 4
    assert [s["id"] for s in shots] == ["a", "7"]
    with pytest.raises(IndexError):
        shots[2]


def test_read_shots_errors_are_the_programs(cli, tmp_path):
    cases = {"bad_key.jsonl": '{"id": "a", "misset": [1, 2, 3]}\n{"id": "b", "colour": 1}\n',
             "bad_value.jsonl": '{"id": "a", "N": "five"}\n',
             "twice.jsonl": '{"id": "a"}\n{"id": "a"}\n',
             "not_json.jsonl": '{"id": "a"\n'}
    (tmp_path / "o").mkdir()
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(nbgrad.Error) as e:
            nbgrad.read_shots(tmp_path / name)
        r = run(cli, ["batch", *SMALL, "-default_F", "1", "-shots", name, "-floatfile", "o/{id}.bin"], tmp_path,
                check=False)
        assert r.returncode != 0
        # the program names the list as given (relative), Python as passed (absolute): the same message otherwise
        assert str(e.value) == cli_error(r).replace(name, str(tmp_path / name)), name
    with pytest.raises(nbgrad.FileError):
        nbgrad.read_shots(tmp_path / "missing.jsonl")


def test_make_shots_matches_cli(cli, tmp_path):
    shots = nbgrad.make_shots(tmp_path / "py.jsonl", 12, seed=4, cell=(70, 80, 90, 90, 90, 90), cell_jitter=1.5,
                              N=6, N_jitter=10, scale_jitter=20)
    run(cli, ["shots", "-n", "12", "-seed", "4", "-cell", "70", "80", "90", "90", "90", "90", "-cell_jitter", "1.5",
              "-N", "6", "-N_jitter", "10", "-scale_jitter", "20", "-o", "cli.jsonl"], tmp_path)
    assert (tmp_path / "py.jsonl").read_bytes() == (tmp_path / "cli.jsonl").read_bytes()
    assert len(shots) == 12 and shots.ids[0] == "shot000001" and "cell" in shots[0] and "scale" in shots[0]
    with pytest.raises(nbgrad.InvalidError, match="jitter"):
        nbgrad.make_shots(tmp_path / "x.jsonl", 3, cell_jitter=1)


def test_batch_matches_cli(cli, data, tmp_path):
    """nbgrad.batch's images equal the program's -floatfile files, bit for bit, and its -floatfile and -noisefile
    files are the program's, byte for byte."""
    (tmp_path / "cli").mkdir()
    (tmp_path / "py").mkdir()
    shots_path = data / "shots.jsonl"
    run(cli, ["batch", *SMALL, "-hkl", str(data / "truth.hkl"), "-default_F", "0", "-shots", str(shots_path),
              "-floatfile", "cli/{id}.bin", "-noisefile", "cli/{id}.img", "-seed", "11", "-quiet"], tmp_path)
    exp = nbgrad.Experiment.from_flags(SMALL + ["-hkl", str(data / "truth.hkl"), "-default_F", "0"])
    seen = []
    images = nbgrad.batch(exp, shots_path, floatfile=tmp_path / "py" / "{id}.bin",
                          noisefile=tmp_path / "py" / "{id}.img", seed=11,
                          progress=lambda sid, done, total: seen.append((sid, done, total)))
    shots = nbgrad.read_shots(shots_path)
    assert list(images) == list(shots.ids) and len(seen) == len(shots) and seen[-1][1:] == (8, 8)
    for sid, img in images.items():
        ref = np.fromfile(tmp_path / "cli" / f"{sid}.bin", dtype=np.float32).reshape(img.shape)
        assert img.shape == (48, 48) and img.max() > 0
        assert np.array_equal(img.view(np.uint32), ref.view(np.uint32)), sid
        assert (tmp_path / "py" / f"{sid}.bin").read_bytes() == (tmp_path / "cli" / f"{sid}.bin").read_bytes()
        assert (tmp_path / "py" / f"{sid}.img").read_bytes() == (tmp_path / "cli" / f"{sid}.img").read_bytes()
    # a shot list's image is the experiment's with the line's keys applied
    e0 = nbgrad.Experiment.from_flags(SMALL + ["-hkl", str(data / "truth.hkl"), "-default_F", "0", "-misset",
                                               *map(repr, shots[0]["misset"])])
    assert np.array_equal(nbgrad.simulate(e0), images[shots.ids[0]])
    with pytest.raises(ValueError, match="{id}"):
        nbgrad.batch(exp, shots, floatfile=tmp_path / "one.bin")


def test_batch_shot_list_with_turns(cli, tmp_path):
    """A shot's experiment list that carries its mosaic domains' own turns (a crystal of blocks, written by the
    program at phi 30) renders through nbgrad.batch as the program's -expt renders it, bit for bit."""
    (tmp_path / "turns.txt").write_text("1 0.3 -0.2 0.25\n2 -0.25 0.4 -0.1\n")
    run(cli, ["simulate", "-cell", "70", "80", "90", "75", "85", "95", "-misset", "10", "5", "3", "-default_F", "100",
              "-N", "8", "-lambda", "1", "-distance", "100", "-detpixels", "48", "-oversample", "1",
              "-mosaic_domains", "3", "-domain_rot", "turns.txt", "-phi", "30", "-floatfile", "truth.bin",
              "-exptfile", "blocks.expt", "-quiet"], tmp_path)
    (tmp_path / "shots.jsonl").write_text(json.dumps({"id": "b1", "expt": str(tmp_path / "blocks.expt")}) + "\n")
    exp = nbgrad.Experiment.from_flags(["-cell", "70", "80", "90", "75", "85", "95", "-default_F", "100", "-N", "8",
                                        "-oversample", "1"])
    img = nbgrad.batch(exp, tmp_path / "shots.jsonl")["b1"]
    ref = np.fromfile(tmp_path / "truth.bin", dtype=np.float32).reshape(img.shape)
    assert img.max() > 0 and np.array_equal(img.view(np.uint32), ref.view(np.uint32))


def cli_ensemble(cli, data, args, name):
    r = run(cli, ["ensemble", *SMALL, "-hkl", "start.hkl", "-default_F", "0", "-shots", "shots.jsonl", "-observed",
                  "obs/{id}.img", *args, "-json", name], data)
    return json.loads((data / name).read_text()), r


def check_same(res, ref, shots, exp):
    assert same_as_cli(res.start_loss, ref["start_loss"]) and same_as_cli(res.loss, ref["loss"])
    assert same_as_cli(res.globals, ref["globals"])
    if ref["F"]:
        assert same_as_cli(res.F.ravel(), np.array(ref["F"])) and res.F.shape == exp.F.shape
        assert same_as_cli(exp.F.ravel(), np.array(ref["F"]))  # the experiment's table holds the refined F
    for sid in shots.ids:
        assert same_as_cli(np.array([res.locals[sid][p] for p in res.local_params]), np.array(ref["locals"][sid]))


def test_ensemble_em_matches_cli(cli, data):
    """F global (EM) with per-shot orientations, and the same with spot regions: the program's JSON, bit for bit,
    and its progress lines through the callback."""
    for extra in ([], ["-spots", "3"]):
        ref, r = cli_ensemble(cli, data, ["-global", "F", "-local", "rotx,roty,rotz", "-cycles", "2", *extra],
                              "em.json")
        exp = nbgrad.Experiment.from_flags(SMALL + ["-hkl", str(data / "start.hkl"), "-default_F", "0"])
        events = []
        shots = nbgrad.read_shots(data / "shots.jsonl")
        res = nbgrad.ensemble(exp, shots, data / "obs" / "{id}.img", "F", "rotx,roty,rotz", cycles=2,
                              spots=3 if extra else None, progress=lambda *a: events.append(a))
        check_same(res, ref, shots, exp)
        assert res.local_params == ["rotx", "roty", "rotz"] and res.F_measured > 30
        assert np.all(np.isnan(res.F_sigma) | (res.F_sigma > 0)) and res.evaluations > 0
        infos = [t for what, _, _, t in events if what == "info"]
        cycles = [t for what, _, _, t in events if what == "cycle"]
        assert infos and all(t in r.stdout for t in infos)
        assert [d for what, d, _, _ in events if what == "cycle"] == [0, 1, 2]
        assert all(t in r.stderr for t in cycles) and "cycle 2: loss" in cycles[-1]
        assert (res.spot_pixels > 0) == bool(extra)


def test_ensemble_bfgs_matches_cli(cli, data):
    """A cell length and F global with the least-squares loss (BFGS), scale local: the program's JSON."""
    ref, _ = cli_ensemble(cli, data, ["-global", "a,F", "-local", "rotx,roty,rotz,scale", "-cycles", "1", "-loss",
                                      "lsq"], "bfgs.json")
    exp = nbgrad.Experiment.from_flags(SMALL + ["-hkl", str(data / "start.hkl"), "-default_F", "0"])
    shots = nbgrad.read_shots(data / "shots.jsonl")
    res = nbgrad.ensemble(exp, shots, str(data / "obs" / "{id}.img"), ["a", "F"], ["rotx", "roty", "rotz", "scale"],
                          cycles=1, loss="lsq")
    check_same(res, ref, shots, exp)
    assert list(res.globals) == ["a"] and res.sigmas["a"] > 0


def test_ensemble_detector_response_matches_cli(cli, data):
    """The observed images' response given (-pedestal, -gain): the program's JSON, and not the default's; per-panel
    values on the single flat detector refused, as by the program."""
    ref, _ = cli_ensemble(cli, data, ["-global", "F", "-local", "rotx,roty,rotz", "-cycles", "1", "-pedestal", "35",
                                      "-gain", "1.25"], "resp.json")
    shots = nbgrad.read_shots(data / "shots.jsonl")
    exp = nbgrad.Experiment.from_flags(SMALL + ["-hkl", str(data / "start.hkl"), "-default_F", "0"])
    res = nbgrad.ensemble(exp, shots, data / "obs" / "{id}.img", "F", "rotx,roty,rotz", cycles=1, pedestal=35,
                          gain=1.25)
    check_same(res, ref, shots, exp)
    exp0 = nbgrad.Experiment.from_flags(SMALL + ["-hkl", str(data / "start.hkl"), "-default_F", "0"])
    res0 = nbgrad.ensemble(exp0, shots, data / "obs" / "{id}.img", "F", "rotx,roty,rotz", cycles=1)
    assert res0.start_loss != res.start_loss
    with pytest.raises(nbgrad.InvalidError, match="single flat"):
        nbgrad.ensemble(exp0, shots, data / "obs" / "{id}.img", "F", "rotx", cycles=1, panel_gain=[1, 2])


def test_ensemble_errors_are_the_programs(cli, data):
    exp = nbgrad.Experiment.from_flags(SMALL + ["-hkl", str(data / "start.hkl"), "-default_F", "0"])
    shots = nbgrad.read_shots(data / "shots.jsonl")
    for glob, loc in (("a,bogus", "rotx"), ("a", "F"), ("a", "a")):
        with pytest.raises(nbgrad.InvalidError) as e:
            nbgrad.ensemble(exp, shots, data / "obs" / "{id}.img", glob, loc, cycles=1)
        r = run(cli, ["ensemble", *SMALL, "-hkl", "start.hkl", "-default_F", "0", "-shots", "shots.jsonl",
                      "-observed", "obs/{id}.img", "-global", glob, "-local", loc], data, check=False)
        assert r.returncode != 0 and str(e.value) == cli_error(r)
    with pytest.raises(nbgrad.FileError, match="nope"):
        nbgrad.ensemble(exp, shots, data / "nope" / "{id}.img", "F", "rotx", cycles=1)
    with pytest.raises(nbgrad.InvalidError, match="-hkl"):
        nbgrad.ensemble(nbgrad.Experiment.from_flags(SMALL + ["-default_F", "100"]), shots,
                        data / "obs" / "{id}.img", "F", "rotx", cycles=1)
    with pytest.raises(ValueError, match="loss"):
        nbgrad.ensemble(exp, shots, data / "obs" / "{id}.img", "F", "rotx", loss="l2")


def test_ensemble_progress_exception_is_raised(data):
    exp = nbgrad.Experiment.from_flags(SMALL + ["-hkl", str(data / "start.hkl"), "-default_F", "0"])

    def stop(*args):
        raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        nbgrad.ensemble(exp, data / "shots.jsonl", data / "obs" / "{id}.img", "F", "", cycles=1, progress=stop)


if CLI_RTOL:  # the baseline build's last bits differ from the program's (conftest.CLI_RTOL)
    pytestmark = pytest.mark.filterwarnings("ignore")
