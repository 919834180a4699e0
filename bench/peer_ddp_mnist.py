#!/usr/bin/env python3
"""Peer reference: PyTorch (Python) DistributedDataParallel on CPU with Gloo.

Trains the classic MNIST CNN (the one the tutorials use: conv32-conv64-fc128-fc10,
--model mnist-cnn) or a small MLP (784-256-256-10, --model mnist-mlp)
on Fashion-MNIST from /usr/share/datasets/fashion-mnist (Debian package
dataset-fashion-mnist), and prints one JSON line with throughput, so dtorch is
compared with it side by side on the same machine (bench/bench_ddp.py, `dtorch bench ddp`) and
checked against it model for model (tests/models/python_peer.h imports it).

Run:  python3 bench/peer_ddp_mnist.py --model mnist-cnn --nproc 2 --threads 1 --steps 200 --batch 64
Protocol: each step draws a uniformly random batch (per-rank generator seeded with the
rank), SGD lr 0.01 momentum 0.9, cross-entropy; warm-up steps are not timed.
(Debian packages: python3-torch, dataset-fashion-mnist)
"""
import argparse, gzip, json, os, time
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp

DATA = "/usr/share/datasets/fashion-mnist"


def load(split):
    p = "train" if split == "train" else "t10k"
    with gzip.open(f"{DATA}/{p}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{DATA}/{p}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = torch.from_numpy(x.astype(np.float32) / 255.0)
    x = (x - 0.2860) / 0.3530
    return x, torch.from_numpy(y.astype(np.int64))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def worker(rank, a, q):
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.nproc > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(a.port))
        dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    x, y = load("train")
    model = Net() if a.model == "mnist-cnn" else MLP()
    if a.nproc > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    n = x.shape[0]
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            if a.nproc > 1:
                dist.barrier()
            t0 = time.perf_counter()
        idx = torch.randint(0, n, (a.batch,), generator=g)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if a.nproc > 1:
        dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        q.put(dict(peer="pytorch-python-ddp", torch=torch.__version__, model=a.model, nproc=a.nproc,
                   threads=a.threads, batch_per_rank=a.batch, steps=a.steps, seconds=dt,
                   samples_per_s=a.steps * a.batch * a.nproc / dt, final_loss=float(loss)))
    if a.nproc > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mnist-cnn", "mnist-mlp"], default="mnist-cnn")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--port", type=int, default=29533)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    if a.nproc == 1:
        worker(0, a, q)
    else:
        mp.spawn(worker, args=(a, q), nprocs=a.nproc, join=True)
    print(json.dumps(q.get()))
