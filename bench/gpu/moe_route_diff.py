#!/usr/bin/env python3
"""moe_route_diff.py — first MoE routing difference between two runs of a KILN_MOE_LOG file.

Usage: KILN_MOE_LOG=/tmp/routes.log build/test_parity_cuda_kv; python3 moe_route_diff.py [--consecutive] /tmp/routes.log
Lines are "moe <backend>#<n-th model> <call> <t> <e1>,<e2>,.. <margin>" (src/model/moe.c). Each run's
calls, in file order, are its MoE layers step after step; runs that took the same tokens line up
call by call. Prints the runs, then for every pair of runs the first (call index, token) whose
experts differ, with both margins (how close each side was to choosing differently). --consecutive
compares each run with the next one only (test_parity_cuda_kv loads, per cache kind, the CPU model
then the device one: a log of all its kinds has hundreds of pairs)."""
import itertools
import sys
from collections import OrderedDict


def main(path, consecutive=False):
    runs = OrderedDict()  # run -> list of (call, [(t, experts, margin)])
    for line in open(path):
        parts = line.split()
        if len(parts) != 6 or parts[0] != "moe":
            continue
        run, call, t, experts, margin = parts[1], int(parts[2]), int(parts[3]), parts[4], float(parts[5])
        calls = runs.setdefault(run, [])
        if not calls or calls[-1][0] != call:
            calls.append((call, []))
        calls[-1][1].append((t, experts, margin))
    for run, calls in runs.items():
        print(f"{run}: {len(calls)} calls")
    names = list(runs)
    pairs = zip(names, names[1:]) if consecutive else itertools.combinations(names, 2)
    for a, b in pairs:
        first = None
        for i, ((_, ta), (_, tb)) in enumerate(zip(runs[a], runs[b])):
            for (t, ea, ma), (_, eb, mb) in zip(ta, tb):
                if ea != eb:
                    first = (i, t, ea, ma, eb, mb)
                    break
            if first:
                break
        if first:
            i, t, ea, ma, eb, mb = first
            print(f"{a} vs {b}: first difference at call {i}, token {t}: {ea} (margin {ma:g}) vs {eb} (margin {mb:g})")
        else:
            print(f"{a} vs {b}: the same experts over {min(len(runs[a]), len(runs[b]))} calls")


if __name__ == "__main__":
    import signal
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = [a for a in sys.argv[1:] if a != "--consecutive"]
    main(args[0] if args else "/dev/stdin", "--consecutive" in sys.argv[1:])
