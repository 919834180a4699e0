#!/usr/bin/python3
"""Two probes behind docs/plan-benchmarks.md's "Where the model misses" for dtorch plan, in
PyTorch (1 thread a process), printed, not published:

  rates     a linear layer's three products (forward, input and weight gradient) at gpt-small's
            and gpt-large's weight shapes (whole and split by tensor parallelism) and 64 to 1024
            rows, in GFLOP/s, against calibrate's 1024 x 1024;
  lockstep  2 ranks over Gloo run 80 segments of matmuls (about a block's forward of gpt-large
            under tp 2), with and without a small all-reduce after each: what meeting the other
            rank every segment costs on this machine, three times each way.

Usage: bench/plan_probe.py rates | .venv/bin/torchrun --nproc-per-node 2 bench/plan_probe.py lockstep
"""
import sys
import time

import torch


def rates():
    torch.set_num_threads(1)
    shapes = [(1024, 1024), (768, 2304), (768, 3072), (1280, 1920), (1280, 2560), (2560, 1280),
              (1280, 5120)]
    for i, o in shapes:
        line = []
        for rows in (64, 128, 256, 1024):
            x, w, g = torch.randn(rows, i), torch.randn(o, i), torch.randn(rows, o)

            def once():
                x @ w.t()
                g @ w
                g.t() @ x

            once()
            t = time.perf_counter()
            for _ in range(5):
                once()
            line.append("%d rows %.1f" % (rows, 6 * rows * i * o / ((time.perf_counter() - t) / 5) / 1e9))
        print("%d x %d: %s GFLOP/s" % (i, o, ", ".join(line)))


def lockstep():
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    x, w, small = torch.randn(128, 1280), torch.randn(2560, 1280), torch.zeros(128 * 1280)

    def run(meet):
        dist.barrier()
        t = time.perf_counter()
        for _ in range(80):
            for _ in range(6):
                x @ w.t()
            if meet:
                dist.all_reduce(small)
        dist.barrier()
        return time.perf_counter() - t

    for _ in range(3):
        apart, together = run(False), run(True)
        if dist.get_rank() == 0:
            print("apart %.2f s, meeting every segment %.2f s (%+.0f%%)" %
                  (apart, together, 100 * (together - apart) / apart), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    {"rates": rates, "lockstep": lockstep}[sys.argv[1] if len(sys.argv) > 1 else "rates"]()
