"""Builds nbgrad's extension against the repository's static library, for any x86-64.

The extension binds include/nbgrad.h alone (the experiment builder included: nbg_builder parses the command line's
flags and reads the files they name).  The library is built by the repository's Makefile (CUDA off: the CUDA objects are not position-independent and the
extension has no use for them on a machine without a GPU) twice, and the extension against each:
  nbgrad._nbgrad     OPT = NBGRAD_OPT (default "-O3": the baseline x86-64 the compiler targets, SSE2), in
                     NBGRAD_BUILD (default build/py);
  nbgrad._nbgrad_v3  OPT = NBGRAD_OPT_V3 (default "-O3 -march=x86-64-v3": AVX2, FMA, BMI2 ... Haswell and
                     Excavator on), in NBGRAD_BUILD + "-v3".
nbgrad/_cpu.py imports the second where the CPU has x86-64-v3's features, the first elsewhere (NBGRAD_KERNELS=
baseline or v3 forces one), so the wheel runs on any x86-64 and at near -march=native speed on the CPUs of the
last decade (make bench prints both against -march=native).  NBGRAD_V3=0 builds the baseline alone (on other
architectures it is always alone, with OPT = -O3).  The link flags are the Makefile's own (make print-ldlibs).

An sdist (python -m build --sdist python, or setup.py sdist) carries a copy of the library's sources as _lib/ and
builds from it when there is no repository around it: it needs make, a C compiler with OpenMP, and the
libraries the Makefile finds (GSL, LAPACKE; HDF5, CBFlib, jansson optional).
"""
import os
import platform
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
# the library's sources: the repository around python/, or in an sdist the copy it carries (_lib, see Sdist)
ROOT = HERE.parent if (HERE.parent / "Makefile").exists() and (HERE.parent / "include" / "nbgrad.h").exists() \
    else HERE / "_lib"
# what of the repository an sdist carries to build the library from its own copy
LIB_PARTS = ("Makefile", "include", "src", "grad", "cuda", "LICENSE")
B = os.environ.get("NBGRAD_BUILD", "build/py")
X86 = platform.machine().lower() in ("x86_64", "amd64")
OPT = os.environ.get("NBGRAD_OPT", "-O3")
OPT_V3 = os.environ.get("NBGRAD_OPT_V3", "-O3 -march=x86-64-v3")
V3 = X86 and os.environ.get("NBGRAD_V3", "1") != "0"


def make(build, opt, *targets, capture=False):
    cmd = ["make", "--no-print-directory", "-C", str(ROOT), f"B={build}", f"OPT={opt}", "CUDA=0", "FORMATS_DL=0", *targets]
    if capture:
        return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    jobs = f"-j{os.cpu_count() or 1}"
    subprocess.run(cmd[:1] + [jobs] + cmd[1:], check=True)
    return ""


def library(build, opt):
    """Builds the library into build with opt; a build directory compiled with other flags is emptied first (make
    does not track flags)."""
    d = ROOT / build
    stamp = d / ".opt"
    if stamp.exists() and stamp.read_text() != opt or not stamp.exists() and (d / "libnbgrad.a").exists():
        for sub in ("src", "grad", "libnbgrad.a"):
            p = d / sub
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    make(build, opt, f"{build}/libnbgrad.a")
    d.mkdir(parents=True, exist_ok=True)
    stamp.write_text(opt)
    return [str(d / "libnbgrad.a")]


class BuildWithLibrary(build_ext):
    def build_extensions(self):
        import numpy

        libs = {"nbgrad._nbgrad": library(B, OPT)}
        if V3:
            libs["nbgrad._nbgrad_v3"] = library(B + "-v3", OPT_V3)
        else:
            self.extensions = [x for x in self.extensions if x.name in libs]
        ldlibs = shlex.split(make(B, OPT, "-s", "print-ldlibs", capture=True).strip().splitlines()[-1])
        for ext in self.extensions:
            ext.include_dirs += [numpy.get_include()]
            ext.extra_objects = libs[ext.name]
            # relinked whenever the library changes (setuptools compares the sources and depends only)
            ext.depends += ext.extra_objects
            ext.extra_link_args = ldlibs
        super().build_extensions()


class Sdist(sdist):
    """An sdist that builds from its own sources: the library's (the Makefile, include/, src/, grad/, cuda/) are
    copied into it as _lib/, where setup.py finds them when there is no repository around it."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dest = Path(base_dir) / "_lib"
        if (ROOT / "LICENSE").exists():
            shutil.copy2(ROOT / "LICENSE", Path(base_dir) / "LICENSE")  # the sdist's own copy of the license
        for part in LIB_PARTS:
            src = ROOT / part
            if src.is_dir():
                shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("*.o", "*.d", "*.a", "*.so*"))
            else:
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / part)


def extension(name, march=()):
    return Extension(
        f"nbgrad.{name}",
        sources=["src/_nbgrad.c"],
        include_dirs=[str(ROOT / d) for d in ("include", "src", "grad")],
        define_macros=[("NBG_PY_MODULE", name)],
        extra_compile_args=["-std=gnu11", "-fopenmp", "-Wall", "-Wno-unused-parameter", *march],
    )


setup(
    ext_modules=[extension("_nbgrad")] + ([extension("_nbgrad_v3", ["-march=x86-64-v3"])] if V3 else []),
    cmdclass={"build_ext": BuildWithLibrary, "sdist": Sdist},
)
