"""Shared pieces of the Python tests: a small experiment (96 x 96 pixels of 0.5 mm, so that a few hundred
reflections land on it and every test runs in well under a second), an HKL file, the command-line program."""
import os
import sys
from pathlib import Path

# pytest run from python/ (python -m pytest puts the working directory first on sys.path): the source tree's
# nbgrad/ has no compiled extension and must not shadow the built or installed package
_SRC = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _SRC]

import numpy as np
import pytest

import nbgrad

ROOT = Path(__file__).resolve().parents[2]
NBG_BIN = Path(os.environ.get("NBG_BIN") or ROOT / "build" / "nbgrad")

# The program (make's -march=native build) and the extension's library give the same bits when they are compiled
# alike: the x86-64-v3 build does on the machines the tests run on; the baseline x86-64 one (a CPU without AVX2,
# or NBGRAD_KERNELS=baseline) contracts no multiply-add into an FMA, and its gradients then differ in the last
# bits (about 1e-12 relative).  Comparisons with the program allow that much there, nothing elsewhere.
CLI_RTOL = 1e-9 if nbgrad.KERNELS == "baseline" else 0.0


def same_as_cli(got, want):
    """got == want, bit for bit, or within CLI_RTOL for the baseline build (scalars, arrays or dicts of them)."""
    if isinstance(want, dict):
        return set(got) == set(want) and all(same_as_cli(got[k], want[k]) for k in want)
    if CLI_RTOL == 0:
        return bool(np.array_equal(np.asarray(got), np.asarray(want)))
    return bool(np.allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=CLI_RTOL, atol=0))


BASE = dict(cell=(70, 80, 90, 75, 85, 95), misset=(10, 5, 3), N=5, wavelength=1.0, distance=100, detpixels=96,
            pixel=0.5, oversample=2)


def base_flags():
    return nbgrad.kwargs_to_flags(**BASE)


@pytest.fixture
def exp():
    return nbgrad.Experiment(default_F=100, **BASE)


@pytest.fixture(scope="session")
def hkl_file(tmp_path_factory):
    """A P1 table over -12..12 with F from a fixed seed, so that F gradients differ between entries."""
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("hkl") / "P1.hkl"
    with open(path, "w") as f:
        f.write("# test table\n")
        for h in range(-12, 13):
            for k in range(-12, 13):
                for l in range(-12, 13):
                    f.write(f"{h} {k} {l} {rng.uniform(50, 150):.2f}\n")
    return path


@pytest.fixture
def exp_hkl(hkl_file):
    return nbgrad.Experiment(hkl=str(hkl_file), default_F=10, **BASE)


@pytest.fixture
def cli():
    if not NBG_BIN.exists():
        pytest.skip(f"{NBG_BIN} is not built (make build/nbgrad)")
    return str(NBG_BIN)
