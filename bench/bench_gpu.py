#!/usr/bin/env python3
"""One GPU: dtorch's training step against PyTorch eager's, in the same run on the same GPU, with
the same model definitions, batch shapes and optimizer, and the GPU's measured bf16 matmul rate
as the denominator of MFU (no datasheet figure).

  gpt-small  nanoGPT's GPT (bench/peer_sharded.py) in dtorch's gpt-small configuration, 16 x 1024
             random tokens, bf16 autocast, AdamW as `dtorch bench memory` runs it (lr 1e-4,
             weight decay 0.01, betas 0.9/0.999, eps 1e-8); PyTorch's AdamW is fused=True, and so is
             dtorch's (Note [Fused optimizers]). MFU by nanoGPT's estimate_mfu: 6N + 12 L H Q T
             flops per token.
  resnet50   torchvision's resnet50(num_classes=1000) with the stem dtorch builds (found by
             matching dtorch's parameter count), 128 x 3 x 224 x 224 random images, bf16 autocast,
             SGD lr 0.01 momentum 0.9; flops per image counted by torch.utils.flop_counter.

The dtorch side is `dtorch bench memory --device DEV ...` (its JSON: step_seconds, phase_seconds,
cuda_peak_*_bytes); the PyTorch side runs here: batches made once on the device by a fixed
generator (no host-to-device copy in the timed loop), warm-up steps untimed, the timed steps
between two torch.cuda.synchronize(). --compile adds torch.compile's row. --quick shrinks
everything (gpt-debug, resnet18 on 32 x 32 images, small batches; torchvision has no
resnet-debug) so that the script's logic can be tried on a CPU with --device cpu.
DTORCH_DROP_FLAGS="--device ..." drops flags (each with its value) from the dtorch command line,
for a dtorch that does not accept them yet.
Usage: bench/bench_gpu.py --dtorch build-gpu/dtorch [--device cuda] [--steps N] [--out-json F]
                          [--publish BENCHMARKS.md] [--compile] [--quick]
"""
import argparse
import datetime
import gc
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import ROOT, libtorch_version, publish, run_json, shown_args  # noqa: E402
from peer_sharded import CONFIGS, GPT  # noqa: E402 - nanoGPT's model, one copy in the repo

START, END = "<!-- gpu:start -->", "<!-- gpu:end -->"
# `dtorch bench memory`'s AdamW (tools/cmd_bench_memory.cpp, tools/strategy_options.cpp), passed
# to it explicitly so that both sides run exactly these.
ADAMW = dict(lr=1e-4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
SGD = dict(lr=0.01, momentum=0.9, weight_decay=0.0)
MATMUL_N, MATMUL_WARMUP, MATMUL_REPEATS = 8192, 3, 10


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def matmul_rate(dev, n):
    """bf16 n x n x n matmuls per second times their 2 n^3 flops: the mean of MATMUL_REPEATS
    after MATMUL_WARMUP untimed."""
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
    for _ in range(MATMUL_WARMUP):
        a @ b
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(MATMUL_REPEATS):
        a @ b
    sync(dev)
    return 2.0 * n ** 3 * MATMUL_REPEATS / (time.perf_counter() - t0)


def free(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ---- the PyTorch side ------------------------------------------------------------------------

def gpt_model(name):
    """nanoGPT's GPT in dtorch's configuration `name`, and the N of estimate_mfu: parameters
    counted once (lm_head is wte) less the position embedding, as nanoGPT's get_num_params."""
    V, BS, L, H, C = CONFIGS[name]
    m = GPT(V, BS, L, H, C)
    n = sum(p.numel() for p in m.parameters()) - m.transformer.wpe.weight.numel()
    return m, n


def resnet_model(name, classes, channels, small_stem):
    """torchvision's ResNet; with small_stem the stem dtorch builds for small images (conv1 3x3
    stride 1, no max-pool: src/dtorch/models/resnet.h)."""
    import torchvision
    m = getattr(torchvision.models, name)(num_classes=classes)
    k, s, p = (3, 1, 1) if small_stem else (7, 2, 3)
    if small_stem or channels != 3:
        m.conv1 = torch.nn.Conv2d(channels, 64, k, s, p, bias=False)
    if small_stem:
        m.maxpool = torch.nn.Identity()
    return m


def resnet_like_dtorch(name, classes, dtorch_params):
    """The torchvision ResNet whose parameter count is dtorch's (which stem, which input
    channels), and a note saying which it is or that none matched."""
    for small in (False, True):
        for ch in (3, 1):
            m = resnet_model(name, classes, ch, small)
            if sum(p.numel() for p in m.parameters()) == dtorch_params:
                stem = "3x3 stride-1 stem, no max-pool" if small else "torchvision's 7x7 stem"
                return m, ch, f"{stem}, {ch} input channel(s)"
    m = resnet_model(name, classes, 3, False)
    got = sum(p.numel() for p in m.parameters())
    return m, 3, (f"torchvision's {name}: {got:,} parameters, dtorch's has {dtorch_params:,}: "
                  "NOT the same architecture")


def eager_run(dev, model, batch, optimizer, warmup, steps, compile_model=False):
    """Trains `model` on the one batch (x, y) with bf16 autocast: seconds per step over `steps`
    timed steps after `warmup` untimed, and the peak bytes allocated and reserved on the GPU."""
    x, y = batch
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    model = model.to(dev)
    opt = optimizer(model.parameters())
    fwd = torch.compile(model) if compile_model else model

    def step():
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            out = fwd(x)
            loss = F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(dev)
    seconds = (time.perf_counter() - t0) / steps
    peak = reserved = None
    if dev.type == "cuda":
        peak, reserved = torch.cuda.max_memory_allocated(dev), torch.cuda.max_memory_reserved(dev)
    return seconds, peak, reserved


def resnet_flops_per_image(dev, model, channels, size, classes):
    """Forward + backward flops of one image, counted by torch.utils.flop_counter on a batch of
    2 (convolutions and matmuls; batch norm and the rest are not counted)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
        model = model.to(dev)
        x = torch.randn(2, channels, size, size, device=dev)
        y = torch.randint(0, classes, (2,), device=dev)
        with FlopCounterMode(display=False) as counter:
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
        model.zero_grad(set_to_none=True)
        return counter.get_total_flops() / 2
    except Exception as e:  # an older torch without FlopCounterMode: no MFU for resnet
        print(f"bench: resnet flops not counted ({type(e).__name__}: {e})", file=sys.stderr)
        return None


# ---- the dtorch side -------------------------------------------------------------------------

def dtorch_cmd(a, flags):
    drop = set(os.environ.get("DTORCH_DROP_FLAGS", "").split())
    cmd, i = [a.dtorch, "bench", "memory", "--device", a.device] + flags, 0
    out = []
    while i < len(cmd):
        if cmd[i] in drop:
            i += 2
            continue
        out.append(cmd[i])
        i += 1
    return out


def dtorch_run(cmd):
    """The JSON line of a `dtorch bench memory` run, or {"error": why}."""
    print("bench: " + shlex.join(cmd), file=sys.stderr, flush=True)
    try:
        return run_json(cmd)
    except SystemExit as e:  # run_json's message: "bench: CMD failed (RC):", then stderr's tail
        lines = [l.strip() for l in str(e).splitlines()
                 if l.strip() and not l.startswith("Run with --help")]  # CLI11's last line
        if len(lines) > 1:
            return {"error": lines[-1][:300]}
        rc = re.search(r"failed \((-?\d+)\)", lines[0]) if lines else None
        return {"error": "exit code %s, nothing on stderr" % (rc.group(1) if rc else "?")}


# ---- reporting -------------------------------------------------------------------------------

def nvidia_smi(query):
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              timeout=30).stdout.splitlines()[0].strip()
    except Exception:
        return "?"


def dtorch_commit():
    """As scripts/gpu-check finds it: DTORCH_COMMIT, else the file .dtorch-commit (either is
    written on purpose by whoever copied the sources, whose .git may be an older one), else git
    where the sources are a checkout."""
    if os.environ.get("DTORCH_COMMIT"):
        return os.environ["DTORCH_COMMIT"]
    path = os.path.join(ROOT, ".dtorch-commit")
    if os.path.exists(path):
        return open(path).readline().strip()
    if os.path.exists(os.path.join(ROOT, ".git")):
        try:
            c = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            if c.returncode == 0:
                out = c.stdout.strip()
                d = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD"],
                                   stderr=subprocess.DEVNULL)
                return out + (" + local changes" if d.returncode != 0 else "")
        except OSError:
            pass
    return "?"


def gib(b):
    return "—" if b is None else "%.1f GiB" % (b / 2**30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build-gpu", "dtorch"))
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (to try the script)")
    ap.add_argument("--steps", type=int, help="timed steps (default 20; --quick 3)")
    ap.add_argument("--warmup", type=int, help="PyTorch's untimed steps (default 5; --quick 1)")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op CPU threads on both sides (dtorch bench memory's default)")
    ap.add_argument("--compile", action="store_true", help="add a torch.compile row")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a CPU")
    ap.add_argument("--out-json", help="write every number here")
    ap.add_argument("--publish", metavar="BENCHMARKS.md",
                    help="replace the block between %s and %s there" % (START, END))
    a = ap.parse_args()
    a.dtorch = os.path.abspath(a.dtorch)
    steps = a.steps or (3 if a.quick else 20)
    warmup = a.warmup if a.warmup is not None else (1 if a.quick else 5)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_gpu: --device %s but torch.cuda.is_available() is False (torch %s): run "
                 "on a GPU machine, or --device cpu --quick to try the script" %
                 (a.device, torch.__version__))
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.quick:
        gpt = dict(model="gpt-debug", batch=4, seq=32)
        res = dict(model="resnet18", batch=4, size=32, classes=10)
        mm_n = 1024
    else:
        gpt = dict(model="gpt-small", batch=16, seq=1024)
        res = dict(model="resnet50", batch=128, size=224, classes=1000)
        mm_n = MATMUL_N

    print(f"bench: bf16 matmul {mm_n}^3 on {dev}", file=sys.stderr, flush=True)
    peak_flops = matmul_rate(dev, mm_n)
    free(dev)
    rows = []  # dicts: model, impl, step_s, rate, unit, mfu, peak, reserved, phases, error

    def add(model, impl, unit, per_step_items, flops_per_item, step_s=None, peak=None,
            reserved=None, phases=None, error=None, note=None):
        rate = per_step_items / step_s if step_s else None
        mfu = rate * flops_per_item / peak_flops if rate and flops_per_item else None
        rows.append(dict(model=model, impl=impl, unit=unit, step_s=step_s, rate=rate, mfu=mfu,
                         peak_bytes=peak, reserved_bytes=reserved, phases=phases, error=error,
                         note=note))
        print("bench: %s %s: %s" % (model, impl, error or "%.1f ms/step" % (1e3 * step_s)),
              file=sys.stderr, flush=True)

    def dtorch_row(model, unit, items, flops, j):
        if "error" in j:
            add(model, "dtorch", unit, items, flops, error=j["error"])
        else:
            add(model, "dtorch", unit, items, flops, step_s=j["step_seconds"],
                peak=j.get("cuda_peak_allocated_bytes"), reserved=j.get("cuda_peak_reserved_bytes"),
                phases=j.get("phase_seconds"))

    def eager_rows(model_name, unit, items, flops, make_model, batch, optimizer):
        kinds = [("PyTorch eager", False)]
        if a.compile:
            kinds.append(("PyTorch torch.compile", True))
        for impl, comp in kinds:
            if optimizer.__name__ == "adamw" and dev.type == "cuda":
                impl += " (fused AdamW)"
            try:
                s, peak, reserved = eager_run(dev, make_model(), batch, optimizer,
                                              max(warmup, 3) if comp else warmup, steps, comp)
                add(model_name, impl, unit, items, flops, s, peak, reserved)
            except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                add(model_name, impl, unit, items, flops,
                    error=str(e).strip().splitlines()[0][:300])
            free(dev)

    # gpt-small
    name, B = gpt["model"], gpt["batch"]
    V, BS, L, H, C = CONFIGS[name]
    T = min(gpt["seq"], BS)
    _, n_params = gpt_model(name)
    gpt_flops = 6 * n_params + 12 * L * H * (C // H) * T  # per token
    j = dtorch_run(dtorch_cmd(a, [
        "--model", name, "--batch-size", str(B), "--seq-len", str(T), "--precision", "bf16",
        "--optimizer", "adamw", "--lr", str(ADAMW["lr"]), "--weight-decay",
        str(ADAMW["weight_decay"]), "--betas", "%g,%g" % ADAMW["betas"], "--eps", str(ADAMW["eps"]),
        "--threads", str(a.threads), "--steps", str(steps)]))
    dtorch_row(name, "tokens/s", B * T, gpt_flops, j)
    gen = torch.Generator(device=dev).manual_seed(0)
    tokens = (torch.randint(0, V, (B, T), device=dev, generator=gen),
              torch.randint(0, V, (B, T), device=dev, generator=gen))

    def adamw(params):
        return torch.optim.AdamW(params, **ADAMW, fused=dev.type == "cuda")

    eager_rows(name, "tokens/s", B * T, gpt_flops, lambda: gpt_model(name)[0], tokens, adamw)
    if "params" in j and j["params"] != sum(p.numel() for p in gpt_model(name)[0].parameters()):
        rows[-1]["note"] = "dtorch's %s has %d parameters, nanoGPT's %d" % (
            name, j["params"], sum(p.numel() for p in gpt_model(name)[0].parameters()))
    del tokens
    free(dev)

    # resnet
    name, B, S, K = res["model"], res["batch"], res["size"], res["classes"]
    j = dtorch_run(dtorch_cmd(a, [
        "--model", name, "--image-size", str(S), "--classes", str(K), "--batch-size", str(B),
        "--precision", "bf16", "--optimizer", "sgd", "--momentum", str(SGD["momentum"]),
        "--lr", str(SGD["lr"]), "--weight-decay", str(SGD["weight_decay"]),
        "--threads", str(a.threads), "--steps", str(steps)]))
    if "params" in j:
        _, channels, arch = resnet_like_dtorch(name, K, j["params"])
    else:
        channels, arch = 3, "torchvision's 7x7 stem, 3 input channels (dtorch did not run)"
    small = "3x3" in arch
    res_flops = resnet_flops_per_image(dev, resnet_model(name, K, channels, small), channels, S, K)
    free(dev)
    dtorch_row(name, "images/s", B, res_flops, j)
    gen = torch.Generator(device=dev).manual_seed(0)
    images = (torch.randn(B, channels, S, S, device=dev, generator=gen),
              torch.randint(0, K, (B,), device=dev, generator=gen))

    def sgd(params):
        return torch.optim.SGD(params, **SGD)

    eager_rows(name, "images/s", B, res_flops, lambda: resnet_model(name, K, channels, small),
               images, sgd)
    del images
    free(dev)

    # ---- the table -------------------------------------------------------------------------
    gpu_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (%d cores)" % (
        os.cpu_count() or 0)
    driver = nvidia_smi("driver_version") if dev.type == "cuda" else "—"
    command = "bench/bench_gpu.py " + shlex.join(shown_args(sys.argv[1:]))
    eager = {r["model"]: r["rate"] for r in rows if r["impl"].startswith("PyTorch eager")}

    def cell(r):
        if r["error"]:
            return "| %s | %s | failed: %s | | | | |" % (r["model"], r["impl"], r["error"])
        base = eager.get(r["model"])
        return "| %s | %s | %.1f | %s %s | %s | %s | %s |" % (
            r["model"], r["impl"], 1e3 * r["step_s"], f"{r['rate']:,.0f}", r["unit"],
            "%.1f%%" % (100 * r["mfu"]) if r["mfu"] is not None else "—", gib(r["peak_bytes"]),
            "%.2fx" % (r["rate"] / base) if base else "—")

    lines = [
        START,
        "## One GPU: dtorch's training step against PyTorch eager",
        "",
        "Measured by `%s` on %s: %s, driver %s, CUDA %s, PyTorch %s, dtorch %s (LibTorch %s)." % (
            command, datetime.date.today().isoformat(), gpu_name, driver, torch.version.cuda,
            torch.__version__, dtorch_commit(), libtorch_version(a.dtorch)),
        "",
        "- MFU's denominator is the device's measured bf16 matmul rate, %.3g TFLOP/s (%d^3, "
        "mean of %d after %d warm-ups), not a datasheet figure." % (
            peak_flops / 1e12, mm_n, MATMUL_REPEATS, MATMUL_WARMUP),
        "- %s: nanoGPT's GPT (bench/peer_sharded.py: bias, tied lm_head, "
        "F.scaled_dot_product_attention) in dtorch's configuration (vocab %d, block %d, %d "
        "layers, %d heads, %d wide), %d x %d random tokens, bf16 autocast, AdamW lr %g, weight "
        "decay %g, betas %g/%g, eps %g on both sides%s. MFU = tokens/s x (6N + 12 L H Q T) / "
        "matmul rate (nanoGPT's "
        "estimate_mfu), N = %s (parameters less the position embedding), L %d, H %d, Q %d, "
        "T %d: %.3g GFLOP per token." % (
            gpt["model"], V, BS, L, H, C, gpt["batch"], T, ADAMW["lr"], ADAMW["weight_decay"],
            *ADAMW["betas"], ADAMW["eps"],
            "; both AdamWs are PyTorch's fused kernel" if dev.type == "cuda"
            else "", f"{n_params:,}", L, H, C // H, T, gpt_flops / 1e9),
        "- %s: torchvision's %s(num_classes=%d) with %s, %d x %d x %d x %d random images, bf16 "
        "autocast, SGD lr %g momentum %g on both sides, channels-last on neither; %s." % (
            res["model"], res["model"], K, arch, B, channels, S, S, SGD["lr"], SGD["momentum"],
            "%.3g GFLOP per image (forward + backward, torch.utils.flop_counter)" % (
                res_flops / 1e9) if res_flops else "flops not counted"),
        "- PyTorch: batches made once on the device, %d warm-up step(s) untimed, %d timed "
        "between two synchronizes. dtorch: `dtorch bench memory`, 1 untimed step, %d timed, its "
        "batches "
        "made by its own generator." % (warmup, steps, steps),
        "",
        "| model | impl | step ms | throughput | MFU | peak GPU memory | vs eager |",
        "|---|---|---|---|---|---|---|",
    ] + [cell(r) for r in rows]
    notes = [r["note"] for r in rows if r.get("note")]
    if notes:
        lines += [""] + ["- " + n for n in notes]
    phase_rows = [r for r in rows if r["impl"] == "dtorch" and r["phases"]]
    if phase_rows:
        lines += ["", "Where dtorch's step goes (`phase_seconds`, ms per step):", "",
                  "| model | forward | backward | optimizer | other | step |",
                  "|---|---|---|---|---|---|"]
        for r in phase_rows:
            p = r["phases"]
            f, b, o = (1e3 * p.get(k, 0.0) for k in ("forward", "backward", "optimizer"))
            lines.append("| %s | %.1f | %.1f | %.1f | %.1f | %.1f |" % (
                r["model"], f, b, o, 1e3 * r["step_s"] - f - b - o, 1e3 * r["step_s"]))
    lines.append(END)

    if a.publish:
        publish(a.publish, lines)
    else:
        print("\n".join(lines))
    if a.out_json:
        with open(a.out_json, "w") as fo:
            json.dump(dict(command=command, device=str(dev), gpu=gpu_name, driver=driver,
                           cuda=torch.version.cuda, torch=torch.__version__,
                           dtorch_commit=dtorch_commit(), matmul_flops=peak_flops,
                           matmul_n=mm_n, gpt_flops_per_token=gpt_flops,
                           resnet_flops_per_image=res_flops, resnet_architecture=arch,
                           steps=steps, warmup=warmup, rows=rows), fo, indent=1)
    failed = [r for r in rows if r["error"]]
    if failed:
        print("bench_gpu: %d of %d rows failed: %s" % (
            len(failed), len(rows), "; ".join("%s %s: %s" % (r["model"], r["impl"], r["error"])
                                              for r in failed)), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
