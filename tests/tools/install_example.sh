#!/usr/bin/env bash
# Installs dtorch as a CMake package into a temporary prefix, builds examples/ddp_custom_model
# against it with find_package(dtorch), and runs it on 2 ranks under `dtorch launch`.
set -euo pipefail
build=$1
src=$2
mkdir -p "$build/test-scratch"
work=$(mktemp -d "$build/test-scratch/install-XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# The compiler that built the library (clang for make test SANITIZE=1, whose runtimes it links).
compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake -S "$src/examples/ddp_custom_model" -B "$work/example" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
  ${compiler:+-DCMAKE_CXX_COMPILER="$compiler"} >/dev/null
cmake --build "$work/example" >/dev/null
out=$("$work/prefix/bin/dtorch" launch --standalone --nproc-per-node 2 -- "$work/example/ddp_custom_model")
echo "$out"
grep -q "\[n0 r0\] ranks 2 loss" <<<"$out"
