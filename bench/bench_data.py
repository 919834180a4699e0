#!/usr/bin/python3
"""Decoded images per second of dtorch's training loader (`dtorch bench data`) against
torchvision's ImageFolder + DataLoader (bench/peer_data.py, Debian's python3-torchvision) with
the same number of workers, the same transform and batch, side by side in one run on two image
folders it writes itself: Fashion-MNIST's 28x28 images as PNG and JPEG files (half each), and
photo-sized 320x240 colour JPEGs (Fashion-MNIST images enlarged and tinted) cut to 64x64.
Writes the data-loading section of BENCHMARKS.md.
Usage: bench/bench_data.py [--dtorch build/dtorch] [--workers 0,2]
"""
import argparse
import datetime
import gzip
import os
import shutil
import sys
import tempfile

import numpy as np
from PIL import Image

from bench_memory import shown_path, short_version
from benchlib import ROOT, libtorch_version, publish, run_json

START, END = "<!-- data:start -->", "<!-- data:end -->"
FASHION = "/usr/share/datasets/fashion-mnist"


def fashion(n):
    with gzip.open(os.path.join(FASHION, "train-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read()[16:], np.uint8).reshape(-1, 28, 28)[:n]
    with gzip.open(os.path.join(FASHION, "train-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read()[8:], np.uint8)[:n]
    return images, labels


def write_small(root, n):
    images, labels = fashion(n)
    for i, (img, label) in enumerate(zip(images, labels)):
        folder = os.path.join(root, "class%d" % label)
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(img).save(os.path.join(folder, "%05d.%s" % (i, "png" if i % 2 else "jpg")))


def write_photos(root, n):
    images, labels = fashion(n)
    rng = np.random.default_rng(0)
    for i, (img, label) in enumerate(zip(images, labels)):
        folder = os.path.join(root, "class%d" % label)
        os.makedirs(folder, exist_ok=True)
        big = np.asarray(Image.fromarray(img).resize((320, 240), Image.BICUBIC), np.float32)
        tint = rng.uniform(0.4, 1.0, size=3)
        noise = rng.normal(0, 6, size=(240, 320, 3))
        rgb = np.clip(big[..., None] * tint + noise + 20, 0, 255).astype(np.uint8)
        Image.fromarray(rgb).save(os.path.join(folder, "%05d.jpg" % i), quality=90)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build", "dtorch"))
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    a = ap.parse_args()
    a.dtorch = os.path.abspath(a.dtorch)
    workers = [int(w) for w in a.workers.split(",")]
    scratch = tempfile.mkdtemp(prefix="bench-data-")
    sets = [("Fashion-MNIST 28x28, PNG and JPEG", "small", 10000, 28, write_small),
            ("320x240 colour JPEG photos", "photos", 3000, 64, write_photos)]
    rows = []
    peer_versions = None
    try:
        for title, name, n, size, write in sets:
            folder = os.path.join(scratch, name)
            write(folder, n)
            for w in workers:
                ours = run_json([a.dtorch, "bench", "data", "--data", "imagefolder:" + folder,
                                 "--data-workers", str(w), "--batch-size", str(a.batch),
                                 "--image-size", str(size)])
                peer = run_json(["/usr/bin/python3", os.path.join(ROOT, "bench", "peer_data.py"),
                                 folder, "--workers", str(w), "--batch", str(a.batch), "--size",
                                 str(size)])
                peer_versions = (peer["torch"], peer["torchvision"])
                print("%s, %d workers: dtorch %.0f, torchvision %.0f images/s" %
                      (title, w, ours["images_per_s"], peer["images_per_s"]), file=sys.stderr)
                rows.append("| %s, %d image(s) to %dx%d | %d | %.0f | %.0f | %.1fx |" % (
                    title, n, size, size, w, ours["images_per_s"], peer["images_per_s"],
                    ours["images_per_s"] / peer["images_per_s"]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    libtorch = libtorch_version(a.dtorch)
    lines = [
        START,
        "## Loading images: dtorch's loader against torchvision's DataLoader (same run)",
        "",
        "Measured by `make bench` (`bench/bench_data.py --workers %s --batch %d`) on %s, %d "
        "cores: one epoch of shuffled training batches of %d (two untimed), decoded, resized "
        "(shorter side) and centre-cropped to the model's input, randomly cropped with padding "
        "and flipped, normalised, stacked; no model. dtorch: `%s bench data --data "
        "imagefolder:DIR --data-workers N` (LibTorch %s; worker threads, Note [Prefetching "
        "loader]). Peer: torchvision %s's `ImageFolder` + `DataLoader(num_workers=N)` on "
        "PyTorch %s (Debian's python3-torchvision; worker processes), the same transform "
        "(`bench/peer_data.py`). N = 0 builds every batch on the main thread (process)."
        % (a.workers, a.batch, datetime.date.today().isoformat(), os.cpu_count(), a.batch,
           shown_path(a.dtorch), libtorch, peer_versions[1], short_version(peer_versions[0])),
        "",
        "| images | workers | dtorch images/s | torchvision images/s | dtorch / torchvision |",
        "|---|---|---|---|---|",
    ] + rows + [
        "",
        "Where the difference comes from: per image, torchvision runs five Python transform "
        "objects on a PIL image and a tensor; dtorch runs one C++ loop from the decoded bytes "
        "into the batch tensor. For photos, libjpeg-turbo decodes at the smallest DCT scale "
        "(1/8 to 1) that still covers the output side, skipping detail the resize would drop; "
        "PIL decodes at full size unless told to (`Image.draft`), which ImageFolder does not.",
        END,
    ]
    publish(a.out, lines)


if __name__ == "__main__":
    main()
