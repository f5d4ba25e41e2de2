#!/usr/bin/python3
"""A multi-axis goniometer through the real client: dials.import reads the SmarGon full CBF of ../shared/data/real
(Diamond I03, a Pilatus 6M: dxtbx's MultiAxisGoniometer of GON_PHI, GON_CHI, GON_OMEGA at 45 deg, scanning omega);
a crystal is put in its list, and a second list gets a hand-built kappa goniometer scanning its middle axis (so that
both its fixed and its setting rotation are not the identity).  nbgrad renders each list and writes it back
(-exptfile); dxtbx reads nbgrad's list.  Checks, for each:

  - nbgrad's list is read by dxtbx as a MultiAxisGoniometer with the input's names, axes, angles and scan axis;
  - its setting rotation, fixed rotation and rotation axis (dxtbx's own, derived from them) equal the input's to
    1e-12, and the crystal's A to 1e-10 relative;
  - the images rendered from the input list and from nbgrad's list agree (a region about the beam, to 1e-6 of the
    peak: the crystal passes through nbgrad's cell and misset on the way);
  - refine (-params goniometer, the spindle's two tilts) from the list against an image of the same list with its
    scan axis turned by 0.3 deg writes a list that keeps every axis but the scan axis, the names, the angles and the
    fixed and setting rotations (1e-12), with dxtbx's rotation axis the truth's within 0.003 deg (noise-free images);
  - nbgrad writes the list's experiment as NXmx (-nxsfile, 2 frames: dxtbx takes the scan axis from the angles that
    vary) and full CBF (-cbffile): dxtbx reads each as a MultiAxisGoniometer with the input's names, axes, angles
    (the scan axis's is the frame's start) and scan axis, its setting and fixed rotations and rotation axis the
    input's to 1e-9; nbgrad reads each file back (the helper $NBG_CBFPANELS -geometry: nbg_read_image's geometry
    with the list's crystal, as a list) with the same goniometer, and renders from it the image of the input list
    (the region above, to 1e-6 of the peak).

    /usr/bin/python3 tests/dials/goniometer.py NBGRAD_BINARY WORKDIR

Prints one PASS/FAIL line per check and "N passed, N failed".
"""
import gzip
import math
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roundtrip  # noqa: E402
from roundtrip import check, run, tail  # noqa: E402

REAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data", "real")
CBF = os.path.join(REAL, "image_examples", "DLS_I03_smargon_0001.cbf.gz")
TILT_DEG = 0.3
RENDER = ["-default_F", "100", "-N", "5", "-oversample", "1", "-phisteps", "2", "-nopgm", "-nonoise"]
ROI = ["-roi", "1150", "1349", "1150", "1349"]


def load(path):
    from dxtbx.model.experiment_list import ExperimentListFactory
    return ExperimentListFactory.from_json_file(path, check_format=False)


def gonio_of(path):
    return load(path)[0].goniometer


def close(a, b, tol):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b))) <= tol * max(1.0, float(np.max(np.abs(b))))


def render(nbgrad, work, expt, name, extra=()):
    rc, t = run([nbgrad, "-expt", expt] + RENDER + ROI + list(extra) + ["-floatfile", name + ".bin", "-exptfile",
                                                                        name + ".expt"], work, name + ".log")
    return rc, t


def compare(nbgrad, work, tag, src):
    """src: the input list (in work); nbgrad renders it, writes it back, and the written list is compared."""
    rc, t = render(nbgrad, work, src, tag + "_out")
    if not check(rc == 0, "gon-%s-write" % tag, "nbgrad rendered %s and wrote it back (%.1f s)" % (src, t)):
        print(tail(os.path.join(work, tag + "_out.log")))
        return
    from dxtbx.model import GoniometerFactory, MultiAxisGoniometer
    from scitbx.array_family import flex
    gi, go = gonio_of(os.path.join(work, src)), gonio_of(os.path.join(work, tag + "_out.expt"))
    multi = isinstance(go, MultiAxisGoniometer)
    check(multi and list(go.get_names()) == list(gi.get_names()) and go.get_scan_axis() == gi.get_scan_axis() and
          close(list(go.get_axes()), list(gi.get_axes()), 0) and close(list(go.get_angles()), list(gi.get_angles()), 0),
          "gon-%s-axes" % tag, "dxtbx reads nbgrad's list as a %s: names %s, scan axis %d, the input's axes and angles "
          "exactly" % (type(go).__name__, list(go.get_names()), go.get_scan_axis()))
    if not multi:
        return
    ds = np.max(np.abs(np.subtract(go.get_setting_rotation(), gi.get_setting_rotation())))
    df = np.max(np.abs(np.subtract(go.get_fixed_rotation(), gi.get_fixed_rotation())))
    da = np.max(np.abs(np.subtract(go.get_rotation_axis(), gi.get_rotation_axis())))
    check(ds <= 1e-12 and df <= 1e-12 and da <= 1e-12, "gon-%s-rotations" % tag,
          "setting rotation, fixed rotation and rotation axis as the input's (largest differences %.2g, %.2g, %.2g; "
          "setting - I up to %.3g, fixed - I up to %.3g)" % (
              ds, df, da, np.max(np.abs(np.subtract(gi.get_setting_rotation(), np.eye(3).ravel()))),
              np.max(np.abs(np.subtract(gi.get_fixed_rotation(), np.eye(3).ravel())))))
    ci = load(os.path.join(work, src))[0].crystal
    co = load(os.path.join(work, tag + "_out.expt"))[0].crystal
    Ai, Ao = np.array(ci.get_A()), np.array(co.get_A())
    dA = float(np.max(np.abs(Ao - Ai)) / np.max(np.abs(Ai)))
    check(dA <= 1e-10, "gon-%s-crystal" % tag, "the crystal's A in dxtbx's frame as the input's (relative difference "
          "%.2g)" % dA)
    # the image of nbgrad's list against the image of the input list
    rc, t = render(nbgrad, work, tag + "_out.expt", tag + "_again")
    a = np.fromfile(os.path.join(work, tag + "_out.bin"), dtype=np.float32)
    b = np.fromfile(os.path.join(work, tag + "_again.bin"), dtype=np.float32) if rc == 0 else np.zeros(1)
    peak = float(a.max()) if a.size else 0.0
    d = float(np.max(np.abs(a - b))) / peak if rc == 0 and a.shape == b.shape and peak > 0 else math.inf
    check(peak > 0 and d <= 1e-6, "gon-%s-image" % tag, "the image from nbgrad's list as the input list's (a %s-pixel "
          "region about the beam, peak %.4g photons, max |diff| / peak %.2g)" % (ROI[1:], peak, d))
    # a tilted spindle, as refine fits it: the truth's scan axis turned by TILT_DEG; refine from the input list with
    # -params goniometer writes the scan axis it found and nothing else changed
    truth = load(os.path.join(work, src))
    k = gi.get_scan_axis()
    axes = [tuple(v) for v in gi.get_axes()]
    e = np.array(axes[k]) / np.linalg.norm(axes[k])
    perp = np.cross(e, (0.0, 0.0, 1.0))
    perp /= np.linalg.norm(perp)
    t = math.radians(TILT_DEG)
    axes[k] = tuple(math.cos(t) * e + math.sin(t) * perp)
    truth[0].goniometer = GoniometerFactory.multi_axis(
        axes=flex.vec3_double(axes), angles=flex.double(list(gi.get_angles())),
        names=flex.std_string(list(gi.get_names())), scan_axis=k)
    truth.as_file(os.path.join(work, tag + "_truth.expt"))
    rc, t0 = render(nbgrad, work, tag + "_truth.expt", tag + "_truth_img")
    rc2, t1 = run([nbgrad, "refine", "-expt", src] + RENDER + ROI + [
        "-observed", tag + "_truth_img.bin", "-params", "goniometer", "-exptfile", tag + "_refined.expt", "-json",
        tag + "_refined.json"], work, tag + "_refine.log") if rc == 0 else (rc, 0)
    if not check(rc2 == 0, "gon-%s-refine" % tag, "nbgrad refine -params goniometer from %s against an image of its "
                 "scan axis turned by %g deg (%.1f s)" % (src, TILT_DEG, t1)):
        print(tail(os.path.join(work, tag + "_refine.log")))
        return
    gt, gr = gonio_of(os.path.join(work, tag + "_truth.expt")), gonio_of(os.path.join(work, tag + "_refined.expt"))
    others = [i for i in range(len(axes)) if i != k]
    kept = isinstance(gr, MultiAxisGoniometer) and list(gr.get_names()) == list(gi.get_names()) and \
        gr.get_scan_axis() == k and close(list(gr.get_angles()), list(gi.get_angles()), 0) and \
        all(close(gr.get_axes()[i], gi.get_axes()[i], 0) for i in others)
    dsf = max(np.max(np.abs(np.subtract(gr.get_setting_rotation(), gi.get_setting_rotation()))),
              np.max(np.abs(np.subtract(gr.get_fixed_rotation(), gi.get_fixed_rotation())))) if kept else math.inf

    def angle(u, v):
        u, v = np.asarray(u, float), np.asarray(v, float)
        return math.degrees(math.acos(min(1.0, float(u @ v / np.linalg.norm(u) / np.linalg.norm(v)))))
    moved = angle(gr.get_rotation_axis(), gi.get_rotation_axis()) if kept else 0.0
    miss = angle(gr.get_rotation_axis(), gt.get_rotation_axis()) if kept else math.inf
    check(kept and dsf <= 1e-12 and moved > 0.5 * TILT_DEG and miss < 0.01 * TILT_DEG and
          abs(np.linalg.norm(gr.get_axes()[k]) - 1) <= 1e-12, "gon-%s-refined" % tag,
          "refine's list: the other axes, names, angles, setting and fixed rotations kept (difference %.2g); dxtbx's "
          "rotation axis moved %.4f deg, %.4f deg from the truth's (turned %g deg); the scan axis's vector %s" % (
              dsf, moved, miss, TILT_DEG, tuple(round(x, 6) for x in gr.get_axes()[k]) if kept else "-"))


def files(nbgrad, helper, work, tag, src):
    """src: the input list, rendered by compare() as TAG_out.bin; nbgrad writes it as NXmx and CBF, and each file is
    read by dxtbx and by nbgrad."""
    rc, t = run([nbgrad, "-expt", src] + RENDER + ROI + ["-frames", "2", "-floatfile", tag + "_files.bin", "-nxsfile",
                                                         tag + ".nxs", "-cbffile", tag + "_#####.cbf"],
                work, tag + "_files.log")
    if not check(rc == 0, "gon-%s-files" % tag, "nbgrad wrote %s as %s.nxs and %s_00001.cbf, 2 frames (%.1f s)" % (
            src, tag, tag, t)):
        print(tail(os.path.join(work, tag + "_files.log")))
        return
    from dxtbx.model import MultiAxisGoniometer
    from dxtbx.model.experiment_list import ExperimentListFactory
    inp = load(os.path.join(work, src))[0]
    gi, start = inp.goniometer, inp.scan.get_oscillation()[0]
    k = gi.get_scan_axis()
    want = list(gi.get_angles())
    want[k] = start

    def same(go, who):
        multi = isinstance(go, MultiAxisGoniometer)
        ok = multi and list(go.get_names()) == list(gi.get_names()) and go.get_scan_axis() == k and \
            close(list(go.get_axes()), list(gi.get_axes()), 1e-12) and close(list(go.get_angles()), want, 1e-12)
        d = max(np.max(np.abs(np.subtract(go.get_setting_rotation(), gi.get_setting_rotation()))),
                np.max(np.abs(np.subtract(go.get_fixed_rotation(), gi.get_fixed_rotation()))),
                np.max(np.abs(np.subtract(go.get_rotation_axis(), gi.get_rotation_axis())))) if multi else math.inf
        return ok and d <= 1e-9, "%s: a %s, names %s, scan axis %s, angles %s (the input's, the scan axis at the "\
            "frame's start %g); setting and fixed rotations and rotation axis within %.2g of the input's" % (
                who, type(go).__name__, list(go.get_names()) if multi else "-", go.get_scan_axis() if multi else "-",
                [round(a, 6) for a in go.get_angles()] if multi else "-", start, d)

    for fmt, name in (("nxs", tag + ".nxs"), ("cbf", tag + "_00001.cbf")):
        try:
            go = ExperimentListFactory.from_filenames([os.path.join(work, name)])[0].goniometer
            ok, what = same(go, "dxtbx reads " + name)
        except Exception as e:  # noqa: BLE001 (what dxtbx says is the finding)
            ok, what = False, "dxtbx cannot read %s: %s" % (name, e)
        check(ok, "gon-%s-%s-dxtbx" % (tag, fmt), what)
        back = "%s_%s_read.expt" % (tag, fmt)
        rc, t = run([helper, "-geometry", name, src, back], work, tag + "_" + fmt + "_read.log")
        if not check(rc == 0, "gon-%s-%s-read" % (tag, fmt), "nbgrad read %s back (its geometry with the list's "
                     "crystal written as %s)" % (name, back)):
            print(tail(os.path.join(work, tag + "_" + fmt + "_read.log")))
            continue
        ok, what = same(gonio_of(os.path.join(work, back)), "nbgrad's reading of " + name)
        check(ok, "gon-%s-%s-gonio" % (tag, fmt), what)
        img = "%s_%s_img" % (tag, fmt)
        rc, t = render(nbgrad, work, back, img, ["-frames", "1"])
        a = np.fromfile(os.path.join(work, tag + "_out.bin"), dtype=np.float32)
        b = np.fromfile(os.path.join(work, img + ".bin"), dtype=np.float32) if rc == 0 else np.zeros(1)
        peak = float(a.max()) if a.size else 0.0
        d = float(np.max(np.abs(a - b))) / peak if rc == 0 and a.shape == b.shape and peak > 0 else math.inf
        check(peak > 0 and d <= 1e-6, "gon-%s-%s-image" % (tag, fmt), "the image from nbgrad's reading of %s as the "
              "input list's (peak %.4g photons, max |diff| / peak %.2g)" % (name, peak, d))


def main(argv):
    nbgrad = os.path.abspath(argv[0])
    work = os.path.abspath(argv[1])
    os.makedirs(work, exist_ok=True)
    if not check(os.path.exists(CBF), "gon-data", "the SmarGon CBF %s" % os.path.relpath(CBF)):
        return
    img = os.path.join(work, "DLS_I03_smargon_0001.cbf")
    with gzip.open(CBF, "rb") as f, open(img, "wb") as out:
        shutil.copyfileobj(f, out)
    rc, t = run(["dials.import", img, "output.experiments=imported.expt"], work, "import.log")
    if not check(rc == 0, "gon-import", "dials.import of the SmarGon CBF (%.1f s)" % t):
        print(tail(os.path.join(work, "import.log")))
        return
    from dxtbx.model import Crystal, GoniometerFactory, MultiAxisGoniometer
    from scitbx.array_family import flex
    el = load(os.path.join(work, "imported.expt"))
    g0 = el[0].goniometer
    if not check(isinstance(g0, MultiAxisGoniometer), "gon-imported", "dials.import gives a %s: names %s, angles %s, "
                 "scan axis %d" % (type(g0).__name__, list(g0.get_names()), list(g0.get_angles()),
                                   g0.get_scan_axis())):
        return
    # a crystal, as dials.index would leave it (in dxtbx's frame, before F and S)
    el[0].crystal = Crystal((51.2, 3.1, -2.4), (7.5, 62.3, 4.4), (-6.1, 9.8, 83.7), space_group_symbol="P 1")
    el.as_file(os.path.join(work, "smargon.expt"))
    # a kappa goniometer scanning its middle axis: fixed and setting rotations both turn
    el[0].goniometer = GoniometerFactory.multi_axis(
        axes=flex.vec3_double([(1, 0, 0), (0.64278761, -0.76604444, 0), (1, 0, 0)]),
        angles=flex.double([30, -40, 12.5]), names=flex.std_string(["PHI", "KAPPA", "OMEGA"]), scan_axis=1)
    el.as_file(os.path.join(work, "kappa.expt"))
    helper = os.path.abspath(os.environ.get("NBG_CBFPANELS") or
                             os.path.join(os.path.dirname(nbgrad), "tests", "dials-cbfpanels"))
    for tag in ("smargon", "kappa"):
        compare(nbgrad, work, tag, tag + ".expt")
        files(nbgrad, helper, work, tag, tag + ".expt")


if __name__ == "__main__":
    roundtrip.run_script(main, sys.argv[1:])
