"""Builds nbgrad._nbgrad against the repository's static library.

The extension binds include/nbgrad.h alone (the experiment builder included: nbg_builder parses the command line's
flags and reads the files they name).  The library is built by the repository's Makefile into its own build directory (build/py by default, NBGRAD_BUILD
to change it) with CUDA off: the CUDA objects are not position-independent and the extension has no use for them
on a machine without a GPU.  The link flags are the Makefile's own (make print-ldlibs), so that the extension
links exactly what the program does (OpenMP, GSL, LAPACKE, HDF5, CBFlib, jansson, as configured).
"""
import os
import shlex
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
B = os.environ.get("NBGRAD_BUILD", "build/py")


def make(*targets, capture=False):
    cmd = ["make", "--no-print-directory", "-C", str(ROOT), f"B={B}", "CUDA=0", *targets]
    if capture:
        return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    jobs = f"-j{os.cpu_count() or 1}"
    subprocess.run(cmd[:1] + [jobs] + cmd[1:], check=True)
    return ""


class BuildWithLibrary(build_ext):
    def build_extensions(self):
        import numpy

        make(f"{B}/libnbgrad.a")
        ldlibs = shlex.split(make("-s", "print-ldlibs", capture=True).strip().splitlines()[-1])
        for ext in self.extensions:
            ext.include_dirs += [numpy.get_include()]
            ext.extra_objects = [str(ROOT / B / "libnbgrad.a")]
            # relinked whenever the library changes (setuptools compares the sources and depends only)
            ext.depends += ext.extra_objects
            ext.extra_link_args = ldlibs
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "nbgrad._nbgrad",
            sources=["src/_nbgrad.c"],
            include_dirs=[str(ROOT / "include")],
            extra_compile_args=["-std=gnu11", "-fopenmp", "-Wall", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildWithLibrary},
)
