"""dxtbx/DIALS interop: a dxtbx Experiment (beam, one-panel detector, goniometer, scan, crystal) as nbgrad's
geometry dict (nbg_geometry), the frame of dxtbx's models (the beam along -z for the usual models), so that
Experiment.from_geometry describes the same experiment.  dxtbx is imported by the caller's experiment, not here:
this module only calls the models' accessors."""
import math

import numpy as np


def _mat3(m):
    return np.array(m, dtype=float).reshape(3, 3)


def geometry_from_dxtbx(experiment) -> dict:
    """The geometry dict of a dxtbx Experiment.  Refused (ValueError): several panels, a missing beam or
    detector.  Without a goniometer (a still) the axis is x and the scan one frame of 0 width."""
    beam, detector = experiment.beam, experiment.detector
    if beam is None or detector is None:
        raise ValueError("from_dxtbx: the experiment needs a beam and a detector")
    if len(detector) != 1:
        raise ValueError(f"from_dxtbx: nbgrad models one panel, the detector has {len(detector)}")
    panel = detector[0]
    fpixels, spixels = panel.get_image_size()
    pixel_f, pixel_s = panel.get_pixel_size()
    g = {
        "fpixels": int(fpixels), "spixels": int(spixels), "pixel_f": float(pixel_f), "pixel_s": float(pixel_s),
        "fast": tuple(panel.get_fast_axis()), "slow": tuple(panel.get_slow_axis()),
        # dxtbx's panel origin is the corner of the first pixel, as nbg_geometry's
        "origin": tuple(panel.get_origin()),
        "thickness": float(panel.get_thickness()), "mu": float(panel.get_mu()),
        "material": str(panel.get_material() or ""),
        "gain": float(panel.get_gain()), "pedestal": float(panel.get_pedestal()),
        # what DIALS reads the counts with ((raw - pedestal) / gain) when it is not dxtbx's default
        "response_stated": int(panel.get_gain() != 1 or panel.get_pedestal() != 0),
        # the sample-to-source direction, which is what nbg_geometry calls the beam's direction
        "direction": tuple(beam.get_sample_to_source_direction()),
        "wavelength": float(beam.get_wavelength()),
        "polarization_normal": tuple(beam.get_polarization_normal()),
        "polarization_fraction": float(beam.get_polarization_fraction()),
    }
    top = panel.get_trusted_range()[1]
    if math.isfinite(top) and top < 1e300:
        g["saturation"] = float(top)
    gonio, scan = experiment.goniometer, experiment.scan
    S = np.eye(3)
    Fm = np.eye(3)
    if gonio is not None:
        # the lab-frame axis is the setting rotation applied to the datum axis; the fixed rotation is the
        # crystal's mounting, folded into the crystal below (S R(datum, phi) F = R(S datum, phi) S F)
        S = _mat3(gonio.get_setting_rotation())
        Fm = _mat3(gonio.get_fixed_rotation())
        g["axis"] = tuple(S @ np.array(gonio.get_rotation_axis_datum(), dtype=float))
        if hasattr(gonio, "get_axes") and hasattr(gonio, "get_scan_axis"):
            # a MultiAxisGoniometer (kappa, SmarGon): its structure, so that a list written back keeps it
            g["goniometer"] = {"axes": tuple(tuple(float(x) for x in v) for v in gonio.get_axes()),
                               "angles": tuple(float(x) for x in gonio.get_angles()),
                               "names": tuple(str(x) for x in gonio.get_names()),
                               "scan_axis": int(gonio.get_scan_axis())}
    if scan is not None:
        start, width = scan.get_oscillation()
        first, last = scan.get_image_range()
        g["scan_start"], g["scan_width"] = float(start), float(width)
        g["nframes"] = int(last - first + 1)
        times = scan.get_exposure_times()
        if len(times) and times[0] > 0:
            g["exposure"] = float(times[0])
    crystal = experiment.crystal
    if crystal is not None:
        a, b, c = (np.array(v, dtype=float) for v in crystal.get_real_space_vectors())
        SF = S @ Fm
        g["real_space"] = tuple(tuple(SF @ v) for v in (a, b, c))
        g["space_group"] = str(crystal.get_space_group().type().hall_symbol())
    return g
