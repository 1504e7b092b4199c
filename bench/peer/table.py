#!/usr/bin/python3
"""table.py RESULTS.jsonl — the kiln vs llama.cpp table (markdown) from bench/peer_llamacpp.sh's results.

Per run: prefill and decode tok/s (medians: kiln bench reports medians; for llama-bench the median of
its samples_ts), decode weight GB/s = weight bytes x decode tok/s (kiln: weight_bytes; llama.cpp:
model_size — both count the tied embedding once, which decode reads once per token as the output
head), and kiln/llama.cpp ratios against the llama.cpp run of the same model and bit width.
"""
import json
import statistics
import sys

BITS = {"bf16": "bf16", "Q8_0": "8-bit", "Q4_0": "4-bit"}


def bits_of(fmt):
    if fmt in BITS:
        return BITS[fmt]
    return "8-bit" if "q8" in fmt else "4-bit" if "q4" in fmt else fmt


def main():
    rows, machine, bw, end = [], {}, {}, {}
    for line in open(sys.argv[1]):
        r = json.loads(line)
        k = r["kind"]
        if k == "machine":
            machine = r
        elif k == "membw":
            bw = r
        elif k == "end":
            end = r
        elif r["engine"] == "kiln":
            b = r["bench"]
            rows.append(dict(model=r["model"], fmt=r["format"], engine="kiln", bytes=b["weight_bytes"],
                             pre=b["prefill_tok_s"], dec=b["decode_tok_s"]))
        else:
            pp, tg = r["pp"][0], r["tg"][0]
            rows.append(dict(model=r["model"], fmt=r["format"], engine="llama.cpp", bytes=pp["model_size"],
                             pre=statistics.median(pp["samples_ts"]), dec=statistics.median(tg["samples_ts"])))
    peak = bw.get("read_gb_s", 0.0)
    print(f"CPU {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores; {machine.get('threads')} threads, "
          f"prompt {machine.get('prompt')}, gen {machine.get('gen')}, median of {machine.get('runs')} runs; "
          f"load average before {machine.get('load_before')}, after {end.get('load_after')}; "
          f"kiln {machine.get('kiln')}, llama.cpp {machine.get('llama_cpp')}")
    print(f"memory read bandwidth, {bw.get('threads')} threads: {peak:.1f} GB/s (median; best {bw.get('best_gb_s', 0):.1f})\n")
    print("| model | bits | engine | format | weights MB | prefill tok/s | decode tok/s | decode GB/s | % of read BW "
          "| prefill ratio | decode ratio |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    ref = {(r["model"], bits_of(r["fmt"])): r for r in rows if r["engine"] == "llama.cpp"}
    goals = []
    for r in rows:
        gbs = r["bytes"] * r["dec"] / 1e9
        pct = f"{100 * gbs / peak:.0f}%" if peak else ""
        l = ref.get((r["model"], bits_of(r["fmt"])))
        pr = dr = ""
        if r["engine"] == "kiln" and l:
            pr, dr = r["pre"] / l["pre"], r["dec"] / l["dec"]
            goals.append((r["model"], r["fmt"], pr, dr))
            pr, dr = f"**{pr:.2f}x**", f"**{dr:.2f}x**"
        print(f"| {r['model']} | {bits_of(r['fmt'])} | {r['engine']} | {r['fmt']} | {r['bytes'] / 1e6:.1f} "
              f"| {r['pre']:.1f} | {r['dec']:.1f} | {gbs:.2f} | {pct} | {pr} | {dr} |")
    print("\nGoals (decode >= 1.5x, prefill >= 1.0x llama.cpp at the same bit width):\n")
    for m, f, pr, dr in goals:
        print(f"- {m} {f}: decode {dr:.2f}x {'MET' if dr >= 1.5 else 'NOT met'}, "
              f"prefill {pr:.2f}x {'MET' if pr >= 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
