#!/usr/bin/env python3
"""Fits the tables of kiln's float32 erf (kernels/cpu/vmath_erf.cpp) and prints them as C++.

erf on [0, 3.9192059) is cut into 16 intervals of width 1/4 (above, erf rounds to 1 in
float32). Interval 0 is [0, 1/4) with centre 0 and erf(x) = x * p(x); interval i > 0 has
centre (i + 1/2) / 4 and erf(c + s) = p(s), p of degree 6. Each p is a near-minimax fit of
the relative error (least squares reweighted by Lawson's rule on 6000 points, double
precision; max relative error 2.6e-9). The two leading coefficients are split into a float
and the float of the rest (hi + lo), the others rounded to float.

Needs numpy:  python3 kernels/cpu/vmath_erf_fit.py
"""
import math

import numpy as np

from vmath_lawson import fit_relative

DEGREE, WIDTH, INTERVALS, ONE = 6, 0.25, 16, 3.9192059


def f32(v):
    return float(np.float32(v))


def fit(i):
    a, b = i * WIDTH, min((i + 1) * WIDTH, ONE)
    c = 0.0 if i == 0 else (i + 0.5) * WIDTH
    x = np.linspace(a, b, 6000)[1 if i == 0 else 0:]
    s, f = x - c, np.array([math.erf(v) for v in x])
    first = 1 if i == 0 else 0  # interval 0: no constant term
    V = np.vander(s, DEGREE + 1, increasing=True)[:, first:]
    best = fit_relative(V, f, f, 80)
    full = [0.0] * first + list(best[1])
    hi0, hi1 = f32(full[0]), f32(full[1])
    return best[0], [hi0, f32(full[0] - hi0), hi1, f32(full[1] - hi1)] + [f32(v) for v in full[2:]]


def main():
    rows = [fit(i) for i in range(INTERVALS)]
    print("// max relative error of the fits: %.2e" % max(r[0] for r in rows))
    names = ["c0 hi", "c0 lo", "c1 hi", "c1 lo"] + ["c%d" % k for k in range(2, DEGREE + 1)]
    for k, name in enumerate(names):
        vals = ["%.9ef" % r[1][k] for r in rows]
        lines = [", ".join(vals[j:j + 4]) for j in range(0, len(vals), 4)]
        print("    // %s\n    {%s}," % (name, ",\n     ".join(lines)))


if __name__ == "__main__":
    main()
