#!/usr/bin/env python3
"""ncu_trace.py — per-kernel times of a run from an Nsight Compute `--page raw --csv
--print-units base` export of many launches with gpu__time_duration.sum: the launches grouped by
kernel and grid (count, mean and total us), largest total first, then the sum, and with --seq
N the first N launches in order. Usage: ncu_trace.py RAW.csv [--seq N]"""
import csv
import sys


def main():
    path = sys.argv[1]
    seq = int(sys.argv[sys.argv.index("--seq") + 1]) if "--seq" in sys.argv else 0
    with open(path, newline="") as f:
        rows = list(csv.reader(l for l in f if l.startswith('"')))
    if len(rows) < 3:
        print("ncu_trace: no launches in", path)
        return
    head = rows[0]
    col = {h: i for i, h in enumerate(head)}
    name_c, grid_c = col.get("Kernel Name"), col.get("Grid Size")
    time_c = col.get("gpu__time_duration.sum")
    if name_c is None or time_c is None:
        print("ncu_trace: no kernel name or duration column in", path)
        return
    launches = []
    for r in rows[2:]:
        try:
            t = float(r[time_c].replace(",", "")) / 1e3  # ns -> us
        except (ValueError, IndexError):
            continue
        name = r[name_c].split("(")[0][:48]
        grid = r[grid_c] if grid_c is not None else ""
        launches.append((name, grid, t))
    groups = {}
    for name, grid, t in launches:
        g = groups.setdefault((name, grid), [0, 0.0])
        g[0] += 1
        g[1] += t
    total = sum(t for _, _, t in launches)
    print(f"{len(launches)} launches, {total:.1f} us in all")
    for (name, grid), (n, t) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:24]:
        print(f"  {name:48s} {grid:>16s} {n:5d} x {t / n:7.2f} us = {t:8.1f} us")
    for i, (name, grid, t) in enumerate(launches[:seq]):
        print(f"  #{i:<4d} {name:48s} {grid:>16s} {t:7.2f} us")


if __name__ == "__main__":
    main()
