# The two commands: `make demo` and `make test`. Each installs what is missing first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all build demo test bench deps-build deps-test deps-bench format clean

all: build

deps-build:
	@scripts/install-deps build data
deps-test:
	@scripts/install-deps build data test
deps-bench:
	@scripts/install-deps build data bench

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: deps-build $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/dtorch train --model mnist-cnn --data fashion-mnist --epochs 2 --batch-size 64 \
	  --lr 0.01 --optimizer sgd --seed 1 --nproc-per-node 2 --out runs/demo

test: deps-test $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

bench: deps-bench build
	bench/bench_ddp.py --dtorch $(BUILD)/dtorch
	bench/bench_memory.py --dtorch $(BUILD)/dtorch

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp')

clean:
	rm -rf $(BUILD)
