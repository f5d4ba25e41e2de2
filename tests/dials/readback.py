#!/usr/bin/python3
"""Reads files with DIALS's dxtbx and prints the models it built as one JSON object (for the tests to compare
with what nbgrad wrote).  Run with Debian's python3 (which has dxtbx):

    /usr/bin/python3 tests/dials/readback.py FILE [FILE...]     images (NXmx, CBF, SMV), one sequence
    /usr/bin/python3 tests/dials/readback.py --expt FILE.expt   an experiment list (images not opened)

Output: {"format": class name, "beam": {...}, "panels": [...], "goniometer": {...}, "scan": {...},
"crystal": {...} or null, "image0": {"sum":..,"max":..,"shape":[slow,fast]}}; lengths mm, angles deg.
"""
import json
import sys


def models(expts, with_image):
    e = expts[0]
    out = {"n_experiments": len(expts)}
    b = e.beam
    out["beam"] = {
        "direction": list(b.get_sample_to_source_direction()),
        "wavelength": b.get_wavelength(),
        "polarization_normal": list(b.get_polarization_normal()),
        "polarization_fraction": b.get_polarization_fraction(),
    }
    out["panels"] = []
    for p in e.detector:
        out["panels"].append({
            "fast": list(p.get_fast_axis()), "slow": list(p.get_slow_axis()), "origin": list(p.get_origin()),
            "pixel_size": list(p.get_pixel_size()), "image_size": list(p.get_image_size()),
            "thickness": p.get_thickness(), "mu": p.get_mu(), "material": p.get_material(),
            "trusted_range": list(p.get_trusted_range()),
            "beam_centre_mm": list(p.get_beam_centre(b.get_s0())) if p.is_coord_valid_mm(
                p.get_beam_centre(b.get_s0())) or True else None,
            "distance": p.get_directed_distance(),
        })
    g = e.goniometer
    out["goniometer"] = None if g is None else {"axis": list(g.get_rotation_axis())}
    s = e.scan
    out["scan"] = None if s is None else {
        "oscillation": list(s.get_oscillation()), "image_range": list(s.get_image_range()),
        "exposure": list(s.get_exposure_times())[:1]}
    c = e.crystal
    out["crystal"] = None if c is None else {
        "real_space": [list(v) for v in c.get_real_space_vectors()],
        "unit_cell": list(c.get_unit_cell().parameters()),
        "A": list(c.get_A())}
    if with_image:
        iset = e.imageset
        out["format"] = type(iset.get_format_class()).__name__ if not isinstance(
            iset.get_format_class(), type) else iset.get_format_class().__name__
        raw = iset.get_raw_data(0)
        raw = raw[0] if isinstance(raw, tuple) else raw
        import numpy
        a = raw.as_numpy_array().astype(float)
        out["image0"] = {"sum": float(a.sum()), "max": float(a.max()), "min": float(a.min()), "shape": list(a.shape),
                         "pixel_10_20": float(a[20, 10]) if a.shape[0] > 20 and a.shape[1] > 10 else None}
        try:
            m = iset.get_mask(0)
            m = m[0] if isinstance(m, tuple) else m
            out["image0"]["masked"] = int((~m.as_numpy_array()).sum()) if m is not None else None
        except Exception as ex:  # noqa: BLE001 -- report, do not fail the read-back
            out["image0"]["masked"] = "error: %s" % ex
    return out


def main(argv):
    from dxtbx.model.experiment_list import ExperimentListFactory
    if len(argv) >= 2 and argv[0] == "--expt":
        expts = ExperimentListFactory.from_json_file(argv[1], check_format=False)
        print(json.dumps(models(expts, False), indent=1))
        return 0
    expts = ExperimentListFactory.from_filenames(argv)
    print(json.dumps(models(expts, True), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
