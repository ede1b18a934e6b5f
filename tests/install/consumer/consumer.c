/* Single-process use of the installed C API: checkpoint, then restore into a
 * cleared buffer and compare. Exits 0 only if the data came back bit for bit. */
#include <cairn.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                  \
  do {                                                                               \
    int rc_ = (call);                                                                \
    if (rc_ != CAIRN_OK) {                                                           \
      fprintf(stderr, "%s: %s: %s\n", #call, cairn_strerror(rc_), cairn_last_error()); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

int main(void) {
  double a[1000], saved[1000];
  for (int i = 0; i < 1000; ++i) a[i] = i * 0.5;
  memcpy(saved, a, sizeof a);
  cairn_t *c = NULL;
  CHECK(cairn_init(NULL, &c));
  CHECK(cairn_protect(c, "a", a, 1000, CAIRN_FLOAT64));
  CHECK(cairn_checkpoint(c, "consumer", 1));
  CHECK(cairn_wait(c, "consumer", 1, CAIRN_LEVEL_PERSISTENT));
  memset(a, 0, sizeof a);
  int64_t v = -1;
  CHECK(cairn_restart_test(c, "consumer", &v));
  CHECK(cairn_restart(c, "consumer", v));
  CHECK(cairn_finalize(&c, 1));
  if (v != 1 || memcmp(a, saved, sizeof a) != 0) {
    fprintf(stderr, "consumer: restored data differs (version %lld)\n", (long long)v);
    return 1;
  }
  printf("consumer: ok\n");
  return 0;
}
