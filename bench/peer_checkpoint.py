#!/usr/bin/env python3
"""Peer reference for checkpointing: how long PyTorch's Distributed Checkpoint
(torch.distributed.checkpoint, "DCP") stalls training on CPU over Gloo, dcp.save (blocking)
against dcp.async_save.

The model is nanoGPT's GPT as bench/peer_sharded.py builds it (bias on, dropout 0, lm_head tied
to wte), imported from there: gpt-small (12 layers, 12 heads, 768 wide, vocab 50304, block 1024)
or gpt-large (36 layers, 20 heads, 1280 wide, same vocab and block). --strategy ddp wraps it in
DistributedDataParallel; --strategy fsdp applies FSDP2's fully_shard to every block, then to the
root, as peer_sharded.py does (without its FSDP1 fallback: a failure is reported). fp32 AdamW
(lr 1e-4, weight decay 0.01), --batch sequences of --seq-len random token ids per rank,
--threads intra-op threads per rank (1 by default).

Protocol, per rank: steps 1..--steps, each timed (forward, backward, optimizer step). After
optimizer step --save-at the training thread builds {"model", "optim"} with
torch.distributed.checkpoint.state_dict.get_state_dict and saves it into <dir>/step-<K>:
  blocking  dcp.save: the whole call, state dict included, is the stall.
  async     dcp.async_save (thread executor, DCP's default DefaultStager: a synchronous deep copy
            into plain CPU memory, no pinned or shared memory): the stall is the state dict plus
            the time until async_save returns (staging included); the write runs in a
            background thread while training goes on. After each later step future.done() is
            checked; the steps that started while it was not yet seen done are
            "steps_during_save_seconds". future.result() is called at the end of training.
The save's collectives run on a dedicated Gloo group (dist.new_group), not on the default group
that DDP / FSDP2 use from the training thread (--ckpt-pg default uses the default group: two
threads issuing collectives on one Gloo group may pair them up differently on each rank).

Each rank prints one JSON line: {"impl": "pytorch", "bench": "checkpoint", "torch", "model",
"strategy", "mode", "rank", "nproc", "seq_len", "batch_size", "stall_seconds",
"save_total_seconds", "step_seconds_median", "steps_during_save_seconds", "checkpoint_bytes",
"peak_rss_bytes", ...} with, besides: "step_seconds" (all steps), "state_dict_seconds"
(get_state_dict), "staging_seconds" (async: the stager's copy), "save_done_after_step" (async:
the step after which future.done() was first seen true), "save_wait_seconds" (async: how long
future.result() blocked at the end), "rank_file_bytes" (this rank's .distcp files) and
"stager" / "process_group". save_total_seconds is, for async, from the call until the future
completed (a done callback stamps the time; "save_result_seconds" is until future.result()
returned at the end); for blocking it equals stall_seconds. step_seconds_median is over the
steps with no save in flight, step 1 left out (it allocates AdamW's state) unless it is the
only one. checkpoint_bytes is the size of all files in the checkpoint folder, after every rank
finished. If anything fails every rank prints {..., "error": one line} and exits 0.

Usage: .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \\
           bench/peer_checkpoint.py --mode async [--strategy fsdp] [--steps 6 --save-at 3]
       .venv/bin/python bench/peer_checkpoint.py --nproc 2 ...   (launches torchrun itself)
"""
import argparse
import datetime
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_sharded import CONFIGS as SHARDED_CONFIGS  # noqa: E402 - nanoGPT, one copy
from peer_sharded import GPT, LR, WEIGHT_DECAY, one_line, train_step  # noqa: E402
from benchlib import torchrun_self  # noqa: E402

# (vocab_size, block_size, n_layer, n_head, n_embd): peer_sharded's (gpt-small, gpt-debug) and
# dtorch's GPTConfig::large() (GPT-2 large, 774M parameters).
CONFIGS = dict(SHARDED_CONFIGS, **{"gpt-large": (50304, 1024, 36, 20, 1280)})


def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def build(a):
    """Returns (module to call, optimizer, impl)."""
    torch.manual_seed(0)  # the same initial model on every rank
    model = GPT(*CONFIGS[a.model])
    if a.strategy == "ddp":
        module = nn.parallel.DistributedDataParallel(model)
        impl = "DistributedDataParallel"
    else:
        from torch.distributed.fsdp import fully_shard
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
        module = model
        impl = "fully_shard"
    opt = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    return module, opt, impl


def folder_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def run(a, row):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    rank, world = dist.get_rank(), dist.get_world_size()
    # The checkpoint folder: rank 0's fresh temp folder unless --dir, the same on every rank.
    owned = not a.dir
    where = [tempfile.mkdtemp(prefix="peer_checkpoint_") if owned and rank == 0 else a.dir]
    dist.broadcast_object_list(where, src=0)
    base = where[0]
    if owned:
        a.tmp_dir = base  # rank_main removes it if the run fails
    ckpt = os.path.join(base, "step-%d" % a.save_at)
    pg = dist.new_group(backend="gloo") if a.ckpt_pg == "dedicated" else None
    row["process_group"] = "dedicated gloo new_group" if pg is not None else "default (WORLD)"

    module, opt, impl = build(a)
    row["parallel_impl"] = impl
    gen = torch.Generator().manual_seed(rank)
    V, BS = CONFIGS[a.model][0], CONFIGS[a.model][1]
    T = min(a.seq_len, BS)

    class TimedStager(DefaultStager):
        """DCP's own default for async_save (StagingOptions all False), with the copy timed."""

        def stage(self, state_dict, **kwargs):
            t = time.perf_counter()
            out = super().stage(state_dict, **kwargs)
            row["staging_seconds"] = time.perf_counter() - t
            return out

    step_seconds, overlapped = [], set()
    future, stager, done_at = None, None, {}
    dist.barrier()
    try:
        for step in range(1, a.steps + 1):
            in_flight = future is not None and "step" not in done_at
            x = torch.randint(0, V, (a.batch, T), generator=gen)
            y = torch.randint(0, V, (a.batch, T), generator=gen)
            t = time.perf_counter()
            loss = train_step(module, lambda l: (opt.zero_grad(set_to_none=True), l.backward(),
                                                 opt.step()), x, y)
            step_seconds.append(time.perf_counter() - t)
            if in_flight:
                overlapped.add(step)
                if future.done():
                    done_at["step"] = step
            if step == a.save_at:
                t0 = time.perf_counter()
                model_sd, optim_sd = get_state_dict(module, opt)
                state = {"model": model_sd, "optim": optim_sd}
                row["state_dict_seconds"] = time.perf_counter() - t0
                if a.mode == "blocking":
                    dcp.save(state, checkpoint_id=ckpt, process_group=pg)
                    row["stall_seconds"] = row["save_total_seconds"] = time.perf_counter() - t0
                else:
                    stager = TimedStager(StagingOptions(False, False, False, False))
                    future = dcp.async_save(
                        state, checkpoint_id=ckpt, process_group=pg, async_stager=stager,
                        async_checkpointer_type=AsyncCheckpointerType(a.async_type))
                    row["stall_seconds"] = time.perf_counter() - t0
                    future.add_done_callback(
                        lambda f: done_at.setdefault("time", time.perf_counter()))
                    if future.done():
                        done_at["step"] = step
                del state, model_sd, optim_sd
        row["final_loss"] = float(loss.detach())
        if future is not None:
            t = time.perf_counter()
            future.result()
            t1 = time.perf_counter()
            row["save_wait_seconds"] = t1 - t
            row["save_result_seconds"] = t1 - t0
            row["save_total_seconds"] = done_at.get("time", t1) - t0
            row["save_done_after_step"] = done_at.get("step")  # None: not done before the end
            row["stager"] = "DefaultStager(StagingOptions(False, False, False, False))"
            row["async_executor"] = a.async_type
    finally:
        if stager is not None:
            stager.close()
    dist.barrier()  # every rank's files are written
    row["checkpoint_bytes"] = folder_bytes(ckpt)
    row["rank_file_bytes"] = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt)
                                 if f.startswith("__%d_" % rank) and f.endswith(".distcp"))
    row["checkpoint_files"] = len(os.listdir(ckpt))
    clean = [s for s in range(1, a.steps + 1) if s not in overlapped]
    timed = [s for s in clean if s > 1] or clean
    row.update(step_seconds=step_seconds,
               step_seconds_median=statistics.median(step_seconds[s - 1] for s in timed)
               if timed else None,
               steps_during_save_seconds=[step_seconds[s - 1] for s in sorted(overlapped)],
               peak_rss_bytes=rss())
    dist.barrier()
    if owned and rank == 0:
        shutil.rmtree(base, ignore_errors=True)
    if pg is not None:
        dist.destroy_process_group(pg)


def rank_main(a):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(a.threads)
    row = dict(impl="pytorch", bench="checkpoint", torch=torch.__version__, model=a.model,
               strategy=a.strategy, mode=a.mode, rank=rank, nproc=world,
               seq_len=min(a.seq_len, CONFIGS[a.model][1]), batch_size=a.batch,
               steps=a.steps, save_at=a.save_at, threads=a.threads)
    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
        run(a, row)
    except Exception as e:  # noqa: BLE001 - report on every rank, exit 0
        keep = ("impl", "bench", "torch", "model", "strategy", "mode", "rank", "nproc", "seq_len",
                "batch_size", "steps", "save_at", "threads", "process_group")
        row = {k: row[k] for k in keep if k in row}
        row.update(error=one_line(e), peak_rss_bytes=rss())
        if rank == 0 and getattr(a, "tmp_dir", None):
            shutil.rmtree(a.tmp_dir, ignore_errors=True)
        print(json.dumps(row), flush=True)
        # A rank left waiting in a collective times out (--timeout) and reports too; end here
        # rather than in destroy_process_group, which may wait on the others.
        sys.stderr.flush()
        os._exit(0)
    print(json.dumps(row), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(CONFIGS), default="gpt-small")
    ap.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--mode", choices=("blocking", "async"), default="blocking")
    ap.add_argument("--steps", type=int, default=6, help="timed optimizer steps")
    ap.add_argument("--save-at", type=int, default=3, help="save after optimizer step K")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1, help="sequences per rank")
    ap.add_argument("--dir", default="",
                    help="checkpoint folder (the save goes to DIR/step-K); default: a fresh "
                    "temp folder under /tmp, deleted at the end")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--async-type", choices=("thread", "process"), default="thread",
                    help="async: dcp.async_save's async_checkpointer_type")
    ap.add_argument("--ckpt-pg", choices=("dedicated", "default"), default="dedicated",
                    help="process group of the save's collectives")
    ap.add_argument("--timeout", type=int, default=600, help="collective timeout, seconds")
    ap.add_argument("--nproc", type=int, default=2,
                    help="ranks to launch with torchrun when not already under it")
    a = ap.parse_args()
    if not 1 <= a.save_at <= a.steps:
        ap.error("--save-at must be within 1..--steps")
    if "RANK" not in os.environ:  # launch the ranks under torchrun, with the same arguments
        return torchrun_self(__file__, a.nproc, a.threads)
    rank_main(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
