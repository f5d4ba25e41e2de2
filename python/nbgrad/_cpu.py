"""Which build of the extension this CPU runs (python/setup.py builds two on x86-64).

    _nbgrad_v3  the library compiled for x86-64-v3 (AVX, AVX2, BMI1, BMI2, F16C, FMA, LZCNT, MOVBE, XSAVE):
                CPUs since Intel Haswell (2013) and AMD Excavator (2015);
    _nbgrad     the baseline x86-64 build (SSE2): any x86-64.

NBGRAD_KERNELS=baseline or v3 forces one.  The choice is in nbgrad.KERNELS.
"""
import importlib
import os

V3_FLAGS = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}


def cpu_flags():
    """The CPU's feature flags as Linux lists them (an empty set elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def load(package):
    """(the extension module, "v3" or "baseline")."""
    want = os.environ.get("NBGRAD_KERNELS", "")
    if want not in ("", "v3", "baseline"):
        raise ImportError(f"NBGRAD_KERNELS={want!r}: expected 'v3' or 'baseline'")
    if want == "v3" or (want == "" and V3_FLAGS <= cpu_flags()):
        try:
            return importlib.import_module(package + "._nbgrad_v3"), "v3"
        except ImportError:
            if want == "v3":
                raise
    return importlib.import_module(package + "._nbgrad"), "baseline"
