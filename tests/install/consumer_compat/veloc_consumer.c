/* Built by install_test.sh against the installed drop-in with only
 * -I<prefix>/include -L<prefix>/lib -lveloc-client, as a VELOC application
 * is: protects an array, checkpoints it, restores it, checks the values. */
#include <mpi.h>
#include <stdio.h>
#include <veloc.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (argc != 2 || VELOC_Init(MPI_COMM_WORLD, argv[1]) != VELOC_SUCCESS) return 1;
  int a[64];
  for (int i = 0; i < 64; ++i) a[i] = i * 3;
  if (VELOC_Mem_protect(0, a, 64, sizeof a[0]) != VELOC_SUCCESS) return 1;
  if (VELOC_Checkpoint("consumer", 1) != VELOC_SUCCESS || VELOC_Checkpoint_wait() != VELOC_SUCCESS) return 1;
  for (int i = 0; i < 64; ++i) a[i] = -1;
  int v = VELOC_Restart_test("consumer", 0);
  if (v != 1 || VELOC_Restart("consumer", v) != VELOC_SUCCESS) return 1;
  for (int i = 0; i < 64; ++i)
    if (a[i] != i * 3) return 1;
  VELOC_Finalize(1);
  MPI_Finalize();
  printf("veloc consumer: ok\n");
  return 0;
}
