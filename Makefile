# The two commands: `make demo` and `make test`. Each installs what is missing first.
#
# TORCH picks the LibTorch, both first-class:
#   TORCH=debian (default)  Debian 12's libtorch-dev 1.13 (CPU, Gloo), from apt; build in build/
#   TORCH=pip               PyPI's torch 2.x wheel (CUDA, NCCL) in the virtual environment
#                           $(VENV); build in build-pip/. Its Python is the peer tests compare with.
# CXX_COMPILER picks the compiler: clang++ for Debian's LibTorch, the system's c++ (GCC) for the
# wheel's, so that .ci/run, which runs both, builds dtorch with both compilers. clang 14 compiles
# dtorch, whose compile time is mostly LibTorch's templates, in about 17% less CPU than GCC 12
# (565 s against 681 s for the library, the command line and the tests on LibTorch 1.13).
# SANITIZE=1 builds with clang, AddressSanitizer and UndefinedBehaviorSanitizer in a folder of its
# own (build-asan/, build-asan-pip/); `make test SANITIZE=1` then runs the unit and multirank
# suites (about 3x the plain suite's time; Note [Sanitized suite] in tests/lsan.supp).
TORCH ?= debian
VENV ?= .venv
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
VENV_PYTHON = $(abspath $(VENV))/bin/python
SANITIZE ?=
CTEST_FLAGS ?=
ifeq ($(SANITIZE),1)
ASAN_SUFFIX = -asan
CMAKE_FLAGS = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DDTORCH_SANITIZE=ON
SANITIZE_DEPS = scripts/install-deps clang
CTEST_FLAGS += -L "unit|multirank"
# Every report goes to a file of its own: a test that expects its command to fail would pass
# over a report on that command's stderr.
SANITIZER_REPORTS = $(abspath $(BUILD))/sanitizer-reports
export ASAN_OPTIONS ?= detect_leaks=1:log_path=$(SANITIZER_REPORTS)/asan
export LSAN_OPTIONS ?= suppressions=$(abspath tests/lsan.supp):print_suppressions=0
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1:log_path=$(SANITIZER_REPORTS)/ubsan
# Forked workers end in _exit, where LeakSanitizer does not look: the sanitized suite exec's the
# tests, their ranks, the command lines and their workers (Note [Forked workers], Note [Fork
# server], Note [Test server]).
export DTORCH_TEST_EXEC_RANKS = 1
export DTORCH_FORK_WORKERS = 0
# Fails the target when any process left a report, and says which kinds.
SANITIZER_CHECK = if [ -n "$$(ls -A $(SANITIZER_REPORTS))" ]; then \
  echo "make test SANITIZE=1: sanitizer reports in $(SANITIZER_REPORTS):"; \
  grep -h -m1 -E "ERROR:|runtime error:" $(SANITIZER_REPORTS)/* | sort | uniq -c; status=1; \
  else echo "make test SANITIZE=1: no sanitizer reports"; fi;
else
SANITIZE_DEPS = true
SANITIZER_CHECK =
endif

ifeq ($(TORCH),debian)
BUILD ?= build$(ASAN_SUFFIX)
# The tests compare with Debian's PyTorch 1.13 through a Python that also has what Debian does
# not package (safetensors, tensorboard, DeepSpeed): scripts/install-venv --debian.
DEBIAN_VENV ?= .venv-debian
TORCH_FLAGS =
CXX_COMPILER ?= clang++
TEST_FLAGS = -DDTORCH_PYTHON=$(abspath $(DEBIAN_VENV))/bin/python
VENV_DEPS = true
TEST_VENV_DEPS = scripts/install-deps venv && scripts/install-venv --debian $(DEBIAN_VENV) test
else ifeq ($(TORCH),pip)
BUILD ?= build$(ASAN_SUFFIX)-pip
TORCH_FLAGS = -DCMAKE_PREFIX_PATH="$$($(VENV_PYTHON) -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
  -DDTORCH_PYTHON=$(VENV_PYTHON)
VENV_DEPS = scripts/install-deps venv && scripts/install-venv $(VENV)
TEST_FLAGS =
TEST_VENV_DEPS = $(VENV_DEPS) test
else
$(error TORCH=$(TORCH) is not one of debian, pip)
endif
ifneq ($(CXX_COMPILER),)
TORCH_FLAGS += -DCMAKE_CXX_COMPILER=$(CXX_COMPILER)
endif
COMPILER_DEPS = $(if $(findstring clang,$(CXX_COMPILER)),clang)

.PHONY: all build demo test bench faults fuzz deps-build deps-test deps-bench format clean

all: build

deps-build:
	@scripts/install-deps build data $(COMPILER_DEPS)
	@$(VENV_DEPS) build
deps-test:
	@scripts/install-deps build data test $(COMPILER_DEPS)
	@$(TEST_VENV_DEPS)
# The benchmarks compare with PyTorch 1.13 (Debian) and 2.x (PyPI) whichever LibTorch is built.
deps-bench:
	@scripts/install-deps build data bench venv
	@scripts/install-venv $(VENV) bench

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) $(TORCH_FLAGS)

build: deps-build $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The demo builds the library and the command line only, not the test suite.
demo: deps-build $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target dtorch_cli
	$(BUILD)/dtorch train --model mnist-cnn --data fashion-mnist --epochs 2 --batch-size 64 \
	  --lr 0.01 --optimizer sgd --seed 1 --nproc-per-node 2 --out runs/demo --overwrite \
	  --print-every 50 --phase-times
	$(BUILD)/dtorch plot runs/demo --out runs/demo/curves.png --title "make demo: mnist-cnn on Fashion-MNIST, DDP on 2 ranks"

# Configures again (seconds), with the tests: a build folder that `make demo` configured before
# GoogleTest was installed, or one configured with -DDTORCH_BUILD_TESTS=OFF, has none yet. ctest
# fails on no tests rather than passing on them; its summary ends with the time per label, and
# scripts/skipped-tests then says why each skipped test was skipped. JOBS tests compute at a
# time, and two more may wait beside them (Note [Tests that wait] in tests/CMakeLists.txt).
test: deps-test
	@$(SANITIZE_DEPS)
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) $(TORCH_FLAGS) $(TEST_FLAGS) \
	  -DDTORCH_BUILD_TESTS=ON
	cmake --build $(BUILD) -j $(JOBS)
ifeq ($(SANITIZE),1)
	rm -rf $(SANITIZER_REPORTS) && mkdir -p $(SANITIZER_REPORTS)
endif
	printf '{"version": {"major": 1, "minor": 0}, "local": [{"cpus": [{"id": "0", "slots": %d}]}]}\n' \
	  $(JOBS) > $(BUILD)/cpus.json
	cd $(BUILD) && ctest --output-on-failure --no-tests=error -j $$(( $(JOBS) + 2 )) \
	  --resource-spec-file cpus.json --timeout 900 $(CTEST_FLAGS); status=$$?; \
	  $(abspath scripts/skipped-tests) .; $(SANITIZER_CHECK) exit $$status

# dtorch on both LibTorch versions: one rank's training step against PyTorch eager's with fused
# AdamW; DDP on Debian's 1.13 against PyTorch 1.13 and 2.x; Gloo's
# own collectives (2.x only) against dtorch's; the sharded strategies on LibTorch 2.x against
# PyTorch 2.x's FSDP, ZeroRedundancyOptimizer and DeepSpeed on the same torch; tensor
# parallelism against PyTorch 2.x's parallelize_module; pipelines against its pipelining;
# activation checkpointing against torch.utils.checkpoint; dtorch train against Lightning's
# Trainer; the image loader against torchvision's DataLoader; gpt-large under ZeRO-3; on a machine
# with a GPU, one GPU's training step against PyTorch eager's; dtorch plan's predictions
# against the layouts it ranks, run.
bench: deps-bench
	$(MAKE) build TORCH=debian
	$(MAKE) build TORCH=pip
	bench/bench_step.py --dtorch build-pip/dtorch --python2 $(VENV_PYTHON)
	bench/bench_host_adam.py --dtorch build-pip/dtorch --python2 $(VENV_PYTHON)
	bench/bench_ddp.py --dtorch build/dtorch --dtorch2 build-pip/dtorch --python2 $(VENV_PYTHON)
	bench/bench_collectives.py --dtorch build-pip/dtorch
	bench/bench_memory.py --dtorch build-pip/dtorch --python2 $(VENV_PYTHON) --nprocs 2
	bench/bench_tensor_parallel.py --dtorch build-pip/dtorch --python2 $(VENV_PYTHON)
	bench/bench_pipeline.py --dtorch build-pip/dtorch --python2 $(VENV_PYTHON)
	bench/bench_activation_checkpointing.py --dtorch build-pip/dtorch --python2 $(VENV_PYTHON)
	bench/bench_context_parallel.py --dtorch build-pip/dtorch --python2 $(VENV_PYTHON)
	bench/bench_checkpoint.py --dtorch build-pip/dtorch --python2 $(VENV_PYTHON)
	bench/bench_plan.py --dtorch build-pip/dtorch
	bench/bench_lightning.py --dtorch build-pip/dtorch --python2 $(VENV_PYTHON)
	bench/bench_data.py --dtorch build/dtorch
	bench/bench_gpt_large.py --dtorch build-pip/dtorch
	@if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then \
	  $(VENV_PYTHON) bench/bench_gpu.py --dtorch build-pip/dtorch --publish BENCHMARKS.md; \
	else echo "make bench: nvidia-smi finds no GPU here: bench/bench_gpu.py skipped"; fi

# The fault matrix (not in CI; about 45 minutes on 2 cores): for ddp, zero3, tp 2, pp 2 (1f1b
# and zb) and an elastic 2:3 job, at a random moment kill -9 or SIGSTOP one random worker,
# SIGTERM or SIGUSR1 a launcher, kill a worker inside a checkpoint write, or hold the store's
# port as a stranger, 20 trials each; every trial must end within DTORCH_TIMEOUT + 10 s naming
# the cause, leave no process or /dev/shm segment behind, and resume to the uninterrupted
# run's result (bench/faults.py says how).
faults:
	$(MAKE) build TORCH=debian
	nice -n 10 bench/faults.py --dtorch build/dtorch --trials 20 --markdown docs/reliability.md

# The readers' libFuzzer harnesses (tests/fuzz, clang with ASan and UBSan): each for FUZZ_SECONDS
# (default 60) on seeds made from real files; findings go to build-fuzz/findings. CI runs the same
# harnesses for a few seconds of random mutations each (FuzzSmoke.*, Note [Two drivers]).
FUZZ_SECONDS ?= 60
fuzz:
	tests/fuzz/run.sh $(FUZZ_SECONDS)

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp')

clean:
	rm -rf build build-pip
