#!/usr/bin/python3
"""Trains gpt-large (GPT-2 large, 774M parameters) with ZeRO-3 at 2 and 4 ranks on this
machine, where its DDP training state (16 bytes a parameter with fp32 AdamW: 12.4 GB per
rank) fits no two ranks, and gpt-small with ZeRO-3 at 1, 2 and 4 ranks, and writes their
per-rank model state and peak RSS next to the ZeRO-3 formula 16P/N to the gpt-large section
of BENCHMARKS.md: peak RSS per rank should fall with N as the model state does.
Usage: bench/bench_gpt_large.py [--dtorch build-pip/dtorch] [--nprocs 2 4] [--small-nprocs 1 2 4]
"""
import argparse
import datetime
import os

from bench_memory import gib, run_lines
from benchlib import ROOT, libtorch_version, publish

START, END = "<!-- gpt-large:start -->", "<!-- gpt-large:end -->"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    ap.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    ap.add_argument("--small-nprocs", type=int, nargs="+", default=[1, 2, 4])
    a = ap.parse_args()
    a.dtorch = os.path.abspath(a.dtorch)

    def zero3_rows(model, nprocs):
        """(table rows, P, peak RSS above model state per rank in GiB at each N): ZeRO-3
        training of `model` at each N in nprocs."""
        rows, P, above = [], 0, []
        for n in nprocs:
            ranks = run_lines([a.dtorch, "bench", "memory", "--model", model, "--strategy",
                               "zero3", "--optimizer", "adamw", "--nproc-per-node", str(n),
                               "--batch-size", "1", "--seq-len", str(a.seq_len), "--steps",
                               str(a.steps)])
            r0 = ranks[0]
            P = r0["params"]
            rows.append("| %d | %.2f | %.2f | %.2f | %.2f | %.1f |" % (
                n, gib(16 * P / n), gib(max(r["model_state_bytes"] for r in ranks)),
                gib(max(r["peak_rss_bytes"] for r in ranks)),
                gib(sum(r["peak_rss_bytes"] for r in ranks)), r0["step_seconds"]))
            # The table's two columns as shown, so the text and the table agree.
            above.append(round(gib(max(r["peak_rss_bytes"] for r in ranks)), 2) -
                         round(gib(max(r["model_state_bytes"] for r in ranks)), 2))
            print(model, rows[-1])
        return rows, P, above

    small_rows, P_small, small_above = zero3_rows("gpt-small", a.small_nprocs)
    rows, P, above = zero3_rows("gpt-large", a.nprocs)
    header = ["| ranks | 16P/N GiB | model state per rank GiB | peak RSS per rank GiB | peak RSS, "
              "all ranks GiB | s/step |",
              "|---|---|---|---|---|---|"]
    libtorch = libtorch_version(a.dtorch)
    lines = [
        START,
        "## A model bigger than one rank: gpt-large with ZeRO-3",
        "",
        "Measured by `make bench` (`bench/bench_gpt_large.py`) on %s, %d cores, %.1f GiB: "
        "gpt-large (GPT-2 large: 36 layers, 1280 wide, 20 heads, %d parameters) trained with "
        "`dtorch bench memory --model gpt-large --strategy zero3 --optimizer adamw "
        "--batch-size 1 --seq-len %d --steps %d` (LibTorch %s, 1 thread per rank). Its DDP "
        "training state, 16P = %.1f GiB per rank, fits no two ranks of this machine; ZeRO-3 "
        "shards it to 16P/N. Peak RSS is the process's high-water mark, set-up included. No "
        "rank ever holds the whole model (4P = %.1f GiB in fp32): it is built one unit at a "
        "time without memory, and each rank initialises its own shards from the units built "
        "again one at a time (Note [Deferred initialisation]). The root unit (embeddings, "
        "%.0f%% of the parameters) is gathered when forward begins and released once its "
        "gradients are reduced at the end of backward, as FSDP's root. Backward keeps at most two units' gradient "
        "buckets alive (Note [Buckets in flight]). Peak RSS per rank is %.2f-%.2f GiB above the "
        "model state at every N (gpt-small below: %.2f-%.2f GiB), so it falls with N as the "
        "model state does; that remainder is reached in backward and does not shrink with N: "
        "LibTorch and the process, the gathered root unit with its gradient (the tied token "
        "embedding gets one from the head and one from the embedding), and the units and "
        "gradient buckets in flight or kept spare (Note [Spare unit memory])."
        % (datetime.date.today().isoformat(), os.cpu_count(),
           os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, P, a.seq_len,
           a.steps, libtorch, gib(16 * P), gib(4 * P), 100.0 * (50304 + 1024) * 1280 / P,
           min(above), max(above), min(small_above), max(small_above)),
        "",
    ] + header + rows + [
        "",
        "The same for gpt-small (%d parameters; the same command with --model gpt-small), "
        "whose root unit (the 50304 x 768 token embedding) is a third of the model."
        % P_small,
        "",
    ] + header + small_rows + [END]
    publish(a.out, lines)


if __name__ == "__main__":
    main()
