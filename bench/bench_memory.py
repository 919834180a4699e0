#!/usr/bin/python3
"""Runs `dtorch bench memory` for every strategy and writes the memory section of BENCHMARKS.md.

Per rank: the model-state bytes dtorch holds (counted from its own buffers) against the ZeRO
paper's formulas for fp32 AdamW (16P for DDP, 8P + 8P/N for ZeRO-1, 4P + 12P/N for ZeRO-2,
16P/N + the largest gathered unit for ZeRO-3), the process's peak RSS, the bytes each rank
sends per step against the paper's communication volume, and samples/s relative to DDP at
the smallest N, all from one run on one machine.
Usage: bench/bench_memory.py [--dtorch build/dtorch] [--model gpt-small] [--nprocs 2 4]
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- memory:start -->", "<!-- memory:end -->"
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")


def run_lines(cmd):
    """Runs cmd and returns every JSON object it printed (one per rank), by rank."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rows = []
    for line in p.stdout.splitlines():
        line = re.sub(r"^\[n\d+ r\d+\] ", "", line.strip())
        if line.startswith("{"):
            rows.append(json.loads(line))
    if not rows:
        sys.exit(f"bench: no JSON from {' '.join(cmd)}:\n{p.stdout[-2000:]}")
    return sorted(rows, key=lambda r: r["rank"])


def gib(b):
    return b / 2**30


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build", "dtorch"))
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    a = ap.parse_args()
    a.dtorch = os.path.abspath(a.dtorch)

    results = {}
    for n in a.nprocs:
        for s in STRATEGIES:
            rows = run_lines([a.dtorch, "bench", "memory", "--model", a.model, "--strategy", s,
                              "--nproc-per-node", str(n), "--steps", str(a.steps),
                              "--batch-size", str(a.batch), "--seq-len", str(a.seq_len)])
            results[(s, n)] = rows
            r = rows[0]
            print(f"{s} x{n}: model state {gib(r['model_state_bytes']):.2f} GiB "
                  f"({r['model_state_over_formula']:.3f} of formula), peak RSS "
                  f"{gib(max(x['peak_rss_bytes'] for x in rows)):.2f} GiB, "
                  f"{r['samples_per_s']:.2f} samples/s", file=sys.stderr)

    P = results[("ddp", a.nprocs[0])][0]["params"]
    n0 = a.nprocs[0]
    cmd = ("bench/bench_memory.py --model %s --nprocs %s --steps %d --batch %d --seq-len %d"
           % (a.model, " ".join(map(str, a.nprocs)), a.steps, a.batch, a.seq_len))
    lines = [
        START,
        "## Memory per rank by strategy (`dtorch bench memory`)",
        "",
        "Measured by `make bench` (`%s`) on %s: %s, P = %d parameters (%.1f M), fp32 AdamW, "
        "batch %d x %d tokens per rank, 1 thread per rank. Model state is what dtorch holds in "
        "its own buffers after a step (parameters, gradients, optimizer state); the formula is "
        "the ZeRO paper's (Rajbhandari et al. 2020, section 5) with 4 + 4 + 8 bytes per "
        "parameter; peak RSS is the largest of the ranks' (`getrusage`), which also holds "
        "activations, gradients in flight, the fp32 model as built before it is sharded, and "
        "LibTorch itself. No Python peer: PyTorch 1.13's "
        "FSDP needs CUDA and there is no DeepSpeed for CPU here; the reference is the formula."
        % (cmd, datetime.date.today().isoformat(), a.model, P, P / 1e6, a.batch, a.seq_len),
        "",
        "| strategy | N | params | grads | optimizer | model state | formula | state / "
        "formula | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in a.nprocs:
        for s in STRATEGIES:
            r = results[(s, n)][0]
            lines.append("| %s | %d | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB | "
                         "%.3f | %.2f GiB |" % (
                             s, n, gib(r["param_bytes"]), gib(r["grad_bytes"]),
                             gib(r["optim_bytes"]), gib(r["model_state_bytes"]),
                             gib(r["formula_bytes"]), r["model_state_over_formula"],
                             gib(max(x["peak_rss_bytes"] for x in results[(s, n)]))))
    lines += [
        "",
        "ZeRO-3's formula term \"largest gathered unit\" is the root unit here (token and "
        "position embeddings, final norm), which stays gathered like FSDP's root; each "
        "transformer block is gathered for its forward and again for its backward.",
        "",
        "## Bytes each rank sends per step",
        "",
        "Counted by the communicator as a bandwidth-optimal ring sends them (allreduce "
        "2(N-1)/N of the buffer, reduce-scatter and allgather (N-1)/N), over 4P bytes of "
        "fp32 parameters. The ZeRO paper's volumes are 2x for DDP, ZeRO-1 and ZeRO-2 and 3x "
        "for ZeRO-3, in the limit of large N; times (N-1)/N they are the column \"paper\". "
        "The counts match the bytes really written to the sockets over Gloo within 5% "
        "(`ReduceScatterWire` in tests/comm/reduce_scatter_test.cpp reads /proc/self/io: at 4 "
        "ranks a 4 MiB reduce-scatter writes 0.75x the buffer, an allreduce 1.5x).",
        "",
        "| strategy | N | allreduce | reduce-scatter | allgather | total / 4P | paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in a.nprocs:
        for s in STRATEGIES:
            r = results[(s, n)][0]
            b = r["bytes_sent_per_step"]
            paper = (3.0 if s == "zero3" else 2.0) * (n - 1) / n
            lines.append("| %s | %d | %.1f MiB | %.1f MiB | %.1f MiB | %.2f | %.2f |" % (
                s, n, b["allreduce"] / 2**20, b["reduce_scatter"] / 2**20,
                b["allgather"] / 2**20, r["sent_per_step_over_param_bytes"], paper))
    lines += [
        "",
        "ZeRO-3 sends less than 3x because its root unit (a third of gpt-small's parameters: "
        "the 50304 x 768 token embedding) is gathered once per step, not once for forward "
        "and once for backward.",
        "",
        "## Throughput by strategy, relative to DDP at N = %d (same run)" % n0,
        "",
        "| strategy | N | samples/s | / DDP |",
        "|---|---|---|---|",
    ]
    base = results[("ddp", n0)][0]["samples_per_s"]
    for s in STRATEGIES:
        r = results[(s, n0)][0]
        lines.append("| %s | %d | %.2f | %.2f |" % (s, n0, r["samples_per_s"],
                                                   r["samples_per_s"] / base))
    lines.append(END)
    block = "\n".join(lines)

    text = open(a.out).read() if os.path.exists(a.out) else "# Benchmarks\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(a.out, "w") as f:
        f.write(text)
    print(block)


if __name__ == "__main__":
    main()
