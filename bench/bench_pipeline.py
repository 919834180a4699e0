#!/usr/bin/python3
"""Runs `dtorch bench memory --pp` for each pipeline schedule and writes the pipeline section of
BENCHMARKS.md.

Per schedule (gpipe, 1f1b, zb) and micro-batch count m: each rank's measured bubble (the part
of a step not spent in forward or backward actions), the on-paper simulator's bubble for the
same schedule with equal forward, input-gradient and weight-gradient times, and the formula
((p-1)/(m+p-1) for GPipe and 1F1B; (p-1)/(3m+p-1) for ZB-H1 with m >= p); the most
micro-batches of activations a rank held; peak RSS per rank; samples/s. Then PyTorch 2.x's
torch.distributed.pipelining (bench/peer_sharded.py --strategy pipeline, the same stages,
schedules, batch and AdamW) in the same run, each bounded by --peer-timeout seconds.
p is --nproc pipeline ranks, one per core: on a machine with fewer cores than ranks the ranks
share cores and the measured bubble mixes waiting for a peer with waiting for a core.
Usage: bench/bench_pipeline.py [--dtorch build-pip/dtorch] [--nproc 2] [--microbatches 4 8 16]
"""
import argparse
import datetime
import os
import sys

from bench_memory import gib, run_lines, run_peer, shown_path, short_version
from benchlib import parse_with_peer, publish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- pipeline:start -->", "<!-- pipeline:end -->"
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")
VIRTUAL = {"interleaved": 2}  # stages per rank


def formula(schedule, p, m):
    if schedule == "zb":
        return (p - 1) / (3 * m + p - 1) if m >= p else float("nan")
    return (p - 1) / (VIRTUAL.get(schedule, 1) * m + p - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (the pipeline's)")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--peer-microbatches", type=int, default=8)
    ap.add_argument("--peer-timeout", type=int, default=600)
    a = parse_with_peer(ap)
    p = a.nproc

    ours = {}
    for schedule in SCHEDULES:
        for m in a.microbatches:
            rows = run_lines([a.dtorch, "bench", "memory", "--model", a.model, "--pp", str(p),
                              "--schedule", schedule, "--microbatches", str(m),
                              "--nproc-per-node", str(p), "--steps", str(a.steps),
                              "--batch-size", str(a.batch), "--seq-len", str(a.seq_len)])
            ours[schedule, m] = rows
            print("%s m=%d: idle %s, %.2f samples/s" % (
                schedule, m, " ".join("%.3f" % r["idle_fraction"] for r in rows),
                rows[0]["samples_per_s"]), file=sys.stderr)
    stages = {s: ",".join("%d-%d" % tuple(u) for r in ours[s, a.microbatches[0]]
                          for u in r["stages_units"]) for s in SCHEDULES}
    theirs = {}
    for schedule in SCHEDULES if a.python2 else []:
        cmd = ["timeout", str(a.peer_timeout), os.path.abspath(a.python2), os.path.abspath(a.peer),
               "--strategy", "pipeline", "--schedule", schedule, "--microbatches",
               str(a.peer_microbatches), "--stages", ",".join(
                   sorted(stages[schedule].split(","), key=lambda r: int(r.split("-")[0]))),
               "--model", a.model, "--nproc", str(p),
               "--steps", str(a.steps), "--batch", str(a.batch), "--seq-len", str(a.seq_len)]
        rows, err = run_peer(cmd)
        if err and "exit code 124" in err:
            err = "no step finished within %d s (killed)" % a.peer_timeout
        theirs[schedule] = (rows, err)
        print("peer %s: %s" % (schedule, err or "%.2f samples/s" % rows[0]["samples_per_s"]),
              file=sys.stderr)

    first = ours[SCHEDULES[0], a.microbatches[0]][0]
    cmd = ("bench/bench_pipeline.py --model %s --nproc %d --microbatches %s --batch %d "
           "--seq-len %d --steps %d" % (a.model, p, " ".join(map(str, a.microbatches)), a.batch,
                                         a.seq_len, a.steps))
    lines = [
        START,
        "## Pipeline schedules (`dtorch bench memory --pp`)",
        "",
        "Measured by `make bench` (`%s`) on %s with %s (LibTorch %s): %s (%.1f M parameters) cut "
        "into %d stages (units %s), one rank per stage, 1 thread per rank, fp32 AdamW, a batch "
        "of %d x %d tokens per step cut into m micro-batches (interleaved: 2 stages per rank, "
        "the model cut into 2p), 1 untimed step then %d timed. "
        "Bubble measured: the part of a rank's step not spent in its forward and backward "
        "actions. Simulated: the on-paper simulator with equal F, B and W times. Activations: "
        "the most micro-batches whose activations the rank held at once."
        % (cmd, datetime.date.today().isoformat(), shown_path(a.dtorch), first["torch"], a.model,
           first["params"] / 1e6, p, stages[SCHEDULES[0]], a.batch, a.seq_len, a.steps),
        "",
        "| schedule | m | bubble per rank, measured | simulated | formula | activations held "
        "per rank | peak RSS per rank | samples/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for schedule in SCHEDULES:
        for m in a.microbatches:
            rows = ours[schedule, m]
            lines.append("| %s | %d | %s | %s | %.3f | %s | %s | %.2f |" % (
                schedule, m, " / ".join("%.3f" % r["idle_fraction"] for r in rows),
                " / ".join("%.3f" % r["simulated_idle_fraction"] for r in rows),
                formula(schedule, p, m), " / ".join(str(r["peak_activations"]) for r in rows),
                " / ".join("%.2f GiB" % gib(r["peak_rss_bytes"]) for r in rows),
                rows[0]["samples_per_s"]))
    lines += [
        "",
        "Stages are balanced by parameter count, not by time: gpt's first stage is its "
        "embeddings (a third of the parameters, little compute), so rank 0 waits most. The %d "
        "ranks share this machine's %d cores, so a measured bubble also holds time spent waiting "
        "for a core, and more micro-batches cost more per-action overhead (samples/s falls as m "
        "grows), where the simulator assumes uncontended, equal actions." % (p, os.cpu_count()),
    ]
    if theirs:
        torch2 = next((rows[0]["torch"] for rows, _ in theirs.values() if rows), None)
        lines += [
            "",
            "### Against PyTorch %s's torch.distributed.pipelining (same run, m = %d)" % (
                short_version(torch2) if torch2 else "2.x", a.peer_microbatches),
            "",
            "| schedule | dtorch samples/s | dtorch peak RSS | peer | peer samples/s | peer "
            "peak RSS | samples/s dtorch / peer |",
            "|---|---|---|---|---|---|---|",
        ]
        for schedule in SCHEDULES:
            o = ours.get((schedule, a.peer_microbatches))
            if not o:
                continue
            o_sps, o_rss = o[0]["samples_per_s"], max(x["peak_rss_bytes"] for x in o)
            rows, err = theirs[schedule]
            if err:
                lines.append("| %s | %.2f | %.2f GiB | | did not run: %s | | |" % (
                    schedule, o_sps, gib(o_rss), err.replace("|", "/")))
                continue
            t_sps, t_rss = rows[0]["samples_per_s"], max(x["peak_rss_bytes"] for x in rows)
            lines.append("| %s | %.2f | %.2f GiB | %s | %.2f | %.2f GiB | %.2f |" % (
                schedule, o_sps, gib(o_rss), rows[0]["impl"], t_sps, gib(t_rss), o_sps / t_sps))
        lines += [
            "",
            "The peer builds the whole model on every rank before keeping its stage (dtorch "
            "builds the stage only), and its last stage's lm_head is an untied copy of wte. "
            "In PyTorch 2.6 Schedule1F1B hung on Gloo (its batched point-to-point waited only "
            "on the last request, pytorch#132644); a schedule that hangs here is killed after "
            "--peer-timeout and its row says so.",
        ]
    lines.append(END)
    publish(a.out, lines)


if __name__ == "__main__":
    main()
