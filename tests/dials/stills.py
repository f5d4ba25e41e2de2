#!/usr/bin/python3
"""Stills from DIALS with their spectra (issue 30 item 3): nbgrad simulates noisy stills of one crystal form (P222,
40 x 50 x 60 A, a Gaussian lattice factor of 10 cells) in random orientations on a 384^2 detector, each with its own
XFEL-like spectrum (five lines at a Gaussian's quantiles, 0.25 % rms wide, the centre moved by 0.1 to 0.3 % per
shot), written as CBF; DIALS indexes every still on its own against the known cell; nbgrad ensemble starts from
DIALS's per-still experiment lists (one .expt per still: its crystal, beam, detector) with the nominal, unshifted
spectrum and a table 25 % off, and refines F globally (EM) and each shot's orientation, spectrum shift and scale on
spot regions (two cycles; measured here: one cycle 30 s, three 80 s, on a busy machine).

DIALS's stills indexer (dials.stills_process, dials.index stills.indexer=stills) fails on Debian's dials: its
candidate refinement imports xfel_mono_sim_ext, which the package lacks (measured: every still "Couldn't index ...
No module named 'xfel_mono_sim_ext'").  So each still is imported as a one-image sequence of 0.05 deg
(convert_stills_to_sequences) and indexed by the rotation indexer (real-space grid search against the known cell,
one macro cycle, the detector and beam as imported: refining them on one still made the cell blow up on 3 of 30,
"Unrealistic unit cell volume increase"): one indexed experiment per still, DIALS's model of it.  The calls run inside one Python process
(no start-up per call), the stills split over two processes.

The cell: a still's cell and its wavelength are nearly degenerate (Bragg's law sees lambda / d), so the shots keep
the crystal form's cell (the one DIALS was given) and refine the spectrum's shift; DIALS's per-still cells are
reported against the truth.

Checks (thresholds from the measured values with margin, in the comments at each check), and a table.

    /usr/bin/python3 tests/dials/stills.py NBGRAD_BINARY WORKDIR
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roundtrip  # noqa: E402  (its counters: roundtrip.PASSED, roundtrip.FAILED)
from roundtrip import check, load_expt, match_crystal, run, tail  # noqa: E402

CELL = (40.0, 50.0, 60.0, 90.0, 90.0, 90.0)
NSHOTS = 24
LAMBDA = 1.0
SIGMA = 0.0025                       # the spectrum's rms width, relative
ZQ = (-1.28, -0.52, 0.0, 0.52, 1.28)  # five lines at a Gaussian's quantiles (equal weights: nanoBragg's sources)


def spectrum(path, direction, shift=0.0):
    """A source file: the five lines, from 10 m up-beam along direction (sample to source), moved by shift (A)."""
    with open(path, "w") as f:
        for z in ZQ:
            lam = LAMBDA * (1 + SIGMA * z) + shift
            f.write("%.12g %.12g %.12g 1 %.12e\n" % (10 * direction[0], 10 * direction[1], 10 * direction[2],
                                                      lam * 1e-10))


def worker(ids, work):
    """DIALS on the stills ids, each in its own folder, in this process (its modules loaded once)."""
    from dials.command_line import dials_import, find_spots, index
    cell = ",".join("%g" % x for x in CELL)
    for sid in ids:
        d = os.path.join(work, "dials", sid)
        os.makedirs(d, exist_ok=True)
        os.chdir(d)
        t0 = time.time()
        try:
            dials_import.run([os.path.join(work, "obs", sid + ".cbf"), "geometry.scan.oscillation=0,0.05",
                              "convert_stills_to_sequences=True"])
            find_spots.run(["imported.expt", "spotfinder.filter.min_spot_size=2"])
            index.run(["imported.expt", "strong.refl", "known_symmetry.unit_cell=" + cell,
                       "known_symmetry.space_group=P222", "indexing.method=real_space_grid_search",
                       "refinement_protocol.n_macro_cycles=1", "detector.fix=all", "beam.fix=all"])
        except (Exception, SystemExit) as e:  # a still DIALS cannot index is counted, not fatal
            print("%s: %s" % (sid, e), flush=True)
        print("%s %.1f s %s" % (sid, time.time() - t0, os.path.exists("indexed.expt")), flush=True)


def crystal_errors(truth, model):
    """Orientation (deg) and cell (max relative length error) of model against truth (dxtbx crystals)."""
    m = match_crystal(truth, model)
    return (m["rot_deg"], m["len_err"]) if m is not None else (float("nan"), float("nan"))


def main(argv):
    if len(argv) >= 3 and argv[0] == "--worker":
        worker(argv[2].split(","), argv[1])
        return 0
    if len(argv) < 2:
        print(__doc__)
        return 2
    nbgrad = os.path.abspath(argv[0])
    work = os.path.abspath(argv[1])
    for d in ("truth", "obs", "dials", "spec", "refined"):
        os.makedirs(os.path.join(work, d), exist_ok=True)
    t_all = time.time()
    rng = np.random.default_rng(30)
    # the truth's table: mmm-symmetric (DIALS may pick any of P222's equivalent settings per still), F 50..150, to
    # the detector's corners (2.3 A); the start's: to 3 A (the detector's edges; a table's cost in the ensemble goes
    # with its box), the truth's F off by 25 % rms (a related structure's, say)
    hmax = [int(CELL[i] / 2.3) + 1 for i in range(3)]
    smax = [int(CELL[i] / 3.0) for i in range(3)]
    Fsym, Fstart = {}, {}
    with open(os.path.join(work, "truth.hkl"), "w") as t, open(os.path.join(work, "start.hkl"), "w") as s:
        for h in range(-hmax[0], hmax[0] + 1):
            for k in range(-hmax[1], hmax[1] + 1):
                for l in range(-hmax[2], hmax[2] + 1):
                    key = (abs(h), abs(k), abs(l))
                    if key not in Fsym:
                        Fsym[key] = 50 + 100 * rng.random()
                    t.write("%d %d %d %.4f\n" % (h, k, l, Fsym[key]))
                    if abs(h) <= smax[0] and abs(k) <= smax[1] and abs(l) <= smax[2]:
                        Fstart[(h, k, l)] = Fsym[key] * max(0.2, 1 + 0.25 * rng.standard_normal())
                        s.write("%d %d %d %.4f\n" % (h, k, l, Fstart[(h, k, l)]))
    crystal = ["-cell"] + ["%g" % x for x in CELL] + ["-N", "10", "-gauss_xtal", "-oversample", "1"]
    det = ["-dials", "-detpixels", "384", "-pixel", "0.1", "-close_distance", "60", "-lambda", "%g" % LAMBDA]
    rc, t_sim = run([nbgrad, "shots", "-n", str(NSHOTS), "-seed", "30", "-o", "shots.jsonl"], work, "shots.log")
    rc2, t2 = run([nbgrad, "batch"] + crystal + det + ["-default_F", "100", "-shots", "shots.jsonl", "-exptfile",
                                                       "truth/{id}.expt"], work, "truth.log")
    ids = [json.loads(line)["id"] for line in open(os.path.join(work, "shots.jsonl"))]
    # each shot's spectrum moved by 0.1 to 0.3 % (either way), through the shot's "spectrum_shift"
    rs = np.random.default_rng(31)
    shift = {sid: float(rs.choice([-1, 1]) * rs.uniform(0.001, 0.003) * LAMBDA) for sid in ids}
    truth = {sid: load_expt(os.path.join(work, "truth", sid + ".expt")) for sid in ids} if rc2 == 0 else {}
    with open(os.path.join(work, "truth.jsonl"), "w") as f:
        for sid in ids:
            direction = truth[sid][0].beam.get_sample_to_source_direction() if truth else (0, 0, 1)
            spectrum(os.path.join(work, "spec", sid + "_nominal.txt"), direction)
            f.write(json.dumps({"id": sid, "expt": "truth/%s.expt" % sid, "sourcefile": "spec/%s_nominal.txt" % sid,
                                "spectrum_shift": shift[sid]}) + "\n")
    rc3, t3 = run([nbgrad, "batch"] + crystal + ["-hkl", "truth.hkl", "-shots", "truth.jsonl", "-cbffile",
                                                 "obs/{id}.cbf", "-data", "noise", "-seed", "3", "-nodump"],
                  work, "simulate.log")
    if not check(rc == 0 and rc2 == 0 and rc3 == 0, "stills-simulate", "nbgrad wrote %d noisy stills (CBF) from "
                 "their true .expt with shifted spectra (%.1f s)" % (NSHOTS, t_sim + t2 + t3)):
        print(tail(os.path.join(work, "simulate.log")))
        print("%d passed, %d failed" % (roundtrip.PASSED, roundtrip.FAILED))
        return 1

    # DIALS: every still indexed on its own, the stills split over two processes
    t0 = time.time()
    procs = []
    todo = [sid for sid in ids if not os.path.exists(os.path.join(work, "dials", sid, "indexed.expt"))]
    for k in range(2 if todo else 0):  # (a rerun into the same folder keeps what DIALS indexed)
        part = todo[k::2]
        log = open(os.path.join(work, "dials", "worker%d.log" % k), "w")
        procs.append((subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", work, ",".join(part)],
                                       stdout=log, stderr=subprocess.STDOUT, cwd=work), log))
    for p, log in procs:
        p.wait()
        log.close()
    t_dials = time.time() - t0
    indexed = [sid for sid in ids if os.path.exists(os.path.join(work, "dials", sid, "indexed.expt"))]
    # measured: 24 of 24 indexed; at least 80 % required
    if not check(len(indexed) >= 0.8 * NSHOTS, "stills-dials-index", "DIALS indexed %d of %d stills, one experiment "
                 "each (%.0f s)" % (len(indexed), NSHOTS, t_dials)):
        print(tail(os.path.join(work, "dials", "worker0.log")))
        print("%d passed, %d failed" % (roundtrip.PASSED, roundtrip.FAILED))
        return 1
    dials_model = {sid: load_expt(os.path.join(work, "dials", sid, "indexed.expt")) for sid in indexed}
    one = all(len(dials_model[sid]) == 1 for sid in indexed)
    check(one, "stills-dials-one", "every indexed still's list holds one experiment")

    # the shot list from DIALS's lists: each still's crystal, beam and detector, the nominal spectrum (sources along
    # DIALS's beam), the crystal form's cell
    with open(os.path.join(work, "start.jsonl"), "w") as f:
        for sid in indexed:
            direction = dials_model[sid][0].beam.get_sample_to_source_direction()
            spectrum(os.path.join(work, "spec", sid + "_start.txt"), direction)
            f.write(json.dumps({"id": sid, "expt": "dials/%s/indexed.expt" % sid,
                                "sourcefile": "spec/%s_start.txt" % sid, "cell": list(CELL)}) + "\n")
    ens = [nbgrad, "ensemble"] + crystal + ["-hkl", "start.hkl", "-shots", "start.jsonl", "-observed",
                                            "obs/{id}.cbf", "-global", "F", "-local",
                                            "orientation,spectrum_shift,scale", "-cycles", "2", "-spots", "3",
                                            "-hklout", "refined.hkl", "-json", "ensemble.json", "-quiet"]
    rc, t_ens = run(ens, work, "ensemble.log")
    if not check(rc == 0, "stills-ensemble", "nbgrad ensemble from DIALS's %d lists: F global, orientation, "
                 "spectrum_shift and scale per shot (%.0f s)" % (len(indexed), t_ens)):
        print(tail(os.path.join(work, "ensemble.log")))
        print("%d passed, %d failed" % (roundtrip.PASSED, roundtrip.FAILED))
        return 1
    res = json.load(open(os.path.join(work, "ensemble.json")))
    # the refined crystals in DIALS's frame: the start's list with the refined offsets, written back by nbgrad batch
    with open(os.path.join(work, "refined.jsonl"), "w") as f:
        for sid in indexed:
            loc = res["locals"][sid]
            f.write(json.dumps({"id": sid, "expt": "dials/%s/indexed.expt" % sid, "cell": list(CELL),
                                "orient": loc[0:3]}) + "\n")
    rc, _ = run([nbgrad, "batch"] + crystal + ["-default_F", "100", "-shots", "refined.jsonl", "-exptfile",
                                               "refined/{id}.expt", "-nodump"], work, "refined.log")
    check(rc == 0, "stills-refined-lists", "the refined crystals written as experiment lists")

    # F against the truth (the refined entries: those a still measured)
    z, Fr, Ft, F0 = [], [], [], []
    for line in open(os.path.join(work, "refined.hkl")):
        h, k, l, F, s = line.split()
        Fx = Fsym[(abs(int(h)), abs(int(k)), abs(int(l)))]
        Fr.append(float(F))
        Ft.append(Fx)
        F0.append(Fstart[(int(h), int(k), int(l))])
        z.append(float(s))  # sigma(F)
    Fr, Ft, F0, S = np.array(Fr), np.array(Ft), np.array(F0), np.array(z)
    corr = float(np.corrcoef(Fr, Ft)[0, 1]) if len(Fr) > 2 else float("nan")
    corr0 = float(np.corrcoef(F0, Ft)[0, 1]) if len(Fr) > 2 else float("nan")
    # the overall scale of F is the shots' scales' to share (a gauge: F c and every scale / c^2 give one model):
    # F compared after one factor, the median ratio
    g = float(np.median(Fr / Ft)) if len(Fr) else 1.0
    z = (Fr / g - Ft) / (S / g)
    rel = float(np.mean(np.abs(Fr / g - Ft) / Ft)) if len(Fr) else float("nan")
    rel0 = float(np.mean(np.abs(F0 - Ft) / Ft)) if len(Fr) else float("nan")
    within = float(np.mean(np.abs(z) < 3)) if len(z) else 0.0
    rmsz = float(np.sqrt(np.mean(z * z))) if len(z) else float("nan")
    # measured (one to three cycles): ~1200 entries, correlation 0.958-0.975 (start 0.72), mean error 4.9-3.9 %
    # after the overall factor (start 20 %); thresholds: correlation > 0.9 and above the start's, error below half
    # the start's.  The standard errors are Poisson's alone (F / (2 sqrt(photons)), 0.6 %): conditional on every
    # shot's model, they miss the partialities' errors (a still sees each reflection once, its partiality set by
    # an orientation known to ~0.01 deg): (F - truth) / sigma is reported (measured rms 9-11), not checked
    check(len(Fr) > 500 and corr > corr0 and corr > 0.9, "stills-F-correlation", "%d F measured; correlation with "
          "the truth %.3f (the start's %.3f)" % (len(Fr), corr, corr0))
    check(rel < 0.5 * rel0, "stills-F-error", "mean |F - truth| / truth %.2f %% after the overall factor %.4f (the "
          "start's %.2f %%); (F - truth) / sigma: rms %.2f, %.1f %% within 3 sigma (Poisson's sigma alone)" % (
              100 * rel, g, 100 * rel0, rmsz, 100 * within))

    # per shot: orientation and cell against the truth, DIALS's model and nbgrad's; the spectrum's shift
    rows = []
    for sid in indexed:
        tc = truth[sid][0].crystal
        d_rot, d_len = crystal_errors(tc, dials_model[sid][0].crystal)
        try:
            n_rot, n_len = crystal_errors(tc, load_expt(os.path.join(work, "refined", sid + ".expt"))[0].crystal)
        except Exception:
            n_rot, n_len = float("nan"), float("nan")
        rows.append((sid, d_rot, n_rot, d_len, n_len, shift[sid], res["locals"][sid][3], res["locals"][sid][4]))
    d_rot = np.array([r[1] for r in rows])
    n_rot = np.array([r[2] for r in rows])
    d_len = np.array([r[3] for r in rows])
    st = np.array([r[5] for r in rows])
    sr = np.array([r[6] for r in rows])
    err = sr - st
    scorr = float(np.corrcoef(sr, st)[0, 1])
    # measured (two runs): nbgrad's orientations 0.016-0.018 deg median (max 0.037, 0.050: the still DIALS had at
    # 0.71 deg) against DIALS's 0.114-0.15 median; every shot better than DIALS's (by 1.2x at the least); required:
    # 3x better on the median and on the mean (DIALS's model of a still is the yardstick), and no shot worse than
    # DIALS's own model of it or 0.1 deg, whichever is larger (a fit that diverged)
    worst = np.nanmax(n_rot - np.maximum(d_rot, 0.1))
    check(np.nanmedian(n_rot) * 3 < np.nanmedian(d_rot) and np.nanmean(n_rot) * 3 < np.nanmean(d_rot) and
          worst <= 0, "stills-orientation", "orientation error, median / mean / max: nbgrad %.4f / %.4f"
          " / %.4f deg, DIALS %.4f / %.4f / %.4f deg; %d shots better than DIALS's model of them" % (
              np.nanmedian(n_rot), np.nanmean(n_rot), np.nanmax(n_rot), np.nanmedian(d_rot), np.nanmean(d_rot),
              np.nanmax(d_rot), int(np.sum(n_rot < d_rot))))
    # measured: shifts recovered to 2e-5 (two or three cycles) to 1e-4 A (one) rms of 2.2e-3; required: rms error
    # < 25 % of the truth's rms, correlation > 0.95 (a shift not refined has an error of the truth's size and no
    # correlation)
    check(np.sqrt(np.mean(err ** 2)) < 0.25 * np.sqrt(np.mean(st ** 2)) and scorr > 0.95, "stills-spectrum-shift",
          "spectrum_shift recovered to %.2g A rms (truth %.2g A rms, mean error %.2g A), correlation %.4f" % (
              np.sqrt(np.mean(err ** 2)), np.sqrt(np.mean(st ** 2)), np.mean(err), scorr))

    print("\nstills from DIALS (%d of %d indexed; P222 %s; 384^2 pixels; five-line spectra of %.2g %% rms, shifted "
          "0.1-0.3 %%); DIALS %.0f s, nbgrad ensemble %.0f s, all %.0f s" % (
              len(indexed), NSHOTS, " ".join("%g" % x for x in CELL), 100 * SIGMA, t_dials, t_ens,
              time.time() - t_all))
    print("| F: entries measured | correlation with the truth | mean relative error (overall factor) | "
          "rms (F - truth) / sigma | within 3 sigma |")
    print("|---|---|---|---|---|")
    print("| %d | %.3f (start %.3f) | %.2f %% (start %.2f %%; factor %.4f) | %.2f | %.1f %% |" % (
        len(Fr), corr, corr0, 100 * rel, 100 * rel0, g, rmsz, 100 * within))
    print("\n| per shot | orientation error: nbgrad / DIALS | cell length error: nbgrad (held) / DIALS |"
          " spectrum shift: truth / nbgrad (A) |")
    print("|---|---|---|---|")
    print("| median | %.4f / %.4f deg | %.3f %% / %.3f %% | rms error %.2g A of %.2g A |" % (
        np.nanmedian(n_rot), np.nanmedian(d_rot), 100 * np.nanmedian([r[4] for r in rows]), 100 * np.median(d_len),
        np.sqrt(np.mean(err ** 2)), np.sqrt(np.mean(st ** 2))))
    print("| mean | %.4f / %.4f deg | %.3f %% / %.3f %% | correlation %.4f |" % (
        np.nanmean(n_rot), np.nanmean(d_rot), 100 * np.nanmean([r[4] for r in rows]), 100 * np.mean(d_len), scorr))
    for r in rows:
        print("| %s | %.4f / %.4f deg | %.3f %% / %.3f %% | %+.5f / %+.5f |" % (
            r[0], r[2], r[1], 100 * r[4], 100 * r[3], r[5], r[6]))
    print("%d passed, %d failed" % (roundtrip.PASSED, roundtrip.FAILED))
    return 0 if roundtrip.FAILED == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
