#!/usr/bin/env bash
# Installs what cairn needs on Debian 12 (apt) and a Python venv for the tests.
# Idempotent: does nothing that is already done.
#   scripts/install-deps.sh        everything: the build, the tests (CephFS,
#                                  Slurm, clang, gfortran, .venv with torch)
#   scripts/install-deps.sh demo   what `make demo` builds and runs: compilers,
#                                  MPI and the libraries libcairn links; no venv
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-all}
case "$profile" in all|demo) ;; *) echo "usage: $0 [demo]" >&2; exit 2 ;; esac

packages=(build-essential cmake ninja-build pkg-config
          libopenmpi-dev openmpi-bin
          libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libxxhash-dev libsqlite3-dev
          python3
          libfabric-dev libfabric-bin
          libsodium-dev
          libzstd-dev
          # erasure coding of the node-loss redundancy level (src/redundancy)
          libisal-dev
          # the topology for the placement of engine threads (src/util/cpu.cpp)
          libhwloc-dev)
if [ "$profile" = all ]; then
  packages+=(git sqlite3 libgtest-dev python3-venv python3-dev
             gfortran
             # the single-host CephFS of the tests (tests/support_py/cephfs.py)
             ceph-mon ceph-osd ceph-mds ceph-mgr ceph-fuse fuse3 attr
             # the single-host Slurm of the tests (tests/support_py/slurm.py)
             slurm-wlm munge
             # the sanitized build and its libFuzzer targets (scripts/sanitize.sh)
             clang libclang-rt-14-dev llvm)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ "$profile" = demo ] && exit 0

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import pytest" 2>/dev/null; then
  echo "install-deps: creating .venv with pytest"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check pytest
fi

# The OpenMetrics parser the metrics test checks the textfiles with.
if ! .venv/bin/python -c "import prometheus_client" 2>/dev/null; then
  echo "install-deps: installing prometheus_client into .venv"
  .venv/bin/pip install -q --disable-pip-version-check prometheus_client
fi

# The FUSE file system of the power-loss campaign (tests/fault/lossy_fs.py),
# over the system's libfuse3 (package fuse3).
if ! .venv/bin/python -c "import mfusepy" 2>/dev/null; then
  echo "install-deps: installing mfusepy into .venv"
  .venv/bin/pip install -q --disable-pip-version-check mfusepy
fi

# The analysis package (bindings/python, imported as `cairn`) with numpy,
# matplotlib, xxhash and cffi (the package reads stores through libcairn), installed editable so
# that .venv always runs this checkout's code. Skipped when .venv already
# imports this checkout's package.
if ! .venv/bin/python - "$PWD/bindings/python" 2>/dev/null <<'PY'
import os, sys
import numpy, matplotlib, xxhash, cffi, cairn
root = os.path.realpath(sys.argv[1])
sys.exit(0 if os.path.realpath(cairn.__file__).startswith(root + os.sep) else 1)
PY
then
  echo "install-deps: installing the cairn Python package (bindings/python) into .venv"
  .venv/bin/pip install -q --disable-pip-version-check numpy matplotlib xxhash cffi
  .venv/bin/pip install -q --disable-pip-version-check -e bindings/python
fi

# The writer API (cairn.Checkpointer) calls libcairn through cffi; its MPI tests
# use mpi4py. Its binary wheel loads the system's libmpi (Open MPI 4.1 here) at
# run time, so that mpi4py and libcairn share one MPI library; where it cannot,
# mpi4py is built from source against libopenmpi-dev (about 6 minutes).
if ! .venv/bin/python -c "import cffi; from mpi4py import MPI" 2>/dev/null; then
  echo "install-deps: installing cffi and mpi4py (over the system MPI) into .venv"
  .venv/bin/pip install -q --disable-pip-version-check cffi
  .venv/bin/pip install -q --disable-pip-version-check --only-binary mpi4py mpi4py || true
  if ! .venv/bin/python -c "from mpi4py import MPI" 2>/dev/null; then
    .venv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-binary mpi4py mpi4py
  fi
fi

# PyTorch, for the tests of cairn.pytorch (tests/python_torch). PyPI's wheel
# is the only one reachable here; it brings CUDA's libraries (about 5 GB
# installed, under a minute), though the tests use CPU tensors only.
# CAIRN_SKIP_TORCH=1 leaves it out (the suite then reports python_torch skipped).
if [ "${CAIRN_SKIP_TORCH:-0}" != 1 ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "install-deps: installing torch into .venv (for the cairn.pytorch tests)"
  .venv/bin/pip install -q --disable-pip-version-check torch
fi
