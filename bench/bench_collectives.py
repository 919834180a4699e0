#!/usr/bin/python3
"""Measures Gloo's own reduce-scatter and flat allgather (LibTorch 2.x) against dtorch's ring
and per-chunk allgather, and writes the collectives section of BENCHMARKS.md.

Both run over Gloo on 127.0.0.1 (DTORCH_SHM=0: the path every multi-node job takes), from the
same dtorch binary built against LibTorch 2.x, alternating, median of --repeats. The faster per
operation is what DTORCH_GLOO_COLLECTIVES=auto should pick (kGlooNativeIsFaster in
src/dtorch/comm/backend_compat.h, Note [Gloo on 2.x], set from this table). The shared-memory path, which single-node
jobs use, is measured too for scale.
Usage: bench/bench_collectives.py --dtorch build-pip/dtorch [--nprocs 2 4] [--out BENCHMARKS.md]
"""
import argparse
import datetime
import os
import statistics
import sys

from benchlib import publish, run_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- collectives:start -->", "<!-- collectives:end -->"
OPS = ("reduce-scatter", "allgather")
PATHS = (("dtorch ring", {"DTORCH_SHM": "0", "DTORCH_GLOO_COLLECTIVES": "dtorch"}),
         ("Gloo native", {"DTORCH_SHM": "0", "DTORCH_GLOO_COLLECTIVES": "native"}),
         ("shared memory", {"DTORCH_SHM": "1"}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    ap.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64 << 10, 4 << 20, 32 << 20])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    a = ap.parse_args()
    a.dtorch = os.path.abspath(a.dtorch)

    rows, torch_version = [], None
    for n in a.nprocs:
        for op in OPS:
            for size in a.sizes:
                iters = max(5, min(200, (64 << 20) // size))
                ms = {name: [] for name, _ in PATHS}
                for _ in range(a.repeats):
                    for name, env in PATHS:
                        r = run_json([a.dtorch, "bench", "allreduce", "--op", op,
                                      "--nproc-per-node", str(n), "--bytes", str(size),
                                      "--iters", str(iters)], env)
                        ms[name].append(r["ms"])
                        torch_version = r["torch"]
                med = {k: statistics.median(v) for k, v in ms.items()}
                rows.append((n, op, size, med))
                print(f"{op} x{n} {size} B: " +
                      ", ".join(f"{k} {v:.3f} ms" for k, v in med.items()), file=sys.stderr)

    ring, native = PATHS[0][0], PATHS[1][0]
    lines = [
        START,
        "## Gloo's own reduce-scatter and allgather against dtorch's (LibTorch 2.x)",
        "",
        "Measured by `make bench` (`bench/bench_collectives.py --nprocs %s --repeats %d`) on %s "
        "with dtorch built against LibTorch %s: `dtorch bench allreduce --op OP` over Gloo on "
        "127.0.0.1 (`DTORCH_SHM=0`, the path of every multi-node job) with "
        "`DTORCH_GLOO_COLLECTIVES=dtorch` (dtorch's ring over send/recv, and an allgather into "
        "per-rank chunks) and `=native` (Gloo's `_reduce_scatter_base` and `_allgather_base`, "
        "which LibTorch 1.13 lacks), and the single-node shared-memory path for scale; ms per "
        "call, median of %d, float32, size = the whole buffer." % (
            " ".join(map(str, a.nprocs)), a.repeats, datetime.date.today().isoformat(),
            torch_version, a.repeats),
        "",
        "| op | ranks | bytes | dtorch ring | Gloo native | native / ring | shared memory |",
        "|---|---|---|---|---|---|---|",
    ]
    wins = {op: [] for op in OPS}
    for n, op, size, med in rows:
        ratio = med[native] / med[ring]
        wins[op].append(ratio)
        lines.append("| %s | %d | %d | %.3f | %.3f | %.2f | %.3f |" % (
            op, n, size, med[ring], med[native], ratio, med["shared memory"]))
    lines += ["", "Time of Gloo's own over dtorch's, geometric mean over sizes and ranks "
              "(below 1: Gloo's is faster): " + ", ".join(
                  "%s %.2f" % (op, statistics.geometric_mean(v)) for op, v in wins.items()) + ".",
              END]
    publish(a.out, lines)


if __name__ == "__main__":
    main()
