#!/usr/bin/env python3
"""refine_cell.py -- fit a crystal's cell and orientation to a noisy image, from Python.

    PYTHONPATH=build/py/lib python3 examples/refine_cell.py      (or after pip install ./python)

The Python counterpart of examples/refine_cell.c: render the true experiment, add Poisson noise, start from a
perturbed cell and orientation, and refine with Levenberg-Marquardt on the Poisson likelihood.  Prints the fitted
values with their standard errors and the true ones.
"""
import numpy as np

import nbgrad

TRUE = dict(cell=(70, 80, 90, 75, 85, 95), misset=(10, 5, 3), N=5, wavelength=1.0, distance=100, detpixels=256,
            pixel=0.2, oversample=2, default_F=100)
PARAMS = ["a", "b", "c", "alpha", "beta", "gamma", "rotx", "roty", "rotz"]


def main():
    truth = nbgrad.Experiment(**TRUE)
    image = nbgrad.simulate(truth)
    # photons: Poisson noise on the image (nanoBragg's generator, a fixed seed), the 40-count pedestal removed
    noisy, photons, _ = nbgrad.noise_image(image, seed=1234, adc=0)
    observed = noisy.astype(np.float32)
    print(f"true image: {image.shape[1]}x{image.shape[0]} pixels, {photons} photons")

    start = truth.copy()
    for name, delta in zip(PARAMS, (0.3, -0.25, 0.2, 0.15, -0.1, 0.1, 0.05, -0.05, 0.04)):
        start.set_param(name, truth.get_param(name) + delta)

    def progress(it, loss, gnorm, step):
        print(f"  iteration {it:2d}  loss {loss:.8g}  |grad| {gnorm:.3g}")

    res = nbgrad.refine(start, observed, PARAMS, method="lm", loss="poisson", progress=progress)
    print(f"{'converged' if res.converged else 'NOT converged'} after {res.iterations} iterations, "
          f"loss {res.start_loss:.8g} -> {res.loss:.8g}")
    print(f"{'param':>6} {'start':>10} {'fitted':>10} {'sigma':>9} {'true':>8}")
    worst = 0.0
    for name in PARAMS:
        t = truth.get_param(name)
        worst = max(worst, abs(res.values[name] - t) / max(res.sigmas[name], 1e-12))
        print(f"{name:>6} {res.start[name]:10.4f} {res.values[name]:10.4f} {res.sigmas[name]:9.2e} {t:8.3f}")
    print(f"largest error: {worst:.1f} sigma")
    return 0 if res.converged and worst < 5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
