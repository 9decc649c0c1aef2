#!/usr/bin/env python3
"""Device time by kernel from an Nsight Compute CSV (ncu --metrics gpu__time_duration.sum --csv).

  ncu --clock-control none --metrics gpu__time_duration.sum --csv PROGRAM ... > k.csv
  python3 bench/ncu_table.py k.csv [--last N] [--top K]

--last N keeps the last N kernels profiled (one CUDA-graph replay of a compiled step: its kernel
nodes are profiled one by one, in order); --last auto (the default) keeps the last call's: the
shortest tail of kernel names that the kernels before it repeat (the last two calls of a step
run the same kernels). A fixed count was wrong whenever a change added or removed kernels (the
replay of 2026-11-29 held 934 kernels, counted as 1300). Rows: total µs, share, launches, mean
µs, name, grid."""
import csv, sys, collections, argparse

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--last", default="auto", help="N, auto or all")
ap.add_argument("--top", type=int, default=40)
o = ap.parse_args()
lines = open(o.csv, errors="replace").read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
rows = [r for r in csv.DictReader(lines[start:]) if r.get("Metric Name") == "gpu__time_duration.sum"]
def repeated_tail(names, shortest=50):
    """The length of the shortest tail that the names before it repeat (0: none)."""
    n = len(names)
    for p in range(shortest, n // 2 + 1):
        if names[n - p:] == names[n - 2 * p:n - p]:
            return p
    return 0

if o.last == "auto":
    p = repeated_tail([r["Kernel Name"] for r in rows])
    if p:
        rows = rows[-p:]
    else:
        print("no repeated tail of kernels: the whole profile is summed", file=sys.stderr)
elif o.last != "all" and int(o.last) > 0:
    rows = rows[-int(o.last):]
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
