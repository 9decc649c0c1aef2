#!/usr/bin/env python3
"""Fits the polynomial of kiln's float32 exp (kernels/cpu/vmath_exp.cpp) and prints it as C++.

exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln(2) / 2; exp(r) = 1 + r + r^2 q(r) with q of
degree 4, a near-minimax fit of the relative error (least squares reweighted by Lawson's rule on
20001 points, double precision; max relative error 3.1e-9), coefficients rounded to float.

Needs numpy:  python3 kernels/cpu/vmath_exp_fit.py
"""
import math

import numpy as np

from vmath_lawson import fit_relative

DEGREE = 4  # of q


def main():
    h = math.log(2) / 2 * 1.0001
    r = np.linspace(-h, h, 20001)
    f = np.exp(r)
    V = np.vander(r, DEGREE + 1, increasing=True) * (r * r)[:, None]
    t = f - 1 - r
    best = fit_relative(V, t, f, 100)
    print("// max relative error of the fit: %.2e" % best[0])
    print("    " + ", ".join("%.9ef" % np.float32(v) for v in best[1]))


if __name__ == "__main__":
    main()
