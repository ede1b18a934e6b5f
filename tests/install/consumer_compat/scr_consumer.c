/* Built by install_test.sh against the installed drop-in with only
 * -I<prefix>/include -L<prefix>/lib -lscr, as an SCR application is:
 * writes one checkpoint dataset through SCR_Route_file. */
#include <mpi.h>
#include <scr.h>
#include <stdio.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (SCR_Init() != SCR_SUCCESS) return 1;
  char routed[SCR_MAX_FILENAME];
  if (SCR_Start_output("ckpt.1", SCR_FLAG_CHECKPOINT) != SCR_SUCCESS ||
      SCR_Route_file("state.dat", routed) != SCR_SUCCESS)
    return 1;
  FILE *f = fopen(routed, "w");
  if (!f || fprintf(f, "state\n") < 0 || fclose(f) != 0) return 1;
  if (SCR_Complete_output(1) != SCR_SUCCESS || SCR_Finalize() != SCR_SUCCESS) return 1;
  MPI_Finalize();
  printf("scr consumer: ok\n");
  return 0;
}
