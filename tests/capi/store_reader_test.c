/* cairn_store.h from C: a serial client writes two versions, the reader lists
 * them, reads a region bit for bit and its header as JSON, and refuses a
 * missing region, a wrong buffer size, an uncommitted version and a damaged
 * region with the expected codes and messages. Everything under a fresh
 * directory in $TMPDIR (or /tmp), removed at the end. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cairn.h"
#include "cairn_store.h"

static int failures = 0;
#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);      \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, " (last error: %s)\n", cairn_last_error());          \
      ++failures;                                                          \
    }                                                                      \
  } while (0)

int main(void) {
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  char root[4096];
  snprintf(root, sizeof root, "%s/cairn-store-reader-XXXXXX", tmp);
  if (mkdtemp(root) == NULL) return 2;
  char store[4200], scratch[4200];
  snprintf(store, sizeof store, "%s/store", root);
  snprintf(scratch, sizeof scratch, "%s/scratch", root);
  setenv("CAIRN_PERSISTENT", store, 1);
  setenv("CAIRN_SCRATCH", scratch, 1);
  setenv("CAIRN_RUN", "r", 1);
  setenv("CAIRN_MODE", "sync", 1);
  setenv("CAIRN_KEEP_PERSISTENT", "0", 1);

  double x[1000];
  cairn_t *c = NULL;
  CHECK(cairn_init(NULL, &c) == CAIRN_OK, "init");
  CHECK(cairn_protect(c, "x", x, 1000, CAIRN_FLOAT64) == CAIRN_OK, "protect");
  for (int v = 1; v <= 2; ++v) {
    for (int i = 0; i < 1000; ++i) x[i] = i * 0.25 + v;
    CHECK(cairn_checkpoint(c, "ck", v) == CAIRN_OK, "checkpoint %d", v);
  }
  CHECK(cairn_finalize(&c, 1) == CAIRN_OK, "finalize");

  cairn_store_t *s = NULL;
  CHECK(cairn_store_open(root, &s) == CAIRN_ENOTFOUND && strstr(cairn_last_error(), "not a cairn store"),
        "a directory without runs/");
  CHECK(cairn_store_open(store, &s) == CAIRN_OK, "open");
  char *json = NULL;
  CHECK(cairn_store_runs(s, &json) == CAIRN_OK && strcmp(json, "[\"r\"]") == 0, "runs: %s", json);
  cairn_store_free(json);
  CHECK(cairn_store_versions(s, "r", "ck", &json) == CAIRN_OK && strcmp(json, "[1,2]") == 0, "versions: %s", json);
  cairn_store_free(json);
  CHECK(cairn_store_shard_header(s, "r", "ck", 2, 0, &json) == CAIRN_OK && strstr(json, "\"name\":\"x\"") &&
            strstr(json, "\"type_name\":\"float64\"") && strstr(json, "\"length\":8000"),
        "header: %s", json);
  cairn_store_free(json);

  double got[1000];
  CHECK(cairn_store_read_region(s, "r", "ck", 1, 0, "x", got, sizeof got) == CAIRN_OK, "read v1");
  int same = 1;
  for (int i = 0; i < 1000; ++i) same &= got[i] == i * 0.25 + 1;
  CHECK(same, "version 1's values");
  CHECK(cairn_store_read_region(s, "r", "ck", 1, 0, "nope", got, sizeof got) == CAIRN_ENOTFOUND &&
            strstr(cairn_last_error(), "no region 'nope' (regions: x)"),
        "missing region");
  CHECK(cairn_store_read_region(s, "r", "ck", 1, 0, "x", got, 8) == CAIRN_EINVAL, "short buffer");
  CHECK(cairn_store_manifest(s, "r", "ck", 3, &json) == CAIRN_ENOTFOUND && strstr(cairn_last_error(), "not committed"),
        "version 3");
  CHECK(cairn_store_read_region(s, "r", "ck", 1, 1, "x", got, sizeof got) == CAIRN_ENOTFOUND &&
            strstr(cairn_last_error(), "no rank 1"),
        "rank 1");

  /* One flipped bit in version 2's data: corruption, named; version 1 intact. */
  char shard[4400];
  snprintf(shard, sizeof shard, "%s/runs/r/ck/v000000000002/shard.000000", store);
  FILE *f = fopen(shard, "r+b");
  CHECK(f != NULL, "open %s", shard);
  if (f) {
    fseek(f, -4096 * 2 + 100, SEEK_END); /* inside x's 8000 bytes, which end the file */
    int b = fgetc(f);
    fseek(f, -1, SEEK_CUR);
    fputc(b ^ 0x10, f);
    fclose(f);
  }
  CHECK(cairn_store_read_region(s, "r", "ck", 2, 0, "x", got, sizeof got) == CAIRN_ECORRUPT &&
            strstr(cairn_last_error(), "checksum mismatch in region 'x'"),
        "damaged v2");
  CHECK(cairn_store_read_region(s, "r", "ck", 1, 0, "x", got, sizeof got) == CAIRN_OK, "v1 still reads");
  cairn_store_close(s);

  char cmd[4300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  if (failures) {
    fprintf(stderr, "%d failed\n", failures);
    return 1;
  }
  printf("store_reader_test: ok\n");
  return 0;
}
