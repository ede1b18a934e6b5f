/* Edge cases of the VELOC drop-in, written against veloc.h only; run by
 * tests/compat/test_veloc.py under mpirun with 2 ranks. Prints "ok <what>"
 * for each check that holds and "FAIL <what>" otherwise. */
#include <stdio.h>
#include <string.h>

#include <veloc.h>

static int rank, failures;

static void check(int cond, const char *what) {
  if (rank == 0 || !cond) printf("%s %s\n", cond ? "ok" : "FAIL", what);
  if (!cond) ++failures;
  fflush(stdout);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 2) return 1;
  const char *cfg = argv[1];
  int counter = 0;
  double a[100], big[200];

  check(VELOC_Init(MPI_COMM_WORLD, cfg) == VELOC_SUCCESS, "init");
  check(VELOC_Restart_test("api", 0) == VELOC_FAILURE, "no checkpoint yet");
  VELOC_Mem_protect(0, &counter, 1, sizeof counter);
  VELOC_Mem_protect(1, a, 100, sizeof(double));
  for (int v = 1; v <= 3; ++v) {
    counter = 10 * v;
    for (int i = 0; i < 100; ++i) a[i] = v * 1000 + i + rank * 0.5;
    check(VELOC_Checkpoint("api", v) == VELOC_SUCCESS, "checkpoint 1..3");
  }
  /* One rank reports failure: the version is not taken, on any rank. */
  int rc = VELOC_Checkpoint_begin("api", 4);
  rc = rc == VELOC_SUCCESS ? VELOC_Checkpoint_mem() : rc;
  check(rc == VELOC_SUCCESS && VELOC_Checkpoint_end(rank == 1 ? 0 : 1) == VELOC_FAILURE,
        "a checkpoint one rank failed is refused on every rank");
  /* The same in file mode: a file one rank could not write is no version. */
  char routed[VELOC_MAX_NAME];
  rc = VELOC_Checkpoint_begin("api", 4);
  rc = rc == VELOC_SUCCESS ? VELOC_Route_file("part.dat", routed) : rc;
  if (rc == VELOC_SUCCESS && rank == 0) {
    FILE *f = fopen(routed, "wb");
    if (f) fclose(f);
  }
  check(rc == VELOC_SUCCESS && VELOC_Checkpoint_end(rank == 0) == VELOC_FAILURE,
        "a file checkpoint one rank failed is refused on every rank");
  /* A file checkpoint under another name, read back through the restart route. */
  rc = VELOC_Checkpoint_begin("files", 1);
  rc = rc == VELOC_SUCCESS ? VELOC_Route_file("mine.dat", routed) : rc;
  FILE *f = rc == VELOC_SUCCESS ? fopen(routed, "wb") : NULL;
  int wrote = f && fprintf(f, "rank %d file\n", rank) > 0;
  if (f) fclose(f);
  check(wrote && VELOC_Checkpoint_end(1) == VELOC_SUCCESS, "file checkpoint");
  check(VELOC_Checkpoint_wait() == VELOC_SUCCESS, "wait");
  check(VELOC_Checkpoint_finished() == VELOC_SUCCESS, "finished after wait");
  check(VELOC_Restart_test("api", 0) == 3, "restart test: newest taken version");
  check(VELOC_Restart_test("api", 2) == 2, "restart test at or below a bound");
  check(VELOC_Checkpoint("late", 7) == VELOC_SUCCESS && VELOC_Checkpoint_wait() == VELOC_SUCCESS &&
            VELOC_Restart_test("late", 5) == VELOC_FAILURE,
        "restart test below every version: none (not an error)");
  check(VELOC_Route_file("x.dat", routed) == VELOC_FAILURE, "route outside a sequence");
  check(VELOC_Restart_test("files", 0) == 1, "restart test of the file checkpoint");
  char line[64] = "";
  rc = VELOC_Restart_begin("files", 1);
  rc = rc == VELOC_SUCCESS ? VELOC_Route_file("another-name.dat", routed) : rc;
  f = rc == VELOC_SUCCESS ? fopen(routed, "rb") : NULL;
  if (f) {
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    fclose(f);
  }
  char expect[64];
  snprintf(expect, sizeof expect, "rank %d file\n", rank);
  check(strcmp(line, expect) == 0 && VELOC_Restart_end(1) == VELOC_SUCCESS, "file restored, one file per rank");
  check(VELOC_Finalize(1) == VELOC_SUCCESS, "finalize");

  /* A new execution (handle): size query and selective recovery of version 2. */
  check(VELOC_Init(MPI_COMM_WORLD, cfg) == VELOC_SUCCESS, "init again");
  counter = -1;
  check(VELOC_Restart_begin("api", 2) == VELOC_SUCCESS, "restart begin");
  check(VELOC_Recover_size(1) == 100 * (int)sizeof(double), "recover size");
  check(VELOC_Recover_size(9) == VELOC_FAILURE, "recover size of an unknown id");
  memset(big, 0, sizeof big);
  VELOC_Mem_protect(0, &counter, 1, sizeof counter);
  VELOC_Mem_protect(1, big, 200, sizeof(double)); /* larger than checkpointed: allowed */
  int ids[1] = {1};
  check(VELOC_Recover_selective(VELOC_RECOVER_SOME, ids, 1) == VELOC_SUCCESS, "recover some");
  int same = counter == -1 && big[100] == 0;
  for (int i = 0; i < 100; ++i) same &= big[i] == 2000 + i + rank * 0.5;
  check(same, "only region 1 restored, bit for bit, its first bytes");
  check(VELOC_Recover_selective(VELOC_RECOVER_REST, ids, 1) == VELOC_SUCCESS && counter == 20, "recover rest");
  check(VELOC_Restart_end(1) == VELOC_SUCCESS, "restart end");
  /* Committed versions are never replaced. */
  check(VELOC_Checkpoint("api", 3) == VELOC_FAILURE, "an earlier execution's version is not overwritten");
  check(VELOC_Checkpoint("api", 5) == VELOC_SUCCESS, "a newer version is taken");
  check(VELOC_Finalize(1) == VELOC_SUCCESS, "finalize again");
  MPI_Finalize();
  return failures ? 1 : 0;
}
