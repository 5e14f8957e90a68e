/* NCCL for CUDA tensors (core/comm.h's vtable over device memory). A rank drives GPU (its rank on
 * the node) % (the node's GPU count); collectives run on that device's collective stream, ordered
 * after the compute work issued before them and before the compute work issued after them. The
 * communicators come from the CUDA plugin; this side picks the GPU and caches them. */
#ifndef FLOW_NCCL_H
#define FLOW_NCCL_H

#include <stdbool.h>

#include "comm.h"

/* The cached NCCL communicator over these world ranks (in this order), made on first use from the
 * MPI communicator over the same ranks (rank 0 of the group makes the ncclUniqueId, MPI broadcasts
 * it, every member calls ncclCommInitRank). Only members may ask; NULL + error otherwise, and
 * without a GPU. */
flow_comm *flow_nccl_for_ranks(const int *ranks, int n);
/* Probe once, on every rank (a collective over the world): which GPU this rank uses, and whether
 * NCCL can carry CUDA tensors (every rank has a GPU of its own, FLOW_NCCL is not 0). A multi-rank
 * world calls it when flow opens; in a world of one the functions below call it on first use. */
int flow_nccl_init(void);
bool flow_nccl_usable(void);
const char *flow_nccl_unusable_reason(void);   /* "" when usable */
/* The GPU this rank uses: node-local rank % the node's GPU count (-1 + error without a GPU). On one
 * node this is world rank % GPU count. */
int flow_nccl_device(void);
/* Destroy every cached NCCL communicator (before flow_comm_finalize). */
void flow_nccl_finalize(void);

#endif
