/* The two values of mpi.h that the MPI backend needs and that rsmpi's bindings lack,
 * because they are macros whose value differs between MPI libraries (Open MPI, MPICH). */
#include <mpi.h>

/* MPI_IN_PLACE: the send buffer of an in-place collective. */
void *xccl_mpi_in_place(void) { return MPI_IN_PLACE; }

/* MPI_TAG_UB: the attribute key of the largest tag the library accepts. */
int xccl_mpi_tag_ub_key(void) { return MPI_TAG_UB; }
