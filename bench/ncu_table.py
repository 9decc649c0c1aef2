#!/usr/bin/env python3
"""Device time by kernel from an Nsight Compute CSV (ncu --metrics gpu__time_duration.sum --csv).

  ncu --clock-control none --metrics gpu__time_duration.sum --csv PROGRAM ... > k.csv
  python3 bench/ncu_table.py k.csv [--last N] [--top K]

--last N keeps the last N kernels profiled (one CUDA-graph replay of a compiled step: its kernel
nodes are profiled one by one, in order). Rows: total µs, share, launches, mean µs, name, grid."""
import csv, sys, collections, argparse

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--last", type=int, default=0)
ap.add_argument("--top", type=int, default=40)
o = ap.parse_args()
lines = open(o.csv, errors="replace").read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
rows = [r for r in csv.DictReader(lines[start:]) if r.get("Metric Name") == "gpu__time_duration.sum"]
if o.last:
    rows = rows[-o.last:]
agg = collections.OrderedDict()
for r in rows:
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    us = float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit", "nsecond"), 1e-3)
    key = (r["Kernel Name"][:90], r.get("Grid Size", ""))
    a = agg.setdefault(key, [0.0, 0])
    a[0] += us
    a[1] += 1
total = sum(a[0] for a in agg.values())
print(f"{len(rows)} kernels, {total:.1f} us in all")
for (name, grid), (us, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[: o.top]:
    print(f"{us:10.1f} {100 * us / total:5.1f}% {n:5d} {us / n:9.1f}  {name}  {grid}")
