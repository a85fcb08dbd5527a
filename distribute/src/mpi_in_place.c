/* MPI_IN_PLACE read from the MPI library's own header (cargo feature `mpi`): the constant is a
 * macro whose value each implementation picks ((void *)1 in Open MPI, (void *)-1 in MPICH),
 * and rsmpi does not export it. Compiled by build.rs with the library's `mpicc`. */
#include <mpi.h>

void *ferroflow_mpi_in_place(void) { return MPI_IN_PLACE; }
