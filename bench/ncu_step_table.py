#!/usr/bin/env python3
"""ncu_step_table.py NCU_CSV [STEP_MS] -- where the time of one decode step goes, by kernel.

Reads Nsight Compute's CSV (`ncu --csv --metrics gpu__time_duration.sum ...`) of a program
that ran a few decode steps without CUDA graphs, cuts out the last step (from the last launch
of the step's first kernel, `embed_kernel`, to the end) and prints: each kernel of that step
in launch order with its duration, then the durations summed by kernel name, and their total
next to STEP_MS (the step time measured without the profiler, when given): the difference is
what launches and gaps between kernels cost.
"""
import csv
import re
import sys
from collections import OrderedDict


def short(name):
    """`void gemv_kernel<(di_dtype)3, 1, 2, 4, false, true>(...)` -> `gemv_kernel<3,1,2,4,0,1>`."""
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(di_dtype\)", "", name)
    name = name.replace("false", "0").replace("true", "1")
    m = re.match(r"([A-Za-z0-9_]+)(<[^>]*>)?", name)
    return (m.group(1) + (m.group(2) or "").replace(" ", "")) if m else name


def main():
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own log lines are not CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        us = v / 1000.0 if unit.startswith("n") else v * 1000.0 if unit.startswith("m") else v
        rows.append((short(r["Kernel Name"]), us))
    starts = [i for i, (n, _) in enumerate(rows) if n.startswith("embed_kernel")]
    if not starts:
        sys.exit("no embed_kernel launch in %s" % sys.argv[1])
    step = rows[starts[-1]:]
    print("last decode step: %d kernels" % len(step))
    for i, (n, us) in enumerate(step):
        print("%4d %9.1f us  %s" % (i, us, n))
    agg = OrderedDict()
    for n, us in step:
        c, t = agg.get(n, (0, 0.0))
        agg[n] = (c + 1, t + us)
    total = sum(us for _, us in step)
    print("\nby kernel (count, total us, share):")
    for n, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print("%5d %10.1f us %5.1f %%  %s" % (c, t, 100 * t / total, n))
    print("\nkernel time of the step: %.1f us" % total)
    if len(sys.argv) > 2:
        ms = float(sys.argv[2])
        print("measured step (no profiler): %.1f us; launches and gaps: %.1f us (%.0f %%)"
              % (ms * 1000, ms * 1000 - total, 100 * (ms * 1000 - total) / (ms * 1000)))


if __name__ == "__main__":
    main()
