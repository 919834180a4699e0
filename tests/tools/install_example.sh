#!/usr/bin/env bash
# Installs dtorch as a CMake package into a temporary prefix, builds examples/EXAMPLE against it
# with find_package(dtorch), and runs it under `dtorch launch`:
#   ddp_custom_model  on 2 ranks;
#   your_transformer  alone, then on 4 ranks as ZeRO-3 x tp 2 with recomputation and as pp 2 x
#                     dp 2: every step's loss equals the one rank's, and under ZeRO-3 every
#                     rank holds the bytes of 1/dp of each unit.
set -euo pipefail
build=$1
src=$2
example=$3
mkdir -p "$build/test-scratch"
work=$(mktemp -d "$build/test-scratch/install-XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# The compiler that built the library (clang for make test SANITIZE=1, whose runtimes it links).
compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
# No optimisation: the examples' models are tiny, and their compile is most of this test.
cmake -S "$src/examples/$example" -B "$work/example" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE= \
  ${compiler:+-DCMAKE_CXX_COMPILER="$compiler"} >/dev/null
cmake --build "$work/example" >/dev/null
program=$work/example/$example
launch() { "$work/prefix/bin/dtorch" launch --standalone "$@"; }

case $example in
ddp_custom_model)
  out=$(launch --nproc-per-node 2 -- "$program")
  echo "$out"
  grep -q "\[n0 r0\] ranks 2 loss" <<<"$out"
  ;;
your_transformer)
  alone=$("$program")
  echo "$alone"
  # "step K loss X" lines (without the launcher's rank prefix) against the one rank's.
  same_losses() {
    awk 'NR == FNR { if ($1 == "step") want[$2] = $4; next }
         { sub(/^\[n0 r0\] /, "") }
         $1 == "step" { n++; d = $4 - want[$2]; if (d < 0) d = -d
                        if (d > 1e-4 * want[$2]) { print "step " $2 ": loss " $4 ", alone " want[$2]; bad = 1 } }
         END { if (n != length(want) || n == 0) { print n " steps, alone " length(want); bad = 1 }
               exit bad }' <(echo "$alone") <(echo "$1")
  }
  zero3=$(launch --nproc-per-node 4 -- "$program" --zero3 --tp 2 --ac)
  echo "$zero3"
  same_losses "$zero3"
  # Each rank: "parameter bytes N (ZeRO-3's 1/2 of each unit: N)".
  [ "$(grep -cE "zero3 \(5 units\).*parameter bytes ([0-9]+) \(ZeRO-3's 1/2 of each unit: \1\)" \
    <<<"$zero3")" = 4 ]
  pipeline=$(launch --nproc-per-node 4 -- "$program" --pp 2)
  echo "$pipeline"
  same_losses "$pipeline"
  ;;
*)
  echo "install_example.sh: unknown example '$example'" >&2
  exit 2
  ;;
esac
