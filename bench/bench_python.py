#!/usr/bin/env python3
"""bench_python.py -- the Python package's call overhead, and the PyTorch adapter's cost.

    PYTHONPATH=build/py/lib python3 bench/bench_python.py [--runs 7] [--threads 0]

1. nbgrad.simulate against the library call alone on the 1024 x 1024 benchmark cases (bench/cases.h): the
   library call is timed inside the extension (_nbgrad._time_simulate: clock_gettime around nbg_simulate, into a
   reused buffer, no Python); nbgrad.simulate is timed from Python with a fresh array each call and with out=
   (a reused one).  Best and median of --runs after a warm-up; the target is an overhead within 5 %.
   build/bench/bench-forward (the C benchmark program) is run on the same case when it is built, for reference.
2. nbgrad.torch.simulate forward + backward against nbgrad.grad (the library's adjoint for the same parameters) on
   tric512 for 1, 3 and 6 parameters, float32 and float64 images, and peak memory (RSS).
3. The wheel's two builds of the library (baseline x86-64, x86-64-v3) against -march=native (bench-forward).
4. nanoBragg's PyTorch port against nbgrad from Python on the same 1024^2 command line, each a fresh process
   (wall time and peak RSS, start-up included, as a user sees them), where the port is importable.  It is not on
   PyPI: install it from a checkout of its repository (`pip install --no-deps -e .`, plus fabio and scipy).
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import nbgrad

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "cubic1k": "-cell 100 100 100 90 90 90 -default_F 100 -lambda 6.2 -N 5 -distance 100 -detpixels 1024",
    "tric1k": "-cell 70 80 90 85 95 105 -misset 10 5 3 -N 8 -lambda 1.5 -default_F 100 -distance 100 -detpixels 1024",
}


def timed(fn, runs):
    fn()  # warm-up: first-touch of memory, thread pool start
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t), statistics.median(t)


def overhead(runs, threads):
    print(f"nbgrad.simulate vs the library call (nbg_simulate), {threads or 'default'} threads, best / median of "
          f"{runs}, the three interleaved (so that the machine's drift hits them alike)")
    print(f"{'case':9} {'library s':>20} {'python s':>20} {'python out= s':>20} {'overhead':>9} {'out=':>7}")
    for name, flags in CASES.items():
        exp = nbgrad.Experiment.from_flags(flags, threads=threads)
        buf = np.empty(exp.shape, np.float32)
        lib, py, out = [], [], []
        nbgrad.simulate(exp)  # warm-up
        for _ in range(runs):
            lib += nbgrad._ext._time_simulate(exp, 1)
            t0 = time.perf_counter()
            nbgrad.simulate(exp)
            py.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            nbgrad.simulate(exp, out=buf)
            out.append(time.perf_counter() - t0)
        (lb, lm), (pb, pm), (ob, om) = ((min(x), statistics.median(x)) for x in (lib, py, out))
        print(f"{name:9} {lb:9.4f} {lm:9.4f}  {pb:9.4f} {pm:9.4f}  {ob:9.4f} {om:9.4f}  "
              f"{100 * (pb / lb - 1):+7.2f}% {100 * (ob / lb - 1):+6.2f}%")
    prog = ROOT / "build" / "bench" / "bench-forward"
    if prog.exists():
        print(f"reference: {prog.relative_to(ROOT)} cubic1k (the C benchmark program)")
        env = dict(os.environ)
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        r = subprocess.run([str(prog), "cubic1k"], stdout=subprocess.PIPE, text=True, env=env)
        print("  " + "\n  ".join(r.stdout.strip().splitlines()))


def kernels(runs):
    """The wheel's two builds of the library (python/setup.py: baseline x86-64 and x86-64-v3) against the
    -march=native library (the program's, build/bench/bench-forward) on tric1k in double: each module's library call
    timed inside the extension (_time_simulate), best of runs, interleaved; the native time from bench-forward run
    in the same process's turn.  Ratios over native (1.00 = as fast)."""
    import importlib
    import re as _re

    prog = ROOT / "build" / "bench" / "bench-forward"
    flags = CASES["tric1k"].split()
    mods = {}
    for name in ("_nbgrad_v3", "_nbgrad"):
        try:
            mods[name] = importlib.import_module("nbgrad." + name)
        except ImportError:
            pass
    if not prog.exists() or not mods:
        print("wheel kernels vs -march=native: bench-forward or the extension is missing, skipped")
        return
    best = {n: float("inf") for n in mods}
    native = float("inf")
    for _ in range(max(3, runs)):
        for n, m in mods.items():
            e = m.Experiment(flags)
            best[n] = min([best[n]] + m._time_simulate(e, 3))
        r = subprocess.run([str(prog), "tric1k"], stdout=subprocess.PIPE, text=True)
        for line in r.stdout.splitlines():
            f = line.split()
            if len(f) > 7 and f[0] == "tric1k" and f[1] == "double" and _re.match(r"^[0-9.]+$", f[6]):
                native = min(native, float(f[6]))
    label = {"_nbgrad_v3": "x86-64-v3 (AVX2, FMA)", "_nbgrad": "baseline x86-64 (SSE2)"}
    print(f"wheel kernels vs -march=native, tric1k double (native {native:.4f} s; the CPU runs "
          f"{nbgrad.KERNELS}): " + ", ".join(f"{label[n]} {best[n]:.4f} s = {best[n] / native:.2f}x" for n in mods))


def torch_cost(runs):
    """nbgrad.torch.simulate forward + backward against nbgrad.grad (the library's adjoint for the same parameters)
    on tric512: 1 and 3 scalar parameters (the forward's tangent images, no second render), 6 (the adjoint in
    backward, a second render), F (the adjoint); in float32 and float64.  The two are interleaved, best of runs.
    "render+adjoint" is what the adapter did before (nbgrad.simulate, then nbgrad.grad) for comparison."""
    try:
        import torch

        import nbgrad.torch as nbt
    except ImportError:
        print("torch adapter: torch is not importable, skipped")
        return
    exp = nbgrad.Experiment.from_flags(CASES["tric1k"].replace("1024", "512"))
    w = np.random.default_rng(0).uniform(0.5, 1.5, exp.shape).astype(np.float32)
    W = torch.from_numpy(w)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"torch adapter on tric512 (forward + backward) / nbgrad.grad, best of {runs} interleaved; "
          f"TANGENT_MAX = {nbt.TANGENT_MAX}")
    print(f"{'params':>28} {'grad s':>8} {'float32':>8} {'float64':>8} {'render+adjoint':>15}")
    for params in (["a"], ["a", "b", "c"], ["a", "b", "c", "rotx", "roty", "rotz"]):
        times = {"grad": [], torch.float32: [], torch.float64: [], "old": []}

        def through_torch(dt):
            ts = {p: torch.tensor(exp.get_param(p), dtype=dt, requires_grad=True) for p in params}
            (nbt.simulate(exp, ts) * W).sum().backward()

        def old():
            nbgrad.simulate(exp)
            nbgrad.grad(exp, w, params)

        jobs = {"grad": lambda: nbgrad.grad(exp, w, params), torch.float32: lambda: through_torch(torch.float32),
                torch.float64: lambda: through_torch(torch.float64), "old": old}
        for fn in jobs.values():
            fn()  # warm-up
        for _ in range(runs):
            for key, fn in jobs.items():
                t0 = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t0)
        b = {k: min(v) for k, v in times.items()}
        print(f"{','.join(params):>28} {b['grad']:8.4f} {b[torch.float32] / b['grad']:7.2f}x "
              f"{b[torch.float64] / b['grad']:7.2f}x {b['old'] / b['grad']:14.2f}x")
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak RSS {rss1 / 1024:.0f} MiB (grew {(rss1 - rss0) / 1024:.0f} MiB during the torch runs)")
    port_compare()


def port_compare():
    """nanoBragg's PyTorch port against nbgrad's Python call, on the same command line, each in a fresh process
    (wall time and peak RSS of the whole process, so the port's start-up is in its number as a user sees it).
    The port is not on PyPI; where it is importable (installed from its repository: pip install -e), it runs."""
    import importlib.util
    import subprocess
    import tempfile
    if importlib.util.find_spec("nanobrag_torch") is None:
        print("nanoBragg's PyTorch port: not importable (not on PyPI; pip install -e a checkout of it), not compared")
        return
    flags = ("-cell 70 80 90 85 95 105 -misset 10 5 3 -N 8 -lambda 1.5 -default_F 100 -distance 100 "
             "-detpixels 1024 -oversample 1")
    with tempfile.TemporaryDirectory() as d:
        runs = {
            "PyTorch port (python -m nanobrag_torch)": [sys.executable, "-m", "nanobrag_torch"] + flags.split() +
            ["-floatfile", os.path.join(d, "port.bin")],
            "nbgrad (python, nbgrad.simulate)": [sys.executable, "-c",
                                                 "import nbgrad, numpy; e = nbgrad.Experiment.from_flags(%r); "
                                                 "nbgrad.simulate(e).tofile(%r)" % (flags, os.path.join(d, "nb.bin"))],
        }
        res = {}
        env = dict(os.environ)
        # the nbgrad this script imported, whatever the working directory
        here = os.path.dirname(os.path.dirname(os.path.abspath(nbgrad.__file__)))
        env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
        for name, cmd in runs.items():
            t0 = time.perf_counter()
            p = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, capture_output=True, text=True, cwd=d, env=env)
            wall = time.perf_counter() - t0
            rss = p.stderr.strip().splitlines()[-1] if p.returncode == 0 and p.stderr.strip() else "?"
            res[name] = (wall, rss, p.returncode)
        import numpy as np
        sums = [float(np.fromfile(os.path.join(d, f), dtype=np.float32).sum()) if os.path.exists(os.path.join(d, f))
                else float("nan") for f in ("port.bin", "nb.bin")]
    print("1024^2 triclinic forward, one process each (wall s, peak RSS KiB, image sum):")
    for (name, (wall, rss, rc)), s in zip(res.items(), sums):
        print(f"  {name}: {wall:.2f} s, {rss} KiB, sum {s:.7g}{'' if rc == 0 else f' (exit {rc})'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    overhead(a.runs, a.threads)
    kernels(a.runs)
    if not a.no_torch:
        torch_cost(max(5, a.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
