#!/usr/bin/python3
"""Structure factors from DIALS (issue 27 item 5): nbgrad's -hkl on DIALS's own MTZ and reflection tables, against
what DIALS's python (cctbx, iotbx.mtz, flex) reads from the same files.

A real still (the thaumatin grid scan's first Pilatus 6M image, ../shared/data/real) is imported as a one-image
sequence of 0.05 deg (DIALS's stills indexer needs a module Debian's dials lacks: see stills.py), its spots found,
indexed against the known cell and space group (P 41 21 2), integrated (dials.integrate) and exported
(dials.export format=mtz: an unmerged MTZ with batches; partiality_threshold=0 and intensity=sum, as a 0.05-deg still
has no full reflection and no profile-fitted intensity).  Then:

  mtz-table      nbgrad -hkl integrated.mtz (column I, type J) writes its table as an Fdump cache; every entry equals
                 the expansion cctbx makes of iotbx.mtz's rows (the space group's sym_equiv_indices and their Friedel
                 mates, F = sqrt(max(I, 0)), a repeated index averaged), and no other entry is set
  mtz-said       the program says which column, what type and which space group it used
  refl-table     nbgrad -hkl integrated.refl against flex's columns (miller_index, intensity.sum.value: the table has
                 intensity.prf.value but no row flagged integrated_prf), no symmetry; and indexed.refl (unindexed
                 rows 0 0 0 left out)
  refine         nbgrad refine from DIALS's indexed.expt on the still's spot regions (indexed.refl), fitting the scale:
                 with -hkl integrated.refl the least-squares loss ends below the one with a constant F (measured:
                 6.59e6 against 7.42e6)

    /usr/bin/python3 tests/dials/hklmtz.py NBGRAD_BINARY WORKDIR
"""
import bz2
import math
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roundtrip  # noqa: E402  (its counters: roundtrip.PASSED, roundtrip.FAILED)
from roundtrip import check, run, tail  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGE = os.path.join(HERE, "..", "..", "..", "shared", "data", "real", "thaumatin_grid", "thau_3_2_0001.cbf.bz2")


def fdump(path):
    """nbgrad's Fdump cache as {(h, k, l): F} of its non-zero entries, and its bounds."""
    with open(path, "rb") as f:
        raw = f.read()
    nl_at = raw.index(b"\n")
    lo_h, hi_h, lo_k, hi_k, lo_l, hi_l = (int(x) for x in raw[:nl_at].split())
    assert raw[nl_at + 1:nl_at + 2] == b"\f"
    nh, nk, nl = hi_h - lo_h + 1, hi_k - lo_k + 1, hi_l - lo_l + 1
    a = np.frombuffer(raw[nl_at + 2:], dtype="<f8").reshape(nh + 1, nk + 1, nl + 1)[:nh, :nk, :nl]
    out = {}
    for i, j, k in zip(*np.nonzero(a)):
        out[(int(i) + lo_h, int(j) + lo_k, int(k) + lo_l)] = float(a[i, j, k])
    return out


def table_of(nbgrad, work, hkl, tag, extra=()):
    """Runs nbgrad -hkl hkl on a 4-pixel image to make it write its table (the Fdump cache); the table and the log."""
    dump = os.path.join(work, tag + ".Fdump")
    cmd = [nbgrad, "-hkl", hkl, "-dump", dump, "-cell", "58", "58", "150", "90", "90", "90", "-N", "1",
           "-detpixels", "4", "-floatfile", os.path.join(work, tag + ".bin")] + list(extra)
    rc, t = run(cmd, work, tag + ".log")
    log = open(os.path.join(work, tag + ".log")).read()
    return (fdump(dump) if rc == 0 and os.path.exists(dump) else None), log, t


def compare(name, got, expected, what):
    """got and expected {hkl: F}: the same non-zero entries and values."""
    if got is None:
        return check(False, name, what + ": nbgrad wrote no table")
    exp = {k: v for k, v in expected.items() if v != 0}
    missing = [k for k in exp if k not in got]
    extra = [k for k in got if k not in exp]
    worst = max((abs(got[k] - v) / max(abs(v), 1e-300) for k, v in exp.items() if k in got), default=0.0)
    return check(not missing and not extra and worst <= 1e-12, name,
                 "%s: %d non-zero entries expected, nbgrad's table has %d; %d missing, %d extra, largest relative "
                 "difference %.3g%s" % (what, len(exp), len(got), len(missing), len(extra), worst,
                                        (" (first missing %s)" % (missing[0],)) if missing else ""))


def mean_F(rows):
    """{hkl: mean F} of (hkl, F) pairs, summed in their order."""
    sums, counts = {}, {}
    for h, f in rows:
        sums[h] = sums.get(h, 0.0) + f
        counts[h] = counts.get(h, 0) + 1
    return {h: sums[h] / counts[h] for h in sums}


def main(argv):
    nbgrad, work = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if not os.path.exists(IMAGE):
        check(False, "data", "%s is missing" % IMAGE)
        return
    with bz2.open(IMAGE) as f, open(os.path.join(work, "thau_3_2_0001.cbf"), "wb") as g:
        g.write(f.read())
    t0 = time.time()
    steps = [
        ["dials.import", "thau_3_2_0001.cbf", "geometry.scan.oscillation=0,0.05", "convert_stills_to_sequences=True"],
        ["dials.find_spots", "imported.expt", "nproc=2"],
        ["dials.index", "imported.expt", "strong.refl", "known_symmetry.space_group=P41212",
         "known_symmetry.unit_cell=57.8,57.8,150,90,90,90", "indexing.method=real_space_grid_search",
         "refinement_protocol.n_macro_cycles=1", "detector.fix=all", "beam.fix=all"],
        ["dials.integrate", "indexed.expt", "indexed.refl", "nproc=2"],
        ["dials.export", "integrated.expt", "integrated.refl", "format=mtz", "partiality_threshold=0",
         "intensity=sum"],
    ]
    for cmd in steps:
        rc, _ = run(cmd, work, cmd[0] + ".out")
        if rc != 0:
            check(False, "dials", "%s failed (exit %d):\n%s" % (" ".join(cmd), rc, tail(os.path.join(work, cmd[0] + ".out"))))
            return
    check(True, "dials", "import, find_spots, index, integrate, export of the still: %.0f s" % (time.time() - t0))

    # --- the MTZ, as DIALS's python reads it ---
    import iotbx.mtz
    from cctbx import miller
    from dials.array_family import flex

    mtz = iotbx.mtz.object(os.path.join(work, "integrated.mtz"))
    sg = mtz.space_group()
    cols = {c.label(): c for c in mtz.columns()}
    H, K, L = (cols[x].extract_values().as_numpy_array() for x in "HKL")
    intensity = cols["I"].extract_values().as_numpy_array()
    valid = cols["I"].selection_valid().as_numpy_array()
    rows = []
    for h, k, l, i, ok in zip(H, K, L, intensity, valid):
        if not ok:
            continue
        F = math.sqrt(max(float(i), 0.0))
        images = set()
        for e in miller.sym_equiv_indices(sg, (int(h), int(k), int(l))).indices():
            x = e.h()
            images.add(tuple(x))
            images.add((-x[0], -x[1], -x[2]))
        rows += [(x, F) for x in sorted(images)]
    expected = mean_F(rows)
    got, log, t = table_of(nbgrad, work, "integrated.mtz", "mtz")
    compare("mtz-table", got, expected, "integrated.mtz (%d rows, %s, %d operations) in %.2f s" %
            (len(H), sg.type().lookup_symbol(), sg.order_z(), t))
    m = re.search(r"-hkl integrated.mtz: (.*)", log)
    check(m is not None and "column I (type J" in m.group(1) and "P 41 21 2" in m.group(1), "mtz-said",
          m.group(1) if m else log[-500:])

    # --- the reflection tables ---
    for name in ("integrated.refl", "indexed.refl"):
        t_ = flex.reflection_table.from_file(os.path.join(work, name))
        mi = list(t_["miller_index"])
        isum = list(t_["intensity.sum.value"])
        prf_set = t_.get_flags(t_.flags.integrated_prf) if "intensity.prf.value" in t_ else None
        prf = list(t_["intensity.prf.value"]) if prf_set is not None else None
        ids = list(t_["id"])
        pairs = []
        for r, (h, s) in enumerate(zip(mi, isum)):
            if tuple(h) == (0, 0, 0) or ids[r] < 0:
                continue
            i = prf[r] if prf_set is not None and prf_set[r] and math.isfinite(prf[r]) else s
            if not math.isfinite(i):
                continue
            pairs.append((tuple(h), math.sqrt(max(i, 0.0))))
        got, log, t = table_of(nbgrad, work, name, name.split(".")[0])
        compare("refl-table-" + name.split(".")[0], got, mean_F(pairs),
                "%s (%d rows, %d indexed with an intensity) in %.2f s" % (name, len(mi), len(pairs), t))

    # --- refine with the table ---
    base = [nbgrad, "refine", "-expt", "indexed.expt", "-observed", "thau_3_2_0001.cbf", "-spotlist", "indexed.refl",
            "-params", "scale", "-maxiter", "5", "-nodump"]
    losses = {}
    for tag, extra in (("table", ["-hkl", "integrated.refl"]), ("constant", ["-default_F", "1"])):
        rc, t = run(base + extra, work, "refine-%s.log" % tag)
        log = open(os.path.join(work, "refine-%s.log" % tag)).read()
        m = re.search(r"loss ([0-9.e+-]+) -> ([0-9.e+-]+)", log)
        losses[tag] = float(m.group(2)) if m and rc in (0, 2, 3, 4) else float("inf")
        print("refine %s: exit %d, %.1f s, final loss %g" % (tag, rc, t, losses[tag]), flush=True)
    check(losses["table"] < losses["constant"], "refine",
          "refine -params scale on the still's spot regions: final loss %.4g with -hkl integrated.refl, %.4g with a "
          "constant F" % (losses["table"], losses["constant"]))


if __name__ == "__main__":
    roundtrip.run_script(main, sys.argv)
