#!/usr/bin/python3
"""Runs `dtorch bench memory` for every strategy and writes the memory section of BENCHMARKS.md.

Per rank: the model-state bytes dtorch holds (counted from its own buffers) against the ZeRO
paper's formulas for fp32 AdamW (16P for DDP, 8P + 8P/N for ZeRO-1, 4P + 12P/N for ZeRO-2,
16P/N for ZeRO-3, which gathers nothing between steps), the process's peak RSS, the bytes each rank
sends per step against the paper's communication volume, and samples/s relative to DDP at
the smallest N, all from one run on one machine. Then the same training under PyTorch 2.x's
DDP, ZeroRedundancyOptimizer and FSDP and under DeepSpeed's ZeRO-1/2/3 (bench/peer_sharded.py,
run by the virtual environment's Python, same model, batch, optimizer and steps), so that
dtorch's samples/s and peak RSS per rank stand beside what Python users run today.
Usage: bench/bench_memory.py [--dtorch build/dtorch] [--model gpt-small] [--nprocs 2 4]
                             [--python2 .venv/bin/python]
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

from benchlib import machine, parse_with_peer, publish, shown_path  # noqa: F401 (re-used)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- memory:start -->", "<!-- memory:end -->"
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
# ZeRO-3 once more with its root unit released after forward and gathered again for backward:
# the paper's 3x bytes, for the bytes and throughput tables.
RESHARD_ROOT = "zero3, root resharded"
FLAGS = {RESHARD_ROOT: ["--strategy", "zero3", "--reshard-root-after-forward"]}
# (dtorch strategy, peer strategy, what the peer is): the same ZeRO stage on both sides.
PAIRS = (("ddp", "ddp", "PyTorch DDP"),
         ("zero1", "zero-redundancy", "PyTorch ZeroRedundancyOptimizer"),
         ("zero3", "fsdp", "PyTorch FSDP"),
         ("zero1", "deepspeed-zero1", "DeepSpeed ZeRO-1"),
         ("zero2", "deepspeed-zero2", "DeepSpeed ZeRO-2"),
         ("zero3", "deepspeed-zero3", "DeepSpeed ZeRO-3"))
PEER_STRATEGIES = tuple(dict.fromkeys(p for _, p, _ in PAIRS))


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


def json_objects(text):
    """Every JSON object in `text`, read wherever one begins: ranks that share one stdout may
    write theirs on one line."""
    rows, decoder = [], json.JSONDecoder()
    at = text.find("{")
    while at >= 0:
        try:
            row, end = decoder.raw_decode(text, at)
            rows.append(row)
            at = text.find("{", end)
        except ValueError:
            at = text.find("{", at + 1)
    return rows


def run_peer(cmd):
    """Runs a peer (bench/peer_*.py): (rows by rank, None) or ([], the one-line reason it
    failed)."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    rows = json_objects(p.stdout)
    errors = [r["error"] for r in rows if "error" in r]
    if errors:
        return [], errors[0]
    if p.returncode != 0 or not rows:
        tail = [l for l in p.stderr.strip().splitlines() if l.strip()]
        return [], "exit code %d: %s" % (p.returncode, tail[-1] if tail else "no output")
    return sorted(rows, key=lambda r: r["rank"]), None


def short_version(v):
    """'2.15.0+cu132' -> '2.15': the part a heading needs."""
    m = re.match(r"(\d+\.\d+)", v or "")
    return m.group(1) if m else str(v)


def gib(b):
    return b / 2**30


def median_run(runs):
    """Of several runs (each its rows by rank), the one of median samples/s, with every rank's
    peak RSS the largest that rank reached in any of them; and (slowest, fastest) samples/s."""
    speeds = sorted(r[0]["samples_per_s"] for r in runs)
    mid = next(r for r in runs if r[0]["samples_per_s"] == speeds[len(speeds) // 2])
    out = [dict(row) for row in mid]
    for row in out:
        row["peak_rss_bytes"] = max(x["peak_rss_bytes"] for r in runs for x in r
                                    if x["rank"] == row["rank"])
    return out, (speeds[0], speeds[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build", "dtorch"))
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed steps before the timed ones (the heap settles in two)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3,
                    help="interleaved runs of each configuration; tables show the median")
    a = parse_with_peer(ap)
    if a.python2:
        a.python2 = os.path.abspath(a.python2)  # the peers run from /tmp
    if a.python2 and not os.path.exists(a.python2):
        sys.exit(f"bench: no Python at {a.python2} (make deps-bench makes .venv)")

    # Each configuration runs --repeats times, the configurations interleaved, so that a slow
    # spell of the machine falls on all of them alike; the tables show each one's median run.
    runs, spread = {}, {}
    for n in a.nprocs:
        for _ in range(a.repeats):
            for s in STRATEGIES + (RESHARD_ROOT,):
                rows = run_lines([a.dtorch, "bench", "memory", "--model", a.model]
                                 + FLAGS.get(s, ["--strategy", s]) + [
                                  "--nproc-per-node", str(n), "--steps", str(a.steps),
                                  "--warmup-steps", str(a.warmup),
                                  "--batch-size", str(a.batch), "--seq-len", str(a.seq_len)])
                runs.setdefault((s, n), []).append(rows)
                r = rows[0]
            print(f"{s} x{n}: model state {gib(r['model_state_bytes']):.2f} GiB "
                  f"({r['model_state_over_formula']:.3f} of formula), peak RSS "
                  f"{gib(max(x['peak_rss_bytes'] for x in rows)):.2f} GiB, "
                  f"{r['samples_per_s']:.2f} samples/s", file=sys.stderr)
    results = {}
    for key, rs in runs.items():
        results[key], spread[key] = median_run(rs)

    # The peers, after all of dtorch's runs, with the same settings and repeats. A peer that
    # cannot run is recorded with its reason, not fatal: the table says why.
    peer_runs, failed = {}, {}
    for n in a.nprocs if a.python2 else []:
        for _ in range(a.repeats):
            for s in PEER_STRATEGIES:
                if (s, n) in failed:
                    continue
                rows, err = run_peer([a.python2, os.path.abspath(a.peer), "--strategy", s,
                                      "--model", a.model, "--nproc", str(n), "--steps",
                                      str(a.steps), "--warmup", str(a.warmup), "--batch",
                                      str(a.batch), "--seq-len", str(a.seq_len)])
                if err:
                    failed[(s, n)] = err
                else:
                    peer_runs.setdefault((s, n), []).append(rows)
                print(f"peer {s} x{n}: " + (f"failed: {err}" if err else
                      f"{rows[0]['impl']}, peak RSS "
                      f"{gib(max(x['peak_rss_bytes'] for x in rows)):.2f} GiB, "
                      f"{rows[0]['samples_per_s']:.2f} samples/s"), file=sys.stderr)
    peers = {key: ([], err) for key, err in failed.items()}
    for key, rs in peer_runs.items():
        if key not in failed:
            peers[key] = (median_run(rs)[0], None)
    ran = [rows[0] for rows, _ in peers.values() if rows]
    torch2 = ran[0]["torch"] if ran else None
    deepspeed = next((r["deepspeed"] for r in ran if "deepspeed" in r), None)
    fsdp = next((r["impl"] for r in ran if r["strategy"] == "fsdp"), None)

    P = results[("ddp", a.nprocs[0])][0]["params"]
    n0 = a.nprocs[0]
    cmd = ("bench/bench_memory.py --model %s --nprocs %s --steps %d --warmup %d --batch %d "
           "--seq-len %d --repeats %d" % (a.model, " ".join(map(str, a.nprocs)), a.steps,
                                          a.warmup, a.batch, a.seq_len, a.repeats))
    lines = [
        START,
        "## Memory per rank by strategy (`dtorch bench memory`)",
        "",
        "Measured by `make bench` (`%s`) on %s (%s): %s, P = %d parameters (%.1f M), fp32 "
        "AdamW, batch %d x %d tokens per rank, 1 thread per rank. Model state is what dtorch "
        "holds in its own buffers after a step (parameters, gradients, optimizer state); the "
        "formula is the ZeRO paper's (Rajbhandari et al. 2020, section 5) with 4 + 4 + 8 bytes "
        "per parameter; peak RSS is the largest of the ranks' (`getrusage`), which also holds "
        "activations, gradients in flight, the fp32 model as built before it is sharded (not "
        "under zero3, which never builds it whole: Note [Deferred initialisation]), and "
        "LibTorch itself. Page faults are the minor faults (`getrusage`) per timed step, "
        "after %d untimed ones, as a share of the pages the gradients span: memory the step "
        "asks the kernel for again instead of reusing. The references are the formula and, "
        "in the last table, %s"
        % (cmd, datetime.date.today().isoformat(), machine(), a.model, P, P / 1e6, a.batch,
           a.seq_len, a.warmup,
           peer_sentence(a, peers, torch2, deepspeed, fsdp)),
        "",
        "| strategy | N | params | grads | optimizer | model state | formula | state / "
        "formula | peak RSS | page faults / step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in a.nprocs:
        for s in STRATEGIES:
            r = results[(s, n)][0]
            lines.append("| %s | %d | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB | "
                         "%.3f | %.2f GiB | %s |" % (
                             s, n, gib(r["param_bytes"]), gib(r["grad_bytes"]),
                             gib(r["optim_bytes"]), gib(r["model_state_bytes"]),
                             gib(r["formula_bytes"]), r["model_state_over_formula"],
                             gib(max(x["peak_rss_bytes"] for x in results[(s, n)])),
                             faults(r)))
    lines += [
        "",
        "ZeRO-3 holds no gathered parameters between steps: each transformer block is "
        "gathered for its forward and again for its backward, and the root unit (token and "
        "position embeddings, final norm, the tied head) when forward begins, until its "
        "gradients are reduced at the end of backward, as FSDP keeps its root.",
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
        for s in STRATEGIES + (RESHARD_ROOT,):
            r = results[(s, n)][0]
            b = r["bytes_sent_per_step"]
            paper = (3.0 if s.startswith("zero3") else 2.0) * (n - 1) / n
            lines.append("| %s | %d | %.1f MiB | %.1f MiB | %.1f MiB | %.2f | %.2f |" % (
                s, n, b["allreduce"] / 2**20, b["reduce_scatter"] / 2**20,
                b["allgather"] / 2**20, r["sent_per_step_over_param_bytes"], paper))
    lines += [
        "",
        "ZeRO-3 sends less than 3x because its root unit (a third of gpt-small's parameters: "
        "the 50304 x 768 token embedding, which is also the output layer) is gathered once per "
        "step, as FSDP gathers its root: the model uses it at both ends of forward, so "
        "releasing it in between would free it only while the loss is computed. With "
        "`--reshard-root-after-forward` (\"%s\") it is released when forward ends and "
        "gathered again for backward like every block, and ZeRO-3 sends the paper's 3x."
        % RESHARD_ROOT,
        "",
        "## Throughput by strategy, relative to DDP at N = %d (same run)" % n0,
        "",
        "Each configuration ran %d times, interleaved with the others (`--repeats`); samples/s "
        "is the median run's, next to the slowest and fastest, and every table here shows the "
        "median run (peak RSS: the largest of all runs). On this shared machine one run's speed "
        "varies by up to a third between runs minutes apart, so single runs are not compared."
        % a.repeats,
        "",
        "| strategy | N | samples/s | slowest-fastest | / DDP |",
        "|---|---|---|---|---|",
    ]
    base = results[("ddp", n0)][0]["samples_per_s"]
    for s in STRATEGIES + (RESHARD_ROOT,):
        r = results[(s, n0)][0]
        lo, hi = spread[(s, n0)]
        lines.append("| %s | %d | %.2f | %.2f-%.2f | %.2f |" % (
            s, n0, r["samples_per_s"], lo, hi, r["samples_per_s"] / base))
    lines += [
        "",
        "## Where a step's time goes, N = %d (same run)" % n0,
        "",
        "Seconds per step on rank 0: forward, backward and the optimizer step as the bench "
        "times them, and the time within them spent waiting for communication that "
        "computation did not hide: gathers of parameters (ZeRO-3's units before their "
        "blocks, in forward and backward; ZeRO-1/2's updated parameters after the optimizer "
        "step) and gradient reductions (DDP's allreduce at the end of backward, ZeRO's "
        "reduce-scatters).",
        "",
        "| strategy | s/step | forward | backward | optimizer step | waiting for gathers | "
        "waiting for reductions |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in STRATEGIES:
        r = results[(s, n0)][0]
        ph = r["phase_seconds"]
        lines.append("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
            s, r["step_seconds"], ph["forward"], ph["backward"], ph["optimizer"],
            ph["gather_wait"], ph["reduce_wait"]))
    if peers:
        lines += peer_table(a, results, peers, torch2)
    lines.append(END)
    publish(a.out, lines)


def faults(row):
    """Rank 0's page faults per step, and their share of the gradients' pages when known."""
    f = row["page_faults_per_step"]
    share = row.get("page_faults_per_grad_page")
    return "%.0f (%.1f%%)" % (f, 100 * share) if share is not None else "%.0f" % f


def peer_sentence(a, peers, torch2, deepspeed, fsdp):
    """What the peer table compares with, for the section's introduction."""
    if not a.python2:
        return ("nothing else: no Python with PyTorch 2.x was given (`--python2`, made by "
                "`make deps-bench` in .venv), so the peers did not run.")
    failed = sorted({s for (s, _), (rows, err) in peers.items() if err})
    text = ("PyTorch %s's own DDP, ZeroRedundancyOptimizer and FSDP%s and DeepSpeed%s's "
            "ZeRO-1/2/3, all on CPU over Gloo, run by `bench/peer_sharded.py` under `%s` "
            "after dtorch's runs with the same model, batch, fp32 AdamW and steps (Debian's "
            "PyTorch 1.13 is left out: its torch.distributed.fsdp does not import under Python "
            "3.11, and its FSDP needs CUDA)." % (
                short_version(torch2) if torch2 else "2.x", " (%s)" % fsdp if fsdp else "",
                " " + deepspeed if deepspeed else "", shown_path(a.python2)))
    fallback = next((r[0]["fully_shard_error"] for r, _ in peers.values()
                     if r and "fully_shard_error" in r[0]), None)
    if fallback:
        text += " FSDP2's `fully_shard` failed on CPU (%s), so FSDP1 ran." % fallback
    if failed:
        text += " Did not run: %s (reasons in the table)." % ", ".join(failed)
    return text


def peer_table(a, results, peers, torch2):
    """dtorch against the peer of the same ZeRO stage, per N: samples/s and the largest peak RSS."""
    lines = [
        "",
        "## dtorch vs PyTorch %s and DeepSpeed (same run)" % (short_version(torch2) if torch2
                                                              else "2.x"),
        "",
        "The peers (`bench/peer_sharded.py`) train the same %s (nanoGPT's model.py, the "
        "sharding unit a transformer block) on %d x %d random token ids per rank, fp32 AdamW "
        "(lr 1e-4, weight decay 0.01), one thread per rank, %d untimed steps then %d timed, "
        "%d runs each interleaved like dtorch's (the median run; peak RSS the largest); "
        "every rank builds the whole model before it is sharded, as dtorch does for ddp, zero1 "
        "and zero2 (its zero3 never builds it whole). DeepSpeed's "
        "reduce and allgather buckets are set to 25 MiB like DDP's and dtorch's (its default, "
        "5e8 elements, is 2 GB in fp32). Peak RSS is the largest rank's. dtorch / peer above 1 "
        "means dtorch is faster; RSS dtorch / peer below 1 that it holds less memory."
        % (a.model, a.batch, a.seq_len, a.warmup, a.steps, a.repeats),
        "",
        "| N | dtorch | samples/s | peak RSS | page faults / step | peer | samples/s | peak RSS "
        "| page faults / step | samples/s dtorch / peer | RSS dtorch / peer |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = []
    for n in a.nprocs:
        for ours, theirs, name in PAIRS:
            o = results[(ours, n)]
            o_sps, o_rss = o[0]["samples_per_s"], max(x["peak_rss_bytes"] for x in o)
            rows, err = peers[(theirs, n)]
            if err:
                lines.append("| %d | %s | %.2f | %.2f GiB | %s | %s | did not run: %s | | | | |"
                             % (n, ours, o_sps, gib(o_rss), faults(o[0]), name,
                                err.replace("|", "/")))
                continue
            t_sps, t_rss = rows[0]["samples_per_s"], max(x["peak_rss_bytes"] for x in rows)
            impl = " (%s)" % rows[0]["impl"] if theirs == "fsdp" else ""
            lines.append("| %d | %s | %.2f | %.2f GiB | %s | %s%s | %.2f | %.2f GiB | %s | %.2f "
                         "| %.2f |" % (n, ours, o_sps, gib(o_rss), faults(o[0]), name, impl, t_sps,
                                       gib(t_rss), faults(rows[0]), o_sps / t_sps,
                                       o_rss / t_rss))
            base += [x["rss_before_model_bytes"] for x in rows]
    if base:
        lines += ["", "Of each peer rank's peak RSS, %.2f-%.2f GiB is held before the model "
                  "exists (Python, PyPI's torch with its CUDA libraries mapped even on CPU, the "
                  "process group)." % (gib(min(base)), gib(max(base)))]
    return lines


if __name__ == "__main__":
    main()
