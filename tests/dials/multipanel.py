#!/usr/bin/python3
"""Multi-panel files through DIALS's dxtbx: nbgrad renders a small detector of four panels (different sizes, one
turned in its plane by 90 deg, one tilted by 20 deg with larger pixels, one nearer the sample) that a hand-made
experiment list describes, and writes it as NXmx (-nxsfile), as an experiment list (-exptfile) and as raw floats
(-floatfile).  dxtbx reads the NXmx file and the list; for every panel of each:

  - fast and slow axes and the origin equal the input list's within 1e-6 (mm for the origin);
  - the pixel size and the image size are the input's exactly;
  - (NXmx) the panel's pixels, as dxtbx's get_raw_data gives them, equal nbgrad's float image's slice exactly.

Then hierarchies (dxtbx writes each panel's and group's vectors in its parent group's frame): the list dxtbx writes
for the NXmx file's detector (its root group not the identity), and the list with its root group turned and moved
as dials.refine moves groups, are read by nbgrad (-expt) and written back (-exptfile, global vectors under an
identity root); every panel nbgrad read sits where dxtbx puts it (within 1e-6), and renders the same image.
And the hierarchies nbgrad writes: the CSPAD layout's 32 modules as groups of its list (dxtbx reads 32 groups of 2
panels, each panel where the flat list puts it), one group moved in dxtbx, read by nbgrad and written back with
its groups.  Last, the whole detector refined through DIALS's hierarchy: the CSPAD layout as NXmx with noise, read
by dxtbx as a three-level hierarchy, its level-1 group moved 0.7 mm and the crystal turned; nbgrad refines the
whole detector's shifts (its distance and beam position) with the orientation and puts every panel back within
0.01 mm (detector_refine).

    /usr/bin/python3 tests/dials/multipanel.py NBGRAD_BINARY WORKDIR

Prints one PASS/FAIL line per check, a table of the panels read back, and "N passed, N failed".
"""
import json
import math
import os
import subprocess
import sys

import numpy as np

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


def rot_y(deg, v):
    a = math.radians(deg)
    c, s = math.cos(a), math.sin(a)
    return [c * v[0] + s * v[2], v[1], -s * v[0] + c * v[2]]


# name, (fast, slow) pixels, pixel mm, fast, slow, origin (DIALS's frame, mm); the beam along -z
PANELS = [
    ("wide", (64, 48), 0.1, [1, 0, 0], [0, -1, 0], [-8.0, 6.0, -100.0]),
    ("turned", (40, 30), 0.1, [0, -1, 0], [-1, 0, 0], [8.0, 6.0, -100.0]),
    ("tilted", (50, 40), 0.15, rot_y(20, [1, 0, 0]), [0, -1, 0], [-8.0, -2.0, -100.0]),
    ("near", (32, 32), 0.1, [1, 0, 0], [0, -1, 0], [3.0, -3.0, -90.0]),
]


def make_input(nbgrad, work):
    """A one-panel list from nbgrad (beam, goniometer, scan, crystal), its detector replaced by the panels."""
    subprocess.check_call([nbgrad, "-cell", "40", "50", "60", "90", "90", "90", "-lambda", "1.0", "-distance",
                           "100", "-detpixels", "32", "-pixel", "0.1", "-default_F", "1", "-exptfile", "base.expt"],
                          cwd=work, stdout=subprocess.DEVNULL)
    with open(os.path.join(work, "base.expt")) as f:
        d = json.load(f)
    p0 = d["detector"][0]["panels"][0]
    panels = []
    for name, size, px, fast, slow, origin in PANELS:
        p = dict(p0)
        p.update({"name": name, "image_size": list(size), "pixel_size": [px, px], "fast_axis": fast,
                  "slow_axis": slow, "origin": origin})
        panels.append(p)
    d["detector"][0]["panels"] = panels
    d["detector"][0]["hierarchy"]["children"] = [{"panel": k} for k in range(len(panels))]
    d["imageset"] = []
    d["experiment"][0].pop("imageset", None)
    with open(os.path.join(work, "in.expt"), "w") as f:
        json.dump(d, f, indent=1)


def compare(tag, detector, raw, image):
    rows = []
    check(len(detector) == len(PANELS), tag + "-count", "%d panels, %d written" % (len(detector), len(PANELS)))
    off = 0
    for k, (name, size, px, fast, slow, origin) in enumerate(PANELS):
        if k >= len(detector):
            break
        p = detector[k]
        df = np.max(np.abs(np.subtract(p.get_fast_axis(), np.array(fast) / np.linalg.norm(fast))))
        ds = np.max(np.abs(np.subtract(p.get_slow_axis(), np.array(slow) / np.linalg.norm(slow))))
        do = np.max(np.abs(np.subtract(p.get_origin(), origin)))
        check(df < 1e-6 and ds < 1e-6 and do < 1e-6, "%s-panel%d-geometry" % (tag, k),
              "fast off by %.2g, slow by %.2g, origin by %.2g mm" % (df, ds, do))
        ok = tuple(p.get_pixel_size()) == (px, px) and tuple(p.get_image_size()) == size
        check(ok, "%s-panel%d-size" % (tag, k), "pixel %s mm, image %s" % (p.get_pixel_size(), p.get_image_size()))
        n = size[0] * size[1]
        dd = None
        if raw is not None:
            a = raw[k].as_numpy_array().astype(np.float64)
            want = image[off:off + n].reshape(size[1], size[0]).astype(np.float64)
            same = a.shape == want.shape and np.array_equal(a, want)
            dd = float(np.max(np.abs(a - want))) if a.shape == want.shape else float("inf")
            check(same and want.sum() > 0, "%s-panel%d-pixels" % (tag, k),
                  "shape %s, largest difference %g, sum %.6g (nbgrad's %.6g)" % (a.shape, dd, a.sum(), want.sum()))
        off += n
        rows.append((tag, k, p.get_name(), df, ds, do, p.get_pixel_size()[0], p.get_image_size(), dd))
    return rows


def worst_placement(a, b):
    """The largest difference between two detectors' panels: axes, and origins in mm."""
    w = 0.0
    for k in range(len(a)):
        for va, vb in ((a[k].get_fast_axis(), b[k].get_fast_axis()), (a[k].get_slow_axis(), b[k].get_slow_axis()),
                       (a[k].get_origin(), b[k].get_origin())):
            w = max(w, float(np.max(np.abs(np.subtract(va, vb)))))
    return w


def hierarchies(nbgrad, work, el, nx_detector, image):
    """The detector as dxtbx writes it with groups (NXmx's, and one whose root group dials.refine would move), read
    by nbgrad and written back: each panel where dxtbx puts it, the image the same."""
    from dxtbx.model.experiment_list import ExperimentListFactory
    from scitbx import matrix
    rows = []
    cases = [("imported", nx_detector, None)]
    # the root group turned by 0.2 deg about the beam and moved by 0.5 mm, as dials.refine moves a group
    turn = matrix.col((0, 0, 1)).axis_and_angle_as_r3_rotation_matrix(0.2, deg=True)
    cases.append(("moved", el[0].detector, (turn, matrix.col((0.5, -0.3, 0.2)))))
    for tag, det, move in cases:
        exp = el[0]
        exp.detector = det
        if move is not None:
            root = det.hierarchy()
            f, s, o = (matrix.col(v) for v in (root.get_local_fast_axis(), root.get_local_slow_axis(),
                                               root.get_local_origin()))
            root.set_local_frame((move[0] * f).elems, (move[0] * s).elems, (move[0] * o + move[1]).elems)
        name = tag + ".expt"
        el.as_file(os.path.join(work, name))
        with open(os.path.join(work, name)) as fh:
            d = json.load(fh)
        h = d["detector"][0]["hierarchy"]
        nonid = max(abs(a - b) for a, b in zip(h["fast_axis"] + h["slow_axis"] + h["origin"],
                                                [1, 0, 0, 0, 1, 0, 0, 0, 0]))
        if move is not None:  # dxtbx's own list of nbgrad's NXmx file may or may not turn its root group
            check(nonid > 1e-3, tag + "-hierarchy", "dxtbx wrote the panels under a root group that is not the "
                  "identity (largest difference %.3g)" % nonid)
        d["imageset"] = []
        d["experiment"][0].pop("imageset", None)
        with open(os.path.join(work, name), "w") as fh:
            json.dump(d, fh, indent=1)
        back = tag + "-back.expt"
        rc = subprocess.call([nbgrad, "-expt", name, "-default_F", "100", "-N", "5", "-water", "2", "-data", "float",
                              "-floatfile", tag + ".bin", "-exptfile", back], cwd=work,
                             stdout=open(os.path.join(work, tag + ".log"), "w"), stderr=subprocess.STDOUT)
        if not check(rc == 0, tag + "-read", "nbgrad read and rendered %s (exit %d; %s.log)" % (name, rc, tag)):
            continue
        got = ExperimentListFactory.from_json_file(os.path.join(work, back), check_format=False)[0].detector
        worst = worst_placement(det, got) if len(got) == len(det) else float("inf")
        check(len(got) == len(det) and worst < 1e-6, tag + "-placed",
              "%d panels where dxtbx puts them: largest difference %.2g (mm for origins)" % (len(got), worst))
        if move is not None:
            # the root group's frame written back as the list has it (dials.refine's turn and shift), not the identity
            ra, rb = det.hierarchy(), got.hierarchy()
            wr = max(abs(a - b) for a, b in zip(ra.get_fast_axis() + ra.get_slow_axis() + ra.get_origin(),
                                                rb.get_fast_axis() + rb.get_slow_axis() + rb.get_origin()))
            check(wr < 1e-9, tag + "-root-frame", "the root group's frame written back as the list has it: largest "
                  "difference %.2g (its turn and shift: %.3g)" % (wr, nonid))
        if move is None:
            img = np.fromfile(os.path.join(work, tag + ".bin"), dtype=np.float32)
            dd = float(np.max(np.abs(img - image))) if img.size == image.size else float("inf")
            check(dd <= 1e-6 * float(image.max()), tag + "-image",
                  "the image from dxtbx's list is nbgrad's own: largest difference %.3g of %.4g" % (dd, image.max()))
        rows.append((tag, 0, "(all panels)", worst, worst, worst, det[0].get_pixel_size()[0],
                     det[0].get_image_size(), None))
    return rows


def layout_groups(nbgrad, work):
    """Hierarchies nbgrad writes: the CSPAD layout's 4 quadrants of 8 modules of two panels as groups of the list's
    hierarchy, two levels (as DIALS's CSPAD lists have them).  dxtbx reads 4 groups of 8 groups of 2 panels, every
    panel where dxtbx's reading of the NXmx file of the same run (written by nbgrad's other writer, modules of
    panels) puts it; a module turned and moved in dxtbx, as dials.refine moves one, is read by nbgrad and written
    back with its groups, every panel where dxtbx puts it."""
    from dxtbx.model.experiment_list import ExperimentListFactory
    from scitbx import matrix
    import dxtbx
    base = ["-layout", "cspad", "-distance", "100", "-cell", "70", "80", "90", "90", "90", "90", "-default_F", "100",
            "-N", "5", "-oversample", "1", "-nopgm", "-nonoise"]
    rc = subprocess.call([nbgrad] + base + ["-exptfile", "cspad_groups.expt", "-nxsfile", "cspad_layout.nxs"],
                         cwd=work, stdout=open(os.path.join(work, "cspad_groups.log"), "w"), stderr=subprocess.STDOUT)
    if not check(rc == 0, "layout-groups", "nbgrad wrote the CSPAD layout's list and NXmx file (exit %d)" % rc):
        return []
    load = lambda name: ExperimentListFactory.from_json_file(os.path.join(work, name), check_format=False)
    el = load("cspad_groups.expt")
    det = el[0].detector
    ndet = dxtbx.load(os.path.join(work, "cspad_layout.nxs")).get_detector()
    quads = list(det.hierarchy())
    modules = [m for q in quads for m in q]
    sizes = sorted(set(len(m) for m in modules))
    w = worst_placement(det, ndet)
    check(len(quads) == 4 and all(len(q) == 8 for q in quads) and sizes == [2] and w < 1e-6, "layout-hierarchy",
          "dxtbx reads %d groups (quadrants) of %s groups (modules) of %s panels; every panel where the NXmx file puts "
          "it: largest difference %.2g (mm for origins)" % (len(quads), sorted(set(len(q) for q in quads)), sizes, w))
    # module 3 of quadrant 1 turned by 0.3 deg about its normal and moved, as dials.refine moves a group
    g = list(quads[1])[3]
    f, s_, o = (matrix.col(v) for v in (g.get_local_fast_axis(), g.get_local_slow_axis(), g.get_local_origin()))
    turn = f.cross(s_).normalize().axis_and_angle_as_r3_rotation_matrix(0.3, deg=True)
    g.set_local_frame((turn * f).elems, (turn * s_).elems, (o + matrix.col((0.4, -0.2, 0.1))).elems)
    el.as_file(os.path.join(work, "cspad_moved.expt"))
    rc = subprocess.call([nbgrad, "-expt", "cspad_moved.expt", "-default_F", "100", "-N", "5", "-oversample", "1",
                          "-nopgm", "-nonoise", "-exptfile", "cspad_back.expt"], cwd=work,
                         stdout=open(os.path.join(work, "cspad_back.log"), "w"), stderr=subprocess.STDOUT)
    if not check(rc == 0, "layout-moved-read", "nbgrad read the list with a module moved (exit %d)" % rc):
        return []
    moved = load("cspad_moved.expt")[0].detector
    back = load("cspad_back.expt")[0].detector
    w2, w3 = worst_placement(moved, back), worst_placement(moved, ndet)
    bq = list(back.hierarchy())
    check(len(bq) == 4 and all(len(q) == 8 for q in bq) and w2 < 1e-6 and w3 > 0.1, "layout-moved-placed",
          "written back with its 4 x 8 groups, every panel where dxtbx puts it: largest difference %.2g (the move: "
          "%.2g mm)" % (w2, w3))
    return [("cspad", 0, "(all panels, groups)", w, w, w, det[0].get_pixel_size()[0], det[0].get_image_size(), None),
            ("moved", 0, "(all panels, group 3 moved)", w2, w2, w2, det[0].get_pixel_size()[0],
             det[0].get_image_size(), None)]


def detector_refine(nbgrad, work):
    """The whole detector refined through DIALS's hierarchy: nbgrad renders the CSPAD layout (64 panels) with
    Poisson noise as NXmx; dxtbx reads it as a hierarchy (root, the detector's translation group, 64 module groups
    of one panel each); the translation group is moved (0.3, -0.25, 0.6) mm, as dials.refine moves a level-1 group
    (the beam position and the distance), and the crystal turned by 0.05 deg.  nbgrad refines from that list the
    whole detector's shifts (-panel_groups detector, and level1: the same group) with the orientation, on its spot
    regions, and the whole detector as DIALS's multi-panel parameterisation does (Dist, Shift1, Shift2, Tau2, Tau3
    in the frame of the panel the beam meets: distance, beam_fast, beam_slow, det_tau2, det_tau3, its tilts free
    too; Tau1, the turn about the normal, which lies along the beam, is on a still the crystal's turn about the beam:
    nbgrad refuses the pair as undetermined); every refined panel must
    sit where the truth's does, within 0.01 mm (the move: 0.71 mm), and the fit must explain the image within its
    noise.  dxtbx's NXmx reader ignores the file's polarization (fraction 0.999,
    reference/dials-interop.md), so the list is given the truth's 0.5 as `dials.import polarization_fraction=0.5`
    would."""
    from dxtbx.model.experiment_list import ExperimentListFactory
    from scitbx import matrix
    rc = subprocess.call([nbgrad, "-layout", "cspad", "-distance", "100", "-cell", "70", "80", "90", "90", "90",
                          "90", "-misset", "10", "20", "30", "-default_F", "100", "-N", "5", "-oversample", "1",
                          "-lambda", "1.3", "-nopgm", "-data", "noise", "-seed", "11", "-nxsfile", "det_truth.nxs",
                          "-exptfile", "det_truth.expt"], cwd=work,
                         stdout=open(os.path.join(work, "det_truth.log"), "w"), stderr=subprocess.STDOUT)
    if not check(rc == 0, "detector-render", "nbgrad rendered the CSPAD layout as NXmx (exit %d)" % rc):
        return []
    nx = ExperimentListFactory.from_filenames([os.path.join(work, "det_truth.nxs")])
    truth = ExperimentListFactory.from_json_file(os.path.join(work, "det_truth.expt"), check_format=False)
    det = nx[0].detector
    top = list(det.hierarchy())
    if not check(len(top) == 1 and top[0].is_group() and len(det) == 64, "detector-hierarchy",
                 "dxtbx reads %d panels under %d level-1 group(s)" % (len(det), len(top))):
        return []
    want = [matrix.col(p.get_origin()) for p in det]
    g = top[0]
    f, s_, o = (matrix.col(v) for v in (g.get_local_fast_axis(), g.get_local_slow_axis(), g.get_local_origin()))
    g.set_local_frame(f.elems, s_.elems, (o + matrix.col((0.3, -0.25, 0.6))).elems)
    nx[0].beam.set_polarization_fraction(0.5)
    cr = truth[0].crystal
    U_true = matrix.sqr(cr.get_U())  # (cr is changed below)
    turn = matrix.col((1, 1, 0)).normalize().axis_and_angle_as_r3_rotation_matrix(0.05, deg=True)
    cr.set_U((turn * matrix.sqr(cr.get_U())).elems)
    nx[0].crystal = cr
    nx.as_file(os.path.join(work, "det_start.expt"))
    moved = max((matrix.col(p.get_origin()) - w).length() for p, w in zip(det, want))
    rows = []
    for level in ("detector", "level1", "frame"):
        out = "det_refined_%s.expt" % level
        log = os.path.join(work, "det_refine_%s.log" % level)
        how = (["-params", "distance,beam_fast,beam_slow,det_tau2,det_tau3,orientation"] if level == "frame" else
               ["-panel_groups", level, "-params", "panel_shift,orientation"])
        rc = subprocess.call([nbgrad, "refine", "-expt", "det_start.expt", "-observed", "det_truth.nxs",
                              "-default_F", "100", "-N", "5", "-oversample", "1"] + how +
                             ["-spots", "3", "-exptfile", out], cwd=work,
                             stdout=open(log, "w"), stderr=subprocess.STDOUT)
        text = open(log).read()
        gof = [ln for ln in text.splitlines() if ln.startswith("goodness of fit")]
        if not check(rc == 0, "detector-refine-" + level, "refine %s converged within the noise "
                     "(exit %d; %s)" % (" ".join(how), rc, gof[0][:110] if gof else log)):
            continue
        back = ExperimentListFactory.from_json_file(os.path.join(work, out), check_format=False)[0]
        err = max((matrix.col(p.get_origin()) - w).length() for p, w in zip(back.detector, want))
        dU = matrix.sqr(back.crystal.get_U()) * U_true.transpose()
        ang = math.degrees(math.acos(max(-1.0, min(1.0, (dU.trace() - 1) / 2))))
        check(err < 0.01 and moved > 0.7 and ang < 0.002, "detector-placed-" + level,
              "every panel where the truth's is: largest origin error %.4f mm (start %.3f mm); orientation %.5f deg "
              "from the truth (start 0.05)" % (err, moved, ang))
        print("detector refined (%s): panel origins %.3f -> %.4f mm, orientation 0.05 -> %.5f deg"
              % (" ".join(how), moved, err, ang))
    return rows


def beam_refine(nbgrad, work):
    """The beam's direction refined on DIALS's detector: the CSPAD list of detector_refine (64 panels, in the frame
    of the panel the beam meets) with its beam turned by 0.1 deg, as
    dials.refine refines a beam (its two angles); nbgrad refines beam_tilt1, beam_tilt2 with the orientation from
    that list, and the list it writes back must give the truth's beam direction within 0.01 deg (the turn: 0.1)."""
    from dxtbx.model.experiment_list import ExperimentListFactory
    from scitbx import matrix
    if not os.path.exists(os.path.join(work, "det_truth.nxs")):
        return []
    nx = ExperimentListFactory.from_filenames([os.path.join(work, "det_truth.nxs")])
    truth = ExperimentListFactory.from_json_file(os.path.join(work, "det_truth.expt"), check_format=False)
    nx[0].beam.set_polarization_fraction(0.5)
    nx[0].crystal = truth[0].crystal
    d_true = matrix.col(nx[0].beam.get_s0()).normalize()
    turn = matrix.col((1, 2, 0)).normalize().axis_and_angle_as_r3_rotation_matrix(0.1, deg=True)
    nx[0].beam.set_direction((turn * matrix.col(nx[0].beam.get_sample_to_source_direction())).elems)
    nx.as_file(os.path.join(work, "beam_start.expt"))
    log = os.path.join(work, "beam_refine.log")
    rc = subprocess.call([nbgrad, "refine", "-expt", "beam_start.expt", "-observed", "det_truth.nxs",
                          "-default_F", "100", "-N", "5", "-oversample", "1", "-params",
                          "beam_tilt1,beam_tilt2,orientation", "-spots", "3", "-exptfile", "beam_refined.expt"],
                         cwd=work, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    if not check(rc == 0, "beam-refine", "refine -params beam_tilt1,beam_tilt2,orientation on 64 lab-frame panels "
                 "converged (exit %d; %s)" % (rc, log)):
        return []
    back = ExperimentListFactory.from_json_file(os.path.join(work, "beam_refined.expt"), check_format=False)[0]
    d_back = matrix.col(back.beam.get_s0()).normalize()
    d_start = matrix.col(nx[0].beam.get_s0()).normalize()
    ang = math.degrees(d_back.angle(d_true))
    ang0 = math.degrees(d_start.angle(d_true))
    check(ang < 0.01 and ang0 > 0.09, "beam-direction",
          "dxtbx reads the refined beam %.5f deg from the truth's (start %.3f deg)" % (ang, ang0))
    print("beam direction refined on the CSPAD's lab-frame panels: %.3f -> %.5f deg" % (ang0, ang))
    return []


def main(argv):
    nbgrad, work = os.path.abspath(argv[0]), argv[1]
    os.makedirs(work, exist_ok=True)
    make_input(nbgrad, work)
    rc = subprocess.call([nbgrad, "-expt", "in.expt", "-default_F", "100", "-N", "5", "-water", "2", "-data",
                          "float", "-floatfile", "mp.bin", "-nxsfile", "mp.nxs", "-exptfile", "mp.expt"], cwd=work,
                         stdout=open(os.path.join(work, "nbgrad.log"), "w"), stderr=subprocess.STDOUT)
    if not check(rc == 0, "render", "nbgrad wrote the multi-panel files (exit %d; %s/nbgrad.log)" % (rc, work)):
        print("0 passed, 1 failed")
        return 1
    image = np.fromfile(os.path.join(work, "mp.bin"), dtype=np.float32)
    check(image.size == sum(s[0] * s[1] for _, s, *_ in PANELS), "float-size", "%d pixels" % image.size)
    from dxtbx.model.experiment_list import ExperimentListFactory
    nx = ExperimentListFactory.from_filenames([os.path.join(work, "mp.nxs")])
    fmt = nx[0].imageset.get_format_class().__name__
    check(fmt == "FormatNXmx", "nxmx-format", "read by %s" % fmt)
    rows = compare("nxmx", nx[0].detector, nx[0].imageset.get_raw_data(0), image)
    el = ExperimentListFactory.from_json_file(os.path.join(work, "mp.expt"), check_format=True)
    rows += compare("expt", el[0].detector, el[0].imageset.get_raw_data(0), image)
    rows += hierarchies(nbgrad, work, el, nx[0].detector, image)
    rows += layout_groups(nbgrad, work)
    rows += detector_refine(nbgrad, work)
    rows += beam_refine(nbgrad, work)
    print("\nfile  panel  name                                   fast      slow      origin(mm)  pixel  image     "
          "pixels")
    for tag, k, name, df, ds, do, px, size, dd in rows:
        print("%-5s %5d  %-36s  %.1e   %.1e   %.1e     %.3f  %-8s  %s" % (
            tag, k, name[-36:], df, ds, do, px, "%dx%d" % tuple(size), "-" if dd is None else "max diff %g" % dd))
    print("%d passed, %d failed" % (PASSED, FAILED))
    return 0 if FAILED == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
