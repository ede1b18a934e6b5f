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
         lib/pkgconfig/cairn.pc bin/cairn bin/cairnd; do
  [ -e "$prefix/$f" ] || { echo "install_test: missing $f in the installed tree" >&2; exit 1; }
done

cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null

export CAIRN_PERSISTENT=$tmp/store CAIRN_SCRATCH=$tmp/scratch
export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$tmp/consumer/consumer"
"$tmp/consumer/consumer_cpp"
# engine_host = daemon finds the installed cairnd beside libcairn (<prefix>/bin).
CAIRN_ENGINE_HOST=daemon CAIRN_RUN=daemon "$tmp/consumer/consumer"

# pkg-config route, as a Makefile user would build. A program without MPI is
# built with the plain compiler: libcairn does not link libmpi (its MPI plugin does).
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cc -o "$tmp/consumer_pc" "$src/tests/install/consumer/consumer.c" $(pkg-config --cflags --libs cairn)
CAIRN_RUN=pc "$tmp/consumer_pc"

# The Fortran module, when this build has it (CAIRN_ENABLE_FORTRAN): with
# find_package(cairn COMPONENTS fortran) and with pkg-config and mpifort.
if grep -q '^CAIRN_ENABLE_FORTRAN:BOOL=ON' "$build/CMakeCache.txt"; then
  for f in include/cairn/fortran/cairn.mod lib/libcairn_fortran.so lib/pkgconfig/cairn-fortran.pc \
           lib/cmake/cairn/cairnFortranTargets.cmake; do
    [ -e "$prefix/$f" ] || { echo "install_test: missing $f in the installed tree" >&2; exit 1; }
  done
  cmake -S "$src/tests/install/consumer_fortran" -B "$tmp/consumer_fortran" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$tmp/consumer_fortran" >/dev/null
  CAIRN_RUN=fortran "$tmp/consumer_fortran/consumer_fortran"
  mpifort -o "$tmp/consumer_fortran_pc" "$src/tests/install/consumer_fortran/consumer.f90" \
    $(pkg-config --cflags --libs cairn-fortran)
  CAIRN_RUN=fortran_pc "$tmp/consumer_fortran_pc"
  # A C-only project still finds cairn when the Fortran targets are installed
  # (the consumer above, project(... C CXX)), and asking it for the component
  # without Fortran says why.
  mkdir -p "$tmp/nofortran"
  printf 'cmake_minimum_required(VERSION 3.20)\nproject(p C)\nfind_package(cairn REQUIRED COMPONENTS fortran)\n' \
    > "$tmp/nofortran/CMakeLists.txt"
  if cmake -S "$tmp/nofortran" -B "$tmp/nofortran/b" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/nofortran.log" 2>&1 ||
     ! grep -q "enables Fortran" "$tmp/nofortran.log"; then
    echo "install_test: find_package(cairn COMPONENTS fortran) without Fortran should fail saying why" >&2
    cat "$tmp/nofortran.log" >&2
    exit 1
  fi
fi

# The drop-ins of other checkpoint libraries (compat/, built with MPI): their
# headers and libraries are installed, and programs built with nothing but
# -I<prefix>/include -L<prefix>/lib -lveloc-client / -lscr (as VELOC and SCR
# applications are) link and run.
if grep -q '^CAIRN_ENABLE_MPI:BOOL=ON' "$build/CMakeCache.txt"; then
  # (their cairn_init_mpi loads the MPI plugin installed beside libcairn)
  for f in include/veloc.h include/veloc/defs.h include/veloc.hpp include/scr.h include/scrf.h \
           lib/libveloc-client.so lib/libscr.so lib/libscrf.so lib/libcairn-mpi.so; do
    [ -e "$prefix/$f" ] || { echo "install_test: missing $f in the installed tree" >&2; exit 1; }
  done
  # Linked as VELOC's and SCR's documentation says (-L and -rpath of the
  # prefix) and run without LD_LIBRARY_PATH: libcairn is found through the
  # drop-ins' own runpath ($ORIGIN).
  mpicc -o "$tmp/veloc_consumer" "$src/tests/install/consumer_compat/veloc_consumer.c" \
    -I"$prefix/include" -L"$prefix/lib" -Wl,-rpath,"$prefix/lib" -lveloc-client
  mpicc -o "$tmp/scr_consumer" "$src/tests/install/consumer_compat/scr_consumer.c" \
    -I"$prefix/include" -L"$prefix/lib" -Wl,-rpath,"$prefix/lib" -lscr
  for lib in libveloc-client.so libscr.so; do
    readelf -d "$prefix/lib/$lib" | grep -q 'RUNPATH.*\$ORIGIN' ||
      { echo "install_test: $lib has no \$ORIGIN in its runpath" >&2; readelf -d "$prefix/lib/$lib" >&2; exit 1; }
  done
  printf 'scratch = %s\npersistent = %s\nmode = sync\n' "$tmp/veloc-scratch" "$tmp/veloc-store" > "$tmp/veloc.cfg"
  CAIRN_RUN=veloc env -u LD_LIBRARY_PATH "$tmp/veloc_consumer" "$tmp/veloc.cfg" | grep -q "veloc consumer: ok" ||
    { echo "install_test: the VELOC consumer failed" >&2; exit 1; }
  (cd "$tmp" && env -u CAIRN_PERSISTENT -u CAIRN_SCRATCH -u LD_LIBRARY_PATH SCR_PREFIX="$tmp/scr" SCR_CACHE_BASE="$tmp/scr-cache" "$tmp/scr_consumer") |
    grep -q "scr consumer: ok" || { echo "install_test: the SCR consumer failed" >&2; exit 1; }
fi

# The installed CLI sees what the consumers wrote.
"$prefix/bin/cairn" ls "$tmp/store" | grep -q consumer || { echo "install_test: cairn ls does not list the checkpoint" >&2; exit 1; }
echo "install_test: ok"
