# Entry points for a fresh Debian 12 machine:
#   make demo   install what it needs (scripts/install-deps.sh demo), build only what it
#               runs, run the checkpoint/kill/restart demonstration (then the same
#               with remote checkpoint agents)
#   make test   install dependencies, build, run every test (and the sanitized build's
#               unit tests and fuzz targets: scripts/sanitize.sh)
#   make demo-history   runs compared version by version (cairn diff, Python report)
BUILD ?= build
# Open MPI refuses to run as root unless told; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT = 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM = 1
JOBS ?= $(shell nproc)

.PHONY: all deps build demo demo-history test bench clean

all: build

deps:
	@scripts/install-deps.sh

# Line tables only (-g1): backtraces and profiles keep file and line, and gcc
# compiles a fifth faster than with full -g (docs/performance.md, "Build, CI
# and the library").
build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$(CURDIR)/.venv/bin/python \
	  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Only what the demonstration runs: heat2d, the cairn CLI, cairnd and
# cairn-agent, from the packages `install-deps.sh demo` installs, optimized
# without debug information (a third less compile time), in a build
# directory of its own.
DEMO_BUILD ?= build-demo
demo:
	@scripts/install-deps.sh demo
	@cmake -S . -B $(DEMO_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" \
	  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DCAIRN_BUILD_TESTS=OFF -DCAIRN_BUILD_BENCH=OFF \
	  -DCAIRN_BUILD_COMPAT=OFF -DCAIRN_ENABLE_FORTRAN=OFF >/dev/null
	@cmake --build $(DEMO_BUILD) -j $(JOBS) --target heat2d cairn_cli cairnd cairn_agent
	@scripts/demo.sh $(DEMO_BUILD)
	@scripts/demo-agents.sh $(DEMO_BUILD)

demo-history: build
	@scripts/demo-history.sh $(BUILD)

test: build
	@scripts/test.sh $(BUILD)

# Benchmarks (results and their reading: docs/benchmarks.md).
bench: build
	@python3 bench/run_core.py --build $(BUILD)
	@python3 bench/run_history.py --build $(BUILD)
	@python3 bench/run_agents.py --build $(BUILD)

clean:
	rm -rf $(BUILD)
