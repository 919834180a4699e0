#!/usr/bin/env python3
"""Peer reference for `dtorch bench memory`: gpt-small trained by PyTorch's and DeepSpeed's own
sharded strategies on CPU over Gloo, printing the same JSON per rank as dtorch does.

bench/bench_memory.py runs it beside each dtorch strategy so that samples/s and peak RSS per
rank are compared with what Python users run today, in the same run on the same machine:
  ddp                  torch DistributedDataParallel                       (dtorch ddp)
  zero-redundancy      DDP + torch.distributed.optim.ZeroRedundancyOptimizer (dtorch zero1)
  fsdp                 FSDP2 fully_shard, or FSDP1 with device_id=cpu when
                       fully_shard fails on CPU; "impl" says which ran        (dtorch zero3)
  deepspeed-zero1/2/3  a DeepSpeed engine with zero_optimization.stage 1/2/3 (dtorch zero1/2/3)
Protocol (dtorch bench memory's): N local ranks, MASTER_ADDR 127.0.0.1, one intra-op thread per
rank, fp32 AdamW (lr 1e-4, weight decay 0.01), --batch sequences of --seq-len random token ids
per rank, one untimed warm-up step, then --steps timed steps between two barriers. The model is
nanoGPT's GPT-2 small as dtorch builds it (tests/models/gpt_test.cpp holds the same text):
bias on, dropout 0, lm_head tied to wte, 124,475,904 parameters counted once each; the
sharding unit is a transformer block, the root (embeddings, final norm) is the last unit.
Each rank prints {"rank", "strategy", "impl", "samples_per_s", "peak_rss_bytes",
"rss_before_model_bytes", "params", "torch", ...}; a strategy that cannot run prints one
{"strategy", "error": reason} and exits 1.
Usage: .venv/bin/python bench/peer_sharded.py --strategy fsdp --nproc 2 [--steps 3]
"""
import argparse
import json
import math
import os
import queue
import resource
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

STRATEGIES = ("ddp", "zero-redundancy", "fsdp", "deepspeed-zero1", "deepspeed-zero2",
              "deepspeed-zero3")
# (vocab_size, block_size, n_layer, n_head, n_embd), dtorch's GPTConfig::small() and ::debug().
CONFIGS = {"gpt-small": (50304, 1024, 12, 12, 768), "gpt-debug": (256, 32, 2, 2, 32)}
LR, WEIGHT_DECAY = 1e-4, 0.01  # dtorch bench memory's AdamW


# ---- The model: nanoGPT's model.py (bias on, dropout 0), as in tests/models/gpt_test.cpp ----

class CausalSelfAttention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.n_head = H
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # nanoGPT's flash branch; dtorch uses the same fused kernel on LibTorch 2.x.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, H)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, V, BS, L, H, C):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, C), wpe=nn.Embedding(BS, C),
            h=nn.ModuleList([Block(C, H) for _ in range(L)]), ln_f=nn.LayerNorm(C)))
        self.lm_head = nn.Linear(C, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        # nanoGPT's _init_weights, then the scaled residual projections (GPT-2 paper).
        with torch.no_grad():
            for name, p in self.named_parameters():
                if ".ln_" in name or name.startswith("transformer.ln_f"):
                    continue
                if name.endswith(".bias"):
                    p.zero_()
                elif name.endswith("c_proj.weight"):
                    p.normal_(0.0, 0.02 / math.sqrt(2 * L))
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# ---- Strategies: each takes the model and returns (module to call, step function, impl) ----

def parallelize_ddp(model, a):
    m = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    return m, torch_step(opt), "DistributedDataParallel"


def parallelize_zero_redundancy(model, a):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    m = nn.parallel.DistributedDataParallel(model)
    opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=LR,
                                  weight_decay=WEIGHT_DECAY)
    return m, torch_step(opt), "DistributedDataParallel+ZeroRedundancyOptimizer"


def parallelize_fsdp(model, a):
    """FSDP2 when it works on CPU, else FSDP1 with device_id=cpu; one unit per block + root."""
    if a.fsdp_impl in ("auto", "fully_shard"):
        try:
            from torch.distributed.fsdp import fully_shard
            for block in model.transformer.h:
                fully_shard(block)
            fully_shard(model)
            opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
            step = torch_step(opt)
            # A step proves it: FSDP2's CPU failures show up in forward/backward, not in wrapping.
            train_step(model, step, *batch_for(a, torch.Generator().manual_seed(99)))
            return model, step, "fully_shard"
        except Exception as e:  # noqa: BLE001 - any failure means: fall back and say why
            if a.fsdp_impl == "fully_shard":
                raise
            a.fully_shard_error = one_line(e)
            # fully_shard changed the model in place; build it anew for FSDP1.
            torch.manual_seed(0)
            model = GPT(*CONFIGS[a.model])
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    m = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"),
             use_orig_params=True)
    opt = torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    return m, torch_step(opt), "FullyShardedDataParallel(device_id=cpu)"


def parallelize_deepspeed(model, a):
    import deepspeed
    stage = int(a.strategy[-1])
    config = {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": 1,
        # fp32 (no fp16/bf16 section); torch's AdamW, not DeepSpeed's CPUAdam, which would have
        # to be compiled first and is a different optimizer kernel from dtorch's and torch's.
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},  # buckets below
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if a.ds_bucket_mb > 0:
        # DeepSpeed's defaults (5e8 elements, 2 GB in fp32) are sized for GPUs; DDP's and
        # dtorch's buckets are 25 MiB. Elements, not bytes: fp32 is 4 bytes each.
        elems = int(a.ds_bucket_mb * 2**20 / 4)
        config["zero_optimization"].update(reduce_bucket_size=elems, allgather_bucket_size=elems)
        if stage == 3:
            config["zero_optimization"]["stage3_prefetch_bucket_size"] = elems
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config,
                                           dist_init_required=False)

    def step(loss):
        engine.backward(loss)
        engine.step()

    return engine, step, "DeepSpeedEngine ZeRO-%d" % stage


def torch_step(opt):
    def step(loss):
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def batch_for(a, gen):
    V, BS = CONFIGS[a.model][0], CONFIGS[a.model][1]
    T = min(a.seq_len, BS)
    return (torch.randint(0, V, (a.batch, T), generator=gen),
            torch.randint(0, V, (a.batch, T), generator=gen))


def train_step(module, step, x, y):
    logits = module(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    step(loss)
    return loss


def one_line(e):
    """The exception as one line: its type and the first line of its message."""
    msg = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, msg[0] if msg else "")


# ---- One rank ----

def worker(rank, a, results):
    try:
        results.put(run_rank(rank, a))
    except BaseException as e:  # noqa: BLE001 - report, then let the parent stop the others
        traceback.print_exc(file=sys.stderr)
        results.put(dict(rank=rank, strategy=a.strategy, error=one_line(e)))
        results.close()
        results.join_thread()  # the reason must reach the parent before this process ends
        sys.stderr.flush()
        os._exit(1)


def run_rank(rank, a):
    torch.set_num_threads(a.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(a.nproc),
                      LOCAL_WORLD_SIZE=str(a.nproc), LOCAL_SIZE=str(a.nproc))
    if a.strategy.startswith("deepspeed"):
        import deepspeed
        # DeepSpeed's CPU accelerator would take oneCCL when installed; Gloo is what every
        # other row of the table uses.
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    # What the process holds before the model exists: Python, torch (PyPI's CUDA build maps
    # about 0.7 GB even on CPU), the process group. Peak RSS includes it.
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    torch.manual_seed(0)  # the same initial model on every rank, as dtorch does
    model = GPT(*CONFIGS[a.model])
    params = sum(p.numel() for p in model.parameters())  # tied weight counted once
    parallelize = {"ddp": parallelize_ddp, "zero-redundancy": parallelize_zero_redundancy,
                   "fsdp": parallelize_fsdp}.get(a.strategy, parallelize_deepspeed)
    module, step, impl = parallelize(model, a)
    gen = torch.Generator().manual_seed(rank)
    t0 = None
    for i in range(1 + a.steps):  # one untimed warm-up step
        if i == 1:
            dist.barrier()
            t0 = time.perf_counter()
        loss = train_step(module, step, *batch_for(a, gen))
    dist.barrier()
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    row = dict(rank=rank, strategy=a.strategy, impl=impl, model=a.model, nproc=a.nproc,
               params=params, batch_per_rank=a.batch, seq_len=min(a.seq_len, CONFIGS[a.model][1]),
               steps=a.steps, seconds=seconds,
               samples_per_s=a.steps * a.batch * a.nproc / seconds, peak_rss_bytes=rss,
               rss_before_model_bytes=base_rss, final_loss=float(loss.detach()),
               torch=torch.__version__)
    if a.strategy.startswith("deepspeed"):
        import deepspeed
        row["deepspeed"] = deepspeed.__version__
    if getattr(a, "fully_shard_error", None):
        row["fully_shard_error"] = a.fully_shard_error
    dist.barrier()
    dist.destroy_process_group()
    return row


# ---- The launcher: N spawned ranks; the first failure stops them all ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a):
    """Runs the ranks and returns (rows by rank, error or None)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, results), daemon=True)
             for r in range(a.nproc)]
    for p in procs:
        p.start()
    rows, error = {}, None
    deadline = time.monotonic() + a.timeout
    while len(rows) < a.nproc and error is None:
        try:
            r = results.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() > deadline:
                error = "timed out after %d s" % a.timeout
            elif any(p.exitcode not in (None, 0) for p in procs) and results.empty():
                # Killed without a word (out of memory, a signal): nothing more will come.
                bad = next(i for i, p in enumerate(procs) if p.exitcode not in (None, 0))
                error = "rank %d died with exit code %s" % (bad, procs[bad].exitcode)
            continue
        if "error" in r:
            error = "rank %d: %s" % (r["rank"], r["error"])
        else:
            rows[r["rank"]] = r
    if error:
        # The others may wait in a collective for the rank that failed: stop them.
        for p in procs:
            if p.is_alive():
                p.terminate()
    for p in procs:
        p.join(10)
    return rows, error


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strategy", choices=STRATEGIES, required=True)
    ap.add_argument("--model", choices=sorted(CONFIGS), default="gpt-small")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--steps", type=int, default=3, help="timed steps, after one untimed")
    ap.add_argument("--batch", type=int, default=1, help="sequences per rank")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--port", type=int, default=0, help="rendezvous port; 0 picks a free one")
    ap.add_argument("--fsdp-impl", choices=("auto", "fully_shard", "fsdp1"), default="auto",
                    help="fsdp: auto tries fully_shard and falls back to FSDP1")
    ap.add_argument("--ds-bucket-mb", type=float, default=25.0,
                    help="deepspeed: reduce/allgather bucket MiB (DDP's and dtorch's 25); "
                    "0 keeps DeepSpeed's defaults")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds before giving up")
    a = ap.parse_args()
    if a.port == 0:
        a.port = free_port()
    if a.strategy.startswith("deepspeed"):
        try:
            import deepspeed  # noqa: F401 - fail here, once, rather than in every rank
        except Exception as e:  # noqa: BLE001
            print(json.dumps(dict(strategy=a.strategy, error=one_line(e),
                                  torch=torch.__version__)))
            return 1
    rows, error = launch(a)
    if error:
        print(json.dumps(dict(strategy=a.strategy, error=error, torch=torch.__version__)))
        return 1
    for r in sorted(rows):
        print(json.dumps(rows[r]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
