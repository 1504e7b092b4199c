#!/usr/bin/env python3
"""ncu_summary.py — short text from two Nsight Compute CSV exports of one kernel launch:
`--page raw --csv` (metrics; the stall reasons are printed largest first) and `--page source --csv
--print-source sass` (the SASS lines with the most warp-stall samples, with their largest stall
columns). Usage: ncu_summary.py RAW.csv [SASS.csv]"""
import csv
import sys


def rows_of(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own notes before the CSV
    return list(csv.reader(lines))


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def raw_summary(path):
    rows = rows_of(path)
    if len(rows) < 3:
        print("raw: no rows in", path)
        return
    head, units, vals = rows[0], rows[1], rows[2]
    stalls, other = [], []
    for h, u, v in zip(head, units, vals):
        if "issue_stalled_" in h:
            reason = h.split("issue_stalled_")[1].split("_per_issue")[0]
            x = num(v)
            if x is not None:
                stalls.append((x, reason))
        elif "__" in h:
            other.append(f"{h} = {v} {u}".strip())
    for o in other:
        print("  ", o)
    total = sum(x for x, _ in stalls)
    print(f"  stall cycles per issued instruction: {total:.2f}")
    for x, r in sorted(stalls, reverse=True):
        if x >= 0.05:
            print(f"    {r:20s} {x:7.2f}")


def sass_summary(path, top=40):
    rows = rows_of(path)
    if len(rows) < 2:
        print("sass: no rows in", path)
        return
    head = rows[0]
    data = rows[1:]
    if data and all(num(c) is None for c in data[0][2:]):
        data = data[1:]  # a units row
    src = next((i for i, h in enumerate(head) if h.lower() == "source"), 1)
    allc = next((i for i, h in enumerate(head) if "Stall Sampling (All" in h), None)
    if allc is None:
        print("sass: columns:", head[:40])
        return
    reasons = [i for i, h in enumerate(head) if h.startswith("stall_") or "Stall Reason" in h]
    tot = sum(num(r[allc]) or 0 for r in data if len(r) > allc)
    print(f"  SASS lines by stall samples (total {tot:.0f}):")
    data = [r for r in data if len(r) > allc and num(r[allc])]
    data.sort(key=lambda r: -num(r[allc]))
    for r in data[:top]:
        parts = []
        for i in reasons:
            x = num(r[i]) if i < len(r) else None
            if x:
                parts.append((x, head[i].replace("stall_", "")))
        parts.sort(reverse=True)
        why = " ".join(f"{n}={x:.0f}" for x, n in parts[:3])
        print(f"  {num(r[allc]):7.0f} {100 * num(r[allc]) / tot:5.1f}%  {r[src][:70]:70s} {why}")


if __name__ == "__main__":
    raw_summary(sys.argv[1])
    if len(sys.argv) > 2:
        sass_summary(sys.argv[2])
