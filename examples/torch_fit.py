#!/usr/bin/env python3
"""torch_fit.py -- nbgrad inside a PyTorch optimisation loop.

    PYTHONPATH=build/py/lib python3 examples/torch_fit.py

Fits the cell lengths and the structure factors' overall scale with torch.optim.Adam: the image is
nbgrad.torch.simulate (the forward renders the image and its tangent images in a, b, c in one pass, the backward
contracts them with the incoming gradient), the loss is ordinary torch code.
"""
import torch

import nbgrad
import nbgrad.torch as nbt


def main():
    common = dict(misset=(10, 5, 3), N=5, wavelength=1.0, distance=100, detpixels=128, pixel=0.4, oversample=2)
    truth = nbgrad.Experiment(cell=(70, 80, 90, 75, 85, 95), default_F=100, **common)
    target = torch.from_numpy(nbgrad.simulate(truth)).double()

    exp = truth.copy()
    cell = torch.tensor([70.2, 79.85, 90.15], dtype=torch.float64, requires_grad=True)
    log_scale = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)  # the image's scale, log
    opt = torch.optim.Adam([cell, log_scale], lr=0.01)
    for it in range(150):
        opt.zero_grad()
        image = nbt.simulate(exp, {"a": cell[0], "b": cell[1], "c": cell[2]}).double() * log_scale.exp()
        loss = ((image - target) ** 2).sum() / target.pow(2).sum()
        loss.backward()
        opt.step()
        if it % 25 == 0 or it == 149:
            a, b, c = cell.detach().tolist()
            print(f"step {it:3d}  loss {loss.item():.3e}  a b c = {a:.4f} {b:.4f} {c:.4f}  "
                  f"scale {log_scale.exp().item():.4f}")
    ok = torch.allclose(cell.detach(), torch.tensor([70.0, 80.0, 90.0], dtype=torch.float64), atol=0.02)
    print("recovered" if ok else "not recovered")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
