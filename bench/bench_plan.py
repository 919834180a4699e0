#!/usr/bin/python3
"""How good dtorch plan's predictions are: for each case calibrates this machine (`dtorch plan
calibrate`) at the case's rank count, then runs `dtorch plan --validate K`, which runs the K
layouts predicted fastest that fit through `dtorch bench memory`, and writes the predicted against
measured step time and peak memory per rank into docs/plan-benchmarks.md (BENCHMARKS.md holds
dtorch against its peers). No other system predicts a whole layout's step time and memory, so
there is no peer to run beside it.

Cases: MODEL:RANKS:GLOBAL_BATCH[:STRATEGY] at --seq-len tokens, fp32 AdamW, 1 thread per rank;
a STRATEGY (`dtorch plan --strategy`) validates that strategy's best layouts, which the others'
may crowd out of the top K (ZeRO-3's, at these sizes).
Usage: bench/bench_plan.py [--dtorch build-pip/dtorch] [--validate 10] [--cases gpt-small:2:2 ...]
                          [--out docs/plan-benchmarks.md]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

from bench_memory import shown_path
from benchlib import libtorch_version, machine, publish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- plan-accuracy:start -->", "<!-- plan-accuracy:end -->"


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    if p.returncode != 0:
        sys.exit("bench_plan: %s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stderr[-2000:]))
    return p.stdout


def miss(predicted, measured):
    return (predicted - measured) / measured


# The table's header names --cases when they are not these.
DEFAULT_CASES = ["gpt-small:2:2", "gpt-small:4:4", "gpt-large:2:2", "gpt-large:4:4",
                 "gpt-small:2:2:zero3"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES)
    ap.add_argument("--validate", type=int, default=10, help="layouts run per case (gpt-small)")
    ap.add_argument("--validate-large", type=int, default=5, help="layouts run per gpt-large case")
    ap.add_argument("--validate-strategy", type=int, default=4,
                    help="layouts run per case of one strategy")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "plan-benchmarks.md"))
    a = ap.parse_args()
    a.dtorch = os.path.abspath(a.dtorch)  # the runs start in /tmp
    tmp = tempfile.mkdtemp(prefix="dtorch-bench-plan-")
    results = []
    for i, case in enumerate(a.cases):
        model, ranks, batch, strategy = (case.split(":") + [""])[:4]
        # Calibrated right before the case: a shared machine's speed drifts over the minutes
        # between the first case and the last.
        machine_file = os.path.join(tmp, "machine-%d.json" % i)
        run([a.dtorch, "plan", "calibrate", "--out", machine_file, "--nproc-per-node", ranks])
        k = a.validate_strategy if strategy else (
            a.validate_large if model == "gpt-large" else a.validate)
        out = run([a.dtorch, "plan", "--model", model, "--nproc-per-node", ranks,
                   "--global-batch-size", batch, "--seq-len", str(a.seq_len), "--machine",
                   machine_file, "--format", "json", "--top", "1", "--validate", str(k),
                   "--validate-steps", str(a.steps)] + (["--strategy", strategy] if strategy else []))
        rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        results.append((model, int(ranks), int(batch), strategy, rows))
        print("%s on %s ranks: %d layouts validated" % (model, ranks, sum(
            "measured_step_s" in r for r in rows)), file=sys.stderr)

    cmd = ("bench/bench_plan.py --validate %d --validate-large %d --validate-strategy %d "
           "--steps %d --seq-len %d" % (a.validate, a.validate_large, a.validate_strategy, a.steps,
                                        a.seq_len))
    if a.cases != DEFAULT_CASES:
        cmd += " --cases " + " ".join(a.cases)
    others = max([r.get("measured_others_cpu_share", 0) for c in results for r in c[-1]] + [0])
    lines = [
        START,
        "## Predicted against measured: `dtorch plan --validate`",
        "",
        "Measured by `make bench` (`%s`) on %s, %s, with %s (LibTorch %s): for each case `dtorch "
        "plan calibrate` at its rank count (each rate the median of three rounds), then `dtorch "
        "plan --validate K` runs the K layouts "
        "predicted fastest that fit through `dtorch bench memory` (%d timed steps after two, "
        "fp32 AdamW, %d tokens, 1 thread per rank). Step: the median timed step, the slowest "
        "rank's; peak: the largest "
        "rank's peak RSS. Miss: (predicted - measured) / measured. Other processes took at most "
        "%.0f%% of the machine's CPU time while a layout ran (Note [Others on the machine]). No "
        "other system predicts a layout's step time and memory, so none runs beside it."
        % (cmd, datetime.date.today().isoformat(), machine(), shown_path(a.dtorch),
           libtorch_version(a.dtorch), a.steps, a.seq_len, 100 * others),
    ]
    total = time_ok = memory_ok = 0
    for model, ranks, batch, strategy, rows in results:
        ran = [r for r in rows if "measured_step_s" in r]
        only = ", %s layouts only (`--strategy %s`)" % (strategy, strategy) if strategy else ""
        lines += ["", "### %s, %d ranks, global batch %d%s" % (model, ranks, batch, only), "",
                  "| # | layout | predicted step s (compute + comm + bubble) | measured step s | "
                  "miss | predicted peak GiB | measured peak GiB | miss |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            # The layout's own flags: --model and --seq-len are the case's.
            flags = r["flags"].split(" --batch-size ", 1)[-1]
            flags = "--batch-size " + flags
            pred = "%.2f (%.2f + %.2f + %.2f)" % (
                r["predicted_step_s"], r["predicted_compute_s"], r["predicted_exposed_comm_s"],
                r["predicted_bubble_s"])
            if "measured_step_s" not in r:
                lines.append("| %d | `%s` | %s | did not run: %s | | %.2f | | |" % (
                    r["rank"], flags, pred, r.get("not_run", "?").replace("|", "/"),
                    r["predicted_peak_gib"]))
                continue
            ts, ms = miss(r["predicted_step_s"], r["measured_step_s"]), miss(
                r["predicted_peak_gib"], r["measured_peak_gib"])
            total += 1
            time_ok += abs(ts) <= 0.25
            memory_ok += abs(ms) <= 0.15
            lines.append("| %d | `%s` | %s | %.2f | %+.0f%% | %.2f | %.2f | %+.0f%% |" % (
                r["rank"], flags, pred, r["measured_step_s"], 100 * ts, r["predicted_peak_gib"],
                r["measured_peak_gib"], 100 * ms))
        if ran:
            best = min(ran, key=lambda r: r["measured_step_s"])
            first = ran[0]
            lines += ["", "Predicted best (#%d) measured %.2f s; measured best (#%d) %.2f s: "
                      "%+.0f%%." % (first["rank"], first["measured_step_s"], best["rank"],
                                   best["measured_step_s"],
                                   100 * miss(first["measured_step_s"], best["measured_step_s"]))]
    lines += ["", "Over all cases: step time within 25%% for %d of %d layouts, peak memory "
              "within 15%% for %d of %d." % (time_ok, total, memory_ok, total), END]
    publish(a.out, lines)


if __name__ == "__main__":
    main()
