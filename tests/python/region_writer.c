/* region_writer: a single-process cairn client that checkpoints one region of
 * every type, shape and storage order the Python package must read back
 * (tests/python/test_cairn_python.py). Configured by the environment
 * (CAIRN_PERSISTENT, CAIRN_SCRATCH, CAIRN_RUN, ...).
 *
 * usage: region_writer [--big] VERSION...   checkpoints "w" once per version given
 *
 * --big adds a region that compresses (tests of compressed shards):
 *   big     float64 256 x 256                a plate heated from its first row:
 *           exp(-i / 20) * sin(j / 40) + v for the first 64 rows, 0 below
 *
 * Values (k = linear index in memory order, v = the version):
 *   u8      uint8   [10]                     k + v
 *   bytes   byte    [16]                     255 - k
 *   i16     int16   2 x 3                    -(k + v)
 *   u16     uint16  [5]                      65535 - k
 *   i32     int32   4 x 5                    1000 k - 7 + v
 *   u32     uint32  [4]                      4000000000 + k
 *   i64     int64   [3]                      (k - 1) * 10^15 + v
 *   u64     uint64  [2]                      2^63 + k
 *   f32     float32 2 x 3 x 4                0.5 k + v
 *   f64     float64 6 x 7                    k / 7.0 + v
 *   fortran float64 3 x 5, column-major      k + v          (element (i, j) at k = i + 3 j)
 *   block   float64 block of a global 8 x 6 array: start (2, 1), count 3 x 4,
 *           from a 5 x 6 buffer at (1, 1); buffer[k] = 1000 + k + v
 *   fblock  float64 column-major block of a global 6 x 4 array: start (1, 0),
 *           count 3 x 2, from a 5 x 3 (Fortran) buffer at (1, 1);
 *           buffer[k] = 2000 + k + v, element (i, j) at k = i + 5 j
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cairn.h"

#define CHECK(call)                                                                        \
  do {                                                                                     \
    int rc_ = (call);                                                                      \
    if (rc_ != CAIRN_OK) {                                                                 \
      fprintf(stderr, "region_writer: %s: %s: %s\n", #call, cairn_strerror(rc_), cairn_last_error()); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

int main(int argc, char **argv) {
  int first = 1;
  const int big = argc > 1 && strcmp(argv[1], "--big") == 0;
  if (big) first = 2;
  if (argc <= first) {
    fprintf(stderr, "usage: region_writer [--big] VERSION...\n");
    return 2;
  }
  static double big_mem[256 * 256];
  static uint8_t u8[10], bytes[16];
  static int16_t i16[6];
  static uint16_t u16[5];
  static int32_t i32[20];
  static uint32_t u32[4];
  static int64_t i64[3];
  static uint64_t u64[2];
  static float f32[24];
  static double f64[42], fortran[15], block_mem[30], fblock_mem[15];

  cairn_t *c = NULL;
  CHECK(cairn_init(NULL, &c));
  const uint64_t d_i16[2] = {2, 3}, d_i32[2] = {4, 5}, d_f32[3] = {2, 3, 4}, d_f64[2] = {6, 7},
                 d_fortran[2] = {3, 5};
  CHECK(cairn_protect(c, "u8", u8, 10, CAIRN_UINT8));
  CHECK(cairn_protect(c, "bytes", bytes, 16, CAIRN_BYTE));
  CHECK(cairn_protect_shaped(c, "i16", i16, CAIRN_INT16, 2, d_i16, 0));
  CHECK(cairn_protect(c, "u16", u16, 5, CAIRN_UINT16));
  CHECK(cairn_protect_shaped(c, "i32", i32, CAIRN_INT32, 2, d_i32, 0));
  CHECK(cairn_protect(c, "u32", u32, 4, CAIRN_UINT32));
  CHECK(cairn_protect(c, "i64", i64, 3, CAIRN_INT64));
  CHECK(cairn_protect(c, "u64", u64, 2, CAIRN_UINT64));
  CHECK(cairn_protect_shaped(c, "f32", f32, CAIRN_FLOAT32, 3, d_f32, 0));
  CHECK(cairn_protect_shaped(c, "f64", f64, CAIRN_FLOAT64, 2, d_f64, 0));
  CHECK(cairn_protect_shaped(c, "fortran", fortran, CAIRN_FLOAT64, 2, d_fortran, 1));
  {
    const uint64_t g[2] = {8, 6}, s[2] = {2, 1}, n[2] = {3, 4}, ms[2] = {5, 6}, m0[2] = {1, 1};
    CHECK(cairn_protect_block(c, "block", block_mem, CAIRN_FLOAT64, 2, g, s, n, ms, m0, 0));
  }
  {
    const uint64_t g[2] = {6, 4}, s[2] = {1, 0}, n[2] = {3, 2}, ms[2] = {5, 3}, m0[2] = {1, 1};
    CHECK(cairn_protect_block(c, "fblock", fblock_mem, CAIRN_FLOAT64, 2, g, s, n, ms, m0, 1));
  }

  if (big) {
    const uint64_t d[2] = {256, 256};
    CHECK(cairn_protect_shaped(c, "big", big_mem, CAIRN_FLOAT64, 2, d, 0));
  }

  for (int a = first; a < argc; ++a) {
    const int64_t v = strtoll(argv[a], NULL, 10);
    for (int k = 0; k < 256 * 256; ++k)
      big_mem[k] = k / 256 < 64 ? exp(-(double)(k / 256) / 20.0) * sin((double)(k % 256) / 40.0) + (double)v : 0.0;
    for (int k = 0; k < 10; ++k) u8[k] = (uint8_t)(k + v);
    for (int k = 0; k < 16; ++k) bytes[k] = (uint8_t)(255 - k);
    for (int k = 0; k < 6; ++k) i16[k] = (int16_t)(-(k + v));
    for (int k = 0; k < 5; ++k) u16[k] = (uint16_t)(65535 - k);
    for (int k = 0; k < 20; ++k) i32[k] = (int32_t)(1000 * k - 7 + v);
    for (int k = 0; k < 4; ++k) u32[k] = 4000000000u + (uint32_t)k;
    for (int k = 0; k < 3; ++k) i64[k] = (int64_t)(k - 1) * INT64_C(1000000000000000) + v;
    for (int k = 0; k < 2; ++k) u64[k] = (UINT64_C(1) << 63) + (uint64_t)k;
    for (int k = 0; k < 24; ++k) f32[k] = 0.5f * (float)k + (float)v;
    for (int k = 0; k < 42; ++k) f64[k] = (double)k / 7.0 + (double)v;
    for (int k = 0; k < 15; ++k) fortran[k] = (double)(k + v);
    for (int k = 0; k < 30; ++k) block_mem[k] = (double)(1000 + k + v);
    for (int k = 0; k < 15; ++k) fblock_mem[k] = (double)(2000 + k + v);
    CHECK(cairn_checkpoint(c, "w", v));
    CHECK(cairn_wait(c, "w", v, CAIRN_LEVEL_PERSISTENT));
  }
  CHECK(cairn_finalize(&c, 1));
  return 0;
}
