#!/usr/bin/python3
"""One training step on one rank, dtorch against PyTorch eager on the same LibTorch, and the
step section of BENCHMARKS.md.

gpt-small (nanoGPT's GPT-2 small as bench/peer_sharded.py builds it, 124M parameters), fp32,
AdamW (lr 1e-4, weight decay 0.01), --batch sequences of --seq-len random token ids, one
intra-op thread, --warmup untimed steps (3: the heap and dtorch's kept large buffers settle over
the first few) and then --steps timed ones. dtorch is `dtorch bench memory`
on one rank (its multi-tensor AdamW, Note [Fused optimizers]); PyTorch is the same model in
eager mode with AdamW(fused=True), AdamW(foreach=True) and the per-parameter loop
(foreach=False), zero_grad(set_to_none=True) as its default. The runs alternate, --rounds times,
and each figure is the median over rounds of each run's median step. Minor page faults per step
(getrusage) stand beside each: memory the kernel had to clear and map again.
Usage: bench/bench_step.py --dtorch build-pip/dtorch [--python2 .venv/bin/python] [--rounds 3]
       .venv/bin/python bench/bench_step.py --eager fused   (one peer run; prints its JSON)
"""
import argparse
import datetime
import json
import os
import resource
import statistics
import sys
import time

from benchlib import ROOT, libtorch_version, machine, publish, run_json, shown_path

START, END = "<!-- step:start -->", "<!-- step:end -->"
EAGER = ("fused", "foreach", "loop")
LR, WEIGHT_DECAY = 1e-4, 0.01


def eager(a):
    """PyTorch eager: the peer's one run, printed as JSON."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peer_sharded import CONFIGS, GPT
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(*CONFIGS[a.model])
    kind = {"fused": dict(fused=True), "foreach": dict(foreach=True),
            "loop": dict(foreach=False)}[a.eager]
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, **kind)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 256, (a.batch, a.seq_len), generator=gen),
                torch.randint(0, 256, (a.batch, a.seq_len), generator=gen)) for _ in range(2)]
    steps, fb, op = [], [], []
    faults0 = 0
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        x, y = batches[s % 2]
        t0 = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if s >= a.warmup:
            steps.append(t2 - t0)
            fb.append(t1 - t0)
            op.append(t2 - t1)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / a.steps
    print(json.dumps(dict(impl="eager-" + a.eager, torch=torch.__version__,
                          step_seconds_median=statistics.median(steps),
                          forward_backward_seconds=statistics.median(fb),
                          optimizer_seconds=statistics.median(op),
                          page_faults_per_step=faults)))


def dtorch_row(a):
    r = run_json([a.dtorch, "bench", "memory", "--model", a.model, "--batch-size", str(a.batch),
                  "--seq-len", str(a.seq_len), "--steps", str(a.steps), "--warmup-steps",
                  str(a.warmup), "--threads", "1"])
    ph = r["phase_seconds"]
    return dict(impl="dtorch", step_seconds_median=r["step_seconds_median"],
                forward_backward_seconds=ph["forward"] + ph["backward"],
                optimizer_seconds=ph["optimizer"], page_faults_per_step=r["page_faults_per_step"],
                grad_bytes=r["grad_bytes"], torch=r["torch"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eager", choices=EAGER, help="run one PyTorch eager peer and print it")
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-pip", "dtorch"))
    venv_python = os.path.join(ROOT, ".venv", "bin", "python")
    ap.add_argument("--python2", default=venv_python)
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per run")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    a = ap.parse_args()
    if a.eager:
        return eager(a)
    a.dtorch, a.python2 = os.path.abspath(a.dtorch), os.path.abspath(a.python2)
    peer = [a.python2, os.path.abspath(__file__), "--model", a.model, "--batch", str(a.batch),
            "--seq-len", str(a.seq_len), "--steps", str(a.steps), "--warmup", str(a.warmup)]
    runs = {}
    for k in range(a.rounds):
        for impl in ("dtorch",) + EAGER:
            r = dtorch_row(a) if impl == "dtorch" else run_json(peer + ["--eager", impl])
            runs.setdefault(r["impl"], []).append(r)
            print(f"round {k + 1}: {r['impl']}: step {r['step_seconds_median'] * 1e3:.0f} ms, "
                  f"optimizer {r['optimizer_seconds'] * 1e3:.0f} ms, "
                  f"{r['page_faults_per_step']:.0f} page faults", flush=True)

    def med(impl, key):
        return statistics.median(r[key] for r in runs[impl])

    fused = "eager-fused"
    lines = [START, "## One rank's training step against PyTorch eager (same run)", "",
             f"One rank, {a.model}, {a.batch} x {a.seq_len} tokens, fp32 AdamW, 1 thread; "
             f"{machine()}, {datetime.date.today()}, LibTorch {libtorch_version(a.dtorch)}, "
             f"PyTorch {runs[fused][0]['torch']}; the median of {a.rounds} alternating rounds "
             f"of {a.steps} timed steps each, after {a.warmup} untimed.",
             f"Command: `bench/bench_step.py --dtorch {shown_path(a.dtorch)} "
             f"--rounds {a.rounds} --warmup {a.warmup} --steps {a.steps}`", "",
             "| | forward + backward | optimizer | step | step vs fused | page faults / step |",
             "|---|---|---|---|---|---|"]
    names = {"dtorch": "dtorch (`bench memory`, multi-tensor AdamW)",
             "eager-fused": "PyTorch eager, AdamW(fused=True)",
             "eager-foreach": "PyTorch eager, AdamW(foreach=True)",
             "eager-loop": "PyTorch eager, per-parameter loop"}
    for impl in ("dtorch",) + tuple("eager-" + e for e in EAGER):
        step = med(impl, "step_seconds_median")
        lines.append(f"| {names[impl]} | {med(impl, 'forward_backward_seconds') * 1e3:.0f} ms | "
                     f"{med(impl, 'optimizer_seconds') * 1e3:.0f} ms | {step * 1e3:.0f} ms | "
                     f"{med(fused, 'step_seconds_median') / step:.2f}x | "
                     f"{med(impl, 'page_faults_per_step'):,.0f} |")
    pages = runs["dtorch"][0]["grad_bytes"] / os.sysconf("SC_PAGE_SIZE")
    lines += ["", f"dtorch's gradients span {pages:,.0f} pages; its page faults per step are "
              f"{med('dtorch', 'page_faults_per_step') / pages:.1%} of them.", "", END]
    publish(a.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
