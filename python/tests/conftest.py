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
