#!/usr/bin/python3
"""Spot regions from DIALS's reflections (nbgrad refine -spotlist strong.refl) on a detector of four panels.

nbgrad renders one noisy image of a detector of 2 x 2 modules (one tilted by 2 deg) as NXmx, with the true
experiment list; dials.import and dials.find_spots find its strong spots (strong.refl, msgpack).  Then:

  - nbgrad reads the table: the count of reflections it boxes equals the table's rows (dials's flex table);
  - the spot regions from the reflections' bounding boxes hold exactly the pixels of the union of those boxes on
    their panels (computed here from the flex table's panel and bbox columns), and with -spots 0 exactly the
    distinct pixels (panel, floor(x), floor(y)) of the observed centroids (xyzobs.px.value);
  - nbgrad refine from the true list with its crystal turned by 0.1 deg, on those spot regions, fits the
    orientation back to within 0.01 deg of the truth (converged);
  - the shoeboxes (-spot_shoebox 0): the pixels nbgrad fits on are those DIALS's own flex shoeboxes mark Foreground
    or Strong (shoebox.mask, any slice), pixel for pixel: a "panel fast slow" list of exactly those pixels (-spots 0)
    gives the same pixel count and the same start and one-iteration losses to the last bit; dilated by 1 the count
    is that of the set grown here;
  - refine on the shoebox pixels (dilated by 0 and 1) recovers the turned orientation within 0.01 deg, on the
    marked pixels alone at least as well as on the best of the square boxes about the centroids (half-widths 1, 2
    and 3; within 1 %: the fits share a floor set by the noise); all errors printed;
  - the detector response DIALS reads the counts with: dials.import with geometry.detector.panel.gain=2.5 and
    pedestal=7 (dxtbx puts them on panel 0) gives a list whose panels nbgrad reads through their own responses,
    panel 0's 7 and 2.5 and the other panels' dxtbx values (0, 1), over the file's pedestal (40); -pedestal wins.

    /usr/bin/python3 tests/dials/spots.py NBGRAD_BINARY WORKDIR

Prints one PASS/FAIL line per check and "N passed, N failed".
"""
import json
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roundtrip  # noqa: E402  (its counters: roundtrip.PASSED, roundtrip.FAILED)
from roundtrip import four_modules  # noqa: E402


def check(ok, name, what):
    return roundtrip.check(ok, "spots-" + name, what)


def run(cmd, cwd, log):
    """roundtrip.run, with the log's text."""
    rc, t = roundtrip.run(cmd, cwd, log)
    with open(os.path.join(cwd, log)) as f:
        return rc, t, f.read()


def rot(axis, deg, v):
    """v turned by deg about the unit axis (Rodrigues)."""
    a = np.asarray(axis, float) / np.linalg.norm(axis)
    t = math.radians(deg)
    v = np.asarray(v, float)
    return v * math.cos(t) + np.cross(a, v) * math.sin(t) + a * np.dot(a, v) * (1 - math.cos(t))


def orientation_error(path_a, path_b):
    """The angle (deg) of the rotation between two lists' crystals (their real-space bases)."""
    def basis(p):
        with open(p) as f:
            c = json.load(f)["crystal"][0]
        return np.array([c["real_space_a"], c["real_space_b"], c["real_space_c"]]).T
    A, B = basis(path_a), basis(path_b)
    U = B @ np.linalg.inv(A)
    u, _, vt = np.linalg.svd(U)
    R = u @ vt
    return math.degrees(math.acos(max(-1.0, min(1.0, (np.trace(R) - 1) / 2))))


def main(argv):
    nbgrad = os.path.abspath(argv[0])
    work = os.path.abspath(argv[1])
    os.makedirs(work, exist_ok=True)
    crystal = ["-cell", "70", "80", "90", "90", "90", "90", "-misset", "12", "-25", "33", "-default_F", "100", "-N",
               "8", "-gauss_xtal", "-lambda", "0.9795"]
    rc, _, _ = run([nbgrad, "-dials", "-close_distance", "100"] + crystal + [
        "-detpixels", "32", "-pixel", "0.1", "-phi", "0", "-osc", "0.5", "-exptfile", "base.expt", "-nopgm",
        "-nonoise"], work, "base.log")
    if not check(rc == 0, "base", "nbgrad wrote the beam, goniometer, scan and crystal (exit %d)" % rc):
        return
    d = four_modules(os.path.join(work, "base.expt"), os.path.join(work, "in.expt"), 256, (-26.0, 26.0), 26.5, -100.0)
    # the start: the crystal turned by 0.1 deg about (1, 2, 3)
    s = json.loads(json.dumps(d))
    c = s["crystal"][0]
    for k in ("real_space_a", "real_space_b", "real_space_c"):
        c[k] = list(rot([1, 2, 3], 0.1, c[k]))
    with open(os.path.join(work, "start.expt"), "w") as f:
        json.dump(s, f, indent=1)
    flags = crystal[crystal.index("-default_F"):]
    rc, t, _ = run([nbgrad, "-expt", "in.expt"] + flags + [
        "-phisteps", "8", "-oversample", "1", "-data", "noise", "-seed", "7", "-adc", "40", "-nxsfile", "image.nxs",
        "-exptfile", "truth.expt"], work, "simulate.log")
    if not check(rc == 0, "simulate", "nbgrad wrote the four-module image as NXmx (%.1f s)" % t):
        return
    for cmd in (["dials.import", "image.nxs"], ["dials.find_spots", "imported.expt", "nproc=2"]):
        rc, t, log = run(cmd, work, cmd[0] + ".log")
        if not check(rc == 0, cmd[0][6:], "%s (%.1f s)" % (" ".join(cmd), t)):
            print(log[-2000:])
            return
    from dials.array_family import flex
    refl = flex.reflection_table.from_file(os.path.join(work, "strong.refl"))
    n = len(refl)
    panel = np.array(refl["panel"], dtype=np.int64)
    xyz = np.array(refl["xyzobs.px.value"]).reshape(-1, 3)
    bbox = np.array(refl["bbox"]).reshape(-1, 6)
    per_panel = [int((panel == q).sum()) for q in range(4)]
    check(n >= 20 and sum(1 for k in per_panel if k > 0) >= 3, "found",
          "dials.find_spots found %d spots, %s on the four panels" % (n, per_panel))
    # the expected regions: image index = panel offset + y * 256 + x
    size = 256
    boxes = set()
    for q, b in zip(panel, bbox):
        for y in range(max(b[2], 0), min(b[3], size)):
            for x in range(max(b[0], 0), min(b[1], size)):
                boxes.add(int(q) * size * size + y * size + x)
    cents = set(int(q) * size * size + int(math.floor(p[1])) * size + int(math.floor(p[0])) for q, p in zip(panel, xyz))
    base = [nbgrad, "refine", "-expt", "start.expt"] + flags + [
        "-phisteps", "8", "-oversample", "1", "-adc", "40", "-observed", "image.nxs", "-params", "orientation",
        "-spotlist", "strong.refl"]
    rc, t, log = run(base + ["-spots", "0", "-maxiter", "1"], work, "centroids.log")
    m = re.search(r"spot regions: (\d+) pixels .*: the (\d+) reflections of", log)
    got = (int(m.group(1)), int(m.group(2))) if m else None
    check(got == (len(cents), n), "centroids",
          "-spots 0: %s pixels of %s reflections read by nbgrad; the flex table's %d distinct centroid pixels of %d "
          "rows" % (got[0] if got else "?", got[1] if got else "?", len(cents), n))
    rc, t, log = run(base + ["-exptfile", "fit.expt"], work, "refine.log")
    m = re.search(r"spot regions: (\d+) pixels .*: the (\d+) reflections of .*bounding boxes", log)
    got = (int(m.group(1)), int(m.group(2))) if m else None
    check(got == (len(boxes), n), "bboxes",
          "%s pixels in the bounding boxes of %s reflections read by nbgrad; the flex table's union of %d boxes "
          "holds %d pixels" % (got[0] if got else "?", got[1] if got else "?", n, len(boxes)))
    ok = rc == 0 and "converged" in log and os.path.exists(os.path.join(work, "fit.expt"))
    e0 = orientation_error(os.path.join(work, "truth.expt"), os.path.join(work, "start.expt"))
    e1 = orientation_error(os.path.join(work, "truth.expt"), os.path.join(work, "fit.expt")) if ok else float("inf")
    if not check(ok and e1 < 0.01, "refine",
                 "refine on the .refl's spot regions (%.1f s, exit %d): orientation %.4f deg off the truth from %.4f "
                 "deg" % (t, rc, e1, e0)):
        print(log[-3000:])
    shoeboxes(refl, base, work, size, e0, e1)
    list_response(nbgrad, work, flags)


def list_response(nbgrad, work, flags):
    """A list's per-panel gain and pedestal, as dials.import's overrides set them, read by nbgrad refine."""
    rc, t, log = run(["dials.import", "image.nxs", "geometry.detector.panel.gain=2.5",
                      "geometry.detector.panel.pedestal=7", "output.experiments=gain.expt"], work, "gain-import.log")
    if not check(rc == 0, "gain-import", "dials.import with a panel's gain and pedestal (%.1f s)" % t):
        print(log[-2000:])
        return
    with open(os.path.join(work, "gain.expt")) as f:
        d = json.load(f)
    with open(os.path.join(work, "truth.expt")) as f:
        d["crystal"] = json.load(f)["crystal"]
    d["experiment"][0]["crystal"] = 0
    with open(os.path.join(work, "gain-xtal.expt"), "w") as f:
        json.dump(d, f, indent=1)
    stated = [(p["gain"], p.get("pedestal", 0.0)) for p in d["detector"][0]["panels"]]
    base = [nbgrad, "refine", "-expt", "gain-xtal.expt"] + flags + [
        "-phisteps", "8", "-oversample", "1", "-adc", "40", "-observed", "image.nxs", "-params", "scale",
        "-maxiter", "1"]
    rc, t, log = run(base, work, "gain-refine.log")
    want = ("pedestal 7 counts (the experiment list's), gain 2.5 counts/photon (the experiment list's)",
            "the panels' own detector response (the experiment's panels): panel 0 pedestal 7, gain 2.5")
    check(stated[0] == (2.5, 7.0) and all(x == (1.0, 0.0) for x in stated[1:]) and all(w in log for w in want),
          "list-response", "DIALS's list states %s; nbgrad reads the observed counts with them: %s" %
          (stated, "yes" if all(w in log for w in want) else "no (exit %d):\n%s" % (rc, log[-1500:])))
    rc, t, log = run(base + ["-pedestal", "40"], work, "gain-refine-option.log")
    check("pedestal 40 counts (-pedestal), gain 2.5 counts/photon (the experiment list's)" in log and
          "panel 0 pedestal 40, gain 2.5" in log, "list-response-option",
          "-pedestal 40 wins over the list's, the list's gains kept%s" % ("" if "(-pedestal)" in log else
                                                                          ":\n" + log[-1500:]))


def shoeboxes(refl, base, work, size, e0, e_bbox):
    """The -spot_shoebox checks: nbgrad's pixels against DIALS's flex masks, and refine on them against squares."""
    fg = 4 | 8  # DIALS's MaskCode Foreground | Strong
    sb = refl["shoebox"]
    spot = set()
    for k in range(len(sb)):
        b = sb[k].bbox
        m = np.array(sb[k].mask, dtype=np.int64).reshape(b[5] - b[4], b[3] - b[2], b[1] - b[0])
        ys, xs = np.nonzero((m & fg).any(axis=0))
        for y, x in zip(ys + b[2], xs + b[0]):
            spot.add((int(sb[k].panel), int(x), int(y)))
    with open(os.path.join(work, "fg.txt"), "w") as f:
        for q, x, y in sorted(spot):
            f.write("%d %d %d\n" % (q, x, y))
    def fit_json(extra, tag):
        rc, _, log = run(base[:-1] + extra + ["-maxiter", "1", "-json", tag + ".json"], work, tag + ".log")
        try:
            with open(os.path.join(work, tag + ".json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            print(log[-2000:])
            return None
    a = fit_json(["strong.refl", "-spot_shoebox", "0"], "sb0")
    b = fit_json(["fg.txt", "-spots", "0"], "fgtxt")
    key = ("pixels", "start_loss", "final_loss")
    got = tuple(a[k] for k in key) if a else None
    want = tuple(b[k] for k in key) if b else None
    check(a is not None and got == want and got[0] == len(spot), "shoebox-pixels",
          "-spot_shoebox 0: %s pixels, start and 1-iteration loss %s; DIALS's flex masks mark %d pixels Foreground "
          "or Strong, fitted as a pixel list: %s" % (got[0] if got else "?", got[1:] if got else "?", len(spot),
                                                      want))
    grown = set()
    for q, x, y in spot:
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                if 0 <= x + dx < size and 0 <= y + dy < size:
                    grown.add((q, x + dx, y + dy))
    c = fit_json(["strong.refl", "-spot_shoebox", "1"], "sb1")
    check(c is not None and c["pixels"] == len(grown), "shoebox-dilate",
          "-spot_shoebox 1: %s pixels; DIALS's marked pixels grown by one (clipped at the panels): %d" %
          (c["pixels"] if c else "?", len(grown)))
    # refine from the turned crystal on each kind of region
    errs = {}
    for tag, extra in (("shoebox0", ["-spot_shoebox", "0"]), ("shoebox1", ["-spot_shoebox", "1"]),
                       ("square1", ["-spots", "1"]), ("square2", ["-spots", "2"]), ("square3", ["-spots", "3"])):
        out = "fit-%s.expt" % tag
        rc, t, log = run(base + extra + ["-exptfile", out], work, "refine-%s.log" % tag)
        m = re.search(r"spot regions: (\d+) pixels", log)
        ok = rc == 0 and "converged" in log and os.path.exists(os.path.join(work, out))
        e = orientation_error(os.path.join(work, "truth.expt"), os.path.join(work, out)) if ok else float("inf")
        errs[tag] = e
        print("  refine on %-8s: %6s pixels, orientation %.7f deg off the truth (from %.4f; %.1f s, exit %d)" %
              (tag, m.group(1) if m else "?", e, e0, t, rc))
    print("  refine on the bounding boxes: orientation %.7f deg off the truth" % e_bbox)
    best_sq = min(errs["square1"], errs["square2"], errs["square3"])
    # at least as well: within 1 % of the best square (the fits share a floor set by the noise)
    check(max(errs["shoebox0"], errs["shoebox1"]) < 0.01 and errs["shoebox0"] <= 1.01 * best_sq,
          "shoebox-refine",
          "refine on the shoebox pixels: %.7f deg (dilated by 1: %.7f) off the truth; on squares of half-width "
          "1, 2, 3 about the centroids: %.7f, %.7f, %.7f" % (errs["shoebox0"], errs["shoebox1"], errs["square1"],
                                                             errs["square2"], errs["square3"]))


if __name__ == "__main__":
    roundtrip.run_script(main, sys.argv[1:])
