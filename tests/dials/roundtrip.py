#!/usr/bin/python3
"""The round trip through the real client: nbgrad simulates a rotation series with an off-centre beam and a
rotated detector (a Gaussian lattice factor: the sinc's side lobes would be found as spots of their own; 16 phi
steps per image: nanoBragg's steps start at the image's start, which turns the crystal by osc/(2 steps) =
0.016 deg on average), writes it as NXmx and as CBF together with the true experiment (.expt), and DIALS (Debian's
dials, run with Debian's /usr/bin/python3) imports, finds spots, indexes and refines it.  Checks:

  - the geometry dxtbx imports from each file equals the truth nbgrad wrote (beam centre and distance within
    0.01 mm, axes within 0.01 deg, wavelength, pixel size, image size, oscillation);
  - the cell DIALS indexes and refines is the true cell within 0.05 % (lengths) and 0.05 deg (angles), and its
    orientation is the true one within 0.05 deg, after matching the two bases by their integer transformation;
  - nbgrad refine started from DIALS's refined model, on every frame at once: its orientation error 5x smaller
    than DIALS's (nbgrad holds DIALS's beam and writes its list in DIALS's frame: its crystal is compared after
    the rotation that takes that beam onto the truth's; DIALS's, whose frame the rotation axis it holds anchors,
    as it is), its cell's length and angle errors 5x smaller or (where that is below nbgrad's own standard
    errors on these images) smaller than DIALS's and within 3 standard errors; on the bright series (16 times the
    photons) all three 5x smaller, without the allowance;
  - a hexagonal crystal (a parallelepiped of 10 x 10 x 20 cells, mosaic domains) that DIALS indexes in another
    basis: nbgrad refined from DIALS's model re-expressed in the data's setting (-setting) is 5x better than DIALS
    (or at its floor) and within the noise; in DIALS's basis (another crystal shape), and with the polarization
    DIALS's list states, the goodness of fit flags the fit (exit 4);
  - a tetragonal (P4) and a hexagonal (P6) crystal indexed by DIALS in their space groups: nbgrad refines the cell
    under the list's space group (a = b, c; the angles held) and must say so, its errors 5x smaller than DIALS's
    or at its floor.

    /usr/bin/python3 tests/dials/roundtrip.py NBGRAD_BINARY WORKDIR [--quick] [--part=cases|crystals|all]

--part=cases runs the series of the three conventions (the first three checks above), --part=crystals the
hexagonal crystal in another basis, the P4 and P6 crystals and the panel modules' hierarchy; each part has folders
of its own, so the two may run at once (the DIALS tier's run.sh runs them so); the default runs both.

Prints one PASS/FAIL line per check, a table of the results, and "N passed, N failed".
"""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

TRUE_CELL = (57.0, 68.0, 79.0, 90.0, 105.0, 90.0)
PASSED = 0
FAILED = 0


def check(ok, name, what):
    global PASSED, FAILED
    if ok:
        PASSED += 1
    else:
        FAILED += 1
    print("%s %s: %s" % ("PASS" if ok else "FAIL", name, what), flush=True)
    return ok


def run(cmd, cwd, log):
    t0 = time.time()
    with open(os.path.join(cwd, log), "w") as f:
        rc = subprocess.call(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    return rc, time.time() - t0


def four_modules(base, out, size, corner, pitch, z):
    """Writes to out the experiment list base (nbgrad's, one panel) with its detector made four modules of size^2
    pixels of 0.1 mm in a 2 x 2 grid (pitch mm apart, the first's origin at corner, all at z), the fourth tilted by
    2 deg about the slow axis; returns the list as a dict."""
    with open(base) as f:
        d = json.load(f)
    p0 = d["detector"][0]["panels"][0]
    mods = []
    for j in range(2):
        for i in range(2):
            fast = [1.0, 0.0, 0.0]
            if i == 1 and j == 1:
                a = math.radians(2.0)
                fast = [math.cos(a), 0.0, -math.sin(a)]
            p = dict(p0)
            p.update({"name": "module %d" % (2 * j + i), "image_size": [size, size], "pixel_size": [0.1, 0.1],
                      "fast_axis": fast, "slow_axis": [0.0, -1.0, 0.0],
                      "origin": [corner[0] + i * pitch, corner[1] - j * pitch, z]})
            mods.append(p)
    d["detector"][0]["panels"] = mods
    d["detector"][0]["hierarchy"]["children"] = [{"panel": k} for k in range(4)]
    d["imageset"] = []
    d["experiment"][0].pop("imageset", None)
    with open(out, "w") as f:
        json.dump(d, f, indent=1)
    return d


def tail(path, n=15):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def load_expt(path):
    from dxtbx.model.experiment_list import ExperimentListFactory
    return ExperimentListFactory.from_json_file(path, check_format=False)


def angle_deg(u, v):
    u = np.asarray(u, float)
    v = np.asarray(v, float)
    c = np.dot(u, v) / np.linalg.norm(u) / np.linalg.norm(v)
    return math.degrees(math.acos(max(-1.0, min(1.0, c))))


def beam_centre(panel, beam):
    """Where the beam meets the panel, mm along fast and slow, and the distance along the normal."""
    return panel.get_beam_centre(beam.get_s0()), panel.get_directed_distance()


def compare_geometry(tag, truth, imported):
    """The imported geometry against the truth: one check per quantity."""
    et, ei = truth[0], imported[0]
    pt, pi = et.detector[0], ei.detector[0]
    (ft, st), dt = beam_centre(pt, et.beam)
    (fi, si), di = beam_centre(pi, ei.beam)
    dc = math.hypot(fi - ft, si - st)
    check(dc < 0.01, tag + "-beam-centre", "beam centre (%.4f, %.4f) mm, truth (%.4f, %.4f), off by %.2g mm"
          % (fi, si, ft, st, dc))
    check(abs(di - dt) < 0.01, tag + "-distance", "distance %.4f mm, truth %.4f" % (di, dt))
    af = angle_deg(pi.get_fast_axis(), pt.get_fast_axis())
    as_ = angle_deg(pi.get_slow_axis(), pt.get_slow_axis())
    check(af < 0.01 and as_ < 0.01, tag + "-axes", "detector axes off by %.2g and %.2g deg" % (af, as_))
    do = np.linalg.norm(np.subtract(pi.get_origin(), pt.get_origin()))
    check(do < 0.01, tag + "-origin", "panel origin off by %.2g mm" % do)
    ag = angle_deg(ei.goniometer.get_rotation_axis(), et.goniometer.get_rotation_axis())
    check(ag < 0.01, tag + "-spindle", "rotation axis %s off by %.2g deg" % (
        tuple(round(x, 5) for x in ei.goniometer.get_rotation_axis()), ag))
    ab = angle_deg(ei.beam.get_sample_to_source_direction(), et.beam.get_sample_to_source_direction())
    dl = abs(ei.beam.get_wavelength() - et.beam.get_wavelength())
    check(ab < 0.01 and dl < 1e-6, tag + "-beam", "beam direction off by %.2g deg, wavelength by %.2g A" % (ab, dl))
    ok = (pi.get_pixel_size() == pt.get_pixel_size() and pi.get_image_size() == pt.get_image_size() and
          np.allclose(ei.scan.get_oscillation(), et.scan.get_oscillation(), atol=1e-9) and
          ei.scan.get_image_range() == et.scan.get_image_range())
    check(ok, tag + "-scan-pixels", "pixel size %s, image size %s, oscillation %s, images %s" % (
        pi.get_pixel_size(), pi.get_image_size(), ei.scan.get_oscillation(), ei.scan.get_image_range()))
    return {"beam_centre_mm": dc, "distance_mm": abs(di - dt), "axes_deg": max(af, as_), "origin_mm": do,
            "spindle_deg": ag, "beam_deg": ab}


def beam_alignment(found_beam, truth_beam):
    """The smallest rotation taking the direction of found_beam (s0 or any vector along the beam) onto truth_beam's
    (about their cross product)."""
    u = np.asarray(found_beam, float) / np.linalg.norm(found_beam)
    v = np.asarray(truth_beam, float) / np.linalg.norm(truth_beam)
    k = np.cross(u, v)
    s, c = np.linalg.norm(k), float(u @ v)
    if s < 1e-15:
        return np.eye(3)
    k /= s
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return c * np.eye(3) + s * K + (1 - c) * np.outer(k, k)


def match_crystal(truth, found, R=None):
    """Cell and orientation of DIALS's crystal against the truth, after expressing the truth in DIALS's basis
    (the bases differ by an integer matrix of determinant +-1); R, when given, turns found's vectors first (a
    change of lab frame)."""
    T = np.array(truth.get_real_space_vectors()).T  # columns a, b, c
    D = np.array(found.get_real_space_vectors()).T
    if R is not None:
        D = np.asarray(R) @ D
    M = np.rint(np.linalg.solve(T, D))
    if abs(abs(np.linalg.det(M)) - 1) > 1e-6:
        return None
    Tm = T @ M
    def cell(B):
        a, b, c = B[:, 0], B[:, 1], B[:, 2]
        return [np.linalg.norm(a), np.linalg.norm(b), np.linalg.norm(c), angle_deg(b, c), angle_deg(a, c),
                angle_deg(a, b)]
    ct, cd = cell(Tm), cell(D)
    len_err = max(abs(cd[i] / ct[i] - 1) for i in range(3))
    ang_err = max(abs(cd[i] - ct[i]) for i in range(3, 6))
    # the rotation that takes the true basis to DIALS's, made orthogonal (polar decomposition)
    R = D @ np.linalg.inv(Tm)
    U, _, Vt = np.linalg.svd(R)
    Rr = U @ Vt
    rot = math.degrees(math.acos(max(-1.0, min(1.0, (np.trace(Rr) - 1) / 2))))
    return {"cell": cd, "true_cell": ct, "len_err": len_err, "ang_err": ang_err, "rot_deg": rot}


FLAGGED_FRAMES = 6


def from_dials(nbgrad, tag, d, observed, truth, crystal_flags, dials_m, extra=(), name="nbgrad", expect="fit",
               params="cell,orientation,detector_frame,spindle_tilt1"):
    """nbgrad refine started from DIALS's refined experiment list (its detector, beam, scan and crystal), on every
    frame of the series at once (the NXmx file, or the CBF files' template), on spot regions, refining the cell, the
    orientation, the detector as dials.refine does (detector_frame: distance, beam_fast, beam_slow, det_tau1-3, its
    Dist, Shift1, Shift2, Tau1-3) and the rotation axis's tilt towards the beam (the beam-spindle angle; its other
    tilt is a turn of everything about the beam).  Its errors against DIALS's: 5x smaller, or, where that lies below nbgrad's own statistical floor on these
    images, smaller than DIALS's and within 3 standard errors.  extra: more flags (last); expect "flagged": a model
    known to be wrong, which the goodness of fit must flag (exit 4), its errors only reported; it is fitted on the
    series' first FLAGGED_FRAMES frames (-frames), which the verdict needs no more than (measured on the hexagonal
    case's polarization: deviance 1.86 / 12.99 times its expectation on 6 frames, 1.82 / 12.39 on 20; the threshold
    is 1.05), at a third of the time."""
    cmd = [nbgrad, "refine", "-expt", "refined.expt"] + crystal_flags + [
        "-phisteps", "16", "-oversample", "1", "-adc", "40", "-observed", observed, "-loss", "poisson",
        "-params", params, "-spots", "3", "-exptfile", name + ".expt", "-json", name + ".json"] + list(extra)
    if "-polar" not in extra:
        cmd += ["-polar", "0"]
    if expect == "flagged":
        cmd += ["-frames", str(FLAGGED_FRAMES)]
    rc, t = run(cmd, d, name + "_refine.log")
    with open(os.path.join(d, name + "_refine.log")) as f:
        log = f.read()
    if expect == "flagged":
        if not check(rc == 4 and "does not explain the data" in log and os.path.exists(os.path.join(d, name + ".expt")),
                     tag + "-nbgrad-flagged", "nbgrad refine from DIALS's model, a model known to be wrong (%s), on "
                     "the first %d frames: the goodness of fit flags it (exit %d, 4 expected; %.1f s)"
                     % (" ".join(extra), FLAGGED_FRAMES, rc, t)):
            print(tail(os.path.join(d, name + "_refine.log")))
            return None
    # exit 0: converged, and the goodness of fit finds the model within the data's noise (exit 4 would say it is not:
    # measured 1.000-1.007 over all pixels and over the spots, against a threshold of 1.05)
    elif not check(rc == 0 and os.path.exists(os.path.join(d, name + ".expt")), tag + "-nbgrad-from-dials",
                   "nbgrad refine from DIALS's model on all frames converged, within the data's noise (%.1f s, exit %d)"
                   % (t, rc)):
        print(tail(os.path.join(d, name + "_refine.log")))
        return None
    # nbgrad holds the beam at DIALS's and refines the rotation axis's tilt towards it (spindle_tilt1): its lab frame
    # is anchored on the beam, DIALS's on the axis (which DIALS holds).  The list nbgrad writes keeps DIALS's frame
    # (its beam as dials.refine left it), so its crystal is compared with the truth after the smallest rotation
    # that takes its beam onto the truth's (DIALS's beam error, measured up to 0.008 deg, is not nbgrad's); DIALS's
    # crystal is compared in its own frame.
    mine = load_expt(os.path.join(d, name + ".expt"))[0]
    R = beam_alignment(mine.beam.get_s0(), truth[0].beam.get_s0())
    m = match_crystal(truth[0].crystal, mine.crystal, R)
    if m is not None:
        m["beam_deg"] = angle_deg(mine.beam.get_s0(), truth[0].beam.get_s0())
    if m is None:
        check(False, tag + "-nbgrad-basis", "nbgrad's basis is an integer transform of the true one")
        return None
    with open(os.path.join(d, name + ".json")) as f:
        out = json.load(f)
    fit = out["parameters"]
    gof = out.get("fit", {})
    m["gof"] = "%.3f / %.3f%s" % (gof.get("deviance_ratio", float("nan")), gof.get("deviance_ratio_spots", float("nan")),
                                  " (flagged)" if gof.get("mismatch") else "")
    # nbgrad's statistical floor: the largest relative standard error of a length, of an angle (deg)
    m["len_sigma"] = max(fit[k]["sigma"] / fit[k]["value"] for k in ("a", "b", "c"))
    m["ang_sigma"] = max(fit[k]["sigma"] for k in ("alpha", "beta", "gamma"))
    m["frames"] = "frames" if "summed over the frames" in log else "1"
    m["time"] = t
    if expect == "flagged":
        return m
    check(m["rot_deg"] * 5 <= dials_m["rot_deg"], tag + "-nbgrad-orientation",
          "orientation off by %.5f deg (in the beam's frame: DIALS's beam, which nbgrad holds, is %.5f deg off the "
          "truth's), DIALS's by %.4f deg (%.1fx smaller)" % (
              m["rot_deg"], m["beam_deg"], dials_m["rot_deg"], dials_m["rot_deg"] / max(m["rot_deg"], 1e-12)))
    held = all(fit[k].get("tied_to") == "fixed" for k in ("alpha", "beta", "gamma"))
    if held:
        # the space group holds the angles at their values: exact in both fits, nothing to compare
        check(m["ang_err"] < 1e-9 and dials_m["ang_err"] < 1e-9, tag + "-nbgrad-angles-held",
              "cell angles held by the space group: off by %.2g deg (DIALS's %.2g deg)" % (m["ang_err"],
                                                                                        dials_m["ang_err"]))
    for what, err, derr, sig, unit, scale in (("lengths", m["len_err"], dials_m["len_err"], m["len_sigma"], "%", 100),
                                              ("angles", m["ang_err"], dials_m["ang_err"], m["ang_sigma"], "deg", 1)):
        if what == "angles" and held:
            continue
        five = err * 5 <= derr
        floor = err < derr and err <= 3 * sig and not tag.startswith("dials-bright")
        check(five or floor, "%s-nbgrad-%s" % (tag, what),
              "cell %s off by %.5f %s, DIALS's by %.5f %s (%.1fx smaller); nbgrad's standard error %.5f %s: %s" % (
                  what, scale * err, unit, scale * derr, unit, derr / max(err, 1e-15), scale * sig, unit,
                  "5x smaller" if five else "within 3 standard errors, which is as close as these images allow"
                  if floor else "neither 5x smaller nor within 3 standard errors"))
    return m


def round_trip(conv, fmt, cdir, files, truth, table, nbgrad=None, crystal_flags=None, index_extra=(), nb_extra=()):
    """dials.import, find_spots, index and refine on one format of one case; checks and a table row.
    index_extra: dials.index's options (a space group); nb_extra: nbgrad refine's extra flags."""
    tag = conv + "-" + fmt
    d = os.path.join(cdir, fmt)
    os.makedirs(d, exist_ok=True)
    paths = [os.path.join(cdir, f) for f in files]
    rc, t = run(["dials.import"] + paths, d, "import.log")
    if not check(rc == 0 and os.path.exists(os.path.join(d, "imported.expt")), tag + "-import",
                 "dials.import read the files (%.1f s)" % t):
        print(tail(os.path.join(d, "import.log")))
        return
    imported = load_expt(os.path.join(d, "imported.expt"))
    geo = compare_geometry(tag, truth, imported)
    rc, t1 = run(["dials.find_spots", "imported.expt", "nproc=2"], d, "find_spots.log")
    check(rc == 0, tag + "-find-spots", "dials.find_spots (%.1f s)" % t1)
    rc, t2 = run(["dials.index", "imported.expt", "strong.refl"] + list(index_extra), d, "index.log")
    if not check(rc == 0, tag + "-index", "dials.index (%.1f s)" % t2):
        print(tail(os.path.join(d, "index.log")))
        return
    rc, t3 = run(["dials.refine", "indexed.expt", "indexed.refl"], d, "refine.log")
    if not check(rc == 0, tag + "-refine", "dials.refine (%.1f s)" % t3):
        print(tail(os.path.join(d, "refine.log")))
        return
    for stage, name in (("indexed", "indexed.expt"), ("refined", "refined.expt")):
        found = load_expt(os.path.join(d, name))[0].crystal
        m = match_crystal(truth[0].crystal, found)
        if not check(m is not None, "%s-%s-basis" % (tag, stage), "DIALS's basis is an integer transform of "
                     "the true one"):
            continue
        check(m["len_err"] < 5e-4 and m["ang_err"] < 0.05, "%s-%s-cell" % (tag, stage),
              "cell %s (truth %s): lengths off by %.3g %%, angles by %.3g deg" % (
                  " ".join("%.3f" % x for x in m["cell"]), " ".join("%.3f" % x for x in m["true_cell"]),
                  100 * m["len_err"], m["ang_err"]))
        check(m["rot_deg"] < 0.05, "%s-%s-orientation" % (tag, stage), "orientation off by %.4f deg" % m["rot_deg"])
        if stage == "refined":
            nb = None
            if nbgrad is not None:
                # every frame: the one NXmx file, or the CBF files' template
                series = paths[0] if fmt == "nxmx" else os.path.join(cdir, "series_#####.cbf")
                nb = from_dials(nbgrad, tag, d, series, truth, crystal_flags, m, nb_extra)
            table.append((conv, fmt, m, geo, rmsds(os.path.join(d, "refined.refl")), t + t1 + t2 + t3, nb))


HEX_CELL = (78.0, 78.0, 37.0, 90.0, 90.0, 120.0)


def setting_case(nbgrad, work, det, series, table, nbrows):
    """A hexagonal crystal in a basis DIALS chooses otherwise: 78 78 37 90 90 120, a parallelepiped of 10 x 10 x 20
    cells along a, b, c (the sinc lattice factor, whose spot shape depends on the basis the cell counts run along),
    with mosaic domains, on the rotated off-centre detector, as NXmx.  DIALS indexes it in P1 in another basis (c, b,
    -a-b, measured).  nbgrad refines from DIALS's refined model three times:
      - with -setting truth.expt (the crystal re-expressed in the data's setting): 5x better than DIALS or at its
        statistical floor, and within the noise (exit 0);
      - in DIALS's basis, the same N along DIALS's a, b, c (another crystal shape): the goodness of fit must flag it
        (exit 4), its errors reported (on the first 6 frames: from_dials);
      - with the setting but the polarization DIALS's list states (dxtbx's NXmx reader writes 0.999; the data are
        unpolarized): flagged (exit 4), on the first 6 frames too."""
    cdir = os.path.join(work, "hexagonal")
    os.makedirs(cdir, exist_ok=True)
    crystal = ["-cell"] + ["%g" % x for x in HEX_CELL] + [
        "-misset", "12", "-25", "33", "-default_F", "100", "-Na", "10", "-Nb", "10", "-Nc", "20", "-lambda", "0.9795",
        "-mosaic", "0.03", "-mosaic_domains", "8", "-mosaic_seed", "11"]
    sim = [nbgrad] + det + crystal + series + ["-nxsfile", "series.nxs", "-exptfile", "truth.expt"]
    rc, t = run(sim, cdir, "simulate.log")
    if not check(rc == 0, "hexagonal-simulate", "nbgrad wrote the hexagonal series as NXmx with the true .expt (%.1f s)"
                 % t):
        print(tail(os.path.join(cdir, "simulate.log")))
        return
    truth = load_expt(os.path.join(cdir, "truth.expt"))
    n = len(table)
    round_trip("hexagonal", "nxmx", cdir, ["series.nxs"], truth, table)
    if len(table) == n:
        return
    dials_m = table[-1][2]
    d = os.path.join(cdir, "nxmx")
    # the convention of the simulation: the mosaic domains of -mosaic_seed are drawn in its frame, as they were
    flags = crystal[crystal.index("-default_F"):] + ["-dials"]
    T = np.array(truth[0].crystal.get_real_space_vectors())
    D = np.array(load_expt(os.path.join(d, "refined.expt"))[0].crystal.get_real_space_vectors())
    M = np.rint(np.linalg.solve(T.T, D.T).T).astype(int)
    check(not np.array_equal(M, np.eye(3, dtype=int)), "hexagonal-dials-basis",
          "DIALS chose another basis than the simulation's (DIALS's a, b, c in the truth's: %s)" % M.tolist())
    series_path = os.path.join(cdir, "series.nxs")
    for label, extra, name, expect in (("-setting truth.expt", ["-setting", "../truth.expt"], "nbgrad_setting", "fit"),
                                       ("DIALS's basis", [], "nbgrad_dials_basis", "flagged"),
                                       ("-setting, DIALS's polarization", ["-setting", "../truth.expt", "-polar",
                                                                           "0.998"], "nbgrad_polar", "flagged")):
        nb = from_dials(nbgrad, "hexagonal-nxmx-" + name[7:].replace("_", "-"), d, series_path, truth, flags, dials_m,
                        extra, name, expect)
        nbrows.append(("hexagonal", "nxmx, " + label, dials_m, nb))


def symmetry_case(nbgrad, work, det, series, table, nbrows):
    """A tetragonal and a hexagonal crystal on the rotated off-centre detector, as NXmx, indexed by DIALS in their
    space groups (dials.index space_group=P4, P6: its cells constrained, its lists carrying the Hall symbols), then
    refined by nbgrad from DIALS's model: the cell under the list's space group (tetragonal a = b and c, the angles
    held; hexagonal a = b, c, gamma 120), the orientation as small rotations, the detector and the spindle tilt.
    nbgrad's JSON must say what it constrained, tie b to a and hold the angles; its errors against the truth 5x
    smaller than DIALS's or at its statistical floor, as in the other cases."""
    for name, cell, sg, hall in (("tetragonal", (62.0, 62.0, 88.0, 90.0, 90.0, 90.0), "P4", "P 4"),
                                 ("hexagonal-P6", (74.0, 74.0, 42.0, 90.0, 90.0, 120.0), "P6", "P 6")):
        cdir = os.path.join(work, name)
        os.makedirs(cdir, exist_ok=True)
        crystal = ["-cell"] + ["%g" % x for x in cell] + [
            "-misset", "12", "-25", "33", "-default_F", "100", "-N", "8", "-gauss_xtal", "-lambda", "0.9795"]
        # 10 frames of the series's 0.5 deg (the test's time; the other cases have 20)
        short = list(series)
        short[short.index("-frames") + 1] = str(min(10, int(series[series.index("-frames") + 1])))
        sim = [nbgrad] + det + crystal + short + ["-space_group", sg, "-nxsfile", "series.nxs", "-exptfile",
                                                  "truth.expt"]
        rc, t = run(sim, cdir, "simulate.log")
        if not check(rc == 0, name + "-simulate", "nbgrad wrote the %s series as NXmx (%.1f s)" % (name, t)):
            print(tail(os.path.join(cdir, "simulate.log")))
            continue
        # -space_group P4 reaches DIALS as its Hall symbol (nbgrad's settings table, generated from gemmi)
        from dxtbx.model.experiment_list import ExperimentListFactory
        tsg = ExperimentListFactory.from_json_file(os.path.join(cdir, "truth.expt"),
                                                   check_format=False)[0].crystal.get_space_group()
        check(tsg.type().lookup_symbol().replace(" ", "") == sg and tsg.type().hall_symbol().strip() == hall,
              name + "-nbgrad-space-group", "nbgrad's list (-space_group %s) read by dxtbx as %s, Hall '%s'" %
              (sg, tsg.type().lookup_symbol(), tsg.type().hall_symbol().strip()))
        truth = load_expt(os.path.join(cdir, "truth.expt"))
        n = len(table)
        # the hexagonal lattice factor of -N along a and b is not invariant under the 60 deg turn DIALS's setting may
        # differ by: nbgrad takes the crystal in the simulation's setting (-setting), with the space group given
        nb_extra = [] if name == "tetragonal" else ["-setting", "../truth.expt", "-space_group", sg]
        round_trip(name, "nxmx", cdir, ["series.nxs"], truth, table, nbgrad, crystal[crystal.index("-default_F"):],
                   index_extra=["space_group=" + sg], nb_extra=nb_extra)
        if len(table) == n:
            continue
        d = os.path.join(cdir, "nxmx")
        with open(os.path.join(d, "refined.expt")) as f:
            got = json.load(f)["crystal"][0].get("space_group_hall_symbol", "")
        check(got.strip() == hall, name + "-dials-space-group", "DIALS's list carries the space group: '%s'" % got)
        nb = table[-1][6]
        if nb is None:
            continue
        with open(os.path.join(d, "nbgrad.json")) as f:
            out = json.load(f)
        par = out["parameters"]
        held = [k for k in ("alpha", "beta", "gamma") if par.get(k, {}).get("tied_to") == "fixed"]
        system = "tetragonal" if name == "tetragonal" else "hexagonal"
        check(system in out.get("constraint", "") and par["b"].get("tied_to") == "a" and
              par["b"]["value"] == par["a"]["value"] and len(held) == 3 and "tied_to" not in par["c"] and
              (system != "hexagonal" or par["gamma"]["value"] == 120),
              name + "-nbgrad-constrained", "nbgrad fitted the cell under %s: %s; b = a = %.5f, c %.5f, angles %s held" %
              (sg, out.get("constraint", "?"), par["a"]["value"], par["c"]["value"], ",".join(held)))


def module_errors(truth, path):
    """The largest distance of a panel's origin from the truth's (mm) and the largest angle of its axes (deg)."""
    t, e = truth[0].detector, load_expt(path)[0].detector
    do = max(float(np.linalg.norm(np.subtract(e[k].get_origin(), t[k].get_origin()))) for k in range(len(t)))
    da = max(max(angle_deg(e[k].get_fast_axis(), t[k].get_fast_axis()), angle_deg(e[k].get_slow_axis(),
                                                                                    t[k].get_slow_axis()))
             for k in range(len(t)))
    return do, da


def hierarchy_case(nbgrad, work, crystal, series, table, nbrows):
    """A detector of four modules (2 x 2 of 512 x 512 pixels, 1 mm gaps, one module tilted by 2 deg) that DIALS
    refines as a hierarchy: nbgrad writes the series as NXmx (one module per panel), dials.import reads it as a
    detector group holding a group per module, dials.refine refines each module (detector.hierarchy_level=2), and
    nbgrad refines from DIALS's list -- whose hierarchy it follows, each module a motion group -- the cell, the
    orientation and every module's shift and turn.  Its crystal errors 5x smaller than DIALS's or at its floor, and
    its modules nearer the truth than DIALS's."""
    cdir = os.path.join(work, "modules")
    os.makedirs(cdir, exist_ok=True)
    base = [nbgrad, "-dials", "-close_distance", "110"] + crystal + [
        "-detpixels", "32", "-pixel", "0.1", "-phi", "0", "-osc", "0.5",
        "-frames", series[series.index("-frames") + 1], "-exptfile", "base.expt", "-nopgm", "-nonoise"]
    rc, _ = run(base, cdir, "base.log")
    if not check(rc == 0, "modules-base", "nbgrad wrote the beam, goniometer, scan and crystal (exit %d)" % rc):
        return
    four_modules(os.path.join(cdir, "base.expt"), os.path.join(cdir, "in.expt"), 512, (-47.0, 50.0), 52.2, -110.0)
    flags = crystal[crystal.index("-default_F"):]
    sim = [nbgrad, "-expt", "in.expt"] + flags + ["-phisteps", "16", "-oversample", "1", "-frames",
                                                   series[series.index("-frames") + 1], "-data", "noise", "-seed", "7",
                                                   "-adc", "40", "-nxsfile", "series.nxs", "-exptfile", "truth.expt"]
    rc, t = run(sim, cdir, "simulate.log")
    if not check(rc == 0, "modules-simulate", "nbgrad wrote the four-module series as NXmx (%.1f s)" % t):
        print(tail(os.path.join(cdir, "simulate.log")))
        return
    truth = load_expt(os.path.join(cdir, "truth.expt"))
    d = os.path.join(cdir, "nxmx")
    os.makedirs(d, exist_ok=True)
    steps = (["dials.import", os.path.join(cdir, "series.nxs")], ["dials.find_spots", "imported.expt", "nproc=2"],
             ["dials.index", "imported.expt", "strong.refl"],
             ["dials.refine", "indexed.expt", "indexed.refl", "detector.hierarchy_level=2"])
    tt = 0
    for cmd in steps:
        rc, t = run(cmd, d, cmd[0] + ".log")
        tt += t
        if not check(rc == 0, "modules-" + cmd[0], "%s (%.1f s)" % (" ".join(cmd[:1] + cmd[2:]), t)):
            print(tail(os.path.join(d, cmd[0] + ".log")))
            return
    refined = load_expt(os.path.join(d, "refined.expt"))
    groups = [len(g) for g in list(refined[0].detector.hierarchy())]
    check(groups == [4], "modules-dials-hierarchy", "DIALS's detector: a group of %s groups (one per module; "
          "hierarchy_level=2 refines each)" % groups)
    dials_m = match_crystal(truth[0].crystal, refined[0].crystal)
    if not check(dials_m is not None, "modules-dials-basis", "DIALS's basis is an integer transform of the true one"):
        return
    ddo, dda = module_errors(truth, os.path.join(d, "refined.expt"))
    nb = from_dials(nbgrad, "modules-nxmx", d, os.path.join(cdir, "series.nxs"), truth, flags, dials_m,
                    name="nbgrad_modules", params="cell,orientation,panels")
    if nb is not None:
        ndo, nda = module_errors(truth, os.path.join(d, "nbgrad_modules.expt"))
        check(ndo < ddo and nda < dda, "modules-nbgrad-placed",
              "modules off the truth by %.4f mm and %.4f deg at most, DIALS's by %.4f mm and %.4f deg (%.1fx, %.1fx)"
              % (ndo, nda, ddo, dda, ddo / max(ndo, 1e-12), dda / max(nda, 1e-12)))
        nb["modules"] = "%.4f / %.4f mm, %.4f / %.4f deg" % (ndo, ddo, nda, dda)
    nbrows.append(("4 modules", "nxmx, DIALS refines each", dials_m, nb))


def rmsds(path):
    """The refined model's positional rmsds, for the table."""
    try:
        from dials.array_family import flex
        refl = flex.reflection_table.from_file(path)
        r = refl.select(refl.get_flags(refl.flags.used_in_refinement))
        x, y, z = r["xyzcal.px"].parts()
        xo, yo, zo = r["xyzobs.px.value"].parts()
        return "%.3f %.3f px %.3f images" % (math.sqrt(flex.mean(flex.pow2(x - xo))),
                                             math.sqrt(flex.mean(flex.pow2(y - yo))),
                                             math.sqrt(flex.mean(flex.pow2(z - zo))))
    except Exception as ex:  # noqa: BLE001 -- the rmsd is for the table only
        return "n/a (%s)" % ex


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    nbgrad = os.path.abspath(argv[0])
    work = os.path.abspath(argv[1])
    quick = "--quick" in argv
    part = "all"
    for a in argv:
        if a.startswith("--part="):
            part = a[len("--part="):]
    if part not in ("cases", "crystals", "all"):
        print("roundtrip.py: unknown --part=%s (cases, crystals or all)" % part)
        return 2
    os.makedirs(work, exist_ok=True)
    nframes = 10 if quick else 20
    crystal = ["-cell"] + ["%g" % x for x in TRUE_CELL] + [
        "-misset", "12", "-25", "33", "-default_F", "100", "-N", "8", "-gauss_xtal", "-lambda", "0.9795"]
    series = ["-detpixels", "1024", "-pixel", "0.1", "-phi", "0", "-osc", "0.5", "-phisteps", "16", "-oversample", "1",
              "-frames", str(nframes), "-data", "noise", "-seed", "7", "-adc", "40"]
    # (convention, detector flags, formats): DIALS's convention with the sample pivot, an off-centre beam
    # (ORGX/ORGY) and three detector rotations, as NXmx and CBF; MOSFLM's with the beam pivot, an off-centre beam
    # and a two-theta swing, as NXmx
    # and the first once more with 16 times the photons (-default_F 400): where nbgrad's statistical floor lies
    # below a fifth of DIALS's errors
    dials_det = ["-dials", "-close_distance", "110", "-ORGX", "420", "-ORGY", "600", "-detector_rotx", "2",
                 "-detector_roty", "-4", "-detector_rotz", "1.5"]
    cases = [("dials", dials_det, ("nxmx", "cbf"), "100"),
             ("mosflm", ["-mosflm", "-distance", "120", "-Xbeam", "45", "-Ybeam", "58", "-twotheta", "6"],
              ("nxmx",), "100"),
             ("dials-bright", dials_det, ("nxmx",), "400")]
    table = []
    for conv, det, formats, F in (cases if part != "crystals" else []):
        cdir = os.path.join(work, conv)
        os.makedirs(cdir, exist_ok=True)
        crystal[crystal.index("-default_F") + 1] = F
        sim = [nbgrad] + det + crystal + series + ["-nxsfile", "series.nxs", "-exptfile", "truth.expt"]
        if "cbf" in formats:
            sim += ["-cbffile", "series_#####.cbf"]
        rc, t = run(sim, cdir, "simulate.log")
        if not check(rc == 0, conv + "-simulate", "nbgrad wrote %d frames (%s) with the true .expt (%.1f s)"
                     % (nframes, ", ".join(formats), t)):
            print(tail(os.path.join(cdir, "simulate.log")))
            continue
        truth = load_expt(os.path.join(cdir, "truth.expt"))
        for fmt in formats:
            files = ["series.nxs"] if fmt == "nxmx" else ["series_%05d.cbf" % (i + 1) for i in range(nframes)]
            round_trip(conv, fmt, cdir, files, truth, table, nbgrad, crystal[crystal.index("-default_F"):])

    nbrows = [(conv, fmt, m, nb) for conv, fmt, m, geo, rmsd, t, nb in table if nb is not None]
    if part != "cases":
        setting_case(nbgrad, work, dials_det, series, table, nbrows)
        n = len(table)
        symmetry_case(nbgrad, work, dials_det, series, table, nbrows)
        nbrows += [(conv, fmt, m, nb) for conv, fmt, m, geo, rmsd, t, nb in table[n:] if nb is not None]
        crystal[crystal.index("-default_F") + 1] = "100"
        hierarchy_case(nbgrad, work, crystal, series, table, nbrows)

    print("\nround trip (truth %s, the hexagonal case's %s; off-centre beam, rotated detector, %d frames of 0.5 deg)"
          % (" ".join("%g" % x for x in TRUE_CELL), " ".join("%g" % x for x in HEX_CELL), nframes))
    print("| convention | format | refined cell | max length error | max angle error | orientation error |"
          " rmsd (x y z) | imported geometry: centre / distance / axes / spindle | DIALS time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for conv, fmt, m, geo, rmsd, t, nb in table:
        print("| %s | %s | %s | %.4f %% | %.4f deg | %.4f deg | %s | %.1e mm / %.1e mm / %.1e deg / %.1e deg |"
              " %.0f s |" % (conv, fmt, " ".join("%.3f" % x for x in m["cell"]), 100 * m["len_err"], m["ang_err"],
                             m["rot_deg"], rmsd, geo["beam_centre_mm"], geo["distance_mm"], geo["axes_deg"],
                             geo["spindle_deg"], t))
    print("\nnbgrad refine from DIALS's refined model (every frame; cell, orientation, detector, spindle tilt) against"
          " DIALS's own errors; nbgrad's standard errors in brackets")
    print("| convention | format | length error nbgrad [sigma] / DIALS | angle error nbgrad [sigma] / DIALS |"
          " orientation error nbgrad / DIALS | nbgrad's goodness of fit: deviance / expected, all / spots |")
    print("|---|---|---|---|---|---|")
    for conv, fmt, m, nb in nbrows:
        if nb is not None:
            print("| %s | %s | %.5f %% [%.5f] / %.4f %% (%.1fx) | %.5f [%.5f] / %.4f deg (%.1fx) |"
                  " %.5f / %.4f deg (%.1fx) | %s |" % (
                      conv, fmt, 100 * nb["len_err"], 100 * nb["len_sigma"], 100 * m["len_err"],
                      m["len_err"] / max(nb["len_err"], 1e-15), nb["ang_err"], nb["ang_sigma"], m["ang_err"],
                      m["ang_err"] / max(nb["ang_err"], 1e-15), nb["rot_deg"], m["rot_deg"],
                      m["rot_deg"] / max(nb["rot_deg"], 1e-12), nb.get("gof", "-")))
    for conv, fmt, m, nb in nbrows:
        if nb is not None and "modules" in nb:
            print("\n%s (%s): module positions against the truth, nbgrad / DIALS: %s" % (conv, fmt, nb["modules"]))
    print("%d passed, %d failed" % (PASSED, FAILED))
    return 0 if FAILED == 0 else 1


def run_script(main, argv):
    """A DIALS-tier script's entry: main(argv), a crash counted as a failure with the summary line still printed,
    the exit status 1 when anything failed."""
    try:
        main(argv)
    except Exception as exc:
        import traceback
        traceback.print_exc()
        check(False, "crash", repr(exc))
    print("%d passed, %d failed" % (PASSED, FAILED))
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
