"""A tensor as the parity corpora's JSON object (shared by the make_*_parity.py generators)."""
import math


def tj(t):
    """{"dtype", "shape", "data"}: row-major data, non-finite floats as "nan" / "inf" / "-inf"."""
    import torch
    t = t.detach()
    data = t.reshape(-1).tolist()
    if t.dtype.is_floating_point:
        data = [("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")) if not math.isfinite(v) else v for v in data]
    elif t.dtype == torch.bool:
        data = [bool(v) for v in data]
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "data": data}
