#!/usr/bin/python3
"""Runs `dtorch bench memory --cp` for gpt-long (4 blocks, 1024 positions) and writes the
context-parallel section of BENCHMARKS.md.

Layouts at --seq-len tokens (1024 by default), --batch sequences per replica, one replica: the
whole sequence on one rank (the model's own attention kernel), then ring attention and Ulysses
over cp 2 and cp 4 ranks, each rank holding 1/cp of every sequence (a head and a tail chunk,
Note [Load-balanced chunks]). Per layout: step time, the bytes each rank keeps from forward to
backward (counted at the allocator, Note [Allocation meter]), and the attention bytes each rank
sends per step next to the count of Note [Ring attention] / Note [Ulysses]
(cp::bytes_sent_per_layer). Then PyTorch 2.x's own context_parallel on the same model, batch
and ranks (bench/peer_context_parallel.py under the virtual environment's Python), in the same
run; where it cannot run (on CPU it cannot) the table says so with its error.
Usage: bench/bench_context_parallel.py [--dtorch build-pip/dtorch] [--seq-len 1024] [--steps 3]
"""
import argparse
import datetime
import os
import sys

from bench_memory import run_lines, run_peer, shown_path, short_version
from benchlib import machine, parse_with_peer, publish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- context-parallel:start -->", "<!-- context-parallel:end -->"


def layouts():
    """(label, cp, kind)"""
    return [("one rank", 1, None)] + [("cp %d %s" % (n, kind), n, kind)
                                      for n in (2, 4) for kind in ("ring", "ulysses")]


def mib(b):
    return b / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.set_defaults(peer=None)
    a = parse_with_peer(ap)
    peer = os.path.join(ROOT, "bench", "peer_context_parallel.py")

    ours = {}
    for label, n, kind in layouts():
        cp = ["--cp", str(n), "--cp-kind", kind] if kind else []
        rows = run_lines([a.dtorch, "bench", "memory", "--model", "gpt-long", "--nproc-per-node",
                          str(n), "--steps", str(a.steps), "--batch-size", str(a.batch),
                          "--seq-len", str(a.seq_len)] + cp)
        ours[label] = rows
        print("%s: %.3f s/step, %.1f MiB kept" % (
            label, rows[0]["step_seconds"], mib(max(r["forward_kept_bytes"] for r in rows))),
            file=sys.stderr)
    theirs, peer_torch = {}, None
    for n in (2, 4) if a.python2 else ():
        rows, err = run_peer([os.path.abspath(a.python2), peer, "--nproc", str(n), "--seq-len",
                              str(a.seq_len), "--batch", str(a.batch), "--steps", str(a.steps)])
        if rows:
            peer_torch = rows[0]["torch"]
        if rows and not rows[0].get("supported", True):
            rows, err = [], rows[0]["reason"]
        theirs[n] = (rows, err)
        print("peer cp %d: %s" % (n, err or "%.3f s/step" % rows[0]["step_seconds"]),
              file=sys.stderr)

    first = ours["one rank"][0]
    cmd = "bench/bench_context_parallel.py --seq-len %d --batch %d --steps %d" % (
        a.seq_len, a.batch, a.steps)
    lines = [
        START,
        "## Context parallelism: ring attention and Ulysses (`dtorch bench memory --cp`)",
        "",
        "Measured by `make bench` (`%s`) on %s, %s, with %s (LibTorch %s): gpt-long (%.2f M "
        "parameters, 4 blocks of 4 heads, 32 wide), one replica of %d sequences x %d tokens, "
        "fp32 AdamW, DDP over the cp ranks (which reduce the gradients of their tokens), 1 "
        "thread per rank, 1 untimed step then %d timed. Kept: the bytes a rank keeps from "
        "forward to backward. Sent: attention bytes per rank per step, counted by the cp group's "
        "communicator, next to cp::bytes_sent_per_layer's count (ring: (cp-1) passes of the "
        "rank's K and V forward and backward plus cp of their gradients; Ulysses: (cp-1)/cp of "
        "q, k, v and the output, each way)."
        % (cmd, datetime.date.today().isoformat(), machine(), shown_path(a.dtorch),
           first["torch"], first["params"] / 1e6, a.batch, a.seq_len, a.steps),
        "",
        "| layout | tokens per rank | s/step | kept per rank | / one rank | sent per step | count |",
        "|---|---|---|---|---|---|---|",
    ]
    whole = max(r["forward_kept_bytes"] for r in ours["one rank"])
    for label, n, kind in layouts():
        rows = ours[label]
        r = rows[0]
        kept = max(x["forward_kept_bytes"] for x in rows)
        sent = "%.2f MiB" % mib(r["cp_bytes_sent_per_step"]) if kind else "-"
        count = "%.2f MiB" % mib(r["cp_formula_bytes_per_step"]) if kind else "-"
        lines.append("| %s | %d | %.3f | %.1f MiB | %.3f | %s | %s |" % (
            label, r.get("tokens_per_rank", a.seq_len), max(x["step_seconds"] for x in rows),
            mib(kept), kept / whole, sent, count))
    lines += [
        "",
        "One rank runs the model's own attention kernel (%s). Ring attention keeps, per layer, "
        "only the rank's q, k, v, its output and each row's log-sum-exp, and recomputes the "
        "probabilities in backward (flash attention's scheme); Ulysses keeps its kernel's state "
        "for the whole sequence and 1/cp of the heads. s/step is wall time with every rank on "
        "this machine's %d cores (cp 4 runs 4 ranks on them), not a scaling figure."
        % ("fused scaled_dot_product_attention" if not first["torch"].startswith("1.")
           else "explicit softmax, which keeps the T x T probabilities", os.cpu_count()),
    ]
    if theirs:
        torch2 = peer_torch
        reasons = {err for _, err in theirs.values() if err}
        lines += ["", "### Against PyTorch %s's context_parallel (same run)" % (
            short_version(torch2) if torch2 else "2.x"), ""]
        if reasons and all(err for _, err in theirs.values()):
            lines.append(
                "PyTorch's `context_parallel` (bench/peer_context_parallel.py, cp 2 and 4, "
                "rotate allgather, every SDPA backend tried) does not run on CPU: %s Its ring "
                "attention routes only the CUDA kernels (flash, memory-efficient, cuDNN); no "
                "comparison is possible on this machine." % "; ".join(sorted(reasons)))
        else:
            lines += ["| cp | dtorch ring s/step | PyTorch s/step | dtorch kept | PyTorch kept |",
                      "|---|---|---|---|---|"]
            for n, (rows, err) in sorted(theirs.items()):
                o = ours["cp %d ring" % n]
                if err:
                    lines.append("| %d | %.3f | did not run: %s | | |" % (
                        n, o[0]["step_seconds"], err.replace("|", "/")))
                    continue
                lines.append("| %d | %.3f | %.3f | %.1f MiB | %.1f MiB |" % (
                    n, o[0]["step_seconds"], rows[0]["step_seconds"],
                    mib(max(x["forward_kept_bytes"] for x in o)),
                    mib(max(x["forward_kept_bytes"] or 0 for x in rows))))
    lines.append(END)
    publish(a.out, lines)


if __name__ == "__main__":
    main()
