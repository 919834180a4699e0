#!/usr/bin/env python3
"""Peer reference for dtorch's context parallelism: PyTorch's own
torch.distributed.tensor.experimental.context_parallel training gpt-long over Gloo on CPU.

The model is nanoGPT's GPT as bench/peer_sharded.py builds it (bias on, dropout 0, lm_head tied
to wte, exact GELU, F.scaled_dot_product_attention(is_causal=True)) in dtorch's gpt-long shape
by default: vocab 256, --model-shape n_layer,n_head,n_embd,block = 4,4,32,1024. The only change
is that forward takes the position ids, since under context parallelism a rank holds a
(load-balanced) slice of the sequence, not its first tokens.

Layout: world = dp x cp ranks on a DeviceMesh ("dp", "cp"); --cp defaults to the world size
(dp = 1). Every cp group trains on one batch of --batch random sequences of --seq-len tokens;
context_parallel shards the tokens, the targets and the position ids along the sequence (with
its head-tail load balancing for causal attention whenever seq_len % (2 cp) == 0) and patches
F.scaled_dot_product_attention with its ring attention, rotating K/V by --rotate (allgather or
alltoall, set_rotate_method). Each rank's loss is the mean over its own tokens, so DDP over the
whole world (dp x cp, equal token counts) averages the gradients into the full-sequence ones.
fp32 AdamW (lr 1e-4, weight decay 0.01), one untimed step, then --steps timed steps between two
barriers; --threads intra-op threads per rank (1 by default, as dtorch bench memory).

Each rank prints one JSON line: {"impl": "pytorch", "bench": "context-parallel", "torch", "rank",
"nproc", "cp", "dp", "seq_len", "batch_size", "rotate", "load_balance", "sdpa_backend",
"step_seconds", "forward_kept_bytes", "peak_rss_bytes", "final_loss", "supported": true}.
forward_kept_bytes (untimed step): bytes of the storages that ATen ops created from the start of
forward to the loss and that are still alive when backward starts (the activations autograd
keeps, with the logits and the loss), counted under a TorchDispatchMode below DTensor, since
PyTorch's CPU allocator keeps no statistics. With --check the untimed step's loss (averaged over
the cp group) is compared with the same model's on the full sequence without context_parallel:
"loss_diff" is their absolute difference, "grad_max_diff" the largest gradient difference.

When context_parallel cannot train the model (PyTorch 2.x only routes the CUDA SDPA kernels,
flash, efficient and cuDNN, to ring attention: on CPU F.scaled_dot_product_attention dispatches
to aten._scaled_dot_product_flash_attention_for_cpu or to the math composite, which DTensor
cannot shard), every rank prints {..., "supported": false, "reason": the one-line error of the
default SDPA dispatch, "backend_errors": {backend: error} for each backend tried} and the
script exits 0.
Usage: .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \\
           bench/peer_context_parallel.py [--seq-len 1024] [--rotate alltoall] [--check]
       .venv/bin/python bench/peer_context_parallel.py --nproc 2 ...   (launches torchrun itself)
"""
import argparse
import datetime
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_sharded import GPT, LR, WEIGHT_DECAY, one_line  # noqa: E402 - nanoGPT, one copy
from benchlib import torchrun_self  # noqa: E402

VOCAB = 256  # dtorch's gpt-long
BACKENDS = ("default", "math", "flash", "efficient", "cudnn")


class PositionGPT(GPT):
    """peer_sharded's GPT with the position ids passed in: logits = ln_f(x) @ wte.weight.T."""

    def forward(self, idx, pos):
        t = self.transformer
        x = t.wte(idx) + t.wpe(pos)
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


class ForwardKept(TorchDispatchMode):
    """Storages created by ATen ops while active (outputs that alias no input: not views, not
    in-place results), held weakly; kept_bytes() sums those still alive. It lets DTensor run
    first, so it counts the local tensors a rank really allocates."""

    def __init__(self):
        super().__init__()
        self.created = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from torch.distributed.tensor import DTensor
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        out = func(*args, **kwargs)
        inputs = {storage_ref(t).cdata for t in flat_tensors((args, kwargs))}
        for t in flat_tensors(out):
            ref = storage_ref(t)
            old = self.created.get(ref.cdata)
            if ref.cdata not in inputs and (old is None or old[0].expired()):
                self.created[ref.cdata] = (ref, t.untyped_storage().nbytes())
        return out

    def kept_bytes(self):
        return sum(n for ref, n in self.created.values() if not ref.expired())


def storage_ref(t):
    from torch.multiprocessing.reductions import StorageWeakRef
    return StorageWeakRef(t.untyped_storage())


def flat_tensors(x):
    if isinstance(x, torch.Tensor):
        return [x] if x.layout == torch.strided and x.device.type != "meta" else []
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat_tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in flat_tensors(v)]
    return []


def sdpa_kernel_for(name):
    import contextlib
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION}[name])


def cross_entropy(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


class Trainer:
    def __init__(self, a, mesh, device):
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method
        self.context_parallel = context_parallel
        set_rotate_method(a.rotate)
        self.a, self.mesh, self.device = a, mesh, device
        L, H, C, BS = a.shape
        torch.manual_seed(0)  # the same initial model on every rank
        self.model = PositionGPT(VOCAB, BS, L, H, C).to(device)
        self.ddp = torch.nn.parallel.DistributedDataParallel(self.model)
        self.opt = torch.optim.AdamW(self.ddp.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        self.gen = torch.Generator().manual_seed(mesh.get_local_rank("dp"))  # one batch per cp group

    def batch(self):
        T = self.a.seq_len
        x = torch.randint(0, VOCAB, (self.a.batch, T), generator=self.gen).to(self.device)
        y = torch.randint(0, VOCAB, (self.a.batch, T), generator=self.gen).to(self.device)
        return x, y, torch.arange(T, device=self.device)

    def step(self, backend, x, y, pos, kept=None, grads_out=None):
        """One AdamW step under context_parallel; returns the loss averaged over the cp group."""
        self.opt.zero_grad(set_to_none=True)
        with self.context_parallel(self.mesh["cp"], buffers=[x, y, pos], buffer_seq_dims=[1, 1, 0],
                                   no_restore_buffers={x, y, pos}), sdpa_kernel_for(backend):
            if kept is None:
                loss = cross_entropy(self.ddp(x, pos), y)
            else:
                with kept:
                    loss = cross_entropy(self.ddp(x, pos), y)
                self.kept_bytes = kept.kept_bytes()  # before backward frees anything
            loss.backward()
        if grads_out is not None:
            grads_out.extend(p.grad.detach().clone() for p in self.model.parameters())
        self.opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=self.mesh["cp"].get_group())
        return float(mean) / self.mesh["cp"].size()

    def reference(self, x, y, pos):
        """The full-sequence loss and gradients (averaged over dp) without context_parallel."""
        loss = cross_entropy(self.model(x, pos), y)
        loss.backward()
        grads = [p.grad.detach().clone() for p in self.model.parameters()]
        self.model.zero_grad(set_to_none=True)
        for g in grads:
            dist.all_reduce(g, group=self.mesh["dp"].get_group())
            g /= self.mesh["dp"].size()
        return float(loss.detach()), grads


def run(a):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=a.timeout))
    cp = a.cp or world
    if world % cp:
        raise SystemExit("--cp %d does not divide the world size %d" % (cp, world))
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device.type, (world // cp, cp), mesh_dim_names=("dp", "cp"))
    row = dict(impl="pytorch", bench="context-parallel", torch=torch.__version__, rank=rank,
               nproc=world, cp=cp, dp=world // cp, seq_len=a.seq_len, batch_size=a.batch,
               model_shape=",".join(map(str, a.shape)), rotate=a.rotate,
               load_balance="head-tail" if a.seq_len % (2 * cp) == 0 else None,
               device=device.type)
    trainer = Trainer(a, mesh, device)

    # The untimed step: the SDPA dispatch (default first, then each forced backend), the
    # forward-kept bytes and, with --check, the parity with the full sequence.
    tried = [a.sdpa_backend] if a.sdpa_backend != "auto" else \
        ["default"] + (["math", "flash"] if device.type == "cpu" else ["flash", "efficient", "cudnn"])
    errors, backend = {}, None
    for name in tried:
        x, y, pos = trainer.batch()
        ref = trainer.reference(x, y, pos) if a.check else None
        grads = []
        try:
            loss0 = trainer.step(name, x, y, pos, kept=ForwardKept(), grads_out=grads)
            failed = torch.zeros(1)
        except Exception as e:  # noqa: BLE001 - an unsupported dispatch: record it, try the next
            errors[name] = one_line(e)
            failed = torch.ones(1)
        dist.all_reduce(failed)  # every rank agrees on whether this backend ran
        if failed.item() == 0:
            backend = name
            break
        errors.setdefault(name, "another rank failed")
        trainer.gen.manual_seed(mesh.get_local_rank("dp"))  # the same batch for the next try
    if backend is None:
        row.update(supported=False, reason=errors[tried[0]], backend_errors=errors,
                   step_seconds=None, forward_kept_bytes=None,
                   peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        print(json.dumps(row), flush=True)
        dist.destroy_process_group()
        return
    if a.check:
        row["loss_diff"] = abs(loss0 - ref[0])
        row["grad_max_diff"] = max(float((g - r).abs().max()) for g, r in zip(grads, ref[1]))
    forward_kept = trainer.kept_bytes

    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = trainer.step(backend, *trainer.batch())
    dist.barrier()
    seconds = time.perf_counter() - t0
    row.update(sdpa_backend=backend, step_seconds=seconds / a.steps,
               forward_kept_bytes=forward_kept,
               peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               first_loss=loss0, final_loss=loss, supported=True)
    if errors:
        row["backend_errors"] = errors
    print(json.dumps(row), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-shape", default="4,4,32,1024",
                    help="n_layer,n_head,n_embd,block_size (gpt-long: 4,4,32,1024)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2, help="sequences per data-parallel replica")
    ap.add_argument("--steps", type=int, default=3, help="timed steps, after one untimed")
    ap.add_argument("--cp", type=int, default=0, help="context-parallel degree (0: world size)")
    ap.add_argument("--rotate", choices=("allgather", "alltoall"), default="allgather")
    ap.add_argument("--check", action="store_true",
                    help="compare the first step's loss with the full sequence's")
    ap.add_argument("--sdpa-backend", choices=("auto",) + BACKENDS, default="auto",
                    help="auto: the default dispatch, then each backend forced by sdpa_kernel")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--timeout", type=int, default=300, help="collective timeout, seconds")
    ap.add_argument("--nproc", type=int, default=2,
                    help="ranks to launch with torchrun when not already under it")
    a = ap.parse_args()
    a.shape = tuple(int(v) for v in a.model_shape.split(","))
    if len(a.shape) != 4 or a.seq_len > a.shape[3]:
        ap.error("--model-shape needs 4 numbers and --seq-len at most the block size")
    if "RANK" not in os.environ:  # launch the ranks under torchrun, with the same arguments
        return torchrun_self(__file__, a.nproc, a.threads)
    run(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
