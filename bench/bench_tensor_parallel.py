#!/usr/bin/python3
"""Runs `dtorch bench memory` for data, sharded, tensor and pipeline parallelism at N ranks and
writes the tensor-parallel section of BENCHMARKS.md.

Layouts (gpt-small, N = 4 by default): ddp (dp N), zero3 (dp N), tp N (one replica split N
ways), dp N/2 x tp 2 (DDP, and ZeRO-3, over pairs of tensor-parallel ranks), pp N under each
pipeline schedule and pp 2 x dp N/2 (1F1B; DDP over the stage pairs, and ZeRO-3 with its units
gathered once per step or with --reshard-after-microbatch). Every layout trains the same
global batch per step: --batch sequences per data-parallel replica, so a pipeline replica
takes N x --batch (pp N) or 2 x --batch (pp 2) sequences, one micro-batch of --batch
sequences per stage. Per layout: samples/s, peak RSS
per rank, model state per rank against the strategy's formula (dtorch bench memory's), and
bytes each rank sends per step, data-parallel and tensor-parallel apart, next to the formulas:
DDP 2(dp-1)/dp x 4 P_local, ZeRO-3 3(dp-1)/dp x 4 P_local (under a pipeline of m micro-batches
2x, or (2m + 1)x resharded after each); tensor parallelism 2(tp-1)/tp x ((4L + 2) A + 12 B T)
with A = B T d x 4 bytes (Megatron's 2 allreduces per block forward and 2 backward, the
vocabulary-parallel embedding's forward and the tied head's input gradient, and the
vocabulary-parallel loss's three floats per token). Then PyTorch 2.x's own DDP, FSDP and
tensor parallelism (parallelize_module with ColwiseParallel/RowwiseParallel), FSDP2 over tensor
parallelism and FSDP2 inside pipeline stages (bench/peer_sharded.py under the virtual
environment's Python) on the same model, batch and optimizer, in the same run.
Usage: bench/bench_tensor_parallel.py [--dtorch build-pip/dtorch] [--nproc 4] [--steps 3]
"""
import argparse
import datetime
import os
import sys

from bench_memory import gib, run_lines, run_peer, shown_path, short_version
from benchlib import parse_with_peer, publish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- tensor-parallel:start -->", "<!-- tensor-parallel:end -->"
# n_layer, n_embd of dtorch's GPTConfig::small() and ::debug().
SHAPES = {"gpt-small": (12, 768), "gpt-debug": (2, 32)}


RESHARD = "--reshard-after-microbatch"
PIPELINE_ZERO3 = (
    " Under a pipeline ZeRO-3 gathers each stage's units once per step (2x, the bytes of DDP's "
    "allreduce); with --reshard-after-microbatch twice per micro-batch but its root unit (the "
    "embeddings, or the final norm and head) once per step, so it sends less than its (2m + 1)x: "
    "more gathers for the memory of the stage's parameters between their uses.")


def layouts(n):
    """(label, dtorch strategy, tp, peer strategy, peer extra args, peer name, pp, schedule,
    dtorch's extra flags). The single-pipeline layouts' peers are in the pipeline section
    (bench/bench_pipeline.py); ZeRO-3 over tensor-parallel shards and over pipeline stages
    are compared with PyTorch's FSDP2 composed the same way."""
    dp_pp = "PyTorch pipelining Schedule1F1B + FSDP2 over dp"
    return [
        ("ddp", "ddp", 1, "ddp", [], "PyTorch DDP", 1, None, []),
        ("zero3", "zero3", 1, "fsdp", [], "PyTorch FSDP", 1, None, []),
        ("tp %d" % n, "ddp", n, "tensor-parallel", [], "PyTorch parallelize_module", 1, None, []),
        ("dp %d x tp 2" % (n // 2), "ddp", 2, None, [], None, 1, None, []),
        ("dp %d x tp 2 zero3" % (n // 2), "zero3", 2, "dp-tp", ["--tp", "2"],
         "PyTorch parallelize_module + FSDP2 over dp", 1, None, []),
    ] + [("pp %d %s" % (n, schedule), "ddp", 1, None, [], None, n, schedule, [])
         for schedule in ("gpipe", "1f1b", "interleaved", "zb")] + [
        ("pp 2 x dp %d 1f1b" % (n // 2), "ddp", 1, None, [], None, 2, "1f1b", []),
        ("pp 2 x dp %d 1f1b zero3" % (n // 2), "zero3", 1, "dp-pp", ["--pp", "2"], dp_pp, 2,
         "1f1b", []),
        ("pp 2 x dp %d 1f1b zero3, %s" % (n // 2, RESHARD), "zero3", 1, "dp-pp",
         ["--pp", "2", RESHARD], dp_pp + " (reshard_after_forward)", 2, "1f1b", [RESHARD]),
    ]


def replica_batch(batch, pp):
    """Sequences per replica: a pipeline of pp stages runs pp micro-batches of `batch`."""
    return batch * pp


def tp_formula(model, tp, batch, seq_len):
    if tp == 1:
        return 0
    layers, width = SHAPES[model]
    activation = batch * seq_len * width * 4
    return 2 * (tp - 1) / tp * ((4 * layers + 2) * activation + 12 * batch * seq_len)


def dp_formula(strategy, dp, p_local, pp, flags):
    """A ring's bytes per rank: allreduce 2x, ZeRO-3 3x (gather for forward and for backward,
    reduce-scatter); ZeRO-3 under a pipeline of pp micro-batches gathers once per step (2x), or
    twice per micro-batch with --reshard-after-microbatch (2 pp + 1)."""
    if dp == 1:
        return 0
    times = 2.0
    if strategy == "zero3":
        times = 3.0 if pp == 1 else 2.0 * pp + 1 if RESHARD in flags else 2.0
    return times * (dp - 1) / dp * 4 * p_local


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    ap.add_argument("--model", default="gpt-small", choices=sorted(SHAPES))
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=64)
    a = parse_with_peer(ap)
    n = a.nproc

    ours, theirs = {}, {}
    for label, strategy, tp, _, _, _, pp, schedule, flags in layouts(n):
        pipeline = ["--pp", str(pp), "--schedule", schedule, "--microbatches", str(pp)] if pp > 1 else []
        rows = run_lines([a.dtorch, "bench", "memory", "--model", a.model, "--strategy", strategy,
                          "--tp", str(tp), "--nproc-per-node", str(n), "--steps", str(a.steps),
                          "--batch-size", str(replica_batch(a.batch, pp)), "--seq-len",
                          str(a.seq_len)] + pipeline + flags)
        ours[label] = rows
        print("%s: %.2f samples/s, peak RSS %.2f GiB" % (
            label, rows[0]["samples_per_s"], gib(max(r["peak_rss_bytes"] for r in rows))),
            file=sys.stderr)
    for label, _, _, peer, extra, _, pp, _, _ in layouts(n) if a.python2 else []:
        if peer is None:
            continue
        if pp > 1:  # dtorch's stages and micro-batches (one of --batch sequences per stage)
            extra = extra + ["--microbatches", str(pp), "--stages", ",".join(
                "%d-%d" % tuple(u) for u in sorted({tuple(u) for r in ours[label]
                                                    for u in r["stages_units"]}))]
        rows, err = run_peer([os.path.abspath(a.python2), os.path.abspath(a.peer), "--strategy",
                              peer, "--model", a.model, "--nproc", str(n), "--steps",
                              str(a.steps), "--batch", str(replica_batch(a.batch, pp)),
                              "--seq-len", str(a.seq_len)] + extra)
        theirs[label] = (rows, err)
        print("peer %s: %s" % (label, err or "%.2f samples/s" % rows[0]["samples_per_s"]),
              file=sys.stderr)

    first = ours["ddp"][0]
    torch2 = next((rows[0]["torch"] for rows, _ in theirs.values() if rows), None)
    cmd = ("bench/bench_tensor_parallel.py --model %s --nproc %d --steps %d --batch %d "
           "--seq-len %d" % (a.model, n, a.steps, a.batch, a.seq_len))
    lines = [
        START,
        "## Tensor and pipeline parallelism against data parallelism and ZeRO-3 (`dtorch bench "
        "memory --tp/--pp`)",
        "",
        "Measured by `make bench` (`%s`) on %s with %s (LibTorch %s): %s, P = %.1f M parameters, "
        "%d ranks, fp32 AdamW, batch %d x %d tokens per data-parallel replica (tensor-parallel "
        "ranks share theirs; a pipeline of pp stages takes pp micro-batches of that size, so "
        "every layout trains the same global batch), 1 thread per rank, 1 untimed step then %d "
        "timed. samples/s counts each "
        "replica's samples once. Bytes sent per step per rank are counted by dtorch's "
        "communicators (data-parallel group and tensor-parallel group apart) as a ring sends "
        "them; the formulas are in bench/bench_tensor_parallel.py's docstring."
        % (cmd, datetime.date.today().isoformat(), shown_path(a.dtorch), first["torch"], a.model,
           first["params"] / 1e6, n, a.batch, a.seq_len, a.steps),
        "",
        "| layout | samples/s | peak RSS per rank | params per rank | model state per rank "
        "(/ formula) | dp bytes/step | formula | tp bytes/step | formula |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, strategy, tp, _, _, _, pp, _, flags in layouts(n):
        rows = ours[label]
        r = rows[0]
        dp_sent = r["bytes_sent_per_step"]["total"]
        tp_sent = r["tp_bytes_sent_per_step"]["total"]
        state = max(x["model_state_bytes"] for x in rows)
        over = max(x["model_state_over_formula"] for x in rows)
        lines.append("| %s | %.2f | %.2f GiB | %.1f M | %.3f GiB (%.2f) | %.1f MiB | %.1f MiB | "
                     "%.2f MiB | %.2f MiB |" % (
                         label, r["samples_per_s"], gib(max(x["peak_rss_bytes"] for x in rows)),
                         r["params_local"] / 1e6, gib(state), over, dp_sent / 2**20,
                         dp_formula(strategy, r["dp"], r["params_local"], pp, flags) / 2**20,
                         tp_sent / 2**20, tp_formula(a.model, tp, a.batch, min(a.seq_len, 32 if a.model == "gpt-debug" else 1024)) / 2**20))
    lines += [
        "",
        "ZeRO-3 sends less than its formula's 3x because its root unit (the token embedding, a "
        "third of gpt-small) is gathered once per step." + PIPELINE_ZERO3 + " Under ZeRO-3 no rank "
        "builds the whole model "
        "(Note [Deferred initialisation]); under a pipeline each rank builds only its own "
        "stage; the other layouts build the whole model on every rank before splitting it, so "
        "their peak RSS holds one unsplit copy. The bytes columns "
        "leave out the pipeline's point-to-point activations and the tied embedding's gradient "
        "sum between the first and last stage.",
    ]
    if theirs:
        lines += [
            "",
            "### Against PyTorch %s (same run)" % (short_version(torch2) if torch2 else "2.x"),
            "",
            "| layout | dtorch samples/s | dtorch peak RSS | peer | peer samples/s | peer peak "
            "RSS | samples/s dtorch / peer | RSS dtorch / peer |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label, _, _, peer, _, name, _, _, _ in layouts(n):
            if peer is None:
                continue
            o = ours[label]
            o_sps, o_rss = o[0]["samples_per_s"], max(x["peak_rss_bytes"] for x in o)
            rows, err = theirs[label]
            if err:
                lines.append("| %s | %.2f | %.2f GiB | %s | did not run: %s | | | |" % (
                    label, o_sps, gib(o_rss), name, err.replace("|", "/")))
                continue
            t_sps, t_rss = rows[0]["samples_per_s"], max(x["peak_rss_bytes"] for x in rows)
            lines.append("| %s | %.2f | %.2f GiB | %s | %.2f | %.2f GiB | %.2f | %.2f |" % (
                label, o_sps, gib(o_rss), name, t_sps, gib(t_rss), o_sps / t_sps, o_rss / t_rss))
        lines += [
            "",
            "PyTorch's tensor-parallel peer gathers the logits whole (ColwiseParallel with "
            "Replicate output on the tied lm_head) and computes a plain cross-entropy; dtorch "
            "keeps them split by vocabulary (vocabulary-parallel cross-entropy).",
        ]
    lines.append(END)
    publish(a.out, lines)


if __name__ == "__main__":
    main()
