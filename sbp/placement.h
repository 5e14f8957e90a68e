/* Placements: a device type and an n-D mesh of ranks. Placements are interned (one object per
 * distinct value, alive until the process ends), so they compare by pointer. */
#ifndef FLOW_PLACEMENT_H
#define FLOW_PLACEMENT_H

#include "../core/comm.h"
#include "../core/device.h"
#include "sbp.h"

typedef struct flow_placement {
  flow_devtype devtype;
  int ndim;                      /* mesh axes */
  int shape[FLOW_MAX_MESH];      /* mesh sizes */
  int nranks;
  int *ranks;                    /* row-major over the mesh */
  int me;                        /* this rank's index in ranks, -1 when not a member */
  int coord[FLOW_MAX_MESH];      /* this rank's mesh coordinate (members only) */
  flow_comm *axis_comm[FLOW_MAX_MESH]; /* ranks sharing every coordinate but one, made on use */
  flow_comm *axis_nccl[FLOW_MAX_MESH]; /* the same groups over NCCL (device data), made on use */
  struct flow_placement *next;
} flow_placement;

/* The interned placement; NULL + error on a bad mesh (repeated or out-of-range rank). */
const flow_placement *flow_placement_get(flow_devtype devtype, int ndim, const int *shape, const int *ranks);
/* The communicator along mesh axis `axis` through this rank (members only). */
flow_comm *flow_placement_axis_comm(const flow_placement *p, int axis);
/* The communicator that moves tensor data of this device type along the axis: NCCL for CUDA,
 * MPI for host memory. Host-side agreement (shapes, checks) uses flow_placement_axis_comm. */
flow_comm *flow_placement_axis_data_comm(const flow_placement *p, int axis, flow_devtype dev);
/* "cpu{0, 1}" / "cuda{{0, 1}, {2, 3}}" */
char *flow_placement_str(const flow_placement *p, char *buf, size_t n);
/* Mesh coordinate of ranks[index]. */
void flow_placement_coord(const flow_placement *p, int index, int *coord);
/* The world ranks of either placement, ascending (malloc'ed; *n of them), or NULL + error. */
int *flow_placement_union(const flow_placement *a, const flow_placement *b, int *n);
void flow_placement_free_all(void);

#endif
