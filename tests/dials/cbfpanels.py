"""Real images and lists read by nbgrad as dxtbx reads them (issue 27 item 1): every image and experiment list of the
real-data folder ($NBG_REALDATA, else ../shared/data/real; compressed ones decompressed into WORKDIR first) against
dxtbx's reading of it, live.  The helper $NBG_CBFPANELS (tests/dials/cbfpanels.c) writes what nbgrad reads, and
every panel is compared with dxtbx's: the number and order of the panels, each panel's size, pixel size, fast and
slow axes and origin (to 1e-6 mm) and its pixels (get_raw_data, every pixel exactly, as 4-byte floats), and the
beam's wavelength and direction.  Three ways in:
  - an image nbgrad places from the file alone (nbg_read_image, nbg_read_cbf_panels): the Pilatus and Eiger
    miniCBFs, the SmarGon full CBF, the CSPAD's multi-panel CBF;
  - an image of a detector whose modules the file does not place (the Pilatus 12M miniCBF, the TimePix_SU SMV:
    dxtbx places them from tables of its own): nbgrad must refuse the file alone, naming the detector and
    dials.import; then dials.import's list of it with the image (nbg_read_expt_panels and nbg_observed_read, as
    -expt LIST -observed IMAGE reads them): the image cut into the list's panels at their raw_image_offset, every
    pixel as dxtbx's where dxtbx's is a count (>= 0), and left out where it is a gap flag (< 0); the same for a
    Pilatus 6M imported with multi_panel=True (60 modules cut from the file's one array);
    Each such list is then written back by nbgrad (refine -exptfile, naming the image): dxtbx reads nbgrad's list
    with every panel's raw_image_offset and frame as DIALS's and cuts the image into DIALS's panel arrays (the
    multi_panel option carried), and nbgrad cuts the image through its own list into dxtbx's pixels;
  - an experiment list without its images (the refined CSPAD hierarchy): every panel's frame.
Then the LCLS CSPAD still through DIALS: dials.import's list of it read by nbgrad (-expt) and rendered on its 64
panels, and refine against the CBF itself (-observed), which must read the CBF's 64 panels in the list's order (the
fit itself is not judged here).

    /usr/bin/python3 tests/dials/cbfpanels.py NBGRAD_BINARY WORKDIR

Prints one PASS/FAIL/SKIP line per check, a table of the files, and "N passed, N failed".
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roundtrip  # noqa: E402  (its counters: roundtrip.PASSED, roundtrip.FAILED)
from roundtrip import check  # noqa: E402

# (file under the real-data folder, the command that decompresses it to stdout or None, how nbgrad reads it:
#  "file" from the file alone, "import" refused alone and read through dials.import's list, "multi_panel" through
#  dials.import multi_panel=True's list of modules, "list" a list's frames)
FILES = [
    ("thermolysin_cspad/idx-20130301060858401.cbf", None, "file"),
    ("image_examples/DLS_I03_smargon_0001.cbf.gz", "gzip -dc", "file"),
    ("image_examples/dlsnxs2cbf_therm_0001.cbf.gz", "gzip -dc", "file"),
    ("thaumatin_grid/thau_3_2_0001.cbf.bz2", "bzip2 -dc", "file"),
    ("thaumatin_grid/thau_3_2_0002.cbf.bz2", "bzip2 -dc", "file"),
    ("thaumatin_grid/thau_3_2_0003.cbf.bz2", "bzip2 -dc", "file"),
    ("image_examples/DLS_I23_P12M_thau_00001.cbf.gz", "gzip -dc", "import"),
    ("image_examples/TIMEPIX_SU_512-stdgoni_0001.img", None, "import"),
    ("thaumatin_grid/thau_3_2_0001.cbf.bz2", "bzip2 -dc", "multi_panel"),
    ("iterative_cspad_refinement/regression_experiments.json", None, "list"),
]
# what the refusal of an "import" file must name
DETECTOR = {"DLS_I23_P12M_thau_00001": "PILATUS 12M", "TIMEPIX_SU_512-stdgoni_0001": "TimePix_SU"}


def compare_panels(tag, det, beam, raw, got, image, use, fmt, rows):
    """nbgrad's panels (got: the helper's json; image, use: its pixels, None for a list alone) against dxtbx's."""
    pans = got["panels"]
    check(len(pans) == len(det), tag + "-count", "%d panels (dxtbx's %s: %d)" % (len(pans), fmt, len(det)))
    if len(pans) != len(det):
        return
    worst_frame, worst_px, bad_names, bad_offset, at, npix, flagged, kept_flag = 0.0, 0.0, 0, 0, 0, 0, 0, 0
    for k, (p, q) in enumerate(zip(det, pans)):
        size = tuple(p.get_image_size())
        n = size[0] * size[1]
        if tuple(q["size"]) != size or abs(q["pixel"] - p.get_pixel_size()[0]) > 1e-12:
            check(False, "%s-size-%d" % (tag, k), "panel %d: nbgrad %s %g mm, dxtbx %s %s" % (
                k, q["size"], q["pixel"], size, p.get_pixel_size()))
            return
        if len(det) > 1:
            bad_names += q["name"] != p.get_name()
        if use is not None or raw is None:
            bad_offset += tuple(q["raw_offset"]) != tuple(p.get_raw_image_offset())
        for key, want in (("fast", p.get_fast_axis()), ("slow", p.get_slow_axis()), ("origin", p.get_origin())):
            worst_frame = max(worst_frame, float(np.abs(np.array(q[key]) - np.array(want)).max()))
        if raw is not None:
            want = raw[k].as_numpy_array().astype(np.float32).ravel()
            mine = image[at:at + n].astype(np.float64)
            if mine.size != n:
                worst_px = 1e30
            elif use is None:
                worst_px = max(worst_px, float(np.abs(mine - want).max()))
            else:
                # through nbg_observed_read: a count as dxtbx's; a gap flag (< 0) left out (and 0)
                u = use[at:at + n]
                counts = want >= 0
                worst_px = max(worst_px, float(np.abs(mine[counts] - want[counts]).max()) if counts.any() else 0.0)
                flagged += int((~counts).sum())
                kept_flag += int(((~counts) & ((u != 0) | (mine != 0))).sum())
        at += n
        npix += n
    check(bad_names == 0, tag + "-order", "the panels in dxtbx's order, named as dxtbx names them (%d differ)" %
          bad_names)
    if use is not None or raw is None:
        check(bad_offset == 0, tag + "-offsets", "every panel's raw_image_offset as dxtbx's (%d differ)" % bad_offset)
    check(worst_frame < 1e-6, tag + "-frames", "every panel's fast, slow and origin as dxtbx's (largest difference "
          "%.2g mm)" % worst_frame)
    if raw is not None:
        check(image.size == at, tag + "-npix", "%d pixels (the panels' %d)" % (image.size, at))
        check(worst_px == 0, tag + "-pixels", "every pixel of every panel as dxtbx's get_raw_data (largest "
              "difference %g over %d pixels%s)" % (worst_px, npix, "" if use is None else
                                                   ", %d of them gap flags" % flagged))
        if use is not None:
            check(kept_flag == 0, tag + "-flags", "dxtbx's gap flags (< 0) left out by nbgrad: %d of %d kept" % (
                kept_flag, flagged))
    dwl = abs(got["wavelength"] - beam.get_wavelength())
    ddir = float(np.abs(np.array(got["direction"]) - np.array(beam.get_sample_to_source_direction())).max())
    check(dwl < 1e-9 and ddir < 1e-9, tag + "-beam", "wavelength %.7g A (dxtbx %.7g), direction to %.1g" % (
        got["wavelength"], beam.get_wavelength(), ddir))
    rows.append((tag, fmt, len(det), "%.1e" % worst_frame, "-" if raw is None else "%g" % worst_px,
                 npix if raw is not None else "-"))


def compare(tag, path, work, helper, rows):
    """An image nbgrad places from the file alone."""
    from dxtbx.model.experiment_list import ExperimentListFactory
    imset = ExperimentListFactory.from_filenames([path])[0].imageset
    prefix = os.path.join(work, tag)
    r = subprocess.run([helper, path, prefix], capture_output=True, text=True)
    if not check(r.returncode == 0, tag + "-read", "nbgrad read %s (%s)" % (os.path.basename(path), r.stderr.strip()
                                                                             or "ok")):
        return
    compare_panels(tag, imset.get_detector(), imset.get_beam(), imset.get_raw_data(0),
                   json.load(open(prefix + ".json")), np.fromfile(prefix + ".f32", dtype=np.float32), None,
                   imset.get_format_class().__name__, rows)


def through_import(tag, path, work, helper, rows, options=()):
    """An image whose modules the file does not place: refused alone, read through dials.import's list (with
    options: a file dxtbx cuts into modules when asked, multi_panel=True, read through that list)."""
    from dxtbx.model.experiment_list import ExperimentListFactory
    prefix = os.path.join(work, tag)
    if not options:
        r = subprocess.run([helper, path, prefix], capture_output=True, text=True)
        msg = r.stderr.strip()
        check(r.returncode == 1 and DETECTOR[tag] in msg and "dials.import" in msg and "-expt" in msg,
              tag + "-refused", "nbgrad refuses %s alone, naming the detector and how to read it (exit %d: %s)" % (
                  os.path.basename(path), r.returncode, msg[:160] + "..."))
    imp = os.path.join(work, tag + "_import")
    os.makedirs(imp, exist_ok=True)
    rc = subprocess.call(["dials.import", path, "output.experiments=imported.expt"] + list(options), cwd=imp,
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    lst = os.path.join(imp, "imported.expt")
    if not check(rc == 0, tag + "-import", "dials.import %s (exit %d)" % (os.path.basename(path), rc)):
        return
    imset = ExperimentListFactory.from_json_file(lst)[0].imageset
    r = subprocess.run([helper, "-expt", lst, prefix, path], capture_output=True, text=True)
    if not check(r.returncode == 0, tag + "-read-list", "nbgrad reads %s through dials.import's list (%s)" % (
            os.path.basename(path), r.stderr.strip() or "ok")):
        return
    npix = sum(p.get_image_size()[0] * p.get_image_size()[1] for p in imset.get_detector())
    if npix < 1000000:
        # the program on the same list and image (a small detector only: a fit on the 12M's 11.5 million pixels
        # takes a minute and a half)
        log = os.path.join(imp, "refine.log")
        rc = subprocess.call([nbgrad_path[0], "refine", "-expt", lst, "-observed", path, "-default_F", "100", "-N",
                              "5", "-cell", "50", "60", "70", "90", "90", "90", "-oversample", "1", "-params", "scale",
                              "-maxiter", "1"], cwd=imp, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        text = open(log).read()
        check(rc in (0, 2, 4) and "over %d pixels" % npix in text, tag + "-refine-reads", "nbgrad refine -expt "
              "(dials.import's list) -observed (the image): the image cut into the list's %d panels, %d pixels "
              "(exit %d; %s)" % (len(imset.get_detector()), npix, rc, log))
    compare_panels(tag, imset.get_detector(), imset.get_beam(), imset.get_raw_data(0),
                   json.load(open(prefix + ".json")), np.fromfile(prefix + ".f32", dtype=np.float32),
                   np.fromfile(prefix + ".use", dtype=np.uint8), imset.get_format_class().__name__ + " (list%s)" % (
                       ", " + " ".join(options) if options else ""), rows)
    written_back(tag, path, work, imp, lst, helper, imset, rows)


def written_back(tag, path, work, imp, lst, helper, imset, rows):
    """nbgrad's own list of dials.import's (refine -exptfile, which names the image it fitted): dxtbx reads it with
    the image, each panel's raw_image_offset and frame as in DIALS's list, and cuts the image into DIALS's panel
    arrays (dxtbx's format class cuts by its own table, so the offsets are checked as dxtbx reads them, and its
    option multi_panel, which the list must carry, decides how many panels it cuts); and nbgrad reads the image
    through its own list (the cut at the offsets that list carries) to dxtbx's pixels."""
    from dxtbx.model.experiment_list import ExperimentListFactory
    out = os.path.join(imp, "nbgrad.expt")
    log = os.path.join(imp, "written.log")
    # a cheap fit (spot regions of the reflections to 4 A, one iteration): only its list is looked at
    rc = subprocess.call([nbgrad_path[0], "refine", "-expt", lst, "-observed", path, "-default_F", "100", "-N", "5",
                          "-cell", "50", "60", "70", "90", "90", "90", "-oversample", "1", "-dmin", "4", "-spots", "2",
                          "-params", "scale", "-maxiter", "1", "-exptfile", out], cwd=imp, stdout=open(log, "w"),
                         stderr=subprocess.STDOUT)
    if not check(rc in (0, 2, 3, 4) and os.path.exists(out), tag + "-written", "nbgrad refine -expt (dials.import's "
                 "list) -exptfile wrote its own list of the image (exit %d; %s)" % (rc, log)):
        return
    mine = ExperimentListFactory.from_json_file(out)[0]
    det, want = mine.detector, imset.get_detector()
    n = min(len(det), len(want))
    bad_off = sum(tuple(det[k].get_raw_image_offset()) != tuple(want[k].get_raw_image_offset()) for k in range(n))
    nonzero = sum(tuple(p.get_raw_image_offset()) != (0, 0) for p in want)
    frame = max(float(np.abs(np.subtract(getattr(det[k], f)(), getattr(want[k], f)())).max())
                for k in range(n) for f in ("get_origin", "get_fast_axis", "get_slow_axis")) if n else 1e30
    check(len(det) == len(want) and bad_off == 0 and frame < 1e-6, tag + "-written-dxtbx-offsets",
          "dxtbx reads nbgrad's list: %d panels (DIALS's %d), every panel's raw_image_offset as in DIALS's list (%d "
          "differ; %d of DIALS's are not (0, 0)), every panel's frame within %.2g mm" % (len(det), len(want), bad_off,
                                                                                        nonzero, frame))
    raw_want, raw_mine = imset.get_raw_data(0), mine.imageset.get_raw_data(0)
    same_shape = len(raw_mine) == len(raw_want) and all(a.all() == b.all() for a, b in zip(raw_mine, raw_want))
    worst = max(float(np.abs(a.as_numpy_array().astype(np.float64) - b.as_numpy_array()).max())
                for a, b in zip(raw_mine, raw_want)) if same_shape else float("inf")
    check(same_shape and worst == 0, tag + "-written-dxtbx-pixels", "dxtbx cuts the image through nbgrad's list "
          "(%s) into DIALS's panel arrays: %d arrays (DIALS's %d), largest difference %g" % (
              mine.imageset.get_format_class().__name__, len(raw_mine), len(raw_want), worst))
    prefix = os.path.join(work, tag + "_written")
    r = subprocess.run([helper, "-expt", out, prefix, path], capture_output=True, text=True)
    if not check(r.returncode == 0, tag + "-written-read", "nbgrad reads %s through its own list (%s)" % (
            os.path.basename(path), r.stderr.strip() or "ok")):
        return
    compare_panels(tag + "-written", want, imset.get_beam(), raw_want, json.load(open(prefix + ".json")),
                   np.fromfile(prefix + ".f32", dtype=np.float32), np.fromfile(prefix + ".use", dtype=np.uint8),
                   imset.get_format_class().__name__ + " (nbgrad's list of it)", rows)


def list_only(tag, path, work, helper, rows):
    """An experiment list without its images: every panel's frame.  A list of several experiments nbgrad refuses
    (it reads one); their first, as dxtbx writes it alone, is read (their detector when they share one)."""
    from dxtbx.model.experiment_list import ExperimentList, ExperimentListFactory
    el = ExperimentListFactory.from_json_file(path, check_format=False)
    expt = el[0]
    prefix = os.path.join(work, tag)
    if len(el) > 1:
        r = subprocess.run([helper, "-expt", path, prefix], capture_output=True, text=True)
        check(r.returncode == 1 and "experiments" in r.stderr, tag + "-several", "nbgrad refuses the list of %d "
              "experiments, saying so (%s)" % (len(el), r.stderr.strip()))
        path = os.path.join(work, tag + "_first.expt")
        ExperimentList([expt]).as_file(path)
        print("     (its first experiment alone, as dxtbx writes it: %d detector(s) among its %d experiments)" % (
            len(el.detectors()), len(el)))
    r = subprocess.run([helper, "-expt", path, prefix], capture_output=True, text=True)
    if not check(r.returncode == 0, tag + "-read-list", "nbgrad reads the list %s (%s)" % (
            os.path.basename(path), r.stderr.strip() or "ok")):
        return
    compare_panels(tag, expt.detector, expt.beam, None, json.load(open(prefix + ".json")), None, None,
                   "experiment list", rows)


def cspad_through_dials(nbgrad, path, work):
    """dials.import's list of the CSPAD still, rendered by nbgrad on its 64 panels; refine reads the CBF."""
    imp = os.path.join(work, "cspad_import")
    os.makedirs(imp, exist_ok=True)
    rc = subprocess.call(["dials.import", path, "output.experiments=cspad.expt"], cwd=imp,
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    if not check(rc == 0, "cspad-import", "dials.import of the CSPAD CBF (exit %d)" % rc):
        return
    base = ["-expt", "cspad.expt", "-default_F", "100", "-N", "5", "-cell", "92.8", "92.8", "128.6", "90", "90",
            "120", "-oversample", "1"]
    rc = subprocess.call([nbgrad] + base + ["-floatfile", "sim.bin"], cwd=imp,
                         stdout=open(os.path.join(imp, "render.log"), "w"), stderr=subprocess.STDOUT)
    size = os.path.getsize(os.path.join(imp, "sim.bin")) if rc == 0 else 0
    check(rc == 0 and size == 64 * 194 * 185 * 4, "cspad-render", "nbgrad renders dials.import's list of the CSPAD "
          "on its 64 panels (exit %d, %d pixels)" % (rc, size // 4))
    log = os.path.join(imp, "refine.log")
    rc = subprocess.call([nbgrad, "refine"] + base + ["-observed", path, "-params", "scale", "-maxiter", "1"],
                         cwd=imp, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    text = open(log).read()
    check(rc in (0, 2, 4) and "2296958 pixels" in text, "cspad-refine-reads", "nbgrad refine -expt (dials.import's "
          "list) -observed (the CBF): the CBF's 64 panels read in the list's order, all but its 2 overloaded pixels "
          "fitted (exit %d; %s)" % (rc, log))


nbgrad_path = [None]  # the program (main sets it)


def main(argv):
    nbgrad, work = os.path.abspath(argv[0]), os.path.abspath(argv[1])
    nbgrad_path[0] = nbgrad
    helper = os.path.abspath(os.environ.get("NBG_CBFPANELS") or
                             os.path.join(os.path.dirname(nbgrad), "tests", "dials", "cbfpanels"))
    real = os.path.abspath(os.environ.get("NBG_REALDATA") or "../shared/data/real")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if not os.path.isdir(real) or not os.access(helper, os.X_OK):
        print("SKIP cbfpanels: no real-data folder (%s) or no helper (%s)" % (real, helper))
        print("0 passed, 0 failed")
        return 0
    rows = []
    for name, unpack, how in FILES:
        src = os.path.join(real, name)
        tag = os.path.basename(name).split(".")[0]
        if not os.path.exists(src):
            print("SKIP %s: %s not found" % (tag, src))
            continue
        path = src
        if unpack is not None:
            path = os.path.join(work, os.path.basename(name).rsplit(".", 1)[0])
            with open(path, "wb") as out:
                if subprocess.call(unpack.split() + [src], stdout=out) != 0:
                    check(False, tag + "-unpack", "%s %s" % (unpack, src))
                    continue
        if how == "multi_panel":
            through_import(tag + "-modules", path, work, helper, rows, ("multi_panel=True",))
        else:
            {"file": compare, "import": through_import, "list": list_only}[how](tag, path, work, helper, rows)
        if unpack is not None:
            os.remove(path)
    cspad = os.path.join(real, FILES[0][0])
    if os.path.exists(cspad):
        cspad_through_dials(nbgrad, cspad, work)
    print("\nfile                         dxtbx                                                   panels  frames (mm)  "
          "pixels  npix")
    for tag, fmt, n, df, dp, npix in rows:
        print("%-28s %-55s %6d  %-11s  %-6s  %s" % (tag, fmt, n, df, dp, npix))
    print("%d passed, %d failed" % (roundtrip.PASSED, roundtrip.FAILED))
    return 0 if roundtrip.FAILED == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
