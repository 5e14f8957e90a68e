/* The NCCL communicator backend (core/comm.h's vtable over device memory). Rank r drives GPU
 * r % local GPU count; collectives run on that device's collective stream, ordered after the
 * compute work issued before them and before the compute work issued after them. */
#ifndef FLOW_NCCL_H
#define FLOW_NCCL_H

#include "comm.h"

/* The cached NCCL communicator over these world ranks (in this order), made on first use from the
 * MPI communicator over the same ranks (rank 0 of the group makes the ncclUniqueId, MPI broadcasts
 * it, every member calls ncclCommInitRank). Only members may ask; NULL + error otherwise, and in a
 * build without CUDA. */
flow_comm *flow_nccl_for_ranks(const int *ranks, int n);
/* The GPU this rank uses: world rank % local GPU count (-1 + error without a GPU). */
int flow_nccl_device(void);
/* Destroy every cached NCCL communicator (before flow_comm_finalize). */
void flow_nccl_finalize(void);

#endif
