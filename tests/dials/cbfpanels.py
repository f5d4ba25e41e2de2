"""Real CBF files read by nbgrad as dxtbx reads them (issue 27 item 1): for each CBF file of the real-data folder
($NBG_REALDATA, else ../shared/data/real; compressed ones decompressed into WORKDIR first) that dxtbx reads, the
helper $NBG_CBFPANELS (tests/dials/cbfpanels.c: nbg_read_cbf_panels and nbg_read_image) writes what nbgrad reads,
and every panel is compared with dxtbx's, live: the number and order of the panels, each panel's size, pixel size,
fast and slow axes and origin (to 1e-6 mm) and its pixels (get_raw_data, every pixel exactly, as 4-byte floats),
and the beam's wavelength and direction.  Then the LCLS CSPAD still through DIALS: dials.import's list of it read by
nbgrad (-expt) and rendered on its 64 panels, and refine against the CBF itself (-observed), which must read the
CBF's 64 panels in the list's order (the fit itself is not judged here).

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

# (file under the real-data folder, the command that decompresses it to stdout or None, what dxtbx makes of it)
FILES = [
    ("thermolysin_cspad/idx-20130301060858401.cbf", None),
    ("image_examples/DLS_I03_smargon_0001.cbf.gz", "gzip -dc"),
    ("image_examples/dlsnxs2cbf_therm_0001.cbf.gz", "gzip -dc"),
    ("thaumatin_grid/thau_3_2_0001.cbf.bz2", "bzip2 -dc"),
    ("image_examples/DLS_I23_P12M_thau_00001.cbf.gz", "gzip -dc"),
]


def compare(tag, path, work, helper, rows):
    from dxtbx.model.experiment_list import ExperimentListFactory
    imset = ExperimentListFactory.from_filenames([path])[0].imageset
    det, beam = imset.get_detector(), imset.get_beam()
    fmt = imset.get_format_class().__name__
    raw = imset.get_raw_data(0)
    prefix = os.path.join(work, tag)
    r = subprocess.run([helper, path, prefix], capture_output=True, text=True)
    if len(det) > 1 and "MiniPilatus" in fmt:
        # a miniCBF of a module detector (P12M): dxtbx describes its modules from the format class's own table;
        # nbgrad reads the header's one flat detector (issue 27: to be refused or described right; not this task)
        print("SKIP %s: %s is a miniCBF that dxtbx (%s) cuts into %d modules from its own table; nbgrad reads it as "
              "one panel (%s)" % (tag, os.path.basename(path), fmt, len(det), "read" if r.returncode == 0 else
                                  r.stderr.strip()), flush=True)
        rows.append((tag, fmt, len(det), "-", "-", "-", "skipped"))
        return
    if not check(r.returncode == 0, tag + "-read", "nbgrad read %s (%s)" % (os.path.basename(path), r.stderr.strip()
                                                                             or "ok")):
        return
    got = json.load(open(prefix + ".json"))
    image = np.fromfile(prefix + ".f32", dtype=np.float32)
    pans = got["panels"]
    check(len(pans) == len(det), tag + "-count", "%d panels (dxtbx's %s: %d)" % (len(pans), fmt, len(det)))
    if len(pans) != len(det):
        return
    worst_frame, worst_px, bad_names, at, npix = 0.0, 0.0, 0, 0, 0
    for k, (p, q) in enumerate(zip(det, pans)):
        size = tuple(p.get_image_size())
        n = size[0] * size[1]
        if tuple(q["size"]) != size or abs(q["pixel"] - p.get_pixel_size()[0]) > 1e-12:
            check(False, "%s-size-%d" % (tag, k), "panel %d: nbgrad %s %g mm, dxtbx %s %s" % (
                k, q["size"], q["pixel"], size, p.get_pixel_size()))
            return
        if len(det) > 1:
            bad_names += q["name"] != p.get_name()
        for key, want in (("fast", p.get_fast_axis()), ("slow", p.get_slow_axis()), ("origin", p.get_origin())):
            worst_frame = max(worst_frame, float(np.abs(np.array(q[key]) - np.array(want)).max()))
        want = raw[k].as_numpy_array().astype(np.float32).ravel()
        mine = image[at:at + n]
        worst_px = max(worst_px, float(np.abs(mine.astype(np.float64) - want).max()) if mine.size == n else 1e30)
        at += n
        npix += n
    check(at == image.size, tag + "-npix", "%d pixels (the panels' %d)" % (image.size, at))
    check(bad_names == 0, tag + "-order", "the panels in dxtbx's order, named as dxtbx names them (%d differ)" %
          bad_names)
    check(worst_px == 0, tag + "-pixels", "every pixel of every panel as dxtbx's get_raw_data (largest difference "
          "%g over %d pixels)" % (worst_px, npix))
    check(worst_frame < 1e-6, tag + "-frames", "every panel's fast, slow and origin as dxtbx's (largest difference "
          "%.2g mm)" % worst_frame)
    dwl = abs(got["wavelength"] - beam.get_wavelength())
    ddir = float(np.abs(np.array(got["direction"]) - np.array(beam.get_sample_to_source_direction())).max())
    check(dwl < 1e-9 and ddir < 1e-9, tag + "-beam", "wavelength %.7g A (dxtbx %.7g), direction to %.1g" % (
        got["wavelength"], beam.get_wavelength(), ddir))
    rows.append((tag, fmt, len(det), "%.1e" % worst_frame, "%g" % worst_px, npix, "compared"))


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


def main(argv):
    nbgrad, work = os.path.abspath(argv[0]), os.path.abspath(argv[1])
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
    for name, unpack in FILES:
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
        compare(tag, path, work, helper, rows)
        if unpack is not None:
            os.remove(path)
    cspad = os.path.join(real, FILES[0][0])
    if os.path.exists(cspad):
        cspad_through_dials(nbgrad, cspad, work)
    print("\nfile                        dxtbx format                     panels  frames (mm)  pixels  npix      ")
    for tag, fmt, n, df, dp, npix, what in rows:
        print("%-27s %-32s %6d  %-11s  %-6s  %-9s %s" % (tag, fmt, n, df, dp, npix, what))
    print("%d passed, %d failed" % (roundtrip.PASSED, roundtrip.FAILED))
    return 0 if roundtrip.FAILED == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
