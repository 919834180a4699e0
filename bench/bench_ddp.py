#!/usr/bin/python3
"""Runs `dtorch bench ddp` and PyTorch's Python DDP peer side by side and writes the DDP section
of BENCHMARKS.md (the block between its ddp:start and ddp:end markers).

Same machine, same run, same protocol (bench/peer_ddp_mnist.py): uniformly random
batches from Fashion-MNIST drawn by a per-rank generator, SGD lr 0.01 momentum 0.9,
cross-entropy, warm-up steps not timed. The peer runs under two Pythons: Debian's (PyTorch
1.13, what dtorch's Debian LibTorch is) and the virtual environment's (PyPI's PyTorch 2.x,
what users have today), so the tables show how dtorch compares with both in one run. Each
configuration runs ours then each peer's, `--repeats` times, and the median samples/s is
reported.
Usage: bench/bench_ddp.py [--dtorch build/dtorch] [--peer PATH] [--python /usr/bin/python3]
                          [--python2 .venv/bin/python] [--out BENCHMARKS.md]
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys

from benchlib import machine, publish, run_json, shown_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- ddp:start -->", "<!-- ddp:end -->"


def active_blas():
    """The BLAS alternative Debian's libblas.so.3 points at, by name ("openblas-openmp")."""
    try:
        out = subprocess.run(["update-alternatives", "--query", "libblas.so.3-x86_64-linux-gnu"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
        m = re.search(r"^Value: (.*)$", out, re.M)
        return os.path.basename(os.path.dirname(m.group(1))) if m else "unknown"
    except FileNotFoundError:
        return "unknown"


def short_version(v):
    """'2.15.0+cu132' -> '2.15', '1.13.0a0' -> '1.13': the part a column name needs."""
    m = re.match(r"(\d+\.\d+)", v or "")
    return m.group(1) if m else str(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build", "dtorch"),
                    help="dtorch built on the first peer's LibTorch (Debian's 1.13)")
    pip_dtorch = os.path.join(ROOT, "build-pip", "dtorch")
    ap.add_argument("--dtorch2", default=pip_dtorch if os.path.exists(pip_dtorch) else None,
                    help="dtorch built on the second peer's LibTorch (PyPI's 2.x; default "
                    "build-pip/dtorch when it exists, else the first dtorch faces both peers)")
    ap.add_argument("--peer", default=os.path.join(ROOT, "bench", "peer_ddp_mnist.py"))
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="first peer's Python (Debian's, PyTorch 1.13)")
    venv_python = os.path.join(ROOT, ".venv", "bin", "python")
    ap.add_argument("--python2", default=venv_python if os.path.exists(venv_python) else None,
                    help="second peer's Python (PyPI's PyTorch 2.x; default .venv/bin/python "
                    "when it exists, else the second peer is left out)")
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    a.dtorch = os.path.abspath(a.dtorch)
    # dtorches[i] faces peer i: each on the same LibTorch, so the BLAS and kernels are the same.
    dtorches = [a.dtorch] + ([os.path.abspath(a.dtorch2)] if a.dtorch2 and a.python2 else [])
    a.peer = os.path.abspath(a.peer)
    if not os.path.exists(a.peer):
        sys.exit(f"bench: the peer {a.peer} is missing (bench/peer_ddp_mnist.py in the repository)")
    pythons = [os.path.abspath(p) for p in [a.python] + ([a.python2] if a.python2 else [])]
    for py in pythons:
        if not os.path.exists(py):
            sys.exit(f"bench: no Python at {py} (make deps-bench makes .venv; --python2 names "
                     "another)")

    # rows[(model, n)]: ours = each dtorch's median, peers = one median per Python, in `pythons`
    # order; peer i is compared with ours[min(i, len(ours) - 1)].
    rows = {}
    versus = [min(i, len(dtorches) - 1) for i in range(len(pythons))]
    peer_torch = [None] * len(pythons)  # each peer's torch.__version__, as it printed it
    port = 29600
    for model in ("mnist-mlp", "mnist-cnn"):
        for n in (1, 2):
            ours, peers, last = [[] for _ in dtorches], [[] for _ in pythons], []
            for _ in range(a.repeats):
                last = [run_json([d, "bench", "ddp", "--model", model, "--nproc-per-node",
                                  str(n), "--threads", "1", "--batch-size", str(a.batch),
                                  "--steps", str(a.steps), "--warmup", str(a.warmup)])
                        for d in dtorches]
                for k, r in enumerate(last):
                    ours[k].append(r["samples_per_s"])
                for i, py in enumerate(pythons):
                    port += 1
                    p = run_json([py, a.peer, "--model", model, "--nproc", str(n), "--threads",
                                  "1", "--batch", str(a.batch), "--steps", str(a.steps),
                                  "--warmup", str(a.warmup), "--port", str(port)])
                    peers[i].append(p["samples_per_s"])
                    peer_torch[i] = p.get("torch")
                print(f"{model} x{n}: " + "  ".join(
                    f"dtorch {r.get('torch')} {x[-1]:.0f}" for r, x in zip(last, ours)) + "  " +
                    "  ".join(f"peer {v} {x[-1]:.0f}" for v, x in zip(peer_torch, peers)) +
                    " samples/s", file=sys.stderr)
            rows[(model, n)] = dict(ours=[statistics.median(x) for x in ours],
                                    peers=[statistics.median(x) for x in peers],
                                    breakdown=last[0]["ms_per_step"],
                                    dtorch_torch=[r.get("torch") for r in last])
    # Column names carry the versions ("PyTorch 1.13 DDP", "dtorch on LibTorch 2.15").
    names = ["PyTorch %s DDP" % short_version(v) for v in peer_torch]
    ours_names = ["dtorch on LibTorch %s" % short_version(v)
                  for v in rows[("mnist-cnn", 1)]["dtorch_torch"]]

    # The allreduce itself: dtorch's shared-memory path against the same ranks over Gloo
    # (DTORCH_SHM=0: c10d's ProcessGroupGloo, what PyTorch's DDP uses on CPU).
    allreduce = []
    for nbytes in (4096, 1 << 20, 4 << 20):
        ms = {}
        for path, env in (("shm", "1"), ("gloo", "0")):
            os.environ["DTORCH_SHM"] = env
            ms[path] = run_json([a.dtorch, "bench", "allreduce", "--nproc-per-node", "2",
                                 "--bytes", str(nbytes), "--iters", "200"])["ms"]
        os.environ.pop("DTORCH_SHM", None)
        allreduce.append((nbytes, ms["shm"], ms["gloo"]))

    cmd = "bench/bench_ddp.py --repeats %d --steps %d --warmup %d" % (
        a.repeats, a.steps, a.warmup)
    lines = [
        START,
        "## DDP against PyTorch's DDP: mnist-mlp and mnist-cnn (same run)",
        "",
        "Measured by `make bench` (`%s`) on %s." % (cmd, datetime.date.today().isoformat()),
        "",
        "- Machine: %s; BLAS of Debian's LibTorch: %s (PyPI's wheels bring MKL); "
        "PyTorch (peers) %s; LibTorch (dtorch) %s. Each peer faces dtorch built on the same "
        "LibTorch." %
        (machine(), active_blas(),
         " and ".join("%s (`%s`)" % (v, shown_path(py)) for v, py in zip(peer_torch, pythons)),
         " and ".join("%s (`%s`)" % (v, shown_path(d))
                      for v, d in zip(rows[("mnist-cnn", 1)]["dtorch_torch"], dtorches))),
        "- Protocol: the peer's (`bench/peer_ddp_mnist.py`): uniformly random batches "
        "of %d per rank from Fashion-MNIST, SGD lr 0.01 momentum 0.9, cross-entropy, "
        "%d warm-up steps untimed, %d timed steps, 1 thread per rank. "
        "Median of %d runs, ours and the peers' alternating." % (a.batch, a.warmup, a.steps,
                                                                    a.repeats),
        "- Transport: the peers reduce gradients with Gloo over TCP on 127.0.0.1; dtorch, whose "
        "ranks are all on one node here, through shared memory (Gloo for everything else, and "
        "for every collective across nodes).",
        "",
        "### DDP throughput (samples/s, all ranks together)",
        "",
        "| model | ranks | " + " | ".join(
            "%s | %s | dtorch / peer" % (ours_names[versus[i]], m) for i, m in enumerate(names)) +
        " |",
        "|---|---|" + "---|---|---|" * len(names),
    ]
    for (model, n), r in rows.items():
        lines.append("| %s | %d | " % (model, n) + " | ".join(
            "%.0f | %.0f | %.2fx" % (r["ours"][versus[i]], x, r["ours"][versus[i]] / x)
            for i, x in enumerate(r["peers"])) + " |")
    lines += ["", "### Scaling efficiency (2-rank samples/s over twice the 1-rank figure)", "",
              "| model | " + " | ".join(ours_names) + " | " + " | ".join(names) + " |",
              "|---|" + "---|" * (len(ours_names) + len(names))]
    for model in ("mnist-mlp", "mnist-cnn"):
        one, two = rows[(model, 1)], rows[(model, 2)]
        lines.append("| %s | " % model + " | ".join(
            "%.2f" % (b / (2 * a1))
            for a1, b in zip(one["ours"] + one["peers"], two["ours"] + two["peers"])) + " |")
    lines += ["", "### Allreduce between 2 ranks (`dtorch bench allreduce`, ms per call)", "",
              "| bytes | dtorch shared memory | Gloo (DTORCH_SHM=0) | speed-up |",
              "|---|---|---|---|"]
    for nbytes, shm, gloo in allreduce:
        lines.append("| %d | %.3f | %.3f | %.0fx |" % (nbytes, shm, gloo, gloo / shm))
    lines += ["", "### Where a dtorch step's time goes (ms per step, rank 0, last run, %s)" %
              ours_names[0], "",
              "Backward includes the time blocked on gradient communication at its end "
              "(`comm wait`); the rest of the allreduce overlaps with backward.", "",
              "| model | ranks | data | forward | backward (incl. wait) | comm wait | optimizer |",
              "|---|---|---|---|---|---|---|"]
    for (model, n), r in rows.items():
        b = r["breakdown"]
        lines.append("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
            model, n, b["data"], b["forward"], b["backward_incl_comm_wait"], b["comm_wait"],
            b["optimizer"]))
    notes_path = os.path.join(ROOT, "bench", "NOTES.md")
    if os.path.exists(notes_path):
        with open(notes_path) as f:
            lines += ["", f.read().strip()]
    # Only this block: the summary above it and the other benchmarks' blocks stay as they are.
    publish(a.out, lines + [END])


if __name__ == "__main__":
    main()
