#!/usr/bin/python3
"""Runs `dtorch bench memory` with and without --activation-checkpointing and writes the
activation-checkpointing section of BENCHMARKS.md.

gpt-small at --seq-len 256 (its blocks' activations dominate a step), --nproc ranks under DDP,
--batch sequences per rank, fp32 AdamW, 1 untimed step then --steps timed. Per setting: step
time, the bytes dtorch's allocator handed out during forward and still held when backward
begins (the activations the graph keeps, with the logits and the loss), the most allocated
from the start of forward to the end of backward, and peak RSS per rank. PyTorch 2.x with
torch.utils.checkpoint (use_reentrant=False) on the same blocks of the same model
(bench/peer_sharded.py --strategy ddp --activation-checkpointing K), same batch, in the same
run: step time and peak RSS.
Usage: bench/bench_activation_checkpointing.py [--dtorch build-pip/dtorch] [--nproc 2]
"""
import argparse
import datetime
import os
import sys

from bench_memory import gib, run_lines, run_peer, shown_path, short_version
from benchlib import parse_with_peer, publish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- activation-checkpointing:start -->", "<!-- activation-checkpointing:end -->"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2, help="sequences per rank")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--every", type=int, nargs="+", default=[0, 1, 2],
                    help="settings of --activation-checkpointing (0: off)")
    a = parse_with_peer(ap)
    common = ["--model", a.model, "--nproc-per-node", str(a.nproc), "--steps", str(a.steps),
              "--batch-size", str(a.batch), "--seq-len", str(a.seq_len)]

    ours, theirs = {}, {}
    for every in a.every:
        ours[every] = run_lines([a.dtorch, "bench", "memory", "--strategy", "ddp",
                                 "--activation-checkpointing", str(every)] + common)
        r = ours[every][0]
        print("dtorch every %d: %.2f s/step, forward kept %.0f MiB" % (
            every, r["step_seconds"], r["forward_kept_bytes"] / 2**20), file=sys.stderr)
        if a.python2:
            theirs[every] = run_peer([os.path.abspath(a.python2), os.path.abspath(a.peer),
                                      "--strategy", "ddp", "--model", a.model, "--nproc",
                                      str(a.nproc), "--steps", str(a.steps), "--batch",
                                      str(a.batch), "--seq-len", str(a.seq_len),
                                      "--activation-checkpointing", str(every)])
            rows, err = theirs[every]
            print("peer every %d: %s" % (every, err or "%.2f s/step" % rows[0]["step_seconds"]),
                  file=sys.stderr)

    first = ours[a.every[0]][0]
    torch2 = next((rows[0]["torch"] for rows, _ in theirs.values() if rows), None)
    cmd = ("bench/bench_activation_checkpointing.py --model %s --nproc %d --batch %d --seq-len %d "
           "--steps %d" % (a.model, a.nproc, a.batch, a.seq_len, a.steps))
    lines = [
        START,
        "## Activation checkpointing (`dtorch bench memory --activation-checkpointing K`)",
        "",
        "Measured by `make bench` (`%s`) on %s with %s (LibTorch %s): %s (%.1f M parameters), "
        "DDP over %d ranks, %d x %d tokens per rank, fp32 AdamW, 1 thread per rank, 1 untimed "
        "step then %d timed; K = 1 recomputes every block, K = 2 every second one. Kept by "
        "forward: bytes the CPU allocator handed out during forward and still held when "
        "backward begins (activations, logits, loss; Note [Allocation meter]). Peak in forward and "
        "backward: the most allocated from the start of forward to the end of backward (the "
        "gradients included) above what the step began with. Values of rank 0; peak RSS "
        "the largest over ranks. PyTorch %s in the same run: the same model and batch under "
        "DistributedDataParallel, its blocks under torch.utils.checkpoint (use_reentrant=False)."
        % (cmd, datetime.date.today().isoformat(), shown_path(a.dtorch), first["torch"], a.model,
           first["params"] / 1e6, a.nproc, a.batch, a.seq_len, a.steps,
           short_version(torch2) if torch2 else "2.x (not run)"),
        "",
        "| checkpointing | dtorch s/step | kept by forward | peak in forward and backward | "
        "dtorch peak RSS | "
        "PyTorch s/step | PyTorch peak RSS | s/step dtorch / PyTorch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for every in a.every:
        r = ours[every][0]
        rss = max(x["peak_rss_bytes"] for x in ours[every])
        label = "off" if every == 0 else ("every block" if every == 1 else "every %d blocks" % every)
        peer = "| did not run | | "
        if every in theirs:
            rows, err = theirs[every]
            if err:
                peer = "| did not run: %s | | " % err.replace("|", "/")
            else:
                t = rows[0]["step_seconds"]
                peer = "| %.2f | %.2f GiB | %.2f " % (
                    t, gib(max(x["peak_rss_bytes"] for x in rows)), r["step_seconds"] / t)
        lines.append("| %s | %.2f | %.0f MiB | %.0f MiB | %.2f GiB %s|" % (
            label, r["step_seconds"], r["forward_kept_bytes"] / 2**20,
            r["forward_backward_peak_bytes"] / 2**20, gib(rss), peer))
    peaks = {round(ours[e][0]["forward_backward_peak_bytes"] / 2**20) for e in a.every}
    same_peak = (" The peak in forward and backward is the same in every row, as expected when it "
                 "is reached at the end of backward, where every gradient (4P = %.0f MiB) is held "
                 "and the activations are already freed; what checkpointing lowers is what "
                 "forward keeps, which grows with batch and sequence length while the gradients "
                 "do not.")
    lines += [
        "",
        "A checkpointed block keeps only its input from forward to backward and runs its forward "
        "again in backward, so a step costs about one more forward of the checkpointed blocks."
        + (same_peak % (4 * first["params"] / 2**20) if len(peaks) == 1 else ""),
        END,
    ]
    publish(a.out, lines)


if __name__ == "__main__":
    main()
