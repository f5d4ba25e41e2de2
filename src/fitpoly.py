#!/usr/bin/python3
"""fitpoly.py -- how the lattice factor's polynomials in src/physics_tmpl.h were fitted (run by hand; needs mpmath).

    python3 src/fitpoly.py

For |d| <= 1/2 and y = (pi d)^2 the kernels evaluate
    cos(pi d)            = 1 - y / 2 + y^2 r(y)     (nbgi_cospi_reduced; r of degree 6 in double, 3 in float)
    sin(pi d) / (pi d)   = 1 - y / 6 + y^2 s(y)     (nbgi_sinpi_poly, for the derivatives; s of degree 6 in double)
with r and s chosen for the least largest absolute error on [0, pi^2 / 4]: Lawson's iteration (weighted least
squares whose weights are multiplied by each point's error until the weighted errors level) at Chebyshev nodes, in
50 digits.  Keeping the two first terms exact keeps the value exact at d = 0 and the small-d behaviour Taylor's.
The script prints each set of coefficients (highest power first, as the Horner form in physics_tmpl.h takes them)
and the largest error over a fine grid once they are rounded to the precision they are used in; tests/test-grad.c
(grad-0-poly) checks the kernels' functions against long double's cosl and sinl.
"""
import struct

import mpmath as mp

mp.mp.dps = 50
Y = mp.pi ** 2 / 4


def fit(f, lead, degree, nodes=300, rounds=60):
    """Coefficients a_0..a_degree with f(y) ~ lead(y) + y^2 sum a_k y^k on [0, Y], least largest error."""
    ys = [Y * (1 - mp.cos(mp.pi * (k + mp.mpf(1) / 2) / nodes)) / 2 for k in range(nodes)]
    target = [(f(y) - lead(y)) / y ** 2 for y in ys]
    w = [mp.mpf(1) / nodes] * nodes
    for _ in range(rounds):
        A = mp.matrix(nodes, degree + 1)
        b = mp.matrix(nodes, 1)
        for i, y in enumerate(ys):
            s = mp.sqrt(w[i]) * y ** 2
            for k in range(degree + 1):
                A[i, k] = s * y ** k
            b[i] = s * target[i]
        a = mp.qr_solve(A, b)[0]
        err = [abs(ys[i] ** 2 * (sum(a[k] * ys[i] ** k for k in range(degree + 1)) - target[i]))
               for i in range(nodes)]
        total = sum(w[i] * err[i] for i in range(nodes))
        w = [w[i] * err[i] / total for i in range(nodes)]
    return [a[k] for k in range(degree + 1)]


def largest_error(f, lead, coef, rnd):
    """The largest |f - polynomial| over 2001 points of [0, 1/2] in d, the coefficients rounded by rnd."""
    c = [mp.mpf(rnd(x)) for x in coef]
    worst = 0
    for j in range(1, 2001):
        y = (mp.pi * mp.mpf(j) / 4000) ** 2
        worst = max(worst, abs(lead(y) + y ** 2 * sum(c[k] * y ** k for k in range(len(c))) - f(y)))
    return worst


def to_float(x):
    return struct.unpack("f", struct.pack("f", float(x)))[0]


def main():
    cos_y = lambda y: mp.cos(mp.sqrt(y))
    sinc_y = lambda y: mp.sin(mp.sqrt(y)) / mp.sqrt(y)
    cos_lead = lambda y: 1 - y / 2
    sin_lead = lambda y: 1 - y * mp.mpf(float(mp.mpf(1) / 6))  # with 1/6 rounded to double, as the kernel has it
    for name, f, lead, degree, rnd, fmt in (
            ("cosine, double", cos_y, cos_lead, 6, float, repr),
            ("sine / u, double", sinc_y, sin_lead, 6, float, repr),
            ("cosine, float", cos_y, cos_lead, 3, to_float, lambda x: "%.9ef" % x)):
        coef = fit(f, lead, degree)
        print("%s: largest error %s with the coefficients rounded" % (name, mp.nstr(largest_error(f, lead, coef, rnd), 3)))
        for a in reversed(coef):
            print("    " + fmt(rnd(a)))


if __name__ == "__main__":
    main()
