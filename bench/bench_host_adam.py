#!/usr/bin/python3
"""The host's AdamW step over ZeRO shards: dtorch (`dtorch bench optimizer`: optim::FusedAdamW,
the step of every ZeRO run and of --offload-optimizer) against DeepSpeed's DeepSpeedCPUAdam, the
step of ZeRO-Offload, on the same shard sizes and threads in the same run; the host-adam section
of BENCHMARKS.md.

Shards: each ZeRO-3 unit of a GPT-2 (its root: the embeddings and the final norm, the head tied;
then one per block) split over --world ranks, one rank's share, fp32. Both step AdamW (lr 1e-3,
weight decay 0.01) over them --warmup untimed times and --steps timed ones at --threads threads
(torch.set_num_threads and OMP_NUM_THREADS: DeepSpeedCPUAdam's OpenMP loops and PyTorch's own);
the runs alternate --rounds times and each figure is the median over rounds of a run's median
step. DeepSpeedCPUAdam is compiled by DeepSpeed's op builder on first use (about 90 s).
Usage: bench/bench_host_adam.py [--dtorch build-pip/dtorch] [--python2 .venv/bin/python]
       .venv/bin/python bench/bench_host_adam.py --peer --shards N,N... --threads T  (one run)
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from benchlib import ROOT, libtorch_version, machine, publish, run_json, shown_path

START, END = "<!-- host-adam:start -->", "<!-- host-adam:end -->"
LR, WEIGHT_DECAY = 1e-3, 0.01
# nanoGPT's GPT-2 sizes: layers, width; a vocabulary of 50257 and 1024 positions.
MODELS = {"gpt-small": (12, 768), "gpt-medium": (24, 1024), "gpt-large": (36, 1280)}


def shards_of(model, world):
    """One rank's ZeRO-3 shards of `model` over `world` ranks: its root unit, then each block."""
    layers, c = MODELS[model]
    root = (50257 + 1024) * c + 2 * c
    block = 12 * c * c + 13 * c
    return [-(-root // world)] + [-(-block // world)] * layers


def peer(a):
    """DeepSpeedCPUAdam's one run, printed as JSON."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    import deepspeed
    torch.set_num_threads(a.threads[0])
    torch.manual_seed(0)
    params = []
    for n in a.shards:
        p = torch.nn.Parameter(torch.randn(n))
        p.grad = torch.randn(n)
        params.append(p)
    opt = DeepSpeedCPUAdam(params, lr=LR, weight_decay=WEIGHT_DECAY, adamw_mode=True)
    for _ in range(a.warmup):
        opt.step()
    steps = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        opt.step()
        steps.append(time.perf_counter() - t0)
    print(json.dumps(dict(impl="DeepSpeedCPUAdam", deepspeed=deepspeed.__version__,
                          torch=torch.__version__, step_seconds_median=statistics.median(steps),
                          checksum=sum(float(p.sum()) for p in params))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    venv_python = os.path.join(ROOT, ".venv", "bin", "python")
    ap.add_argument("--python2", default=venv_python, help="Python with DeepSpeed")
    ap.add_argument("--models", nargs="+", default=["gpt-small", "gpt-large"])
    ap.add_argument("--world", type=int, default=2, help="ranks the shards are split over")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    ap.add_argument("--peer", action="store_true", help="one DeepSpeedCPUAdam run")
    ap.add_argument("--shards", type=lambda s: [int(x) for x in s.split(",")])
    a = ap.parse_args()
    if a.peer:
        return peer(a)
    a.dtorch, a.python2 = os.path.abspath(a.dtorch), os.path.abspath(a.python2)  # runs from /tmp
    rows = []
    peer_versions = ""
    for model in a.models:
        shards = shards_of(model, a.world)
        listed = ",".join(map(str, shards))
        for threads in a.threads:
            env = {"OMP_NUM_THREADS": str(threads)}
            mine, theirs = [], []
            for _ in range(a.rounds):
                r = run_json([a.dtorch, "bench", "optimizer", "--shards", listed, "--threads",
                              str(threads), "--warmup", str(a.warmup), "--steps", str(a.steps)],
                             env)
                mine.append(r["step_seconds_median"])
                p = run_json([a.python2, os.path.abspath(__file__), "--peer", "--shards", listed,
                              "--threads", str(threads), "--warmup", str(a.warmup), "--steps",
                              str(a.steps)], env)
                theirs.append(p["step_seconds_median"])
                peer_versions = "DeepSpeed %s, PyTorch %s" % (p["deepspeed"], p["torch"])
            d, s = statistics.median(mine), statistics.median(theirs)
            rows.append((model, threads, len(shards), sum(shards), d, s))
            print(f"{model} threads={threads}: dtorch {d:.4f} s, DeepSpeedCPUAdam {s:.4f} s, "
                  f"{s / d:.2f}x", file=sys.stderr)
    command = "bench/bench_host_adam.py --dtorch %s --models %s --world %d --threads %s " \
              "--rounds %d --warmup %d --steps %d" % (
                  shown_path(a.dtorch), " ".join(a.models), a.world,
                  " ".join(map(str, a.threads)), a.rounds, a.warmup, a.steps)
    lines = [START, "## The host's AdamW step against DeepSpeedCPUAdam (same run)", "",
             "Measured by `%s` on %s, %s: dtorch with LibTorch %s, DeepSpeedCPUAdam with %s. "
             "One rank's ZeRO-3 shards of each model over %d ranks (its root unit, then a shard "
             "per block), fp32 AdamW (lr %g, weight decay %g), %d untimed and %d timed steps; "
             "dtorch is `dtorch bench optimizer` (optim::FusedAdamW, the step of every ZeRO "
             "run and of `--offload-optimizer`), the peer DeepSpeed's CPU Adam (ZeRO-Offload's "
             "step) on the same shards; the runs alternate %d times and each figure is the "
             "median of the runs' median steps. Speed: DeepSpeedCPUAdam's step over dtorch's."
             % (command, datetime.date.today().isoformat(), machine(),
                libtorch_version(a.dtorch), peer_versions, a.world, LR, WEIGHT_DECAY, a.warmup,
                a.steps, a.rounds), "",
             "| model | threads | shards | parameters | dtorch s | DeepSpeedCPUAdam s | speed |",
             "|---|---|---|---|---|---|---|"]
    for model, threads, n, total, d, s in rows:
        lines.append("| %s | %d | %d | %.1f M | %.4f | %.4f | %.2f |"
                     % (model, threads, n, total / 1e6, d, s, s / d))
    lines.append(END)
    publish(a.out, lines)


if __name__ == "__main__":
    main()
