#!/usr/bin/python3
"""The peer of `dtorch bench data`: torchvision's ImageFolder + DataLoader with the training
transform dtorch's loader applies (Resize(S), CenterCrop(S), RandomCrop(S, padding=S//8),
RandomHorizontalFlip, ToTensor, Normalize with ImageNet's statistics), num_workers worker
processes, shuffled batches of one epoch (drop_last), `warmup` batches untimed. Prints one JSON
line: images, seconds, images_per_s.
Usage: peer_data.py DIR --workers N --batch 64 --size 32 [--warmup 2] [--batches 0]
"""
import argparse
import json
import time

import torch
import torchvision
from torchvision import datasets, transforms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batches", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    s = a.size
    t = transforms.Compose([
        transforms.Resize(s), transforms.CenterCrop(s),
        transforms.RandomCrop(s, padding=max(1, s // 8)), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    data = datasets.ImageFolder(a.dir, transform=t)
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True,
                                         num_workers=a.workers)
    it = iter(loader)
    for _ in range(a.warmup):
        next(it)
    timed = len(loader) - a.warmup if a.batches == 0 else min(a.batches, len(loader) - a.warmup)
    start = time.perf_counter()
    images = 0
    for _ in range(timed):
        x, y = next(it)
        images += x.shape[0]
    seconds = time.perf_counter() - start
    print(json.dumps({"bench": "data", "impl": "torchvision", "workers": a.workers,
                      "images": images, "seconds": seconds, "images_per_s": images / seconds,
                      "torch": torch.__version__, "torchvision": torchvision.__version__}))


if __name__ == "__main__":
    main()
