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
  tensor-parallel      torch.distributed.tensor.parallel over all N ranks (tp = N, dp = 1):
                       Megatron's plan (c_attn, c_fc colwise; c_proj rowwise; wte rowwise and
                       lm_head colwise, still tied); every rank feeds the same batch
  dp-tp                2-D mesh (dp = N / tp, tp = --tp): the same plan on "tp", FSDP2
                       fully_shard on "dp"; one batch per dp rank, shared by its tp group
  dp-pp                2-D mesh (pp = --pp, dp = N / pp): torch.distributed.pipelining
                       Schedule1F1B over "pp" with --stages and --microbatches as pipeline,
                       each stage's blocks and the stage FSDP2 fully_shard on "dp"
                       (reshard_after_forward off, as torchtitan under a pipeline; on with
                       --reshard-after-microbatch); one batch per dp rank     (dtorch zero3 --pp)
  pipeline             torch.distributed.pipelining over all N ranks (pp = N): rank r holds
                       the units --stages gives it (dtorch's split: embedding, blocks, head),
                       a PipelineStage and ScheduleGPipe / Schedule1F1B /
                       ScheduleInterleavedZeroBubble (--schedule gpipe|1f1b|zb) over
                       --microbatches; with --schedule interleaved --stages lists 2N stages,
                       rank r runs stages r and r + N under ScheduleInterleaved1F1B; lm_head
                       is a copy of wte on the last stage (untied)
Protocol (dtorch bench memory's): N local ranks, MASTER_ADDR 127.0.0.1, one intra-op thread per
rank, fp32 AdamW (lr 1e-4, weight decay 0.01), --batch sequences of --seq-len random token ids
per rank, --warmup untimed steps (1), then --steps timed steps between two barriers. The model is
nanoGPT's GPT-2 small as dtorch builds it (tests/models/gpt_test.cpp holds the same text):
bias on, dropout 0, lm_head tied to wte, 124,475,904 parameters counted once each; the
sharding unit is a transformer block, the root (embeddings, final norm) is the last unit.
Each rank prints {"rank", "strategy", "impl", "samples_per_s", "peak_rss_bytes",
"rss_before_model_bytes", "params", "torch", ...}; a strategy that cannot run prints one
{"strategy", "error": reason} and exits 1. tensor-parallel and dp-tp also print "tp", "dp" and
"bytes_sent_per_step" (the warm-up step's collectives counted as dtorch counts its own); their
samples/s counts the dp batches only, since a tp group trains on one batch.
With --activation-checkpointing K every K-th block runs under torch.utils.checkpoint
(use_reentrant=False), as dtorch's --activation-checkpointing K recomputes it.
Usage: .venv/bin/python bench/peer_sharded.py --strategy fsdp --nproc 2 [--steps 3]
       .venv/bin/python bench/peer_sharded.py --strategy dp-tp --nproc 4 [--tp 2]
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
import torch.utils.checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

STRATEGIES = ("ddp", "zero-redundancy", "fsdp", "deepspeed-zero1", "deepspeed-zero2",
              "deepspeed-zero3", "tensor-parallel", "dp-tp", "dp-pp", "pipeline")
TP_STRATEGIES = ("tensor-parallel", "dp-tp")
# (vocab_size, block_size, n_layer, n_head, n_embd), dtorch's GPTConfig::small() and ::debug().
CONFIGS = {"gpt-small": (50304, 1024, 12, 12, 768), "gpt-debug": (256, 32, 2, 4, 32)}
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
        qkv = self.c_attn(x)
        # Under tensor parallelism c_attn is column-sharded: this rank sees 3 * C / tp features,
        # its own q, k and v heads (tensor_parallel's interleave_qkv); unsharded, Cl == C.
        Cl = qkv.size(2) // 3
        H = self.n_head * Cl // C
        q, k, v = qkv.split(Cl, dim=2)
        q, k, v = (t.view(B, T, H, Cl // H).transpose(1, 2) for t in (q, k, v))
        # nanoGPT's flash branch; dtorch uses the same fused kernel on LibTorch 2.x.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, Cl))


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
        every = getattr(self, "checkpoint_every", 0)
        for i, block in enumerate(self.transformer.h):
            if every and self.training and i % every == 0:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
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


def interleave_qkv(linear, tp):
    """Reorders c_attn's output rows from [q | k | v] to [q_0 k_0 v_0 | q_1 k_1 v_1 | ...].

    ColwiseParallel gives tp rank r the r-th contiguous slice of the rows; of the fused
    [q | k | v] that would be a slice of q (or of q and k) with no v, which is wrong. After this
    permutation the r-th slice holds q_r, k_r and v_r, each C / tp wide: heads r * H / tp up to
    (r + 1) * H / tp of q, k and v, whose outputs c_proj's r-th column slice (RowwiseParallel)
    expects. The same function as the unpermuted layer: only the storage order changes.
    """
    with torch.no_grad():
        for p in (linear.weight, linear.bias):
            p.copy_(p.view(3, tp, -1, *p.shape[1:]).transpose(0, 1).reshape(p.shape))


def tensor_parallel(model, tp_mesh):
    """Megatron's plan on tp_mesh: per block c_attn and c_fc colwise, both c_proj rowwise (one
    allreduce after attention and one after the MLP, forward and backward); wte rowwise
    (vocab-sharded, PyTorch's recipe for an embedding) and lm_head colwise, with its logits
    gathered (Replicate) for the plain cross entropy. Layer norms, wpe and the rowwise biases
    stay replicated. Returns what "impl" says."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    V, H = model.lm_head.out_features, model.transformer.h[0].attn.n_head
    tp = tp_mesh.size()
    if H % tp or V % tp:
        raise ValueError("tp = %d must divide n_head = %d and vocab = %d" % (tp, H, V))
    plan = {"transformer.wte": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Replicate())}
    for i, block in enumerate(model.transformer.h):
        interleave_qkv(block.attn.c_attn, tp)
        plan.update({"transformer.h.%d.attn.c_attn" % i: ColwiseParallel(),
                     "transformer.h.%d.attn.c_proj" % i: RowwiseParallel(),
                     "transformer.h.%d.mlp.c_fc" % i: ColwiseParallel(),
                     "transformer.h.%d.mlp.c_proj" % i: RowwiseParallel()})
    parallelize_module(model, tp_mesh, plan)
    # parallelize_module gives wte and lm_head a DTensor each, both Shard(0) of the same
    # (V, C) weight: tie them again, so that one tensor gets both gradients.
    model.transformer.wte.weight = model.lm_head.weight
    return "parallelize_module(Megatron plan, wte RowwiseParallel tied to lm_head " \
        "ColwiseParallel(output Replicate), c_attn q/k/v interleaved)"


def parallelize_tensor(model, a):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (a.nproc,), mesh_dim_names=("tp",))
    impl = tensor_parallel(model, mesh)
    a.dp_size, a.tp_size, a.data_rank = 1, a.nproc, 0  # every rank feeds the same batch
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    return model, torch_step(opt), impl


def parallelize_dp_tp(model, a):
    """The tensor-parallel plan on the "tp" sub-mesh, then FSDP2 on "dp": one unit per block +
    root, as fsdp; the tp-sharded weights become 2-D DTensors (Shard(0) on dp, their tp
    placement on tp)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    if a.tp < 1 or a.nproc % a.tp:
        raise ValueError("--tp %d does not divide --nproc %d" % (a.tp, a.nproc))
    mesh = init_device_mesh("cpu", (a.nproc // a.tp, a.tp), mesh_dim_names=("dp", "tp"))
    impl = tensor_parallel(model, mesh["tp"])
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    a.dp_size, a.tp_size = mesh["dp"].size(), mesh["tp"].size()
    a.data_rank = mesh["dp"].get_local_rank()  # one batch per dp rank, shared by its tp group
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    return model, torch_step(opt), "fully_shard(dp) + " + impl


class PipelineStageModule(nn.Module):
    """Units [begin, end) of the GPT: 0 the embeddings, 1..L the blocks, L + 1 the head."""

    def __init__(self, model, begin, end):
        super().__init__()
        L = len(model.transformer.h)
        self.first, self.last = begin == 0, end == L + 2
        if self.first:
            self.wte, self.wpe = model.transformer.wte, model.transformer.wpe
        self.blocks = nn.ModuleList(model.transformer.h[max(begin - 1, 0):min(end - 1, L)])
        if self.last:
            self.ln_f = model.transformer.ln_f
            self.lm_head = nn.Linear(self.ln_f.weight.numel(), model.lm_head.weight.size(0),
                                     bias=False)
            with torch.no_grad():
                self.lm_head.weight.copy_(model.lm_head.weight)

    def forward(self, x):
        if self.first:
            pos = torch.arange(0, x.size(1), dtype=torch.long, device=x.device)
            x = self.wte(x) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def parallelize_pipeline(model, a):
    """Returns run(x, y) -> loss (last stage) or None, and the impl string."""
    from torch.distributed import pipelining as pipe
    rank, n = dist.get_rank(), dist.get_world_size()
    ranges = a.stages.split(",")
    # interleaved: len(ranges) = 2n stages, rank r runs stages r and r + n.
    mine = list(range(rank, len(ranges), n))
    modules = []
    for s in mine:
        begin, end = (int(v) for v in ranges[s].split("-"))
        modules.append(PipelineStageModule(model, begin, end))
    del model
    stages = [pipe.PipelineStage(m, s, len(ranges), torch.device("cpu"))
              for m, s in zip(modules, mine)]
    V = CONFIGS[a.model][0]

    def loss_fn(out, target):
        return F.cross_entropy(out.reshape(-1, V), target.reshape(-1))

    kind = {"gpipe": pipe.ScheduleGPipe, "1f1b": pipe.Schedule1F1B}.get(a.schedule)
    if kind:
        schedule = kind(stages[0], a.microbatches, loss_fn=loss_fn)
    elif a.schedule == "interleaved":
        schedule = pipe.ScheduleInterleaved1F1B(stages, a.microbatches, loss_fn=loss_fn)
    else:
        schedule = pipe.ScheduleInterleavedZeroBubble(stages, a.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=LR,
                            weight_decay=WEIGHT_DECAY)

    def run(x, y):
        opt.zero_grad(set_to_none=True)
        losses = []
        if rank == 0:
            schedule.step(x)
        elif rank == n - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        return sum(losses) / len(losses) if losses else torch.zeros(())

    return run, "torch.distributed.pipelining %s" % type(schedule).__name__


def parallelize_dp_pp(model, a):
    """FSDP2 over "dp" inside each pipeline stage, the stages over "pp" (torchtitan's 2-D
    pipeline layout). Returns run(x, y) -> loss (last stage) or zeros, and the impl string."""
    from torch.distributed import pipelining as pipe
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    if a.pp < 2 or a.nproc % a.pp:
        raise ValueError("--pp %d must be >= 2 and divide --nproc %d" % (a.pp, a.nproc))
    mesh = init_device_mesh("cpu", (a.pp, a.nproc // a.pp), mesh_dim_names=("pp", "dp"))
    s = mesh["pp"].get_local_rank()
    ranges = a.stages.split(",")
    if len(ranges) != a.pp:
        raise ValueError("--stages %s: give %d ranges" % (a.stages, a.pp))
    begin, end = (int(v) for v in ranges[s].split("-"))
    module = PipelineStageModule(model, begin, end)
    del model
    for block in module.blocks:
        fully_shard(block, mesh=mesh["dp"], reshard_after_forward=a.reshard_after_microbatch)
    fully_shard(module, mesh=mesh["dp"], reshard_after_forward=a.reshard_after_microbatch)
    stage = pipe.PipelineStage(module, s, a.pp, torch.device("cpu"), group=mesh["pp"].get_group())
    V = CONFIGS[a.model][0]

    def loss_fn(out, target):
        return F.cross_entropy(out.reshape(-1, V), target.reshape(-1))

    schedule = pipe.Schedule1F1B(stage, a.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    a.dp_size, a.data_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()

    def run(x, y):
        opt.zero_grad(set_to_none=True)
        losses = []
        if s == 0:
            schedule.step(x)
        elif s == a.pp - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        return sum(losses) / len(losses) if losses else torch.zeros(())

    return run, "fully_shard(dp) + torch.distributed.pipelining Schedule1F1B"


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


# Collective (schema name, without the namespace) -> (dtorch's traffic kind, the argument whose
# bytes count: the input buffer, the shard for an allgather).
COLLECTIVES = {
    "all_reduce": ("allreduce", 0), "all_reduce_": ("allreduce", 0),
    "all_reduce_coalesced": ("allreduce", 0), "all_reduce_coalesced_": ("allreduce", 0),
    "all_gather_into_tensor": ("allgather", 0), "all_gather_into_tensor_out": ("allgather", 0),
    "all_gather_into_tensor_coalesced": ("allgather", 0),
    "reduce_scatter_tensor": ("reduce_scatter", 0),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
    "broadcast": ("broadcast", 0), "broadcast_": ("broadcast", 0),
    "allreduce_": ("allreduce", 0), "allreduce_coalesced_": ("allreduce", 0),
    "_allgather_base_": ("allgather", 1), "allgather_": ("allgather", 1),
    "allgather_into_tensor_coalesced_": ("allgather", 1),
    "_reduce_scatter_base_": ("reduce_scatter", 1), "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
}
# Bytes one rank sends, per byte counted, in a group of n: dtorch's Communicator's ring volumes.
RING = {"allreduce": lambda n: 2.0 * (n - 1) / n, "allgather": lambda n: n - 1.0,
        "reduce_scatter": lambda n: (n - 1.0) / n, "broadcast": lambda n: 1.0}


class CommBytes(TorchDispatchMode):
    """Counts the bytes this rank sends in collectives, as dtorch's Communicator counts its own
    (allreduce 2(n-1)/n of the buffer, reduce-scatter and allgather (n-1)/n of the full buffer,
    broadcast the buffer): torch.distributed's (FSDP2's) and the functional ones that DTensor
    issues when it redistributes. As CommDebugMode does, it lets DTensor run first."""

    def __init__(self):
        super().__init__()
        self.sent = dict.fromkeys(RING, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        from torch.distributed.tensor import DTensor
        if any(t is DTensor for t in types):
            return NotImplemented  # DTensor turns it into local ops and collectives first
        namespace, _, name = func._schema.name.partition("::")
        if "c10d" in namespace and name in COLLECTIVES:
            kind, i = COLLECTIVES[name]
            n = group_size(list(args) + list(kwargs.values()))
            if n > 1:
                self.sent[kind] += int(RING[kind](n) * nbytes(args[i]))
        return func(*args, **kwargs)

    def per_step(self):
        return dict(self.sent, total=sum(self.sent.values()))


def group_size(args):
    for x in reversed(args):
        if isinstance(x, str):  # a functional collective's group name, after its reduce op
            return dist.distributed_c10d._resolve_process_group(x).size()
        if isinstance(x, torch.ScriptObject) and x._type().name() == "ProcessGroup":
            return dist.ProcessGroup.unbox(x).size()  # a torch.distributed collective's group
    raise ValueError("a collective without a process group")


def nbytes(x):
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    return sum(nbytes(t) for t in x) if isinstance(x, (list, tuple)) else 0


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
    model.checkpoint_every = a.activation_checkpointing
    params = sum(p.numel() for p in model.parameters())  # tied weight counted once
    parallelize = {"ddp": parallelize_ddp, "zero-redundancy": parallelize_zero_redundancy,
                   "fsdp": parallelize_fsdp, "tensor-parallel": parallelize_tensor,
                   "dp-tp": parallelize_dp_tp}.get(a.strategy, parallelize_deepspeed)
    if a.strategy == "pipeline":
        run, impl = parallelize_pipeline(model, a)
        model = None  # this rank keeps its stage only
        a.dp_size = 1  # one pipeline: one batch per step
    elif a.strategy == "dp-pp":
        run, impl = parallelize_dp_pp(model, a)
        model = None
    else:
        module, step, impl = parallelize(model, a)
        run = lambda x, y: train_step(module, step, x, y)  # noqa: E731
    if a.strategy == "pipeline":
        a.data_rank = 0  # every stage of the one pipeline sees the same batch
    # Tensor parallel (and pipeline) ranks share their batch: the seed is the rank's dp
    # coordinate.
    gen = torch.Generator().manual_seed(getattr(a, "data_rank", rank))
    traffic = CommBytes() if a.strategy in TP_STRATEGIES else None
    t0 = faults0 = None
    for i in range(a.warmup + a.steps):  # untimed warm-up steps first
        if i == a.warmup:
            dist.barrier()
            t0 = time.perf_counter()
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        if i == 0 and traffic is not None:
            with traffic:  # the warm-up step's collectives, the same as every step's
                loss = run(*batch_for(a, gen))
            continue
        loss = run(*batch_for(a, gen))
    dist.barrier()
    seconds = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss = usage.ru_maxrss * 1024
    batches = getattr(a, "dp_size", a.nproc)  # distinct batches per step
    row = dict(rank=rank, strategy=a.strategy, impl=impl, model=a.model, nproc=a.nproc,
               params=params, batch_per_rank=a.batch, seq_len=min(a.seq_len, CONFIGS[a.model][1]),
               steps=a.steps, seconds=seconds,
               samples_per_s=a.steps * a.batch * batches / seconds, peak_rss_bytes=rss,
               rss_before_model_bytes=base_rss, final_loss=float(loss.detach()),
               step_seconds=seconds / a.steps,
               page_faults_per_step=(usage.ru_minflt - faults0) / a.steps,
               activation_checkpointing=a.activation_checkpointing,
               torch=torch.__version__)
    if a.strategy.startswith("deepspeed"):
        import deepspeed
        row["deepspeed"] = deepspeed.__version__
    if getattr(a, "fully_shard_error", None):
        row["fully_shard_error"] = a.fully_shard_error
    if traffic is not None:
        row.update(tp=a.tp_size, dp=a.dp_size, bytes_sent_per_step=traffic.per_step())
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
    ap.add_argument("--steps", type=int, default=3, help="timed steps, after the untimed ones")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before the timed ones")
    ap.add_argument("--batch", type=int, default=1, help="sequences per rank")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--port", type=int, default=0, help="rendezvous port; 0 picks a free one")
    ap.add_argument("--fsdp-impl", choices=("auto", "fully_shard", "fsdp1"), default="auto",
                    help="fsdp: auto tries fully_shard and falls back to FSDP1")
    ap.add_argument("--tp", type=int, default=2,
                    help="dp-tp: tensor parallel degree; dp is --nproc / --tp")
    ap.add_argument("--ds-bucket-mb", type=float, default=25.0,
                    help="deepspeed: reduce/allgather bucket MiB (DDP's and dtorch's 25); "
                    "0 keeps DeepSpeed's defaults")
    ap.add_argument("--pp", type=int, default=2,
                    help="dp-pp: pipeline stages; dp is --nproc / --pp")
    ap.add_argument("--reshard-after-microbatch", action="store_true",
                    help="dp-pp: FSDP2 reshards after every micro-batch's forward")
    ap.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved", "zb"), default="1f1b",
                    help="pipeline: the schedule")
    ap.add_argument("--microbatches", type=int, default=4, help="pipeline: per batch")
    ap.add_argument("--stages", default="",
                    help="pipeline: each rank's units begin-end, comma-separated (0 embeddings, "
                    "1..L blocks, L+1 head), e.g. 0-7,7-14")
    ap.add_argument("--activation-checkpointing", type=int, default=0, metavar="K",
                    help="recompute every K-th block in backward with torch.utils.checkpoint "
                    "(use_reentrant=False; 0: off)")
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
