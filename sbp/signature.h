/* SBP signature rules: for an op's rule (carried by the op's definition, ops/op.h) and the logical
 * shapes of its inputs and outputs, the 1-D signatures it can run under (DESIGN.md section 4). The
 * n-D signature is chosen per mesh axis (the Cartesian product of 1-D ones) by the dispatcher,
 * cheapest boxing first. No rule here knows an op by name. */
#ifndef FLOW_SIGNATURE_H
#define FLOW_SIGNATURE_H

#include "../core/tensor.h"
#include "sbp.h"

#define FLOW_SIG_MAX_IO 8
#define FLOW_SIG_MAX 48

typedef struct flow_sbp_sig {
  flow_sbp in[FLOW_SIG_MAX_IO];
  flow_sbp out[FLOW_SIG_MAX_IO];
} flow_sbp_sig;

typedef struct flow_sig_list {
  int n;
  flow_sbp_sig v[FLOW_SIG_MAX];
} flow_sig_list;

typedef struct flow_sig_query {
  int nin, nout;
  int in_ndim[FLOW_SIG_MAX_IO];
  int64_t in_shape[FLOW_SIG_MAX_IO][FLOW_MAX_DIMS];
  int out_ndim[FLOW_SIG_MAX_IO];
  int64_t out_shape[FLOW_SIG_MAX_IO][FLOW_MAX_DIMS];
  const flow_attrs *attrs;
  int p;                       /* ranks on the mesh axis being decided */
} flow_sig_query;

/* What an op adds to its family's rule: where the op is linear, partial sums pass through it. */
enum {
  FLOW_SBP_LINEAR = 1 << 0,    /* linear in all inputs together: (P, ..., P) -> P */
  FLOW_SBP_P_FIRST = 1 << 1,   /* linear in input 1 alone: (P, B) -> P */
  FLOW_SBP_P_SECOND = 1 << 2,  /* linear in input 2 alone: (B, P) -> P */
  FLOW_SBP_BACKWARD = 1 << 3,  /* the family's gradient op (layer_norm_grad, cross_entropy_grad) */
};

typedef void (*flow_sbp_rule_fn)(const flow_sig_query *q, unsigned flags, flow_sig_list *l);

/* An op's SBP rule: its family's builder and the op's flags. */
typedef struct flow_sbp_rule {
  const char *family;          /* for the explain trace */
  flow_sbp_rule_fn fn;
  unsigned flags;
  unsigned whole_when;         /* attrs.flags bits (the op's own) under which the result depends on
                                  whole inputs: the op then runs under all-broadcast only */
} flow_sbp_rule;

/* The rule of family `id` with flags, for an op definition: .sbp = FLOW_SBP_RULE(matmul, 0). */
#define FLOW_SBP_RULE(id, flags) (&(const flow_sbp_rule){#id, flow_sbp_rule_##id, (flags), 0})
/* ... that holds unless attrs.flags has one of the bits in `whole` (say, a mean over all rows that
 * divides by a count no shard knows). */
#define FLOW_SBP_RULE_UNLESS(id, flags, whole) (&(const flow_sbp_rule){#id, flow_sbp_rule_##id, (flags), (whole)})

/* The families (what each allows is documented above its builder in signature.c). */
void flow_sbp_rule_elementwise(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_reduce(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_matmul(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_linear(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_softmax(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_layer_norm(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_attention(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_permute(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_along_axis(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_along_axes(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_triangle(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_view(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_expand(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_embedding(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_index_select(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_scatter_add(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_cross_entropy(const flow_sig_query *q, unsigned flags, flow_sig_list *l);
void flow_sbp_rule_batch_norm(const flow_sig_query *q, unsigned flags, flow_sig_list *l);

/* Fill the candidates (the all-broadcast one always comes first; it is the only one when the attrs
 * carry one of the rule's whole_when bits). Returns false when the op has no rule (NULL): it then
 * runs on broadcast inputs only. */
bool flow_sbp_candidates(const flow_sbp_rule *rule, const flow_sig_query *q, flow_sig_list *out);

#endif
