#!/usr/bin/env python3
"""sensitivity_map.py -- where on the detector the image responds to each parameter (forward-mode tangents).

    PYTHONPATH=build/py/lib python3 examples/sensitivity_map.py [OUT_PREFIX]

nbgrad.jvp renders dI/dtheta for several parameters in one pass.  With matplotlib the image and the maps are
plotted into OUT_PREFIX.png (default: build/sensitivity); without it every map is written as OUT_PREFIX_<param>.npy
and a PGM of its magnitude, OUT_PREFIX_<param>.pgm.
"""
import sys
from pathlib import Path

import numpy as np

import nbgrad

PARAMS = ["a", "rotz", "distance", "Na"]


def main(prefix):
    exp = nbgrad.Experiment(cell=(70, 80, 90, 75, 85, 95), misset=(10, 5, 3), N=5, wavelength=1.0, distance=100,
                            detpixels=256, pixel=0.2, oversample=2, default_F=100)
    tangents, image = nbgrad.jvp(exp, PARAMS, return_image=True)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for name, t in zip(PARAMS, tangents):
        print(f"dI/d{name:9s} max |.| {np.abs(t).max():.4g} photons per unit, total {t.sum():+.4g}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        for name, t in zip(PARAMS, tangents):
            np.save(f"{prefix}_{name}.npy", t)
            mag = np.abs(t).astype(np.float32)
            # a PGM's 8 bits: the 99.9th percentile maps to 255
            top = float(np.percentile(mag, 99.9)) or 1.0
            nbgrad.write_pgm(f"{prefix}_{name}.pgm", mag, 255.0 / top)
        print(f"matplotlib is not installed: wrote {prefix}_<param>.npy and .pgm")
        return 0
    fig, axes = plt.subplots(1, len(PARAMS) + 1, figsize=(4 * (len(PARAMS) + 1), 4))
    axes[0].imshow(np.sqrt(image), cmap="gray_r")
    axes[0].set_title("image (sqrt)")
    for ax, name, t in zip(axes[1:], PARAMS, tangents):
        lim = float(np.percentile(np.abs(t), 99.5)) or 1.0
        ax.imshow(t, cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(f"dI/d{name}")
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(f"{prefix}.png", dpi=80)
    print(f"wrote {prefix}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/sensitivity")))
