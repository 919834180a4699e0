#!/usr/bin/env python3
"""Peer for `dtorch train`: one epoch of the tutorials' MNIST CNN (the peer's Net) on
Fashion-MNIST with PyTorch Lightning's Trainer, as CSC's Lightning tutorial runs it:
strategy "ddp" on CPU (Gloo), --nproc processes, batch --batch per rank, SGD lr 0.01 momentum
0.9, a checkpoint at the end of the epoch, then the test split. Prints one JSON line (rank 0):
wall seconds from start to exit, training samples/s (the epoch's training loop only), test
accuracy, versions.
Usage: .venv/bin/python bench/peer_lightning.py --nproc 2 --batch 64 --out /tmp/lightning-run
"""
import argparse
import importlib.util
import json
import os
import time

START = time.time()
os.environ.setdefault("OMP_NUM_THREADS", "1")  # as dtorch's launcher sets for its workers

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import lightning as L  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "bench", "peer_ddp_mnist.py")


def load_peer(path):
    spec = importlib.util.spec_from_file_location("torch_ddp_mnist", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Classifier(L.LightningModule):
    def __init__(self, net, lr):
        super().__init__()
        self.net, self.lr = net, lr

    def training_step(self, batch, _):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def test_step(self, batch, _):
        x, y = batch
        correct = (self.net(x).argmax(-1) == y).float().sum()
        self.log("correct", correct, reduce_fx="sum", sync_dist=True)
        self.log("count", float(len(y)), reduce_fx="sum", sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class EpochTimer(L.Callback):
    def on_train_epoch_start(self, trainer, module):
        self.start = time.time()

    def on_train_epoch_end(self, trainer, module):
        self.seconds = time.time() - self.start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--peer", default=PEER)
    ap.add_argument("--out", default="/tmp/lightning-run")
    a = ap.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(a.seed, verbose=False)
    peer = load_peer(a.peer)
    x, y = peer.load("train")
    tx, ty = peer.load("test")
    train = DataLoader(TensorDataset(x, y), batch_size=a.batch, shuffle=True)
    test = DataLoader(TensorDataset(tx, ty), batch_size=1000)
    timer = EpochTimer()
    trainer = L.Trainer(accelerator="cpu", devices=a.nproc, strategy="ddp", max_epochs=1,
                        enable_progress_bar=False, logger=False, enable_model_summary=False,
                        default_root_dir=a.out, callbacks=[timer])
    module = Classifier(peer.Net(), a.lr)
    trainer.fit(module, train)
    seconds = torch.tensor([timer.seconds])
    result = trainer.test(module, test, verbose=False)[0]
    if trainer.global_rank == 0:
        # Lightning pads the last batch of each rank's shard the way DistributedSampler does.
        samples = len(train.dataset)
        print(json.dumps({"wall_seconds": time.time() - START,
                          "samples_per_s": samples / float(seconds[0]),
                          "train_seconds": float(seconds[0]),
                          "test_accuracy": result["correct"] / result["count"],
                          "lightning": L.__version__, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
