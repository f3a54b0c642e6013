#!/usr/bin/env python3
"""ncu_step_table.py NCU_CSV [STEP_MS] [--first] -- where the time of one step goes, by kernel.

Reads Nsight Compute's CSV (`ncu --csv --metrics gpu__time_duration.sum ...`) of a program
that ran a few decode steps without CUDA graphs, cuts out the last step (from the last launch
of the step's first kernel, `embed_kernel`, to the end) and prints: each kernel of that step
in launch order with its duration, then the durations summed by kernel name, and their total
next to STEP_MS (the step time measured without the profiler, when given): the difference is
what launches and gaps between kernels cost. --first takes the first step instead (up to the
second `embed_kernel`): a profile of an engine run's first forward, e.g. a prefill chunk of
several prompts (`bench_engine --gen-len 2` under ncu). When the CSV also holds `dram__bytes_read.sum`
(add it to ncu's --metrics), each kernel's DRAM reads and their rate are printed too.
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


BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def read_rows(path):
    """[(kernel, us, dram bytes or None)] in launch order."""
    kernels = OrderedDict()  # launch ID -> [name, us, bytes]
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own log lines are not CSV
    for r in csv.DictReader(lines):
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "")
        k = kernels.setdefault(r["ID"], [short(r["Kernel Name"]), 0.0, None])
        if r.get("Metric Name") == "gpu__time_duration.sum":
            k[1] = v / 1000.0 if unit.startswith("n") else v * 1000.0 if unit.startswith("m") else v
        elif r.get("Metric Name") == "dram__bytes_read.sum":
            k[2] = v * BYTE_UNITS.get(unit, 1)
    return [tuple(k) for k in kernels.values()]


def main():
    first = "--first" in sys.argv[1:]
    args = [a for a in sys.argv[1:] if a != "--first"]
    if not args:
        sys.exit(__doc__)
    rows = read_rows(args[0])
    starts = [i for i, (n, _, _) in enumerate(rows) if n.startswith("embed_kernel")]
    if not starts:
        sys.exit("no embed_kernel launch in %s" % args[0])
    step = rows[starts[0]:starts[1] if len(starts) > 1 else len(rows)] if first else rows[starts[-1]:]
    with_bytes = all(b is not None for _, _, b in step)
    print("%s step: %d kernels%s" % ("first" if first else "last", len(step),
                                     "; DRAM MB read, GB/s" if with_bytes else ""))
    for i, (n, us, b) in enumerate(step):
        extra = " %8.2f MB %6.0f GB/s" % (b / 1e6, b / us / 1e3) if with_bytes and us > 0 else ""
        print("%4d %9.1f us%s  %s" % (i, us, extra, n))
    agg = OrderedDict()
    for n, us, b in step:
        c, t, tb = agg.get(n, (0, 0.0, 0.0))
        agg[n] = (c + 1, t + us, tb + (b or 0.0))
    total = sum(us for _, us, _ in step)
    print("\nby kernel (count, total us, share%s):" % (", DRAM MB, GB/s" if with_bytes else ""))
    for n, (c, t, tb) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        extra = " %9.1f MB %6.0f GB/s" % (tb / 1e6, tb / t / 1e3) if with_bytes and t > 0 else ""
        print("%5d %10.1f us %5.1f %%%s  %s" % (c, t, 100 * t / total, extra, n))
    print("\nkernel time of the step: %.1f us" % total)
    if with_bytes:
        tb = sum(b for _, _, b in step)
        print("DRAM read in the step: %.1f MB (%.0f GB/s over the kernel time)" % (tb / 1e6, tb / total / 1e3))
    if len(args) > 1:
        ms = float(args[1])
        print("measured step (no profiler): %.1f us; launches and gaps: %.1f us (%.0f %%)"
              % (ms * 1000, ms * 1000 - total, 100 * (ms * 1000 - total) / (ms * 1000)))


if __name__ == "__main__":
    main()
