#!/usr/bin/env bash
# Makes the seed corpus of every fuzz harness (tests/fuzz/*_fuzz.cpp) from real files: Debian's
# Fashion-MNIST, its fortunes, images libjpeg and libpng encode, and the files of tiny
# `dtorch train` runs (checkpoints, sharded metadata, pipeline and tensor-parallel layouts,
# safetensors, config.json, metrics.jsonl). Also the fixture folders some harnesses read beside
# the fuzzed file (a sharded checkpoint's shards, a tensor-parallel run's tp folders).
#
# Usage: tests/fuzz/make_seeds.sh [SEEDS_DIR] (default build-fuzz/seeds). DTORCH names the
# command line that trains (default build/dtorch, the ordinary build). Takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=$(realpath -m "${1:-build-fuzz/seeds}")
DTORCH=${DTORCH:-build/dtorch}
MNIST=/usr/share/datasets/fashion-mnist  # Debian's dataset-fashion-mnist
FORTUNES=/usr/share/games/fortunes       # Debian's fortunes
[ -x "$DTORCH" ] || { echo "make_seeds: $DTORCH is not built (make build)" >&2; exit 1; }
[ -d "$MNIST" ] || { echo "make_seeds: apt-get install dataset-fashion-mnist" >&2; exit 1; }
[ -d "$FORTUNES" ] || { echo "make_seeds: apt-get install fortunes" >&2; exit 1; }

rm -rf "$SEEDS"
mkdir -p "$SEEDS"
RUNS=$SEEDS/runs
TMP=$SEEDS/tmp
mkdir -p "$RUNS" "$TMP"

# ---- tiny training runs: every file format dtorch writes ------------------------------------
train() {
  local out=$1
  shift
  "$DTORCH" train --epochs 1 --nproc-per-node 2 --test-samples 64 --out "$RUNS/$out" \
    "$@" >>"$RUNS/log" 2>&1 || { echo "make_seeds: dtorch train $* failed, see $RUNS/log" >&2; exit 1; }
}
train mlp-ddp --model mnist-mlp --train-samples 128 --strategy ddp --optimizer adam
train mlp-zero1 --model mnist-mlp --train-samples 128 --strategy zero1
train gpt-ddp --model gpt-debug --data text --train-samples 64 --save-format safetensors
train gpt-zero1 --model gpt-debug --data text --train-samples 64 --strategy zero1 --optimizer adamw
train gpt-tp --model gpt-debug --data text --train-samples 64 --tp 2 --strategy zero1
train gpt-pp --model gpt-debug --data text --train-samples 64 --pp 2
train gpt-pp-zero --model gpt-debug --data text --train-samples 64 --pp 2 --strategy zero1 \
  --schedule interleaved

seed() {  # seed HARNESS FILE [NAME]
  mkdir -p "$SEEDS/$1"
  cp "$2" "$SEEDS/$1/${3:-$(basename "$2")}"
}

# ---- checkpoints ------------------------------------------------------------------------------
for f in "$RUNS"/gpt-ddp/checkpoint-*.dtc "$RUNS"/gpt-pp/pp*/checkpoint-*.dtc; do
  seed checkpoint "$f" "$(echo "${f#"$RUNS"/}" | tr / _)"
done
# checkpoint_payload_fuzz frames its input itself: the seeds are the payloads (the torch.save
# archive after the 24-byte header), all of gpt-debug (the model it loads them into).
python3 - "$RUNS/gpt-ddp" "$SEEDS/checkpoint_payload" <<'PY'
import glob, os, sys
os.makedirs(sys.argv[2], exist_ok=True)
for f in glob.glob(sys.argv[1] + "/checkpoint-*.dtc"):
    open(os.path.join(sys.argv[2], os.path.basename(f) + ".payload"), "wb").write(open(f, "rb").read()[24:])
PY
for f in "$RUNS"/gpt-zero1/model.pt "$RUNS"/gpt-pp/model.pt "$RUNS"/gpt-zero1/step-*/*.pt; do
  seed torch_save "$f" "$(echo "${f#"$RUNS"/}" | tr / _)"
done
seed safetensors "$RUNS/gpt-ddp/model.safetensors"
"$DTORCH" checkpoint consolidate "$RUNS/gpt-pp" "$TMP/pp.safetensors" >/dev/null
seed safetensors "$TMP/pp.safetensors" consolidated.safetensors
# One tensor of each dtype safetensors names, with __metadata__, as its Python writer lays it out.
python3 - "$SEEDS/safetensors/dtypes.safetensors" <<'PY'
import json, struct, sys
dtypes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
          "U8": 1, "BOOL": 1}
header, data = {"__metadata__": {"format": "pt"}}, b""
for i, (dtype, size) in enumerate(dtypes.items()):
    shape = [2, 3] if i % 2 else [5]
    n = shape[0] * (shape[1] if len(shape) > 1 else 1)
    header["t_" + dtype.lower()] = {"dtype": dtype, "shape": shape,
                                    "data_offsets": [len(data), len(data) + n * size]}
    data += bytes((j * 7 + i) % 2 if dtype == "BOOL" else (j * 7 + i) % 251 for j in range(n * size))
header["scalar"] = {"dtype": "F32", "shape": [], "data_offsets": [len(data), len(data) + 4]}
data += struct.pack("<f", 1.5)
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(text)) + text + data)
PY
for f in "$RUNS"/*/step-*/metadata.json "$RUNS"/*/*/step-*/metadata.json; do
  seed sharded_metadata "$f" "$(echo "${f#"$RUNS"/}" | tr / _)"
done
for f in "$RUNS"/*/pipeline.json; do
  seed pipeline_layout "$f" "$(echo "${f#"$RUNS"/}" | tr / _)"
done
seed tensor_parallel_layout "$RUNS/gpt-tp/tensor_parallel.json"
# Fixtures: the files the fuzzed metadata.json and tensor_parallel.json describe.
mkdir -p "$SEEDS/fixtures"
cp -r "$RUNS"/gpt-zero1/step-* "$SEEDS/fixtures/sharded"
mkdir -p "$SEEDS/fixtures/tensor_parallel" "$SEEDS/fixtures/pipeline"
cp -r "$RUNS"/gpt-tp/tp*-of-* "$SEEDS/fixtures/tensor_parallel/"
cp -r "$RUNS"/gpt-pp/pp*-of-* "$RUNS"/gpt-pp-zero/pp*-of-* "$SEEDS/fixtures/pipeline/"

# ---- configuration ----------------------------------------------------------------------------
for f in "$RUNS"/*/config.json; do
  seed run_config "$f" "$(echo "${f#"$RUNS"/}" | tr / _)"
done
# Machine files as `dtorch plan calibrate` writes them: a CPU node with its offload disk, and GPU
# nodes with the optional sections (rates by rows, convolutions, ring attention, overlap, inter-node links).
mkdir -p "$SEEDS/machine_file"
cat >"$SEEDS/machine_file/cpu.json" <<'JSON'
{"name": "cpu", "device": "cpu", "ranks_per_node": 2, "memory_per_rank_bytes": 12e9,
 "base_bytes_per_rank": 3e8, "matmul_flops": {"fp32": 6e10},
 "first_touch_seconds_per_byte": 2e-10, "adamw_seconds_per_parameter": 1e-9,
 "offload_disk": {"dir": "/nvme", "state_bytes_per_s": 1.4e9},
 "intra_node": {"allreduce": [{"ranks": 2, "latency_s": 2e-5, "bus_bytes_per_s": 5e9}],
                "reduce_scatter": [{"ranks": 2, "latency_s": 2e-5, "bus_bytes_per_s": 4e9}],
                "allgather": [{"ranks": 2, "latency_s": 2e-5, "bus_bytes_per_s": 4e9}],
                "p2p": [{"ranks": 2, "latency_s": 1e-5, "bus_bytes_per_s": 6e9}]}}
JSON
cat >"$SEEDS/machine_file/gpu.json" <<'JSON'
{"name": "gpu", "device": "cuda", "ranks_per_node": 4, "memory_per_rank_bytes": 8e10,
 "matmul_flops": {"fp32": 5e13, "bf16": 7e14},
 "matmul_by_rows": {"bf16": [{"rows": 64, "flops": 1e14}, {"rows": 4096, "flops": 6e14}]},
 "conv_flops": {"fp32": 3e13}, "lockstep_fraction": 0.05,
 "ring_attention": {"step_seconds": 1e-4, "seconds_per_score": 1e-12, "forward_share": 0.3},
 "overlap": {"zero2": 0.7, "zero3": 0.5},
 "intra_node": {"allreduce": [{"ranks": 2, "latency_s": 1e-5, "bus_bytes_per_s": 3e11},
                              {"ranks": 4, "latency_s": 2e-5, "bus_bytes_per_s": 2.5e11}],
                "reduce_scatter": [{"ranks": 4, "latency_s": 2e-5, "bus_bytes_per_s": 2e11}],
                "allgather": [{"ranks": 4, "latency_s": 2e-5, "bus_bytes_per_s": 2e11}],
                "p2p": [{"ranks": 2, "latency_s": 5e-6, "bus_bytes_per_s": 2e11}]},
 "inter_node": {"allreduce": [{"ranks": 4, "latency_s": 5e-5, "bus_bytes_per_s": 2e10}],
                "reduce_scatter": [{"ranks": 4, "latency_s": 5e-5, "bus_bytes_per_s": 2e10}],
                "allgather": [{"ranks": 4, "latency_s": 5e-5, "bus_bytes_per_s": 2e10}],
                "p2p": [{"ranks": 2, "latency_s": 3e-5, "bus_bytes_per_s": 2e10}]}}
JSON
for f in "$RUNS"/*/metrics.jsonl; do
  seed run_curves "$f" "$(echo "${f#"$RUNS"/}" | tr / _)"
done
# DeepSpeed files: the JSON texts of its tests, and ds_config.json files as the tutorials write
# them.
python3 - tests/train/config/deepspeed_config_test.cpp "$SEEDS/deepspeed_config" <<'PY'
import json, os, re, sys
os.makedirs(sys.argv[2], exist_ok=True)
texts = re.findall(r'R"\((.*?)\)"', open(sys.argv[1]).read(), re.S)
tutorial = [
    {"train_batch_size": 32, "gradient_accumulation_steps": 1,
     "optimizer": {"type": "Adam", "params": {"lr": 0.00015, "betas": [0.9, 0.999], "eps": 1e-8,
                                              "weight_decay": 0.01}},
     "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                  "warmup_num_steps": 1000}},
     "gradient_clipping": 1.0, "zero_optimization": {"stage": 2, "overlap_comm": True,
                                                     "reduce_bucket_size": 5e8},
     "steps_per_print": 10, "wall_clock_breakdown": False},
    {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
     "bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
     "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
     "tensorboard": {"enabled": True, "output_path": "tb/", "job_name": "run"}},
    {"train_batch_size": 16, "fp16": {"enabled": False, "loss_scale": 0,
                                      "initial_scale_power": 16, "loss_scale_window": 1000,
                                      "hysteresis": 2, "min_loss_scale": 1},
     "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
                                                  "cycle_first_step_size": 100,
                                                  "cycle_momentum": False}},
     "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}},
     "communication_data_type": "bf16"},
    {"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR",
     "params": {"total_num_steps": 100, "warmup_num_steps": 10, "warmup_min_ratio": 0.1,
                "cos_min_ratio": 0.01}}},
    {"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR",
     "params": {"total_num_steps": 100, "warmup_num_steps": 10, "warmup_type": "linear"}}},
]
texts += [json.dumps(t, indent=2) for t in tutorial]
for i, t in enumerate(t for t in texts if "{" in t):
    open(os.path.join(sys.argv[2], "ds%02d.json" % i), "w").write(t)
PY

# ---- data sets --------------------------------------------------------------------------------
python3 - "$MNIST" "$SEEDS" <<'PY'
import gzip, os, struct, sys
mnist, seeds = sys.argv[1], sys.argv[2]
idx, cifar = os.path.join(seeds, "idx"), os.path.join(seeds, "cifar10")
os.makedirs(idx, exist_ok=True)
os.makedirs(cifar, exist_ok=True)
images = gzip.open(os.path.join(mnist, "t10k-images-idx3-ubyte.gz")).read()
labels = gzip.open(os.path.join(mnist, "t10k-labels-idx1-ubyte.gz")).read()
def images_idx(n):  # the first n images, the header's count set to n
    return struct.pack(">IIII", 0x803, n, 28, 28) + images[16:16 + n * 784]
def labels_idx(n):
    return struct.pack(">II", 0x801, n) + labels[8:8 + n]
files = {"images-3": images_idx(3), "images-1": images_idx(1), "labels-100": labels_idx(100),
         "labels-0": labels_idx(0), "images-2d": struct.pack(">III", 0x802, 2, 784) + images[16:16 + 1568]}
for name, data in files.items():
    open(os.path.join(idx, name), "wb").write(data)
    open(os.path.join(idx, name + ".gz"), "wb").write(gzip.compress(data, mtime=0))
# A real file as it ships (5 KB).
open(os.path.join(idx, "t10k-labels-idx1-ubyte.gz"), "wb").write(
    open(os.path.join(mnist, "t10k-labels-idx1-ubyte.gz"), "rb").read())
# CIFAR-10 records (label byte, then 3 planes of 32 x 32) built from Fashion-MNIST's pixels.
def record(i):
    img = images[16 + i * 784:16 + (i + 1) * 784]
    plane = b"".join(img[r * 28:(r + 1) * 28] + bytes(4) for r in range(28)) + bytes(4 * 32)
    return bytes([labels[8 + i]]) + plane + plane[::-1] + bytes(b ^ 0xff for b in plane)
for n in (1, 2, 4):
    open(os.path.join(cifar, "batch-%d.bin" % n), "wb").write(b"".join(record(i) for i in range(n)))
PY
mkdir -p "$SEEDS/text"
for f in art computers linux tao; do  # the start of a few fortune files, and an index file
  [ -f "$FORTUNES/$f" ] && head -c 4096 "$FORTUNES/$f" >"$SEEDS/text/$f"
done
[ -f "$FORTUNES/tao.dat" ] && cp "$FORTUNES/tao.dat" "$SEEDS/text/tao.dat"
printf 'x' >"$SEEDS/text/one-byte"

# Images: libjpeg and libpng encode Fashion-MNIST pixels in the variants the decoder handles.
cat >"$TMP/encode.c" <<'C'
/* encode OUT W H COMPONENTS KIND(jpeg|jpeg-progressive|png|png16|png-palette) < raw pixels */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <png.h>
int main(int argc, char** argv) {
  const char* out = argv[1];
  int w = atoi(argv[2]), h = atoi(argv[3]), c = atoi(argv[4]);
  const char* kind = argv[5];
  unsigned char* px = malloc((size_t)w * h * c);
  if (fread(px, 1, (size_t)w * h * c, stdin) != (size_t)w * h * c) return 1;
  if (strncmp(kind, "jpeg", 4) == 0) {
    struct jpeg_compress_struct info;
    struct jpeg_error_mgr err;
    FILE* f = fopen(out, "wb");
    info.err = jpeg_std_error(&err);
    jpeg_create_compress(&info);
    jpeg_stdio_dest(&info, f);
    info.image_width = w;
    info.image_height = h;
    info.input_components = c;
    info.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&info);
    jpeg_set_quality(&info, 75, TRUE);
    if (strcmp(kind, "jpeg-progressive") == 0) jpeg_simple_progression(&info);
    jpeg_start_compress(&info, TRUE);
    for (int y = 0; y < h; ++y) {
      JSAMPROW row = px + (size_t)y * w * c;
      jpeg_write_scanlines(&info, &row, 1);
    }
    jpeg_finish_compress(&info);
    jpeg_destroy_compress(&info);
    fclose(f);
    return 0;
  }
  png_image png;
  memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = w;
  png.height = h;
  png.format = c == 1 ? PNG_FORMAT_GRAY : c == 2 ? PNG_FORMAT_GA : c == 3 ? PNG_FORMAT_RGB
                                                                        : PNG_FORMAT_RGBA;
  if (strcmp(kind, "png16") == 0) png.format |= PNG_FORMAT_FLAG_LINEAR;
  if (strcmp(kind, "png-palette") == 0) png.format |= PNG_FORMAT_FLAG_COLORMAP;
  if (strcmp(kind, "png16") == 0) { /* 16-bit samples: repeat each byte */
    unsigned short* wide = malloc((size_t)w * h * c * 2);
    for (size_t i = 0; i < (size_t)w * h * c; ++i) wide[i] = (unsigned short)(px[i] * 257);
    return png_image_write_to_file(&png, out, 0, wide, 0, NULL) ? 0 : 1;
  }
  if (png.format & PNG_FORMAT_FLAG_COLORMAP) { /* a grey palette */
    unsigned char map[256 * 3];
    for (int i = 0; i < 256; ++i) map[3 * i] = map[3 * i + 1] = map[3 * i + 2] = (unsigned char)i;
    png.format = PNG_FORMAT_RGB_COLORMAP;
    png.colormap_entries = 256;
    return png_image_write_to_file(&png, out, 0, px, 0, map) ? 0 : 1;
  }
  return png_image_write_to_file(&png, out, 0, px, 0, NULL) ? 0 : 1;
}
C
cc -O1 -o "$TMP/encode" "$TMP/encode.c" -ljpeg -lpng
mkdir -p "$SEEDS/image_decode"
python3 - "$MNIST" "$TMP/pixels" <<'PY'
import gzip, sys
images = gzip.open(sys.argv[1] + "/t10k-images-idx3-ubyte.gz").read()[16:16 + 4 * 784]
grey = images[:784]
open(sys.argv[2] + "-1", "wb").write(grey)
open(sys.argv[2] + "-2", "wb").write(bytes(v for p in grey for v in (p, 255 - p)))
open(sys.argv[2] + "-3", "wb").write(bytes(v for i in range(784) for v in images[i::784][:3]))
open(sys.argv[2] + "-4", "wb").write(bytes(v for i in range(784) for v in images[i::784][:4]))
PY
enc() { "$TMP/encode" "$SEEDS/image_decode/$1" 28 28 "$2" "$3" <"$TMP/pixels-$2"; }
enc grey.jpg 1 jpeg
enc rgb.jpg 3 jpeg
enc progressive.jpg 3 jpeg-progressive
enc grey.png 1 png
enc grey-alpha.png 2 png
enc rgb.png 3 png
enc rgba.png 4 png
enc rgb16.png 3 png16
enc palette.png 1 png-palette

rm -rf "$TMP"
for d in "$SEEDS"/*/; do
  [ "$(basename "$d")" = runs ] || [ "$(basename "$d")" = fixtures ] ||
    echo "$(basename "$d"): $(ls "$d" | wc -l) seeds"
done
