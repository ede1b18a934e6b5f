/* The part of the Fortran module `cairn` (cairn.F90) that must be C: the MPI
 * handle conversion. A Fortran communicator (an integer handle, or the
 * MPI_VAL of an mpi_f08 type(MPI_Comm)) becomes a C MPI_Comm with
 * MPI_Comm_f2c, which may be a macro (MPICH) and so cannot be bound from
 * Fortran directly. */
#include <mpi.h>

#include "cairn.h"
#include "cairn_mpi.h"

int cairn_fortran_init_mpi(MPI_Fint comm, const char *config_path, cairn_t **out) {
  return cairn_init_mpi(MPI_Comm_f2c(comm), config_path, out);
}
