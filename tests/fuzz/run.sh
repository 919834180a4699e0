#!/usr/bin/env bash
# Builds the fuzz harnesses (tests/fuzz/*_fuzz.cpp) with clang, libFuzzer, ASan and UBSan in a
# build folder of their own, makes their seeds when there are none, and fuzzes each in turn for
# SECONDS; then prints per harness the inputs executed and whether it was clean. Inputs that
# found something are kept in $BUILD/findings/HARNESS/ (crash-*, timeout-*, oom-*,
# leak-*), each with the first lines that say what it is.
#
# Usage: tests/fuzz/run.sh [SECONDS] [HARNESS...]     (default 60 s, every harness)
#   BUILD=build-fuzz  JOBS=1  NICE=10      where and how gently to build and run
#   LEAKS=1|0 (default 1)   LeakSanitizer (Note [Leaks] below)
#   FORK=1 (default)        libFuzzer's -fork=1: a finding is kept and fuzzing goes on; 0: the
#                           first one stops the harness
# Reproduce a finding: build-fuzz/fuzz/HARNESS build-fuzz/findings/HARNESS/crash-...
#
# Note [Leaks]: LibTorch's allocations for the life of the process (operator registry, thread
# pools) are still reachable when libFuzzer checks an input, so LeakSanitizer stays quiet about
# them (20 s of every harness: no report but real leaks); LEAKS=0 turns it off.
set -uo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-60}
shift || true
BUILD=${BUILD:-build-fuzz}
JOBS=${JOBS:-1}
NICE=${NICE:-10}
LEAKS=${LEAKS:-1}
FORK=${FORK:-1}

if [ ! -f "$BUILD/build.ninja" ]; then
  nice -n "$NICE" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTORCH_FUZZ=ON -DDTORCH_BUILD_TESTS=OFF \
    -DDTORCH_BUILD_TOOLS=OFF >/dev/null || exit 1
fi
nice -n "$NICE" cmake --build "$BUILD" -j "$JOBS" --target dtorch_fuzz || exit 1
[ -d "$BUILD/seeds/fixtures" ] || tests/fuzz/make_seeds.sh "$BUILD/seeds" || exit 1

if [ $# -gt 0 ]; then
  HARNESSES=("$@")
else
  HARNESSES=()
  for f in tests/fuzz/*_fuzz.cpp; do HARNESSES+=("$(basename "$f" .cpp)"); done
fi
export DTORCH_FUZZ_SEEDS=$PWD/$BUILD/seeds
# The harnesses' scratch files (tmpfs), with those of processes that crashed before cleaning up.
DTORCH_FUZZ_SCRATCH=$(mktemp -d /dev/shm/dtorch-fuzz-run.XXXXXX) || exit 1
export DTORCH_FUZZ_SCRATCH
trap 'rm -rf "$DTORCH_FUZZ_SCRATCH"' EXIT
# UBSan's reports are fatal in the build (-fno-sanitize-recover); stack traces for them too.
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=$LEAKS}

# What a finding is, in three lines: the exception or the sanitizer's report, the exception's
# what(), and the stack: its top frame and the first of dtorch's own (function, file:line).
what_is() {  # what_is BINARY INPUT
  local out frames
  # The slow unwinder: LibTorch has no frame pointers, and a leak's stack ends in it otherwise.
  out=$(ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0 timeout 60 "$1" -timeout=10 \
    -detect_leaks="$LEAKS" "$2" 2>&1)
  echo "$out" | grep -m1 -E "terminate called|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:" |
    sed -E 's/==[0-9]+== ?//; s/ (on|at) (address|pc) .*//; s/ \(used: .*//'
  echo "$out" | grep -m1 "what():" | sed -E 's/^ +//'
  echo "$out" | python3 -c '
import re, sys
skip = re.compile(r"^(__sanitizer|__interceptor|__asan|__ubsan|__cxa|__gnu_cxx|fuzzer::|std::terminate|"
                  r"abort|raise|__pthread|__libc|_start|main$|LLVMFuzzerTestOneInput|operator new|"
                  r"malloc|calloc|std::vector|std::__|void std::|int dtorch::fuzz::|dtorch::fuzz::)")
frames = []
for line in sys.stdin:
    m = re.match(r"\s+#\d+ 0x[0-9a-f]+ (?:in (.*?) )?(\S+?)(?: \(BuildId: \w+\))?$", line)
    if not m:
        continue
    func, where = m.group(1) or "", m.group(2)
    if "libc.so" in where or "libstdc++" in where:
        continue
    # The function without its arguments and template arguments.
    depth, name = 0, ""
    for i, ch in enumerate(func):
        if ch in "(<":
            if depth == 0 and func.startswith("(anonymous namespace)", i):
                name += "(anonymous)"
            depth += 1
        elif ch in ")>":
            depth -= 1
        elif depth == 0:
            name += ch
    name = name.strip()
    if skip.match(name):
        continue
    frames.append((name or "?") + " " + where.strip("()"))
top = frames[0] if frames else "?"
own = next((f for f in frames if f.startswith("dtorch::")), "?")
print("  top:    " + top)
print("  dtorch: " + own)
'
}


# The distinct findings among INPUTS of FOLDER (same first line, same dtorch frame), each with
# how many inputs found it, the smallest of them, and what it is (from its .txt).
distinct() {  # distinct FOLDER INPUT...
  local dir=$1 f
  shift
  for f in "$@"; do
    printf '%s|%s|%s|%s %s\n' "$(sed -n 1p "$dir/$f.txt")" "$(grep -m1 '^  dtorch: ' "$dir/$f.txt")" \
      "$(grep -m1 '^  top: ' "$dir/$f.txt")" "$(stat -c %s "$dir/$f")" "$f"
  done | sort -t'|' -k1,2 -k4n | awk -F'|' '
    { key = $1 "|" $2; n[key]++
      if (!(key in first)) { first[key] = $4; top[key] = $3; order[++k] = key } }
    END { for (i = 1; i <= k; i++) { key = order[i]; split(key, p, "|"); split(first[key], s, " ")
            printf "    %d input(s), smallest %s (%s bytes): %s\n    %s\n    %s\n",
                   n[key], s[2], s[1], p[1], top[key], p[2] } }'
}

summary=()
for h in "${HARNESSES[@]}"; do
  bin=$BUILD/fuzz/$h
  name=${h%_fuzz}
  [ -x "$bin" ] || { summary+=("$h: not built"); continue; }
  corpus=$BUILD/corpus/$name
  findings=$BUILD/findings/$h
  mkdir -p "$corpus" "$findings"
  log=$BUILD/logs/$h.log
  mkdir -p "$(dirname "$log")"
  before=$(ls "$findings" | grep -v '\.txt$' | sort)
  fork_flags=()
  [ "$FORK" = 1 ] && fork_flags=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  echo "== $h: $SECS s (log $log)"
  # Seeds as large as a checkpoint (300 KB) must fit: -max_len follows the largest seed.
  max_len=$(find "$BUILD/seeds/$name" -type f -printf '%s\n' | sort -n | tail -1)
  nice -n "$NICE" "$bin" "$corpus" "$BUILD/seeds/$name" -max_total_time="$SECS" -timeout=10 \
    -max_len="$(( ${max_len:-4096} > 4096 ? max_len : 4096 ))" -detect_leaks="$LEAKS" \
    -close_fd_mask=1 -print_final_stats=1 -artifact_prefix="$findings/" "${fork_flags[@]}" \
    >"$log" 2>&1
  # Executions: the last progress line of fork mode ("#N: cov: ...") or the final stats.
  execs=$(grep -oE "stat::number_of_executed_units: [0-9]+" "$log" | tail -1 | grep -oE "[0-9]+$")
  [ -n "$execs" ] || execs=$(grep -oE "^#[0-9]+" "$log" | tail -1 | tr -d '#')
  new=$(comm -13 <(echo "$before") <(ls "$findings" | grep -v '\.txt$' | sort))
  if [ -z "$new" ]; then
    summary+=("$h: ${execs:-?} executions, clean")
    rmdir "$findings" 2>/dev/null
  else
    summary+=("$h: ${execs:-?} executions, $(echo "$new" | wc -l) finding(s) in $findings")
    for f in $new; do
      what_is "$bin" "$findings/$f" >"$findings/$f.txt"
    done
    distinct "$findings" $new >"$BUILD/logs/$h.findings"
    while IFS= read -r line; do summary+=("$line"); done <"$BUILD/logs/$h.findings"
  fi
done
echo
printf '%s\n' "${summary[@]}"
