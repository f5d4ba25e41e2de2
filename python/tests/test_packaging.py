"""The package as built for any x86-64: the baseline extension holds no AVX instruction, the x86-64-v3 one no
AVX-512, the CPU check picks the one this machine runs, py.typed ships."""
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import nbgrad
from nbgrad import _cpu

X86 = platform.machine().lower() in ("x86_64", "amd64")


def _module_file(name):
    d = Path(nbgrad.__file__).parent
    found = sorted(d.glob(name + ".*.so")) + sorted(d.glob(name + ".so"))
    if not found:
        pytest.skip(f"{name} is not built here")
    return found[0]


def _disassembly(path):
    if shutil.which("objdump") is None:
        pytest.skip("objdump is not installed")
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], stdout=subprocess.PIPE, text=True,
                          check=True).stdout


# AVX-512: its registers (zmm, the upper 16 vector registers, the mask registers) and EVEX-only operations
AVX512 = re.compile(r"%zmm|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|%k[0-7]\b|\{1to|vpternlog|vpermt2|vrndscale|vscalef|"
                    r"vgetexp|vfixupimm|vcvt\w*qq")
AVX = re.compile(r"%ymm|\bv(add|mul|sub|div|fmadd|fnmadd|fmsub|broadcast|perm|movap|movup|xorp|andp|cmp)\w*\s")


@pytest.mark.skipif(not X86, reason="x86-64 only")
def test_baseline_has_no_avx():
    text = _disassembly(_module_file("_nbgrad"))
    bad = [ln for ln in text.splitlines() if AVX.search(ln) or AVX512.search(ln)]
    assert not bad, f"{len(bad)} AVX instructions in the baseline build, e.g. {bad[:3]}"


@pytest.mark.skipif(not X86, reason="x86-64 only")
def test_v3_has_no_avx512():
    text = _disassembly(_module_file("_nbgrad_v3"))
    bad = [ln for ln in text.splitlines() if AVX512.search(ln)]
    assert not bad, f"{len(bad)} AVX-512 instructions in the x86-64-v3 build, e.g. {bad[:3]}"
    assert AVX.search(text)  # it is the AVX2 build


def test_kernels_choice():
    want = os.environ.get("NBGRAD_KERNELS") or ("v3" if X86 and _cpu.V3_FLAGS <= _cpu.cpu_flags() else "baseline")
    assert nbgrad.KERNELS == want
    assert nbgrad._ext.__name__ == "nbgrad._nbgrad" + ("_v3" if want == "v3" else "")


def test_py_typed_ships():
    assert (Path(nbgrad.__file__).parent / "py.typed").exists()


def test_importing_the_other_build_changes_nothing():
    # importing the baseline submodule rebinds nbgrad._nbgrad; the package keeps using the build it chose (_ext)
    import importlib

    importlib.import_module("nbgrad._nbgrad")
    exp = nbgrad.Experiment(cell=(70, 70, 70, 90, 90, 90), default_F=10, detpixels=16, N=2)
    assert nbgrad.simulate(exp).shape == (16, 16)
