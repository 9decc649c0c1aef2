"""Near-minimax fits of relative error for the vmath_*_fit.py scripts (needs numpy)."""
import numpy as np


def fit_relative(V, target, scale, iterations):
    """Coefficients c minimizing max |V c - target| / scale: least squares reweighted by
    Lawson's rule (each point's weight times its error, renormalized), the best iterate kept.
    Returns (max relative error, c)."""
    w, best = np.ones(len(target)), None
    for _ in range(iterations):
        sw = np.sqrt(w) / scale
        c = np.linalg.lstsq(V * sw[:, None], target * sw, rcond=None)[0]
        err = (V @ c - target) / scale
        if best is None or np.max(np.abs(err)) < best[0]:
            best = (np.max(np.abs(err)), c)
        w = w * np.abs(err) + 1e-300
        w /= w.sum()
    return best
