/* The heat solver shared by the drop-in test programs (veloc_heat.c,
 * scr_heat.c): MPI only, no checkpoint library. Rows 1..rows of a
 * (rows + 2) x cols grid are this rank's; rows 0 and rows + 1 are halos. */
#ifndef HEAT_COMMON_H
#define HEAT_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <mpi.h>

static int rank, nranks;

static uint64_t fnv(const void *data, size_t n, uint64_t h) {
  const unsigned char *p = (const unsigned char *)data;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* One Jacobi sweep over rows 1..rows (rows 0 and rows+1 are halos). */
static double sweep(int cols, int rows, double *cur, double *next) {
  MPI_Request req[4];
  int n = 0;
  if (rank > 0) {
    MPI_Isend(cur + cols, cols, MPI_DOUBLE, rank - 1, 1, MPI_COMM_WORLD, &req[n++]);
    MPI_Irecv(cur, cols, MPI_DOUBLE, rank - 1, 1, MPI_COMM_WORLD, &req[n++]);
  }
  if (rank < nranks - 1) {
    MPI_Isend(cur + (size_t)rows * cols, cols, MPI_DOUBLE, rank + 1, 1, MPI_COMM_WORLD, &req[n++]);
    MPI_Irecv(cur + (size_t)(rows + 1) * cols, cols, MPI_DOUBLE, rank + 1, 1, MPI_COMM_WORLD, &req[n++]);
  }
  MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
  double local = 0;
  for (int i = 1; i <= rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      double left = cur[(size_t)i * cols + (j > 0 ? j - 1 : j)];
      double right = cur[(size_t)i * cols + (j < cols - 1 ? j + 1 : j)];
      double v = 0.25 * (cur[(size_t)(i - 1) * cols + j] + cur[(size_t)(i + 1) * cols + j] + left + right);
      double d = fabs(v - cur[(size_t)i * cols + j]);
      if (d > local) local = d;
      next[(size_t)i * cols + j] = v;
    }
  }
  /* Fixed boundaries: the top row of rank 0 is hot, the bottom of the last rank cold. */
  memcpy(next, cur, sizeof(double) * cols);
  memcpy(next + (size_t)(rows + 1) * cols, cur + (size_t)(rows + 1) * cols, sizeof(double) * cols);
  double global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return global;
}

#endif
