#!/usr/bin/python3
"""Measures how long one checkpoint holds training up, written blocking or in the background
(`dtorch bench checkpoint`, --async-checkpoint), next to PyTorch DCP's dcp.save and
dcp.async_save of the same model (bench/peer_checkpoint.py under the virtual environment's
Python) in the same run, and writes the checkpoint section of BENCHMARKS.md.

Layouts: gpt-small under DDP (PyTorch: DDP) and gpt-large under ZeRO-3 (PyTorch: FSDP2), 2
ranks each, fp32 AdamW, batch 1 x --seq-len tokens per rank, 1 thread per rank, --steps
optimizer steps with one save after step --save-at, each model's runs repeated (--repeats: a
disk's speed varies from run to run, gpt-large's stall by 20%). Per run: the median step
without a save, the stall (how long the save call held the training thread), the time until
every rank's part was written, the steps that ran while a background save was in flight, and
the checkpoint's size. Runs that cannot fit this machine's memory are listed with the reason.
Usage: bench/bench_checkpoint.py [--dtorch build-pip/dtorch] [--steps 4] [--save-at 2]
       [--repeats gpt-small:3 gpt-large:3]
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
    "moments: 12 bytes a parameter over 2 ranks, 4.3 GiB) on top of the rank's peak (the "
    "blocking rows' peak RSS), which 2 ranks cannot hold in this machine's 23.5 GiB")


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


def median_of(runs):
    """Each figure's median over runs (summary()'s of one implementation and mode), so that
    one run's disk hiccup does not decide a row."""
    out = {}
    for k in runs[0]:
        values = sorted(r[k] for r in runs if r[k] is not None)
        out[k] = values[len(values) // 2] if values else None
    return out


def row(impl, mode, s):
    during = "%.2f" % s["during"] if s["during"] is not None else "-"
    return "| %s | %s | %.2f | %.2f | %.2f | %s | %.2f GiB | %.2f GiB |" % (
        impl, mode, s["step"], s["stall"], s["total"], during, gib(s["bytes"]), gib(s["rss"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    ap.add_argument("--models", nargs="+", default=["gpt-small", "gpt-large"])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--save-at", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--repeats", nargs="*", default=["gpt-small:3", "gpt-large:3"],
                    help="MODEL:N: run each of MODEL's saves N times, dtorch and PyTorch "
                    "alternating, and report each figure's median (default: each model 3 "
                    "times; a disk's speed varies from run to run; a model not named once)")
    ap.add_argument("--skip", nargs="*", default=[SKIP_LARGE_ASYNC],
                    help="MODEL:MODE=WHY: runs left out of both, with why (default: "
                    "gpt-large's background saves, which do not fit 24 GiB)")
    a = parse_with_peer(ap)
    peer = os.path.join(ROOT, "bench", "peer_checkpoint.py")
    skipped = dict(s.split("=", 1) for s in a.skip)
    repeats = {m: int(n) for m, n in (r.split(":") for r in a.repeats)}

    results = {}
    torch_version = None
    for model, strategy, peer_strategy, _ in cases(a.models):
        for mode in ("blocking", "async"):
            key = "%s:%s" % (model, mode)
            if key in skipped:
                results[key] = (None, skipped[key], None, skipped[key])
                continue
            common = ["--model", model, "--strategy", strategy, "--nproc-per-node",
                      str(a.nproc), "--steps", str(a.steps), "--save-at", str(a.save_at),
                      "--seq-len", str(a.seq_len)]
            ours_runs, file_runs, peer_runs, err = [], [], [], None
            for _ in range(repeats.get(model, 1)):
                rows = run_lines([a.dtorch, "bench", "checkpoint"] + common +
                                 (["--async-checkpoint"] if mode == "async" else []))
                torch_version = rows[0]["torch"]
                ours_runs.append(summary(rows))
                if strategy == "ddp" and mode == "blocking":
                    # The layout the shared save replaced: rank 0 writes it all.
                    file_runs.append(summary(run_lines(
                        [a.dtorch, "bench", "checkpoint"] + common +
                        ["--checkpoint-layout", "file"])))
                if a.python2:
                    prows, err = run_peer([os.path.abspath(a.python2), peer, "--nproc",
                                           str(a.nproc), "--model", model, "--strategy",
                                           peer_strategy, "--mode", mode, "--steps",
                                           str(a.steps), "--save-at", str(a.save_at),
                                           "--seq-len", str(a.seq_len)])
                    if prows:
                        peer_runs.append(summary(prows))
                        results.setdefault("peer_torch", prows[0]["torch"])
            ours = median_of(ours_runs)
            theirs = median_of(peer_runs) if peer_runs else None
            if file_runs:
                results[key + ":file"] = median_of(file_runs)
            results[key] = (ours, None, theirs, err)
            print("%s: dtorch stall %.2f s%s" % (
                key, ours["stall"], ", peer stall %.2f s" % theirs["stall"] if theirs else
                ", peer: %s" % err), file=sys.stderr)

    cmd = "bench/bench_checkpoint.py --steps %d --save-at %d --seq-len %d --repeats %s" % (
        a.steps, a.save_at, a.seq_len, " ".join(a.repeats))
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
        "the slowest rank's; with --repeats MODEL:N each figure is the median of N runs, "
        "dtorch's and PyTorch's alternating."
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
            if "%s:%s:file" % (model, mode) in results:
                lines.append(row("dtorch, one file", mode, results["%s:%s:file" % (model, mode)]))
            if theirs:
                lines.append(row("PyTorch", mode, theirs))
            elif err:
                lines.append("| PyTorch | %s | did not run: %s | | | | | |" % (
                    mode, err.replace("|", "/")))
    lines += [
        "",
        "Under DDP both write each replicated tensor once, every rank its share at once: DCP "
        "drops the duplicates across ranks, dtorch gives each tensor with its optimizer state to "
        "the rank with the fewest bytes so far, largest first (`--checkpoint-layout auto`, "
        "sharded from 64 MiB of state on 2 or more ranks; Note [Saving replicated state]). "
        "\"dtorch, one file\" is `--checkpoint-layout file`, rank 0 writing the whole .dtc while "
        "the other ranks wait. A ZeRO-3 rank writes its own shards under both. Both fsync every "
        "file. dtorch's files carry one CRC-32 each, of all their bytes, the zip records inside "
        "leaving theirs out (Note [One checksum per file]); DCP's torch.save computes each "
        "record's.",
        END,
    ]
    publish(a.out, lines)


if __name__ == "__main__":
    main()
