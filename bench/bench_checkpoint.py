#!/usr/bin/python3
"""Measures how long one checkpoint holds training up, written blocking or in the background
(`dtorch bench checkpoint`, --async-checkpoint), next to PyTorch DCP's dcp.save and
dcp.async_save of the same model (bench/peer_checkpoint.py under the virtual environment's
Python) in the same run, and writes the checkpoint section of BENCHMARKS.md.

Layouts: gpt-small under DDP (PyTorch: DDP) and gpt-large under ZeRO-3 (PyTorch: FSDP2), 2
ranks each, fp32 AdamW, batch 1 x --seq-len tokens per rank, 1 thread per rank, --steps
optimizer steps with one save after step --save-at. Per run: the median step without a save,
the stall (how long the save call held the training thread), the time until every rank's part
was written, the steps that ran while a background save was in flight, and the checkpoint's
size. Runs that cannot fit this machine's memory are listed with the reason.
Usage: bench/bench_checkpoint.py [--dtorch build-pip/dtorch] [--steps 6] [--save-at 3]
"""
import argparse
import datetime
import os
import sys

from bench_memory import gib, run_lines, run_peer, shown_path, short_version
from benchlib import machine, parse_with_peer, publish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- checkpoint-stall:start -->", "<!-- checkpoint-stall:end -->"
SKIP_LARGE_ASYNC = (
    "gpt-large:async=a background save stages a copy of each rank's state (parameters and AdamW "
    "moments: 12 bytes a parameter over 2 ranks, 4.3 GiB) on top of the rank's training peak "
    "(above: 11.3 GiB dtorch, 9.6 GiB PyTorch), which 2 ranks cannot hold in this machine's "
    "23.5 GiB")


def cases(models):
    """(model, dtorch strategy, peer strategy, peer name)"""
    known = {"gpt-small": ("ddp", "ddp", "DDP + DCP"), "gpt-large": ("zero3", "fsdp", "FSDP2 + DCP")}
    return [(m,) + known[m] for m in models]


def summary(rows):
    """The slowest rank's figures (a save holds every rank up until the slowest is done), from
    dtorch's lines or the peer's."""
    during = [s for r in rows for s in r.get("steps_during_save_seconds") or []]
    during += [s for r in rows
               for s, d in zip(r["step_seconds"], r.get("steps_during_save") or []) if d]
    return {
        "step": max(r["step_seconds_median"] for r in rows),
        "stall": max(r["stall_seconds"] for r in rows),
        "total": max(r["save_total_seconds"] for r in rows),
        "during": max(during) if during else None,
        "bytes": max(r["checkpoint_bytes"] for r in rows),
        "rss": max(r["peak_rss_bytes"] for r in rows),
    }


def row(impl, mode, s):
    during = "%.2f" % s["during"] if s["during"] is not None else "-"
    return "| %s | %s | %.2f | %.2f | %.2f | %s | %.2f GiB | %.2f GiB |" % (
        impl, mode, s["step"], s["stall"], s["total"], during, gib(s["bytes"]), gib(s["rss"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    ap.add_argument("--models", nargs="+", default=["gpt-small", "gpt-large"])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--save-at", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--skip", nargs="*", default=[SKIP_LARGE_ASYNC],
                    help="MODEL:MODE=WHY: runs left out of both, with why (default: "
                    "gpt-large's background saves, which do not fit 24 GiB)")
    a = parse_with_peer(ap)
    peer = os.path.join(ROOT, "bench", "peer_checkpoint.py")
    skipped = dict(s.split("=", 1) for s in a.skip)

    results = {}
    torch_version = None
    for model, strategy, peer_strategy, _ in cases(a.models):
        for mode in ("blocking", "async"):
            key = "%s:%s" % (model, mode)
            if key in skipped:
                results[key] = (None, skipped[key], None, skipped[key])
                continue
            rows = run_lines([a.dtorch, "bench", "checkpoint", "--model", model, "--strategy",
                              strategy, "--nproc-per-node", str(a.nproc), "--steps",
                              str(a.steps), "--save-at", str(a.save_at), "--seq-len",
                              str(a.seq_len)] + (["--async-checkpoint"] if mode == "async" else []))
            torch_version = rows[0]["torch"]
            ours = summary(rows)
            theirs, err = None, None
            if a.python2:
                prows, err = run_peer([os.path.abspath(a.python2), peer, "--nproc", str(a.nproc),
                                       "--model", model, "--strategy", peer_strategy, "--mode",
                                       mode, "--steps", str(a.steps), "--save-at",
                                       str(a.save_at), "--seq-len", str(a.seq_len)])
                if prows:
                    theirs = summary(prows)
                    results.setdefault("peer_torch", prows[0]["torch"])
            results[key] = (ours, None, theirs, err)
            print("%s: dtorch stall %.2f s%s" % (
                key, ours["stall"], ", peer stall %.2f s" % theirs["stall"] if theirs else
                ", peer: %s" % err), file=sys.stderr)

    cmd = "bench/bench_checkpoint.py --steps %d --save-at %d --seq-len %d" % (
        a.steps, a.save_at, a.seq_len)
    lines = [
        START,
        "## The stall a checkpoint causes: blocking against in the background (`dtorch bench "
        "checkpoint`)",
        "",
        "Measured by `make bench` (`%s`) on %s, %s, with %s (LibTorch %s) and PyTorch %s's "
        "torch.distributed.checkpoint (bench/peer_checkpoint.py): %d ranks, fp32 AdamW, batch 1 "
        "x %d tokens per rank, 1 thread per rank, %d optimizer steps with one save (model and "
        "optimizer state) after step %d. Step: the median step without a save in flight. "
        "Stall: how long the save call held the training thread (for a background save, the "
        "copy of the rank's state to host memory; PyTorch's async_save also builds the state "
        "dict and stages it). Written: from the call until every rank's part was on disk. "
        "During: the slowest step that ran while a background save was in flight. Seconds are "
        "the slowest rank's."
        % (cmd, datetime.date.today().isoformat(), machine(), shown_path(a.dtorch),
           torch_version or "?", short_version(results.get("peer_torch", "2.x")), a.nproc,
           a.seq_len, a.steps, a.save_at),
    ]
    for model, strategy, _, peer_name in cases(a.models):
        lines += ["", "### %s, dtorch %s against PyTorch %s" % (model, strategy, peer_name), "",
                  "| | save | step s | stall s | written s | during s | checkpoint | peak RSS |",
                  "|---|---|---|---|---|---|---|---|"]
        for mode in ("blocking", "async"):
            ours, why, theirs, err = results["%s:%s" % (model, mode)]
            if why:
                lines.append("| dtorch, PyTorch | %s | not run: %s | | | | | |" % (mode, why))
                continue
            lines.append(row("dtorch", mode, ours))
            if theirs:
                lines.append(row("PyTorch", mode, theirs))
            elif err:
                lines.append("| PyTorch | %s | did not run: %s | | | | | |" % (
                    mode, err.replace("|", "/")))
    lines += [
        "",
        "Under DDP, DCP drops the replicated state's duplicates across ranks and each rank writes "
        "its half; dtorch's rank 0 writes the whole .dtc (one file, with its CRC-32, fsynced) "
        "while the other ranks wait. A ZeRO-3 rank writes its own shards under both.",
        END,
    ]
    publish(a.out, lines)


if __name__ == "__main__":
    main()
