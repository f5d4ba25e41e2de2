#!/usr/bin/python3
"""A scan-varying crystal through the real client: nbgrad renders a rotation series from an experiment list whose
crystal wobbles while it rotates (A_at_scan_points, dials.refine's scan-varying model), and DIALS (Debian's dials)
predicts the same list's reflections with its scan-varying predictor (the A matrix at each reflection's angle,
interpolated between the scan points).  If nbgrad reads the scan points and gives each image its crystal as DIALS
means them, its spots lie where DIALS predicts them.  Checks:

  - the series renders from the list (each image its own crystal; the program says so);
  - nbgrad's spots (the centroid of its noise-free image about each prediction, in the image the reflection falls
    in) within 0.25 px rms of DIALS's scan-varying predictions, and at the scan's ends (first and last 3 images) at
    least 3x closer to them than to DIALS's predictions from the static crystal.

The wobble is a turn about the axis across the beam and the spindle, 0 at the middle scan point and 0.4 deg at the
ends (quadratic in the scan point).

    /usr/bin/python3 tests/dials/scanvarying.py NBGRAD_BINARY WORKDIR

Prints one PASS/FAIL line per check and "N passed, N failed".
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roundtrip  # noqa: E402
from roundtrip import check, run, tail  # noqa: E402

NFRAMES = 20
OSC = 0.5
WOBBLE = 0.4  # deg: the crystal turned by WOBBLE ((k - NFRAMES / 2) / (NFRAMES / 2))^2 at scan point k, about the
# axis across the beam and the spindle.  Not a drift of constant rate: turning the crystal at a constant rate while the
# spindle turns it is, to first order, turning it about a tilted spindle (0.03 deg an image of 0.5 deg is a tilt of
# 3.4 deg), which DIALS's indexing explains with a static crystal and a turned beam and detector


def rot(axis, deg):
    a = np.asarray(axis, float) / np.linalg.norm(axis)
    t = math.radians(deg)
    K = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return np.eye(3) + math.sin(t) * K + (1 - math.cos(t)) * K @ K


def main(argv):
    nbgrad = os.path.abspath(argv[0])
    work = os.path.abspath(argv[1])
    os.makedirs(work, exist_ok=True)
    crystal = ["-default_F", "100", "-N", "8", "-gauss_xtal"]
    det = ["-dials", "-close_distance", "110", "-ORGX", "420", "-ORGY", "600", "-detpixels", "1024", "-pixel", "0.1",
           "-lambda", "0.9795", "-oversample", "1", "-phisteps", "16"]
    static = [nbgrad] + det + crystal + ["-cell", "57", "68", "79", "90", "105", "90", "-misset", "12", "-25", "33",
                                         "-phi", "0", "-osc", str(OSC), "-frames", str(NFRAMES), "-roi", "0", "0", "0",
                                         "0", "-exptfile", "static.expt"]
    rc, t = run(static, work, "static.log")
    if not check(rc == 0, "sv-static-list", "nbgrad wrote the static experiment (%.1f s)" % t):
        print(tail(os.path.join(work, "static.log")))
        return
    # the truth: the static crystal turned by WOBBLE ((k - NFRAMES / 2) / (NFRAMES / 2))^2 deg at scan point k (a
    # wobble that neither a static crystal nor a tilted spindle can follow)
    doc = json.load(open(os.path.join(work, "static.expt")))
    c0 = doc["crystal"][0]
    B0 = np.array([c0["real_space_a"], c0["real_space_b"], c0["real_space_c"]]).T
    spindle = np.array(doc["goniometer"][0]["rotation_axis"])
    beam = np.array(doc["beam"][0]["direction"])
    axis = np.cross(spindle, beam)
    truth = [rot(axis, WOBBLE * ((k - NFRAMES / 2) / (NFRAMES / 2)) ** 2) @ B0 for k in range(NFRAMES + 1)]
    c0["A_at_scan_points"] = [list(np.linalg.inv(B.T).ravel()) for B in truth]
    json.dump(doc, open(os.path.join(work, "drift.expt"), "w"), indent=1)

    rc, t = run([nbgrad, "-expt", "drift.expt"] + crystal + ["-oversample", "1", "-phisteps", "16", "-floatfile",
                                                             "render_#####.bin"], work, "render.log")
    log = open(os.path.join(work, "render.log")).read()
    if not check(rc == 0 and "scan-varying crystal" in log and "each image gets its own" in log, "sv-render",
                 "nbgrad rendered %d images noise-free, each with its own crystal (%.1f s)" % (NFRAMES, t)):
        print(tail(os.path.join(work, "render.log")))
        return
    # DIALS's predictions of the same list: its scan-varying predictor (the A at each reflection's angle,
    # interpolated between the scan points), and the static crystal's (force_static)
    from dials.array_family import flex
    from dxtbx.model.experiment_list import ExperimentListFactory
    expt = ExperimentListFactory.from_json_file(os.path.join(work, "drift.expt"), check_format=False)[0]
    preds = {}
    for name, static in (("scan-varying", False), ("static", True)):
        try:
            preds[name] = flex.reflection_table.from_predictions(expt, force_static=static)
            ok, what = True, "%d reflections" % len(preds[name])
        except Exception as exc:  # noqa: BLE001 - the predictor's own error is the message
            ok, what = False, repr(exc)
        if not check(ok, "sv-predict-" + name, "DIALS's %s prediction of the list: %s" % (name, what)):
            return
    # each reflection DIALS predicts with the scan-varying crystal: the centroid of nbgrad's image of the image it
    # falls in, over a 9 x 9 box about the prediction, against the prediction and against the static crystal's
    # prediction of the same reflection
    sv, st = preds["scan-varying"], preds["static"]
    hkl_st = {tuple(h): i for i, h in enumerate(st["miller_index"])}
    xyz_sv = np.array(sv["xyzcal.px"]).reshape(-1, 3)
    xyz_st = np.array(st["xyzcal.px"]).reshape(-1, 3)
    images = [np.fromfile(os.path.join(work, "render_%05d.bin" % (f + 1)), np.float32).reshape(1024, 1024)
              for f in range(NFRAMES)]
    peak = max(float(im.max()) for im in images)
    rows = []
    for i, h in enumerate(sv["miller_index"]):
        j = hkl_st.get(tuple(h))
        x, y, z = xyz_sv[i]
        f = int(math.floor(z))
        if j is None or f < 0 or f >= NFRAMES or abs(z - f - 0.5) > 0.3:
            continue  # a reflection at an image's edge is split between two images
        x0, y0 = int(round(x)) - 4, int(round(y)) - 4
        if x0 < 0 or y0 < 0 or x0 + 9 > 1024 or y0 + 9 > 1024:
            continue
        w = images[f][y0:y0 + 9, x0:x0 + 9].astype(float)
        s = w.sum()
        if not w.max() > 0.05 * peak:
            continue  # too weak to centre on
        ys, xs = np.mgrid[y0:y0 + 9, x0:x0 + 9]
        cx, cy = (w * (xs + 0.5)).sum() / s, (w * (ys + 0.5)).sum() / s
        rows.append((z, math.hypot(cx - x, cy - y), math.hypot(cx - xyz_st[j][0], cy - xyz_st[j][1])))
    rows = np.array(rows)
    if not check(len(rows) >= 200, "sv-spots", "%d reflections centred in nbgrad's images" % len(rows)):
        return
    ends = (rows[:, 0] < 3) | (rows[:, 0] >= NFRAMES - 3)
    rms = lambda v: float(np.sqrt(np.mean(v ** 2)))
    check(rms(rows[:, 1]) < 0.25 and 3 * rms(rows[ends, 1]) <= rms(rows[ends, 2]), "sv-predictions",
          "nbgrad's spots against DIALS's scan-varying predictions: rms %.3f px over the scan, %.3f px in its first "
          "and last 3 images (%d reflections); against the static crystal's there %.3f px" % (
              rms(rows[:, 1]), rms(rows[ends, 1]), int(ends.sum()), rms(rows[ends, 2])))
    print("scan-varying: the truth's wobble %g deg at the ends of %d images" % (WOBBLE, NFRAMES))
    refine_scan_varying(nbgrad, work, crystal, truth)


def angle(Ba, Bb):
    """The rotation angle (deg) between two real-space bases (columns a, b, c): that of Ba Bb^-1."""
    R = Ba @ np.linalg.inv(Bb)
    w = np.array([R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1]])
    return math.degrees(math.asin(min(1.0, 0.5 * float(np.linalg.norm(w)))))


def refine_scan_varying(nbgrad, work, crystal, truth):
    """nbgrad refine from the list's static crystal (the truth's at the middle scan point; what a static fit of the
    scan would start from) on the noise-free images, the orientation alone, once with one crystal for the scan and
    once with -scan_varying 2 (6 knots over the 10 deg): each image boundary's crystal of the written list against
    the truth's, rms.  The scan-varying fit must be several times closer."""
    errs = {}
    for name, extra in (("static", []), ("scan-varying", ["-scan_varying", "2"])):
        out = "fit_%s.expt" % name.replace("-", "_")
        rc, t = run([nbgrad, "refine", "-expt", "drift.expt"] + crystal +
                    ["-oversample", "1", "-phisteps", "16", "-observed", "render_#####.bin", "-params", "orientation",
                     "-spots", "3", "-exptfile", out] + extra, work, "refine_%s.log" % name)
        try:
            c = json.load(open(os.path.join(work, out)))["crystal"][0]
        except (OSError, ValueError, KeyError, IndexError):
            c = None
        if c is None or rc not in (0, 4):
            check(False, "sv-refine-" + name, "nbgrad refine (exit %d)\n%s" % (
                rc, tail(os.path.join(work, "refine_%s.log" % name))))
            return
        if "A_at_scan_points" in c:
            fitted = [np.linalg.inv(np.array(A).reshape(3, 3)).T for A in c["A_at_scan_points"]]
        else:
            B = np.array([c["real_space_a"], c["real_space_b"], c["real_space_c"]]).T
            fitted = [B] * len(truth)
        e = [angle(F, T) for F, T in zip(fitted, truth)]
        errs[name] = (float(np.sqrt(np.mean(np.square(e)))), max(e), t, len(fitted))
    (rs, ws, ts, _), (rv, wv, tv, nv) = errs["static"], errs["scan-varying"]
    check(nv == len(truth) and rv * 4 < rs and wv * 4 < ws, "sv-refine",
          "nbgrad refine from the static crystal, orientation only, each scan point's crystal against the truth's: "
          "one crystal %.4f deg rms (largest %.4f; %.0f s), -scan_varying 2 %.4f deg rms (largest %.4f; %d scan points "
          "written; %.0f s): %.1fx" % (rs, ws, ts, rv, wv, nv, tv, rs / rv if rv > 0 else float("inf")))


if __name__ == "__main__":
    roundtrip.run_script(main, sys.argv[1:])
