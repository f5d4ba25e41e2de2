#!/usr/bin/python3
"""The real-data tier (make test-real; issue 27 item 7): real stills from real beamlines, indexed by DIALS (Debian's
dials, as the client would), refined by nbgrad from DIALS's model, and the spot predictions of both compared with
the spots observed.

The data (../shared/data/real, from DIALS's public regression data; $NBG_REAL_DATA overrides the folder):
  thaumatin  the first still of a grid scan, Pilatus 6M miniCBF (thaumatin_grid/thau_3_2_0001.cbf.bz2),
             P 41 21 2, 57.8 57.8 150
  cspad      an LCLS CSPAD XFEL still of thermolysin (thermolysin_cspad/idx-20130301060858401.cbf): 64 panels of
             194 x 185 after metrology, dark-subtracted (negative pixels), P 61 2 2, 92.8 92.8 128.6

DIALS: DIALS's stills indexer fails on Debian's dials (its candidate refinement imports xfel_mono_sim_ext, which
the package lacks: see stills.py).  The thaumatin still is imported as a one-image sequence of 0.05 deg
(convert_stills_to_sequences) and indexed by the rotation indexer (real-space grid search against the known cell).
For the CSPAD file that import fails inside dxtbx (template_regex_from_list: a TypeError, whatever the file is
called), so it is imported as the still it is and indexed with indexing.stills.indexer=sequences: the rotation
indexer's search and refinement on a still (DIALS's refinement then models it as a still, predicting on the Ewald
sphere).  Its spots are found as XFEL processing finds them on dark-subtracted data (dispersion gain 25, global
threshold 100, spots of 2 pixels or more), where the defaults take 1.4 million pixels as strong.

nbgrad: refine from DIALS's indexed.expt on boxes of half-width 3 about DIALS's reflections (-spotlist, -spots 3),
fitting the orientation, the cell under the space group, the background, the crystal size Na Nb Nc and the
structure factors as per-reflection scales (-params orientation,cell,bg,Na,Nb,Nc,F; the start F from DIALS's
indexed intensities, -hkl indexed.refl) with the Poisson loss, the crystal taken as a sphere (-round_xtal: see SHAPE);
then `nbgrad simulate` renders the refined experiment (-exptfile) with the fitted F (-hklout), crystal size and
shape: nbgrad's model image.

The spots compared are those DIALS used in its refinement (flag used_in_refinement): DIALS's xyzcal.px of the others
are meaningless for a still.  The observed centroid is DIALS's xyzobs.px.value, the counts-weighted mean of
(x + 0.5, y + 0.5) over the shoebox's foreground pixels (checked below: recomputed from the shoebox's data and mask).
Three metrics, each reported for DIALS and nbgrad:
  (a) "spot finder's centroid of the model image": nbgrad's predicted centroid is the same weighted mean over the
      same foreground pixels, weighted by nbgrad's model image plus its fitted background (the observed counts
      include the background).  It favours a pixel model: the prediction is measured exactly as the observation is,
      with the same pixels, the same truncation to the spot finder's foreground and the same background; a model
      that predicts the pixels well predicts this centroid well, errors of the window cancel.  DIALS's prediction
      is its xyzcal.px (the reflection's predicted position).  It is not informative: the foreground's own centre,
      each of its pixels weighted alike and no model at all, scores better than nbgrad's model (measured at stop 58:
      thaumatin 0.17 / 0.09 px, ratios 0.23 / 0.14 to DIALS's; cspad 0.16 / 0.17, 0.35 / 0.37; nbgrad 0.28 / 0.11
      and 0.20 / 0.24): the observation's foreground mask, which enters the prediction, decides it.  Printed beside
      it, and in the table as "no model".
  (b) "the reflection's own model spot": refine -centroids, the centroid of the reflection's own model photons alone
      (nbg_reflection_centroids: rendered with every other structure factor at 0, no background, no truncation to the
      observed spot) over the square of half-width 5 about its observed centroid: where the model puts that reflection's
      light.  The stricter one: nothing of the observation enters the prediction, and no neighbour's light.  DIALS's
      prediction is again xyzcal.px.  One thing weighs against the model: the observed centroid is the spot finder's,
      truncated to the pixels above its threshold (and the neighbours' tails in them), while the model's takes the whole
      spot.  How much, is measured (floors(): a model exactly right, nbgrad's model image taken as the truth, seen
      through that truncation) and printed: noise-free thaumatin 0.27 / 0.34 px, cspad 0.11 / 0.13 px; with Poisson
      counts of the detector's gain (data_gain: the Pilatus 1, the CSPAD's ADU 5.7 a photon) 0.42 / 0.41 and 0.17 /
      0.16; the centroids' own Poisson error is 0.07 / 0.04 and 0.03 / 0.03 px (until stop 58 the CSPAD's counts were
      taken as photons: 0.13 / 0.14 and 0.01 / 0.01).  All are below 0.8 x DIALS's (0.60 / 0.52 and 0.36 / 0.36): the
      truncation and the counts do not forbid the target.  What keeps one lattice's metric (b) near 1 is a part of the
      observed centroids that neither model predicts: its errors and DIALS's correlate 0.8 (thaumatin x 0.79, y 0.52;
      cspad 0.80 / 0.83), their mean is 0.74 / 0.47 and 0.41 / 0.43 px rms.  On the thaumatin still the observed spots
      are streaks along x (rms widths x / y 1.11 / 0.64 px against the model's 1.02 / 0.77): a horizontal divergence
      (fixed -hdivrange 2 mrad, 5 steps) takes chi^2 from 7.6 to 6.2 but puts metric (b) x further off (0.86 px against
      0.81).  And they are lumpy: their brightest pixel holds 0.233 of the spot (bounding box, nbgrad's background off)
      against the model's 0.176, the observed spot the sharper in 82 % of them (cspad: 0.514 against 0.494, 56 %):
      sub-peaks that move from spot to spot, consistent with a crystal of a few discrete blocks, which one lattice with
      a smooth spread does not draw (the fit's small Na Nb Nc, 21 x 13 x 5 cells, broaden the spot to cover the
      sub-peaks and are no crystal size).  The crystal of blocks below tests that.  For information the output also
      gives the model image's centroid (every reflection's light, no background) over the bounding box widened by 0, 1,
      3 and 6 px, which a close neighbour's light enters (the thaumatin still's c of 150 A puts spots a few pixels
      apart).
  (c) "DIALS's spot finder on the model image", for information: the model plus its fitted background in counts of
      the detector's gain (Poisson photons), in a copy of the observed file (the thaumatin still's miniCBF; the CSPAD's
      four packed sections through pycbf), imported and searched by the still's own DIALS commands; each used
      reflection takes the model spot found on its panel nearest its own model spot (b) within 3 px.  Nothing
      observed enters this prediction of the observed centroid, the foreground mask included, which is what makes
      (a) so good: metric (a) without the background is 0.50 / 0.20 px on thaumatin (the background weighs the
      observed foreground's own geometry into both centroids).  Measured, ratios to DIALS over the spots found
      (seeds 1-5): thaumatin one lattice 1.04-1.13 / 0.74-0.87 (134-137 of 247 spots; the others are weak
      reflections the observation found on its noise), blocks 0.83-0.91 / 0.49-0.55; cspad one lattice 0.81-0.84 /
      0.94-0.98, blocks 0.77-0.92 / 0.75-0.83 (with the spot finder's gain of 25 for the noise, until stop 58: 0.84-0.94
      / 0.94-1.02 and 0.81-0.99 / 0.79-0.99).  It agrees with (b), not with (a).
The crystal of blocks (see BLOCKS): the same fit with the crystal as 11 mosaic domains, each turned by its own
fitted angles, reported with metric (b) and chi^2 per pixel beside the one lattice's. Measured: thaumatin chi^2 7.51 ->
5.07, metric (b) 0.80 / 0.41 -> 0.61 / 0.36 px (DIALS 0.75 / 0.66: ratios 0.80 / 0.55, 0.003 over the target's edge;
with nanoBragg's sensor model, before the physical one was the default for a list's sensor, 7.59 -> 5.17 and 0.79 /
0.54); cspad chi^2 101 -> 79, metric (b) 0.41 / 0.46 -> 0.41 / 0.45 px (DIALS 0.46 / 0.45: 0.90 / 0.99). Checked: it
converges and its chi^2 is below the one lattice's.
Metric (b)'s errors are also split on the detector into radial (along 2theta) and tangential parts: the blocks'
errors no longer follow DIALS's tangentially (correlation thaumatin 0.72 -> 0.37, cspad 0.91 -> 0.32) but do
radially (0.93, 0.89), and on the cspad nbgrad's spots lie 0.16-0.19 px further out than observed (DIALS's -0.03).
All three metrics are in-sample for DIALS: its refinement minimises exactly xyzcal.px - xyzobs.px.value over these
reflections; nbgrad fits the pixels of boxes about them, not their centroids.
The issue's target is nbgrad's rms at most 0.8 times DIALS's, in x and in y.  Until stop 58 it was checked on metric
(a), which a prediction with no model passes (above).  It is printed for metric (b), for one lattice and for the
blocks, and for metric (c), met or not (measured: met by none, the thaumatin blocks' (b) 0.803 / 0.546 the nearest);
the check is a guard on metric (b), nbgrad's one lattice at most 1.2 x DIALS's (GUARD_B).  Metric (b) matches
refine's centroids to the table's rows by Miller index and observed centroid within 1e-3 px; until stop 55 it matched
them on values rounded to 3 decimals, which left out the 30 thaumatin and 7 cspad spots whose 4th decimal is 5 (the
file's rounding and the table's value round apart): the numbers above are over every used spot.
Also reported: chi^2 per pixel (refine's deviance / its expectation, the JSON's fit.deviance_ratio; DIALS models
positions, not pixels, so it has none), the standard errors scaled by sqrt(chi^2), the cell, nbgrad's orientation
change from DIALS's, iterations and times.

Checks (thresholds from the measured values with margin, stated at each check), a table, and the summary line.

    /usr/bin/python3 tests/dials/realstills.py NBGRAD_BINARY [WORKDIR]

Without WORKDIR the work is done in a temporary folder that is removed at the end.
"""
import bz2
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roundtrip  # noqa: E402  (its counters: roundtrip.PASSED, roundtrip.FAILED)
from roundtrip import check, run, tail  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("NBG_REAL_DATA") or os.path.join(HERE, "..", "..", "..", "shared", "data", "real")
TARGET = 0.8  # the target: nbgrad's rms at most 0.8 x DIALS's
GUARD_B = 1.2  # the check on metric (b): nbgrad's one lattice at most 1.2 x DIALS's (measured 1.06 / 0.63, 0.89 / 1.02)

STILLS = {
    "thaumatin": {
        "file": os.path.join("thaumatin_grid", "thau_3_2_0001.cbf.bz2"),
        "image": "thau_0001.cbf",
        "dials": [
            ["dials.import", "thau_0001.cbf", "geometry.scan.oscillation=89.9997,0.05",
             "convert_stills_to_sequences=True", "output.experiments=imported.expt"],
            ["dials.find_spots", "imported.expt", "output.reflections=strong.refl", "nproc=1"],
            ["dials.index", "imported.expt", "strong.refl", "space_group=P41212", "unit_cell=57.8,57.8,150,90,90,90",
             "indexing.method=real_space_grid_search", "output.experiments=indexed.expt",
             "output.reflections=indexed.refl"],
        ],
    },
    "cspad": {
        "file": os.path.join("thermolysin_cspad", "idx-20130301060858401.cbf"),
        "image": "cspad.cbf",
        "dials": [
            ["dials.import", "cspad.cbf", "output.experiments=imported.expt"],
            ["dials.find_spots", "imported.expt", "output.reflections=strong.refl", "nproc=1",
             "spotfinder.threshold.dispersion.gain=25", "spotfinder.threshold.dispersion.global_threshold=100",
             "spotfinder.filter.min_spot_size=2"],
            ["dials.index", "imported.expt", "strong.refl", "space_group=P6122",
             "unit_cell=92.8,92.8,128.6,90,90,120", "indexing.stills.indexer=sequences",
             "output.experiments=indexed.expt", "output.reflections=indexed.refl"],
        ],
    },
}

# the crystal's shape: a sphere (-round_xtal), whose spots fall off alike in every direction, in place of the default
# parallelepiped, whose sinc^2 spots have streaks along the cell's axes; measured (nbgrad at this commit, metric (b)
# ratios x / y and chi^2 per pixel): thaumatin 1.07 / 0.67, 7.73 -> 1.08 / 0.62, 7.59; cspad 1.00 / 1.24, 104.0 ->
# 0.92 / 1.04, 101.2 (metric (a) unchanged: 0.37 / 0.16 and 0.43 / 0.52).  Both refine and simulate take it.
SHAPE = ["-round_xtal"]
REFINE = SHAPE + ["-spotlist", "indexed.refl", "-spots", "3", "-hkl", "indexed.refl", "-nodump",
          "-params", "orientation,cell,bg,Na,Nb,Nc,F", "-N", "20", "-oversample", "2", "-maxiter", "100",
          "-loss", "poisson", "-json", "refined.json", "-hklout", "refined.hkl", "-exptfile", "refined.expt",
          "-centroids", "centroids.txt"]

# The crystal of blocks: the same fit with the crystal as 11 mosaic domains of equal weight, each turned by its own
# angles (-params ... domain_rot: every domain's but domain 0's, whose turn the orientation makes), from DIALS's model
# with the domains of a 0.5 deg spread (seed 12345678) under the turns, so that the domains start apart (identical
# domains have identical derivatives, and a fit cannot part them).  The spread stays fixed.  Measured on the
# thaumatin still over starts (domains / spread): 7 / 0.3 -> metric (b) 0.62 / 0.37 px, chi^2 5.22; 11 / 0.2 0.61 /
# 0.38, 5.26; 11 / 0.3 0.62 / 0.35, 5.05; 11 / 0.5 0.60 / 0.35, 5.16; 15 / 0.3 0.60 / 0.36, 5.02 (one lattice: 0.81 /
# 0.42, 7.59).
BLOCKS = ["-mosaic", "0.5", "-mosaic_domains", "11", "-maxiter", "300"]
REFINE_BLOCKS = [a for a in REFINE] + BLOCKS
REFINE_BLOCKS[REFINE_BLOCKS.index("-params") + 1] += ",domain_rot"
for k, v in (("-json", "blocks.json"), ("-hklout", "blocks.hkl"), ("-exptfile", "blocks.expt"),
             ("-centroids", "blocks_centroids.txt"), ("-maxiter", None)):
    i = REFINE_BLOCKS.index(k)
    if v is None:
        del REFINE_BLOCKS[i:i + 2]  # the first -maxiter (REFINE's); BLOCKS' stays
    else:
        REFINE_BLOCKS[i + 1] = v

# Thresholds, per still, from the values measured here (Debian's dials 3.12, nbgrad at this commit) with margin:
#   dev_ratio   chi^2 per pixel of nbgrad's fit: measured thaumatin 7.51 (7.59 with nanoBragg's sensor model), cspad
#               101 (dark-subtracted ADU taken as photons: the Poisson loss's chi^2 is the gain, 5.7, times a photon
#               chi^2 there); the check allows about twice that
#   cell_rel    nbgrad's a and c against DIALS's: measured thaumatin 0.03 % / 0.02 %, cspad 0.10 % / 0.06 %;
#               allowed 0.3 %
#   turn_deg    nbgrad's orientation against DIALS's: measured thaumatin 0.19 deg, cspad 0.07 deg; allowed 0.3 deg
#   gain        where the detector's counts per photon are known, data_gain's estimate must find them within 20 %:
#               the thaumatin Pilatus counts photons (1; measured 0.95); the CSPAD's is not known here (measured 5.7)
LIMITS = {
    "thaumatin": {"dev_ratio": 15.0, "cell_rel": 0.003, "turn_deg": 0.3, "gain": 1.0},
    "cspad": {"dev_ratio": 210.0, "cell_rel": 0.003, "turn_deg": 0.3, "gain": None},
}


def own_centroids(path, refl, obs):
    """refine -centroids' own-spot centroids (x, y; NaN where none), matched to refl's rows by Miller index and
    observed centroid (the file's 4 decimals: within 1e-3 px; a key of values rounded to 3 decimals would miss a
    centroid whose 4th decimal is 5, where the file's rounding and the table's value round apart)."""
    own = {}
    for line in open(path):
        if line.startswith("#"):
            continue
        v = line.split()
        own.setdefault((int(v[1]), int(v[2]), int(v[3])), []).append((float(v[4]), float(v[5]), float(v[10]),
                                                                        float(v[11])))
    out = np.full((len(obs), 2), np.nan)
    for i, (h, o) in enumerate(zip(list(refl["miller_index"]), obs)):
        for x, y, cx, cy in own.get((h[0], h[1], h[2]), []):
            if abs(x - o[0]) < 1e-3 and abs(y - o[1]) < 1e-3:
                out[i] = (cx, cy)
                break
    return out


def rms(d):
    return np.sqrt(np.mean(np.square(d), axis=0)) if len(d) else np.array([np.nan, np.nan])


def block_turn_deg(par, m):
    """The angle (deg) of block m's turn Rz Ry Rx, from refine's JSON parameters d<m>.rot_x ... (deg)."""
    x, y, z = (math.radians(par["d%d.rot_%s" % (m, c)]["value"]) for c in "xyz")
    Rx = np.array([[1, 0, 0], [0, math.cos(x), -math.sin(x)], [0, math.sin(x), math.cos(x)]])
    Ry = np.array([[math.cos(y), 0, math.sin(y)], [0, 1, 0], [-math.sin(y), 0, math.cos(y)]])
    Rz = np.array([[math.cos(z), -math.sin(z), 0], [math.sin(z), math.cos(z), 0], [0, 0, 1]])
    return math.degrees(math.acos(max(-1.0, min(1.0, (np.trace(Rz @ Ry @ Rx) - 1.0) / 2.0))))


def rotation_angle_deg(U1, U2):
    R = np.asarray(U1).reshape(3, 3) @ np.asarray(U2).reshape(3, 3).T
    return math.degrees(math.acos(max(-1.0, min(1.0, (np.trace(R) - 1.0) / 2.0))))


def dials_refinement_steps(log):
    """(steps in the last refinement table of dials.index's log, i.e. its last macro cycle; steps over all its
    tables; the number of tables), or None."""
    tables = []
    in_table = False
    for ln in log.splitlines():
        if re.match(r"\|\s+Step\s+\|", ln):
            in_table = True
            tables.append(0)
            continue
        if in_table:
            if re.match(r"\|\s+\d+\s+\|", ln):
                tables[-1] += 1
            elif not (ln.startswith("+") or ln.startswith("|-") or re.match(r"\|\s+\|", ln)):
                in_table = False
    tables = [max(n - 1, 0) for n in tables]  # step 0 is the start
    return (tables[-1], sum(tables), len(tables)) if tables else None


def frame_difference(d_expt, n_expt):
    """How far the list nbgrad's -exptfile wrote lies from DIALS's in the lab frame: the largest distance between
    the two detectors' panel corners and the points 100 mm along their beams (mm).  nbgrad refines neither the
    detector nor the beam here, and writes DIALS's frame as it is (no turn putting the beam along -z: dials.index
    tilts it), so the two coincide to rounding and the orientations compare directly."""
    def points(e):
        pts = []
        for p in e.detector:
            o, f, s_ = (np.asarray(v, float) for v in (p.get_origin(), p.get_fast_axis(), p.get_slow_axis()))
            w, h = (n * sz for n, sz in zip(p.get_image_size(), p.get_pixel_size()))
            pts += [o, o + w * f, o + h * s_, o + w * f + h * s_]
        b = np.asarray(e.beam.get_s0(), float)
        pts.append(100.0 * b / np.linalg.norm(b))
        return np.array(pts)
    P, Q = points(d_expt), points(n_expt)
    return float(np.max(np.linalg.norm(P - Q, axis=1))) if P.shape == Q.shape else float("inf")


def turn_deg(d_expt, n_expt):
    """nbgrad's crystal orientation against DIALS's, U against U as the two lists state them (the same frame); the
    frame difference (mm)."""
    Ud = np.asarray(d_expt.crystal.get_U()).reshape(3, 3)
    Un = np.asarray(n_expt.crystal.get_U()).reshape(3, 3)
    return rotation_angle_deg(Un, Ud), frame_difference(d_expt, n_expt)


DRAWS = 20  # noisy draws a spot for the floor of metric (b) (floors)
WIDEN = (0, 1, 3, 6)  # the model image's centroid over the bbox widened by these, px (for information)


def shoebox_at(sbs, panels, k, model, offsets, sizes, want):
    """Reflection k's shoebox as arrays: the model image of its panel (ny x nx), the panel's size, the box (x0, x1,
    y0, y1), its counts and its foreground (mask bits `want`), the first slice of each."""
    sb = sbs[k]
    p = panels[k]
    nx, ny = sizes[p]
    img = model[offsets[p]:offsets[p] + nx * ny].reshape(ny, nx).astype(np.float64)
    x0, x1, y0, y1, _, _ = sb.bbox
    data = sb.data.as_numpy_array()[0].astype(np.float64)
    fg = (sb.mask.as_numpy_array()[0] & want) == want
    return img, nx, ny, (x0, x1, y0, y1), data, fg


def centroids(refl, model, offsets, sizes, bg):
    """Per reflection of refl (a flex table with shoeboxes): the observed centroid recomputed from the shoebox,
    metric (a)'s model centroid (model + bg over the shoebox's foreground), metric (a)'s without the background, the
    model image's centroid over the bbox widened by each of WIDEN (NaN where the model is empty there), and last the
    foreground's own centre (each of its pixels weighted alike: a prediction with no model, metric (a)'s null)."""
    from dials.algorithms.shoebox import MaskCode
    want = MaskCode.Valid | MaskCode.Foreground
    sbs = refl["shoebox"]
    panels = list(refl["panel"])
    bboxes = list(refl["bbox"])
    out = np.full((len(refl), 4 + len(WIDEN), 2), np.nan)
    for k in range(len(refl)):
        img, nx, ny, (x0, x1, y0, y1), data, fg = shoebox_at(sbs, panels, k, model, offsets, sizes, want)
        ys, xs = np.mgrid[y0:y1, x0:x1]
        cx0, cx1, cy0, cy1 = max(x0, 0), min(x1, nx), max(y0, 0), min(y1, ny)
        m = np.zeros_like(data)
        m[cy0 - y0:cy1 - y0, cx0 - x0:cx1 - x0] = img[cy0:cy1, cx0:cx1]
        for j, w in zip((0, 1, 2, 3 + len(WIDEN)), (data * fg, (m + bg) * fg, m * fg, fg.astype(np.float64))):
            s = w.sum()
            if s > 0:
                out[k, j] = ((w * (xs + 0.5)).sum() / s, (w * (ys + 0.5)).sum() / s)
        for j, g in enumerate(WIDEN):
            bx0, bx1, by0, by1 = bboxes[k][0] - g, bboxes[k][1] + g, bboxes[k][2] - g, bboxes[k][3] + g
            bx0, by0, bx1, by1 = max(bx0, 0), max(by0, 0), min(bx1, nx), min(by1, ny)
            w = img[by0:by1, bx0:bx1]
            s = w.sum()
            if s > 0:
                ys, xs = np.mgrid[by0:by1, bx0:bx1]
                out[k, 3 + j] = ((w * (xs + 0.5)).sum() / s, (w * (ys + 0.5)).sum() / s)
    return out


def floors(refl, model, offsets, sizes, bg, ownc, rows, gain):
    """Why metric (b) stays near DIALS's, per reflection of rows (indices into refl); the observed counts, the model
    image and its background bg are gain per photon:
      noise   the observed centroid's Poisson error from its counts, sqrt(gain sum c (x - xbar)^2) / sum c over the
              foreground;
      trunc   metric (b) of a model that is exactly right, seen through the spot finder's truncation: nbgrad's own
              model image (every reflection's light plus its fitted background) taken as the truth, its brightest
              n pixels within 3 px of the reflection's own model centroid (n: the observed spot's foreground pixel
              count; fewer where pixels tie at the cut, none where the model is empty there), their weighted
              centroid against the own centroid; noise-free; and the same with Poisson counts drawn about that
              truth (photons: Poisson(truth / gain), DRAWS draws a spot), the n pixels chosen on the noisy counts
              and weighted by them, as a spot finder chooses them (an estimate: its threshold and connected regions
              are not imitated);
      moments the spots' rms widths in x and y (sqrt of the second moments): observed (shoebox counts less nbgrad's
              background, over the bounding box) and nbgrad's model alone over the same box; and their peak
              fractions, the brightest pixel's share of the spot (how sharp its structure is), and whether the
              observed spot's is the larger.
    Returns (noise, trunc, trunc with noise) as rms x / y, the mean moments (observed x, y, model x, y, observed and
    model peak fractions, the fraction of spots sharper than the model's) and the number of spots they are over."""
    from dials.algorithms.shoebox import MaskCode
    want = MaskCode.Valid | MaskCode.Foreground
    sbs = refl["shoebox"]
    panels = list(refl["panel"])
    noise, trunc, trunc_noisy, mom = [], [], [], []
    rng = np.random.default_rng(27)  # fixed: the same numbers every run
    for k in rows:
        img, nx, ny, (x0, x1, y0, y1), data, fg = shoebox_at(sbs, panels, k, model, offsets, sizes, want)
        ys, xs = np.mgrid[y0:y1, x0:x1] + 0.5
        w = data * fg
        s = w.sum()
        cx, cy = (w * xs).sum() / s, (w * ys).sum() / s
        c = np.clip(w, 0, None)
        noise.append((math.sqrt(gain * (c * (xs - cx) ** 2).sum()) / s,
                      math.sqrt(gain * (c * (ys - cy) ** 2).sum()) / s))
        ox, oy = int(ownc[k, 0]), int(ownc[k, 1])
        bx0, bx1, by0, by1 = max(ox - 3, 0), min(ox + 4, nx), max(oy - 3, 0), min(oy + 4, ny)
        win = img[by0:by1, bx0:bx1].ravel()
        wy, wx = (a.ravel() + 0.5 for a in np.mgrid[by0:by1, bx0:bx1])
        n = min(int(fg.sum()), win.size)
        cut = np.sort(win)[::-1][n - 1]
        top = win > cut if (win >= cut).sum() > n else win >= cut  # no arbitrary choice among equal pixels
        t = win[top] + bg
        if top.any() and cut > 0:
            trunc.append(((t * wx[top]).sum() / t.sum() - ownc[k, 0], (t * wy[top]).sum() / t.sum() - ownc[k, 1]))
            for _ in range(DRAWS):
                # the same with Poisson counts (photons), the n pixels chosen on the noisy counts (ties broken at
                # random) and weighted by them
                c = rng.poisson(np.clip(win + bg, 0, None) / gain) + rng.uniform(0.0, 1e-6, win.size)
                top = np.argsort(-c)[:n]
                t = c[top]
                trunc_noisy.append(((t * wx[top]).sum() / t.sum() - ownc[k, 0],
                                    (t * wy[top]).sum() / t.sum() - ownc[k, 1]))
        if x0 >= 0 and y0 >= 0 and x1 <= nx and y1 <= ny:
            row, peak = [], []
            for v in (data - bg, img[y0:y1, x0:x1]):
                v = np.clip(v, 0, None)
                if v.sum() <= 0:
                    break
                mx, my = (v * xs).sum() / v.sum(), (v * ys).sum() / v.sum()
                row += [math.sqrt((v * (xs - mx) ** 2).sum() / v.sum()),
                        math.sqrt((v * (ys - my) ** 2).sum() / v.sum())]
                peak.append(v.max() / v.sum())
            if len(row) == 4:
                mom.append(row + peak + [float(peak[0] > peak[1])])
    return (np.sqrt(np.mean(np.square(noise), axis=0)), rms(np.array(trunc)), rms(np.array(trunc_noisy)),
            np.mean(mom, axis=0) if mom else np.full(7, np.nan), len(mom))


def data_gain(work):
    """The detector's counts per photon as the observed image's background shows it: the slope of the variance
    against the mean over 8 x 8 pixel blocks (their pixels within 4 MADs of the block's median, spots and edges out;
    blocks with an untrusted pixel left out), the blocks' means and variances averaged in 9 bins between the 5th and
    95th percentile of the means, a straight line through the bins.  A Poisson counter gives 1 (measured: the
    thaumatin Pilatus 0.95); dark-subtracted integrating data their ADU per photon (the CSPAD: 5.7; its spot finder
    is told 25, a threshold's setting).  Returns (gain, intercept, blocks)."""
    from dxtbx.model.experiment_list import ExperimentListFactory
    el = ExperimentListFactory.from_json_file(os.path.join(work, "imported.expt"), check_format=True)
    raw = el[0].imageset.get_raw_data(0)
    raw = raw if isinstance(raw, tuple) else (raw,)
    B = 8
    ms, vs = [], []
    for r, panel in zip(raw, el[0].detector):
        a = r.as_numpy_array().astype(np.float64)
        lo, hi = panel.get_trusted_range()
        ny, nx = a.shape
        blk = a[:ny // B * B, :nx // B * B].reshape(ny // B, B, nx // B, B).swapaxes(1, 2).reshape(-1, B * B)
        blk = blk[~((blk <= lo) | (blk >= hi)).any(axis=1)]
        med = np.median(blk, axis=1, keepdims=True)
        mad = 1.4826 * np.median(np.abs(blk - med), axis=1, keepdims=True)
        keep = np.abs(blk - med) <= 4 * np.maximum(mad, 1)
        n = keep.sum(axis=1)
        ok = n >= 48
        m = (blk * keep).sum(axis=1) / n
        v = (((blk - m[:, None]) ** 2) * keep).sum(axis=1) / (n - 1)
        ms.append(m[ok])
        vs.append(v[ok])
    ms, vs = np.concatenate(ms), np.concatenate(vs)
    q = np.percentile(ms, np.linspace(5, 95, 10))
    mb, vb = [], []
    for lo, hi in zip(q[:-1], q[1:]):
        s = (ms >= lo) & (ms < hi)
        if s.sum() > 20:
            mb.append(ms[s].mean())
            vb.append(vs[s].mean())
    slope, icpt = np.polyfit(mb, vb, 1)
    return float(slope), float(icpt), int(ms.size)


def write_one_section(src, dst, counts):
    """counts (one panel) into a copy of the one-section byte-offset miniCBF src, its header whole (the same
    detector, sensor and beam for dials.import), through dxtbx's byte-offset compressor; or a string saying why
    not."""
    from dials.array_family import flex
    from dxtbx.ext import compress

    orig = open(src, "rb").read()
    sect = b"--CIF-BINARY-FORMAT-SECTION--\r\n"
    if orig.count(sect) != 1 or b"x-CBF_BYTE_OFFSET" not in orig:
        return "not computed: neither one byte-offset section nor the sections of one detector's panels"
    packed = bytes(compress(flex.int(counts[0])))
    start = orig.find(b"\x0c\x1a\x04\xd5", orig.find(sect))
    head = "\r\n".join(ln for ln in orig[:start].decode("latin1").split("\r\n") if not ln.startswith("Content-MD5"))
    head = re.sub(r"X-Binary-Size: \d+", "X-Binary-Size: %d" % len(packed), head)
    with open(dst, "wb") as f:
        f.write(head.encode("latin1") + b"\x0c\x1a\x04\xd5" + packed + b"\x00" * 4095 +
                b"\r\n--CIF-BINARY-FORMAT-SECTION----\r\n;\r\n\r\n")
    return None


def write_sections(src, dst, raw, counts):
    """counts (a panel each) into a copy of src, a full CBF whose array sections hold the panels as tiles (the
    CSPAD's: four sections of 8 x 185 x 388, two 194-pixel panels across each tile), through CBFlib's own Python
    binding (pycbf, DIALS's), each section rewritten with its own compression and element type.  Each panel's place
    is the one tile whose pixels are the panel's as dxtbx reads it (raw); the caller checks the written file reads
    back as counts.  A string saying why not, or None."""
    import pycbf

    h = pycbf.cbf_handle_struct()
    h.read_widefile(src.encode(), pycbf.MSG_DIGEST)
    h.find_category(b"array_data")
    h.find_column(b"data")
    arrays, infos = [], []
    for i in range(h.count_rows()):
        h.select_row(i)
        h.find_column(b"data")
        info = h.get_integerarrayparameters_wdims_fs()
        if info[2] != 4 or info[3] != 1:
            return "not computed: section %d is not of signed 32-bit integers" % i
        infos.append(info)
        dims = (max(info[11], 1), max(info[10], 1), info[9])
        arrays.append(np.frombuffer(h.get_integerarray_as_string(), dtype="<i4").reshape(dims).copy())
    for p, (r, c) in enumerate(zip(raw, counts)):
        ny, nx = r.shape
        places = [(q, t, y0, x0) for q, a in enumerate(arrays) for t in range(a.shape[0])
                  for y0 in range(0, a.shape[1] - ny + 1, ny) for x0 in range(0, a.shape[2] - nx + 1, nx)
                  if np.array_equal(a[t, y0:y0 + ny, x0:x0 + nx], r)]
        if len(places) != 1:
            return "not computed: panel %d matches %d tiles of the file's sections" % (p, len(places))
        q, t, y0, x0 = places[0]
        arrays[q][t, y0:y0 + ny, x0:x0 + nx] = c
    for i, (a, info) in enumerate(zip(arrays, infos)):
        h.select_row(i)
        h.find_column(b"data")
        h.set_integerarray_wdims_fs(info[0], info[1], a.astype("<i4").tobytes(), 4, 1, a.size, b"little_endian",
                                    info[9], info[10], info[11], info[12])
    h.write_widefile(dst.encode(), pycbf.CBF, pycbf.MIME_HEADERS | pycbf.MSG_DIGEST | pycbf.PAD_4K, 0)
    return None


def spotfinder_on_model(work, spec, model, bg, ownc, obs, cal, panels, rows, gain, tag="", seed=1, radius=3.0):
    """Metric (c), for information: DIALS's own spot finder run on nbgrad's model image, so that nothing observed
    enters the prediction of the observed centroid (metric (a) takes the observation's foreground).  The image is
    the model plus its fitted background in counts of the detector's gain (gain x Poisson((model + bg) / gain), seed
    fixed: the thaumatin Pilatus's 1, the cspad's as its background shows it, data_gain's 5.7; its spot finder is told
    25, a threshold's setting, which until stop 58 set the counts' noise too, 4.4 times the variance), the observed
    file's untrusted pixels (outside
    the detector's trusted range) kept, written into a copy of the observed file: a one-section miniCBF through
    dxtbx's compressor, the CSPAD's multi-section CBF through pycbf (write_sections); either is checked to read back
    as its counts.  It is imported and searched with the still's own DIALS commands.  Each used reflection takes the
    model spot found on its panel nearest its own model spot (metric (b)'s centroid, the model's alone) within
    radius px; rows: the used reflections with an own model spot.  Returns (matched rows, nbgrad's rms, DIALS's rms
    over them, the predictions) or a string saying why it was not computed."""
    import dxtbx
    from dials.array_family import flex

    src = os.path.join(work, spec["image"])
    img = dxtbx.load(src)
    raw = img.get_raw_data()
    raw = [np.asarray(r.as_numpy_array()) for r in (raw if isinstance(raw, tuple) else (raw,))]
    if model.size != sum(r.size for r in raw):
        return "not computed: the model has %d pixels, the image %d" % (model.size, sum(r.size for r in raw))
    rng = np.random.default_rng(seed)
    counts, off = [], 0
    for r, panel in zip(raw, img.get_detector()):
        lam = np.clip(model[off:off + r.size].reshape(r.shape).astype(np.float64) + bg, 0, None) / gain  # photons
        off += r.size
        c = np.rint(gain * rng.poisson(lam)).astype(np.int32)
        lo, hi = panel.get_trusted_range()
        bad = (r <= lo) | (r >= hi)
        c[bad] = r[bad]
        counts.append(c)
    sf = os.path.join(work, "spotfinder_on_model" + tag)
    os.makedirs(sf)
    image = "model_0001.cbf"
    dst = os.path.join(sf, image)
    why = write_one_section(src, dst, counts) if len(raw) == 1 else write_sections(src, dst, raw, counts)
    if why:
        return why
    back = dxtbx.load(dst).get_raw_data()
    back = back if isinstance(back, tuple) else (back,)
    if len(back) != len(counts) or not all(np.array_equal(b.as_numpy_array(), c) for b, c in zip(back, counts)):
        return "not computed: the written file does not read back as its counts"
    for cmd in spec["dials"][:2]:  # dials.import (the image's name replaced), dials.find_spots
        cmd = [image if a == spec["image"] else a for a in cmd]
        rc, _ = run(cmd, sf, cmd[0] + ".out")
        if rc != 0:
            return "not computed: %s failed (exit %d)" % (cmd[0], rc)
    strong = flex.reflection_table.from_file(os.path.join(sf, "strong.refl"))
    sx, sy, _ = strong["xyzobs.px.value"].parts()
    sx, sy, sp = np.array(sx), np.array(sy), np.array(list(strong["panel"]))
    pred = np.full((len(obs), 2), np.nan)
    for k in rows:
        on = sp == panels[k]
        d = np.hypot(sx[on] - ownc[k, 0], sy[on] - ownc[k, 1])
        if d.size and d.min() <= radius:
            j = int(np.argmin(d))
            pred[k] = (sx[on][j], sy[on][j])
    ok = np.zeros(len(obs), bool)
    ok[rows] = True
    ok &= np.isfinite(pred[:, 0])
    return ok, rms(pred[ok] - obs[ok]), rms(cal[ok] - obs[ok]), pred


def radial_tangential(expt, panels, obs, preds, rows):
    """Each prediction's error (prediction - observed centroid) split on the detector into its radial part (along
    the diffracted ray's direction away from the beam) and its tangential part, in pixels, over rows; preds: a list
    of (n, 2) predictions in px.  Returns per prediction (rms radial, rms tangential, mean radial) and the
    radial and tangential parts themselves (for their correlations)."""
    det, s0 = expt.detector, np.asarray(expt.beam.get_unit_s0(), float)
    parts = np.zeros((len(preds), 2, len(rows)))
    for j, k in enumerate(rows):
        p = det[int(panels[k])]
        o = np.asarray(p.get_pixel_lab_coord(tuple(obs[k])), float)
        v = o / np.linalg.norm(o)
        rad = v - s0 * np.dot(v, s0)
        rad /= np.linalg.norm(rad)
        tan = np.cross(s0, rad)
        for i, pr in enumerate(preds):
            e = (np.asarray(p.get_pixel_lab_coord(tuple(pr[k])), float) - o) / p.get_pixel_size()[0]
            parts[i, :, j] = (np.dot(e, rad), np.dot(e, tan))
    return [(rms(x[0]), rms(x[1]), x[0].mean()) for x in parts], parts


def fmt2(v):
    return "%.3f / %.3f" % (v[0], v[1])


def print_metric_c(mc, rows):
    """Metric (c)'s lines: spotfinder_on_model's result mc over the used spots with an own model spot (rows)."""
    if isinstance(mc, str):
        print("    " + mc)
        return
    okc, c_nb, c_dials, _ = mc
    print("    nbgrad model's spots found  rms x / y %s px over %d of the %d used spots with an own model spot "
          "(the rest: no spot found within 3 px of it)" % (fmt2(c_nb), okc.sum(), rows.sum()))
    print("    DIALS  xyzcal.px            rms x / y %s px over the same; ratios %.2f / %.2f" %
          (fmt2(c_dials), c_nb[0] / c_dials[0], c_nb[1] / c_dials[1]))


def one_still(nbgrad, work, name, spec):
    """DIALS and nbgrad on one still; its checks; a dict of results for the table (None where it stopped)."""
    from dials.array_family import flex
    from dxtbx.model.experiment_list import ExperimentListFactory

    lim = LIMITS[name]
    src = os.path.join(DATA, spec["file"])
    if not check(os.path.exists(src), name + "-data", src):
        return None
    os.makedirs(work)
    if src.endswith(".bz2"):
        with bz2.open(src) as f, open(os.path.join(work, spec["image"]), "wb") as g:
            g.write(f.read())
    else:
        shutil.copyfile(src, os.path.join(work, spec["image"]))

    # --- DIALS ---
    t_dials = 0.0
    for cmd in spec["dials"]:
        rc, t = run(cmd, work, cmd[0] + ".out")
        t_dials += t
        if rc != 0:
            check(False, name + "-dials", "%s failed (exit %d):\n%s" % (" ".join(cmd), rc,
                                                                      tail(os.path.join(work, cmd[0] + ".out"))))
            return None
    d_expt = ExperimentListFactory.from_json_file(os.path.join(work, "indexed.expt"), check_format=False)
    refl = flex.reflection_table.from_file(os.path.join(work, "indexed.refl"))
    refl = refl.select(refl["miller_index"] != (0, 0, 0))
    used = np.array(list(refl.get_flags(refl.flags.used_in_refinement)))
    d_cell = d_expt[0].crystal.get_unit_cell().parameters()
    d_steps = dials_refinement_steps(open(os.path.join(work, "dials.index.out")).read())
    imp = ExperimentListFactory.from_json_file(os.path.join(work, "imported.expt"), check_format=False)[0]
    p0, pi0 = imp.detector[0], d_expt[0].detector[0]
    bc = np.subtract(pi0.get_beam_centre_px(d_expt[0].beam.get_s0()), p0.get_beam_centre_px(imp.beam.get_s0()))
    print("%s: dials.index refined the beam direction by %.3f deg, the beam centre by (%.2f, %.2f) px and the "
          "distance by %.3f mm from the imported model; %s refinement steps in its last macro cycle (%s in all, %s "
          "cycles)" %
          (name, roundtrip.angle_deg(imp.beam.get_s0(), d_expt[0].beam.get_s0()), bc[0], bc[1],
           pi0.get_distance() - p0.get_distance(),
           *(d_steps if d_steps else ("?", "?", "?"))))
    # DIALS ran (import, find_spots, index) and indexed the still: measured thaumatin 247 of 276 indexed spots used
    # in refinement, cspad 118 of 167; at least 100 asked of both
    check(used.sum() >= 100, name + "-dials",
          "dials.import, find_spots, index (%s): %d indexed, %d used in refinement, cell %s, %.1f s"
          % (spec["dials"][-1][5] if name == "cspad" else "one-image sequence of 0.05 deg", len(refl), used.sum(),
             " ".join("%.3f" % x for x in d_cell), t_dials))
    # the detector's counts per photon: where it is known (the Pilatus counts photons), that, and the estimate from
    # the observed image's background checked against it; else the estimate (the CSPAD's dark-subtracted ADU): the
    # noise of metric (c)'s model image and of the floors below.  refine is not given it: it fits counts, as the list
    # states them (gain 1), from structure factors that DIALS's intensities in those counts start; its chi^2 per
    # pixel is then gain times a photon chi^2, and is printed both ways
    measured, g_icpt, g_blocks = data_gain(work)
    known = lim["gain"]
    line = ("the observed image's background: variance = %.2f x mean %+.1f over %d blocks of 8 x 8 pixels (counts per "
            "photon %.2f)" % (measured, g_icpt, g_blocks, measured))
    if known is None:
        gain = measured
        print("%s: %s; not known for this detector, not checked" % (name, line))
    else:
        gain = known
        check(abs(measured / known - 1) <= 0.2, name + "-gain", "%s; the detector's is %g (within 20 %%)" %
              (line, known))

    # --- nbgrad refine ---
    rc, t_refine = run([nbgrad, "refine", "-expt", "indexed.expt", "-observed", spec["image"]] + REFINE, work,
                       "refine.log")
    log = os.path.join(work, "refine.log")
    # exit 0: converged within the noise; 3 and 4 converged with a model that does not explain the data (3: its
    # floor, 4: its noise), both expected of real data; 2 is "not converged", anything else an error
    if not os.path.exists(os.path.join(work, "refined.json")) or rc not in (0, 3, 4):
        check(False, name + "-refine", "nbgrad refine exit %d:\n%s" % (rc, tail(log)))
        return None
    js = json.load(open(os.path.join(work, "refined.json")))
    par = js["parameters"]
    check(js.get("converged") is True and js["iterations"] < 100, name + "-refine",
          "nbgrad refine converged after %d iterations (%s), exit %d, %.1f s" % (js["iterations"], js.get("reason"),
                                                                                rc, t_refine))
    dev = js["fit"]["deviance_ratio"]
    sig = js["fit"].get("sigma_scale") or math.sqrt(max(dev, 1.0))
    check(math.isfinite(dev) and dev < lim["dev_ratio"], name + "-chi2",
          "chi^2 per pixel (deviance / expected over %d pixels) %.3f, limit %.0f%s" %
          (js["fit"]["pixels"], dev, lim["dev_ratio"], "" if gain == 1 else
           " (counts of %.2f per photon: about %.1f in photons)" % (gain, dev / gain)))
    n_expt = ExperimentListFactory.from_json_file(os.path.join(work, "refined.expt"), check_format=False)
    n_cell = n_expt[0].crystal.get_unit_cell().parameters()
    if d_expt[0].scan is None:
        # a still (DIALS's list has no scan and no goniometer) is written back as one, not as a scan of width 0
        check(n_expt[0].scan is None and n_expt[0].goniometer is None, name + "-still",
              "DIALS's still is written back by nbgrad as a still: scan %s, goniometer %s" %
              (n_expt[0].scan, n_expt[0].goniometer))
    turn, frame_diff = turn_deg(d_expt[0], n_expt[0])
    rel = max(abs(n_cell[0] / d_cell[0] - 1), abs(n_cell[2] / d_cell[2] - 1))
    # the list nbgrad wrote is in DIALS's frame: its detector and beam are DIALS's (nbgrad refines neither here) to
    # rounding, so U compares with DIALS's directly
    check(frame_diff < 1e-6, name + "-frame", "nbgrad's list in DIALS's lab frame, not turned: its detector's panel "
          "corners and its beam as DIALS's within %.2g mm (the beam %.3f deg off -z, as dials.index left it)" % (
              frame_diff, roundtrip.angle_deg(n_expt[0].beam.get_s0(), (0.0, 0.0, -1.0))))
    check(rel < lim["cell_rel"] and turn < lim["turn_deg"], name + "-model",
          "cell %s (DIALS's %s; a and c within %.3f %%), orientation %.4f deg from DIALS's (U against U; limits "
          "%.1f %%, %.1f deg)"
          % (" ".join("%.3f" % x for x in n_cell), " ".join("%.3f" % x for x in d_cell), 100 * rel, turn,
             100 * lim["cell_rel"], lim["turn_deg"]))

    # --- nbgrad's model image ---
    Ns = [par[k]["value"] for k in ("Na", "Nb", "Nc")]
    bg = par["bg"]["value"]
    rc, t_sim = run([nbgrad, "simulate", "-expt", "refined.expt", "-hkl", "refined.hkl", "-Na", repr(Ns[0]),
                     "-Nb", repr(Ns[1]), "-Nc", repr(Ns[2]), "-oversample", "2", "-nopgm", "-floatfile",
                     "model.bin"] + SHAPE, work, "simulate.log")
    det = n_expt[0].detector
    sizes = [tuple(p.get_image_size()) for p in det]
    offsets = np.concatenate([[0], np.cumsum([nx * ny for nx, ny in sizes])]).astype(int)
    model = np.fromfile(os.path.join(work, "model.bin"), dtype=np.float32) if rc == 0 else np.zeros(0)
    if not check(rc == 0 and model.size == offsets[-1] and model.sum() > 0, name + "-render",
                 "nbgrad simulate of the refined experiment: exit %d, %d pixels on %d panel(s), %.1f s" %
                 (rc, model.size, len(sizes), t_sim)):
        return None

    c = centroids(refl, model, offsets, sizes, bg)
    obs = np.array(refl["xyzobs.px.value"])[:, :2]
    cal = np.array(refl["xyzcal.px"])[:, :2]
    # the definition metric (a) rests on: DIALS's observed centroid is the counts-weighted mean over the shoebox's
    # foreground (measured: identical, 0 px)
    dev_obs = np.nanmax(np.abs(c[:, 0] - obs))
    check(dev_obs < 1e-3, name + "-centroid-definition",
          "xyzobs.px.value recomputed from the shoeboxes' data and foreground masks: largest difference %.2g px"
          % dev_obs)
    u = used
    d_dials = rms(cal[u] - obs[u])
    a_nb = rms(c[u, 1] - obs[u])
    oka = u & np.isfinite(c[:, 2, 0])
    a_nobg = rms(c[oka, 2] - obs[oka])
    okn = u & np.isfinite(c[:, 3 + len(WIDEN), 0])
    a_null = rms(c[okn, 3 + len(WIDEN)] - obs[okn])
    # metric (b): refine -centroids' own-spot centroids of the fitted model
    ownc = own_centroids(os.path.join(work, "centroids.txt"), refl, obs)
    okb = u & np.isfinite(ownc[:, 0])
    b_nb = rms(ownc[okb] - obs[okb])
    b_dials = rms(cal[okb] - obs[okb])
    print("%s: %d spots used in DIALS's refinement" % (name, u.sum()))
    print("  metric (a), spot finder's centroid of the model image (same pixels and weights as the observation):")
    print("    DIALS  xyzcal.px                       rms x / y %s px" % fmt2(d_dials))
    print("    nbgrad model + fitted background %.3f  rms x / y %s px" % (bg, fmt2(a_nb)))
    print("    nbgrad model alone (no background)     rms x / y %s px (for information; model empty on the "
          "foreground of %d used spots)" % (fmt2(a_nobg), u.sum() - oka.sum()))
    print("    no model: the foreground's own centre  rms x / y %s px over %d spots (ratios to DIALS %.2f / %.2f): "
          "metric (a) %s, the foreground mask (the observation's) decides it" %
          (fmt2(a_null), okn.sum(), a_null[0] / d_dials[0], a_null[1] / d_dials[1],
           "is not informative" if np.all(a_null <= a_nb) else "hardly tells models apart"))
    print("  metric (b), the reflection's own model spot (refine -centroids, 5 px about the observed centroid, its "
          "photons alone, nothing observed; stricter):")
    print("    DIALS  xyzcal.px                       rms x / y %s px (over the same %d spots)" % (fmt2(b_dials),
                                                                                              okb.sum()))
    print("    nbgrad model                           rms x / y %s px (model empty about %d used spots)" %
          (fmt2(b_nb), u.sum() - okb.sum()))
    for j, g in enumerate(WIDEN):
        okg = u & np.isfinite(c[:, 3 + j, 0])
        print("    (for information: the model image's centroid over the bbox widened by %d px, every reflection's "
              "light: nbgrad %s px over %d spots, DIALS %s)" % (g, fmt2(rms(c[okg, 3 + j] - obs[okg])), okg.sum(),
                                                               fmt2(rms(cal[okg] - obs[okg]))))
    panels = np.array(list(refl["panel"]))
    mc = spotfinder_on_model(work, spec, model, bg, ownc, obs, cal, panels, np.nonzero(okb)[0], gain)
    print("  metric (c), for information: DIALS's spot finder on nbgrad's model image (model + fitted background, "
          "Poisson counts of the detector's gain %.2f, seed 1; nothing observed enters the prediction):" % gain)
    print_metric_c(mc, okb)
    f_noise, f_trunc, f_trunc_n, f_mom, n_mom = floors(refl, model, offsets, sizes, bg, ownc, np.nonzero(okb)[0],
                                                       gain)
    e_nb, e_d = ownc[okb] - obs[okb], cal[okb] - obs[okb]
    corr = [np.corrcoef(e_nb[:, i], e_d[:, i])[0, 1] for i in (0, 1)]
    print("  why metric (b) stays near DIALS's (floors over the same %d spots):" % okb.sum())
    print("    the observed centroids' Poisson noise (gain %.2f)   rms x / y %s px" % (gain, fmt2(f_noise)))
    print("    a model exactly right, seen through the spot finder's truncation to its foreground (nbgrad's model "
          "image as the truth): metric (b) rms x / y %s px noise-free, %s px with Poisson counts (gain %.2f), against "
          "0.8 x DIALS's %s" % (fmt2(f_trunc), fmt2(f_trunc_n), gain, fmt2(TARGET * b_dials)))
    print("    nbgrad's and DIALS's errors (prediction - observed) correlate %.2f / %.2f in x / y: the part of the "
          "observed centroids that neither model predicts, rms x / y %s px (the two errors' mean)" %
          (corr[0], corr[1], fmt2(rms((e_nb + e_d) / 2))))
    print("    spot widths (rms, px) over the bounding box, %d spots: observed x / y %.2f / %.2f, nbgrad's model "
          "%.2f / %.2f" % (n_mom, *f_mom[:4]))
    print("    the brightest pixel's share of the spot, mean over the same: observed %.3f, nbgrad's model %.3f; the "
          "observed spot the sharper in %.0f %% of them" % (f_mom[4], f_mom[5], 100 * f_mom[6]))
    meets_b = bool(np.all(b_nb <= TARGET * b_dials)) and okb.sum() == u.sum()
    print("  metric (b) %s the target (nbgrad <= %.1f x DIALS in x and y): ratios %.2f / %.2f" %
          ("MEETS" if meets_b else "does NOT meet", TARGET, b_nb[0] / b_dials[0], b_nb[1] / b_dials[1]))

    # --- the crystal of blocks (see BLOCKS) ---
    rc, t_blk = run([nbgrad, "refine", "-expt", "indexed.expt", "-observed", spec["image"]] + REFINE_BLOCKS, work,
                    "blocks.log")
    blk = None
    if not os.path.exists(os.path.join(work, "blocks.json")) or rc not in (0, 3, 4):
        check(False, name + "-blocks", "nbgrad refine of the crystal of blocks, exit %d:\n%s" %
              (rc, tail(os.path.join(work, "blocks.log"))))
    else:
        jb = json.load(open(os.path.join(work, "blocks.json")))
        dev_b = jb["fit"]["deviance_ratio"]
        ownb = own_centroids(os.path.join(work, "blocks_centroids.txt"), refl, obs)
        okk = u & np.isfinite(ownb[:, 0])
        bb_nb, bb_dials = rms(ownb[okk] - obs[okk]), rms(cal[okk] - obs[okk])
        turns = [block_turn_deg(jb["parameters"], m) for m in range(1, 11)]
        meets_bb = bool(np.all(bb_nb <= TARGET * bb_dials)) and okk.sum() == u.sum()
        print("  the crystal of blocks (11 mosaic domains, each turned by its own fitted angles):")
        print("    metric (b): nbgrad rms x / y %s px, DIALS's %s over the same %d spots (model empty about %d used "
              "spots): ratios %.3f / %.3f, %s the target" %
              (fmt2(bb_nb), fmt2(bb_dials), okk.sum(), u.sum() - okk.sum(), bb_nb[0] / bb_dials[0],
               bb_nb[1] / bb_dials[1], "MEETS" if meets_bb else "does NOT meet"))
        print("    the blocks' own turns, domains 1 to 10 (deg; each on top of its spread's draw): %s" %
              " ".join("%.3f" % t for t in turns))
        # the blocks' model image (the list carries the domains, their spread's seed and their turns) and metric (c)
        pb = jb["parameters"]
        rc_b, _ = run([nbgrad, "simulate", "-expt", "blocks.expt", "-hkl", "blocks.hkl"] +
                      sum([["-" + k, repr(pb[k]["value"])] for k in ("Na", "Nb", "Nc")], []) +
                      ["-oversample", "2", "-nopgm", "-floatfile", "blocks_model.bin"] + SHAPE, work,
                      "simulate_blocks.log")
        print("    metric (c), for information: DIALS's spot finder on the blocks' model image (as above):")
        if rc_b != 0:
            print("    not computed: nbgrad simulate of blocks.expt exit %d" % rc_b)
        else:
            mb = np.fromfile(os.path.join(work, "blocks_model.bin"), dtype=np.float32)
            print_metric_c(spotfinder_on_model(work, spec, mb, pb["bg"]["value"], ownb, obs, cal, panels,
                                               np.nonzero(okk)[0], gain, tag="_blocks"), okk)
        # where the errors lie on the detector: radial (along 2theta) and tangential parts of metric (b)'s errors
        both = np.nonzero(okb & okk)[0]
        st, parts = radial_tangential(d_expt[0], panels, obs, [ownc, ownb, cal], both)
        print("  metric (b)'s errors split on the detector, radial (along 2theta) / tangential rms (mean radial), px, "
              "over %d spots:" % len(both))
        for lab, (r_, t_, m_) in zip(("nbgrad one lattice", "nbgrad blocks", "DIALS xyzcal.px"), st):
            print("    %-20s %.3f / %.3f (%+.3f)" % (lab, r_, t_, m_))
        cor = [[np.corrcoef(parts[i, c], parts[2, c])[0, 1] for c in (0, 1)] for i in (0, 1)]
        print("    correlation with DIALS's errors, radial / tangential: one lattice %.2f / %.2f, blocks %.2f / %.2f" %
              (cor[0][0], cor[0][1], cor[1][0], cor[1][1]))
        # the blocks explain the pixels better than one lattice: measured chi^2 thaumatin 7.51 -> 5.07
        check(jb.get("converged") is True and dev_b < dev, name + "-blocks",
              "the crystal of blocks: converged after %d iterations (exit %d, %.1f s), chi^2 per pixel %.3f against "
              "one lattice's %.3f" % (jb["iterations"], rc, t_blk, dev_b, dev))
        blk = {"nb_b": bb_nb, "dials_b": bb_dials, "meets_b": meets_bb, "dev": dev_b, "iters": jb["iterations"],
               "t_refine": t_blk}
        if known is None:
            # the same fit given the detector's gain (-gain, as a crystallographer who measured it would): its loss
            # is the counts' divided by the gain, and the fit takes another path, on which it turned one domain away
            # from every spot region.  Until stop 58 that refused the whole fit after its last step ("does not
            # determine d3.rot_x", exit 1, nothing written); now it writes its result, those parameters' standard
            # errors undefined (JSON null) and named in a warning.  Measured: 86 iterations, exit 2 (no step lowers
            # the loss), domains 3 and 4 undetermined (the binary before: exit 1 after the same steps).
            args = [a if a != "blocks.json" else "blocks_gain.json" for a in REFINE_BLOCKS]
            for k in ("-hklout", "-exptfile", "-centroids"):  # the blocks' outputs above stay theirs
                i = args.index(k)
                del args[i:i + 2]
            rc_g, t_g = run([nbgrad, "refine", "-expt", "indexed.expt", "-observed", spec["image"]] + args +
                            ["-gain", "%.4f" % gain], work, "blocks_gain.log")
            jg = None
            if os.path.exists(os.path.join(work, "blocks_gain.json")):
                jg = json.load(open(os.path.join(work, "blocks_gain.json")))
            und = [k for k, v in jg["parameters"].items() if v.get("sigma") is None and not k.startswith("F")] \
                if jg else []
            warned = "WARNING: the fit moved" in open(os.path.join(work, "blocks_gain.log")).read()
            check(rc_g in (0, 2, 3, 4) and jg is not None and len(und) == jg.get("undetermined", -1) and
                  warned == (len(und) > 0), name + "-blocks-gain",
                  "the crystal of blocks fitted with -gain %.4f writes its result: exit %d after %s iterations "
                  "(%.1f s), %d parameter(s) the fit left without information (%s)%s" %
                  (gain, rc_g, jg["iterations"] if jg else "?", t_g, len(und), ", ".join(und) or "none",
                   ", named in a warning" if warned else ""))
    # Until stop 58 this checked the target on metric (a) (measured thaumatin 0.37 / 0.17 of DIALS's, cspad
    # 0.43 / 0.52).  But the foreground's own centre, with no model at all, scores 0.23 / 0.14 and 0.35 / 0.37
    # (printed above): metric (a) measures the observation's foreground mask, not the model, and a check on it
    # could not tell a right model from none.  The check now guards what is informative, metric (b), where nothing
    # observed enters the prediction: nbgrad's one lattice within 20 % of DIALS's or better (measured thaumatin
    # 1.06 / 0.63, cspad 0.89 / 1.02).  The target (0.8) is printed above, met or not, for (b) and (c).
    check(bool(np.all(b_nb <= GUARD_B * b_dials)) and okb.sum() == u.sum(), name + "-centroids",
          "metric (b): nbgrad's own model spots rms x / y %s px, DIALS's %s px over %d spots (ratios %.2f / %.2f, "
          "guard <= %.1f; the issue's target %.1f %s)" %
          (fmt2(b_nb), fmt2(b_dials), okb.sum(), b_nb[0] / b_dials[0], b_nb[1] / b_dials[1], GUARD_B, TARGET,
           "met" if meets_b else "NOT met"))

    return {"name": name, "n": int(u.sum()), "dials_a": d_dials, "nb_a": a_nb, "null_a": a_null, "dials_b": b_dials,
            "nb_b": b_nb,
            "meets_b": meets_b, "d_cell": d_cell, "n_cell": n_cell,
            "n_sig": (par["a"]["sigma"] * sig, par["c"]["sigma"] * sig), "turn": turn, "dev": dev,
            "iters": js["iterations"], "d_steps": d_steps, "t_dials": t_dials, "t_refine": t_refine,
            "t_sim": t_sim, "Ns": Ns, "bg": bg, "blocks": blk}


def table(rows):
    print("\nstill      model   rms (a) x / y    rms (b) x / y    cell a, c (A)                 turn (deg)  chi^2/px  "
          "iterations  time (s)")
    print("(DIALS's iterations: the steps of its last refinement macro cycle, in brackets all its steps; its time is "
          "import, find_spots and index; nbgrad's orientation change is from DIALS's model, U against U in DIALS's "
          "frame)")
    for r in rows:
        print("%-10s DIALS   %-16s %-16s %8.3f %8.3f                          -   %8s  %10s  %8.1f" %
              (r["name"], fmt2(r["dials_a"]), fmt2(r["dials_b"]), r["d_cell"][0], r["d_cell"][2], "-",
               "%d (%d)" % r["d_steps"][:2] if r["d_steps"] else "?", r["t_dials"]))
        print("%-10s no model %-15s %-16s (metric (a)'s null: the foreground's own centre, no model)" %
              ("", fmt2(r["null_a"]), "-"))
        print("%-10s nbgrad  %-16s %-16s %8.3f(%.3f) %8.3f(%.3f)  %10.4f  %8.3f  %10d  %8.1f" %
              ("", fmt2(r["nb_a"]), fmt2(r["nb_b"]), r["n_cell"][0], r["n_sig"][0], r["n_cell"][2], r["n_sig"][1],
               r["turn"], r["dev"], r["iters"], r["t_refine"]))
        print("%-10s         Na Nb Nc %.2f %.2f %.2f, background %.2f; (sigma) scaled by sqrt(chi^2)%s" %
              ("", r["Ns"][0], r["Ns"][1], r["Ns"][2], r["bg"],
               "" if r["meets_b"] else "; metric (b) misses the target"))
        b = r.get("blocks")
        if b:
            print("%-10s blocks  %-16s %-16s %8s %8s  %10s  %8.3f  %10d  %8.1f" %
                  ("", "-", fmt2(b["nb_b"]), "", "", "", b["dev"], b["iters"], b["t_refine"]))
            print("%-10s         11 mosaic domains turned by their own angles; metric (b) %s the target (DIALS %s)" %
                  ("", "meets" if b["meets_b"] else "misses", fmt2(b["dials_b"])))


def main(argv):
    nbgrad = os.path.abspath(argv[1])
    keep = len(argv) > 2
    work = os.path.abspath(argv[2]) if keep else tempfile.mkdtemp(prefix="nbg-real.")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rows = []
    try:
        for name, spec in STILLS.items():
            t0 = time.time()
            r = one_still(nbgrad, os.path.join(work, name), name, spec)
            print("%s: %.0f s in all" % (name, time.time() - t0), flush=True)
            if r:
                rows.append(r)
        if rows:
            table(rows)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    roundtrip.run_script(main, sys.argv)
