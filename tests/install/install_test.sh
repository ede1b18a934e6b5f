#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, checks the installed layout,
# builds consumers with find_package(cairn) and with pkg-config, and runs them.
# usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d /tmp/cairn-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/cairn.h include/cairn_mpi.h lib/libcairn.so lib/cmake/cairn/cairnConfig.cmake \
         lib/pkgconfig/cairn.pc bin/cairn; do
  [ -e "$prefix/$f" ] || { echo "install_test: missing $f in the installed tree" >&2; exit 1; }
done

cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null

export CAIRN_PERSISTENT=$tmp/store CAIRN_SCRATCH=$tmp/scratch
export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$tmp/consumer/consumer"
"$tmp/consumer/consumer_cpp"

# pkg-config route, as a Makefile user would build. libcairn links MPI, so use mpicc.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
mpicc -o "$tmp/consumer_pc" "$src/tests/install/consumer/consumer.c" $(pkg-config --cflags --libs cairn)
CAIRN_RUN=pc "$tmp/consumer_pc"

# The installed CLI sees what the consumers wrote.
"$prefix/bin/cairn" ls "$tmp/store" | grep -q consumer || { echo "install_test: cairn ls does not list the checkpoint" >&2; exit 1; }
echo "install_test: ok"
