#!/usr/bin/python3
"""Times one epoch of mnist-cnn on Fashion-MNIST with `dtorch train` and with PyTorch
Lightning's Trainer (bench/peer_lightning.py: strategy ddp on CPU over Gloo), same model,
batch per rank, optimizer and data, side by side in one run, and writes the Lightning section
of BENCHMARKS.md: wall time from start to exit, training samples/s, test accuracy.
Usage: bench/bench_lightning.py [--dtorch build-pip/dtorch] [--nproc 2] [--batch 64]
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench_memory import shown_path, short_version
from benchlib import ROOT, libtorch_version, parse_with_peer, publish, run_json

START, END = "<!-- lightning:start -->", "<!-- lightning:end -->"


def run_dtorch(a, out):
    """One epoch of `dtorch train`: (wall seconds, its epoch record)."""
    cmd = [a.dtorch, "train", "--model", "mnist-cnn", "--epochs", "1", "--nproc-per-node",
           str(a.nproc), "--batch-size", str(a.batch), "--optimizer", "sgd", "--lr", "0.01",
           "--momentum", "0.9", "--seed", "1", "--progress", "off", "--out", out]
    start = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    wall = time.time() - start
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        epochs = [json.loads(l) for l in f if '"kind":"epoch"' in l]
    return wall, epochs[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    a = parse_with_peer(ap)
    if not a.python2:
        sys.exit("bench_lightning: no Python with PyTorch 2.x and Lightning (--python2; "
                 "`make deps-bench` makes .venv)")
    scratch = tempfile.mkdtemp(prefix="bench-lightning-")
    try:
        wall, record = run_dtorch(a, os.path.join(scratch, "dtorch"))
        print("dtorch: %.1f s, %.0f samples/s" % (wall, record["samples_per_s"]), file=sys.stderr)
        peer = run_json([os.path.abspath(a.python2),
                         os.path.join(ROOT, "bench", "peer_lightning.py"), "--nproc",
                         str(a.nproc), "--batch", str(a.batch), "--out",
                         os.path.join(scratch, "lightning")])
        print("Lightning: %.1f s, %.0f samples/s" % (peer["wall_seconds"], peer["samples_per_s"]),
              file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    libtorch = libtorch_version(a.dtorch)
    cmd = "bench/bench_lightning.py --nproc %d --batch %d" % (a.nproc, a.batch)
    lines = [
        START,
        "## One epoch against PyTorch Lightning's Trainer (same run)",
        "",
        "Measured by `make bench` (`%s`) on %s: mnist-cnn (the tutorials' CNN) for one epoch of "
        "Fashion-MNIST's 60,000 training images on %d CPU ranks, batch %d per rank, SGD lr 0.01 "
        "momentum 0.9, 1 thread per rank, a checkpoint at the end of the epoch, then the 10,000 "
        "test images. dtorch: `%s train` (LibTorch %s, DDP). Lightning %s on PyTorch %s: "
        "`Trainer(accelerator=\"cpu\", devices=%d, strategy=\"ddp\")` over Gloo, the same "
        "network (`bench/peer_lightning.py`). Wall time runs from the command's start to its "
        "exit (process start-up, data loading, training, checkpoint, test); samples/s counts "
        "the training loop alone."
        % (cmd, datetime.date.today().isoformat(), a.nproc, a.batch, shown_path(a.dtorch),
           libtorch, peer["lightning"], short_version(peer["torch"]), a.nproc),
        "",
        "| | wall time | training samples/s | test accuracy |",
        "|---|---|---|---|",
        "| dtorch train | %.1f s | %.0f | %.2f%% |" % (wall, record["samples_per_s"],
                                                    100 * record["test_accuracy"]),
        "| Lightning Trainer | %.1f s | %.0f | %.2f%% |" % (
            peer["wall_seconds"], peer["samples_per_s"], 100 * peer["test_accuracy"]),
        "| dtorch / Lightning | %.2fx faster | %.2fx | |" % (
            peer["wall_seconds"] / wall, record["samples_per_s"] / peer["samples_per_s"]),
        "",
        "The two shuffle differently (dtorch's sampler and Lightning's DistributedSampler draw "
        "other orders from the same seed), so their accuracies may differ by the luck of one "
        "epoch.",
        END,
    ]
    publish(a.out, lines)


if __name__ == "__main__":
    main()
