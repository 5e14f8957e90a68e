/* SBP signature rules by op family (signature.h). Each rule lists the 1-D signatures under which
 * running the op on shards gives the shards of the logical result (ONEFLOW-NOTES.md, "Op
 * signatures"). Rules read logical shapes, attrs and the op's flags only; they never see data. */
#include "signature.h"

#include <stdint.h>

static flow_sbp S(int a) { return flow_sbp_split(a); }
static const flow_sbp B = {FLOW_SBP_B, 0}, P = {FLOW_SBP_P, 0};

/* A new signature, all broadcast. */
static flow_sbp_sig *add(flow_sig_list *l) {
  if (l->n == FLOW_SIG_MAX) return NULL;
  flow_sbp_sig *s = &l->v[l->n++];
  for (int i = 0; i < FLOW_SIG_MAX_IO; i++) s->in[i] = s->out[i] = B;
  return s;
}

/* Every input and output takes the same value (P->P for linear ops). */
static void all_same(const flow_sig_query *q, flow_sig_list *l, flow_sbp v) {
  flow_sbp_sig *s = add(l);
  if (!s) return;
  for (int i = 0; i < q->nin; i++) s->in[i] = v;
  for (int j = 0; j < q->nout; j++) s->out[j] = v;
}

static int norm_axis(int64_t axis, int ndim) { return (int)(axis < 0 ? axis + ndim : axis); }

/* ---- elementwise with broadcasting ----------------------------------------------------------- */

/* Output axis i split: each input splits the matching axis, or is broadcast where it has size 1.
 * Partial sums pass where the op's flags say it is linear. */
void flow_sbp_rule_elementwise(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  int nd = q->out_ndim[0];
  for (int i = 0; i < nd; i++) {
    if (q->out_shape[0][i] == 1) continue;
    flow_sbp_sig *s = add(l);
    if (!s) return;
    for (int k = 0; k < q->nin; k++) {
      int j = i - (nd - q->in_ndim[k]);
      s->in[k] = j >= 0 && q->in_shape[k][j] == q->out_shape[0][i] ? S(j) : B;
    }
    for (int o = 0; o < q->nout; o++) s->out[o] = q->out_ndim[o] == nd ? S(i) : B;
  }
  if (flags & FLOW_SBP_LINEAR) all_same(q, l, P);
  if (q->nin == 2 && (flags & FLOW_SBP_P_FIRST)) {
    flow_sbp_sig *s = add(l);
    if (s) { s->in[0] = P; s->out[0] = P; }
  }
  if (q->nin == 2 && (flags & FLOW_SBP_P_SECOND)) {
    flow_sbp_sig *s = add(l);
    if (s) { s->in[1] = P; s->out[0] = P; }
  }
}

/* ---- reductions ------------------------------------------------------------------------------ */

/* Split on a kept axis stays split; split on a reduced axis gives partial sums, which only a
 * linear reduction (sum) allows; the others are split on kept axes only. */
void flow_sbp_rule_reduce(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  const flow_attrs *a = q->attrs;
  int nd = q->in_ndim[0], removed = 0;
  bool mask[FLOW_MAX_DIMS];
  for (int d = 0; d < nd; d++) mask[d] = a->naxes == 0;
  for (int i = 0; i < a->naxes; i++) {
    int d = norm_axis(a->axes[i], nd);
    if (d >= 0 && d < nd) mask[d] = true;
  }
  bool sum = flags & FLOW_SBP_LINEAR;
  for (int i = 0; i < nd; i++) {
    if (mask[i] && !sum) { removed++; continue; }
    flow_sbp_sig *s = add(l);
    if (!s) return;
    s->in[0] = S(i);
    for (int o = 0; o < q->nout; o++) s->out[o] = mask[i] ? P : S(a->keepdim ? i : i - removed);
    removed += mask[i];
  }
  if (sum) all_same(q, l, P);
}

/* ---- matmul: Y = op(A) op(B), batched ---------------------------------------------------------- */

void flow_sbp_rule_matmul(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  int an = q->in_ndim[0], bn = q->in_ndim[1], on = q->out_ndim[0];
  bool ta = q->attrs->flags & FLOW_ATTR_TRANS_A, tb = q->attrs->flags & FLOW_ATTR_TRANS_B;
  flow_sbp_sig *s;
  if (an >= 2 && bn >= 2) {
    int am = ta ? an - 1 : an - 2, ak = ta ? an - 2 : an - 1;
    int bk = tb ? bn - 1 : bn - 2, bN = tb ? bn - 2 : bn - 1;
    if ((s = add(l))) { s->in[0] = S(am); s->out[0] = S(on - 2); }
    if ((s = add(l))) { s->in[1] = S(bN); s->out[0] = S(on - 1); }
    if ((s = add(l))) { s->in[0] = S(ak); s->in[1] = S(bk); s->out[0] = P; }
    for (int i = 0; i < on - 2; i++) {
      if (q->out_shape[0][i] == 1 || !(s = add(l))) continue;
      int ja = i - (on - an), jb = i - (on - bn);
      s->in[0] = ja >= 0 && q->in_shape[0][ja] == q->out_shape[0][i] ? S(ja) : B;
      s->in[1] = jb >= 0 && q->in_shape[1][jb] == q->out_shape[0][i] ? S(jb) : B;
      s->out[0] = S(i);
    }
  }
  if ((s = add(l))) { s->in[0] = P; s->out[0] = P; }
  if ((s = add(l))) { s->in[1] = P; s->out[0] = P; }
}

/* ---- linear: Y [N, out] = X [N, in] W [out, in]^T + b [out] ------------------------------------ */

/* Rows of X split -> rows of Y; out features split (W's rows with b) -> Y's columns; in features
 * split (X's and W's columns) -> partial sums of X W^T, so b goes partial too and is counted once
 * (B -> P keeps it on one rank). Y is linear in (X, b) together and in (W, b) together. */
void flow_sbp_rule_linear(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)q; (void)flags;
  flow_sbp_sig *s;
  if ((s = add(l))) { s->in[0] = S(0); s->out[0] = S(0); }
  if ((s = add(l))) { s->in[1] = S(0); s->in[2] = S(0); s->out[0] = S(1); }
  if ((s = add(l))) { s->in[0] = S(1); s->in[1] = S(1); s->in[2] = P; s->out[0] = P; }
  if ((s = add(l))) { s->in[0] = P; s->in[2] = P; s->out[0] = P; }
  if ((s = add(l))) { s->in[1] = P; s->in[2] = P; s->out[0] = P; }
}

/* ---- ops normalising over one axis: split on any other ------------------------------------- */

void flow_sbp_rule_softmax(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  int nd = q->in_ndim[0], ax = norm_axis(q->attrs->axis, nd);
  for (int i = 0; i < nd; i++)
    if (i != ax) all_same(q, l, S(i));
}

/* layer_norm: x then weight/bias; outputs y, mean, rstd. layer_norm_grad (FLOW_SBP_BACKWARD): dy,
 * dmean, drstd, x, mean, rstd then weight; outputs dx and the partial weight and bias gradients. */
void flow_sbp_rule_layer_norm(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  bool grad = flags & FLOW_SBP_BACKWARD;
  int rows = grad ? 6 : 1, nd = q->in_ndim[grad ? 3 : 0];
  for (int i = 0; i < nd - 1; i++) {
    flow_sbp_sig *s = add(l);
    if (!s) return;
    for (int k = 0; k < rows; k++) s->in[k] = S(i);
    for (int o = 0; o < q->nout; o++) s->out[o] = grad && o > 0 ? P : S(i);
  }
}

/* attention over [B, H, T, D]: batch and heads split; every tensor has both axes first */
void flow_sbp_rule_attention(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  for (int i = 0; i < 2; i++) all_same(q, l, S(i));
}

/* ---- views and shape ops ----------------------------------------------------------------------- */

void flow_sbp_rule_permute(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  const flow_attrs *a = q->attrs;
  for (int i = 0; i < a->naxes; i++) {
    flow_sbp_sig *s = add(l);
    if (!s) return;
    s->in[0] = S(norm_axis(a->axes[i], a->naxes));
    s->out[0] = S(i);
  }
  all_same(q, l, P);
}

/* split on any axis but the one the op works along (narrow, cat) */
void flow_sbp_rule_along_axis(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  int nd = q->out_ndim[0], ax = norm_axis(q->attrs->axis, nd);
  for (int i = 0; i < nd; i++)
    if (i != ax) all_same(q, l, S(i));
  all_same(q, l, P);
}

/* split on any axis not listed in attrs.axes, the axes the op works along (flip) */
void flow_sbp_rule_along_axes(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  int nd = q->in_ndim[0];
  bool listed[FLOW_MAX_DIMS] = {false};
  for (int i = 0; i < q->attrs->naxes; i++) {
    int d = norm_axis(q->attrs->axes[i], nd);
    if (d >= 0 && d < nd) listed[d] = true;
  }
  for (int i = 0; i < nd; i++)
    if (!listed[i]) all_same(q, l, S(i));
  all_same(q, l, P);
}

void flow_sbp_rule_triangle(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  for (int i = 0; i < q->in_ndim[0] - 2; i++) all_same(q, l, S(i));
  all_same(q, l, P);
}

/* view: input axis i stays split as output axis j when the elements before them agree and the
 * shards cover the same flat ranges (equal sizes, or both divisible by p). The dispatcher gives
 * the kernel the shard's shape. */
void flow_sbp_rule_view(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  int64_t pin = 1;
  for (int i = 0; i < q->in_ndim[0]; i++) {
    int64_t pout = 1, n = q->in_shape[0][i];
    for (int j = 0; j < q->out_ndim[0]; j++) {
      int64_t m = q->out_shape[0][j];
      if (pout == pin && n > 1 && (m == n || (n % q->p == 0 && m % q->p == 0))) {
        flow_sbp_sig *s = add(l);
        if (s) { s->in[0] = S(i); s->out[0] = S(j); }
        break;
      }
      pout *= m;
      if (pout > pin) break;
    }
    pin *= n;
  }
  all_same(q, l, P);
}

void flow_sbp_rule_expand(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  int lead = q->out_ndim[0] - q->in_ndim[0];
  for (int i = 0; i < q->in_ndim[0]; i++) {
    if (q->in_shape[0][i] != q->out_shape[0][i + lead] || q->in_shape[0][i] == 1) continue;
    flow_sbp_sig *s = add(l);
    if (s) { s->in[0] = S(i); s->out[0] = S(i + lead); }
  }
  all_same(q, l, P);
}

/* ---- lookups ----------------------------------------------------------------------------------- */

/* embedding(ids, weight [V, D]): ids split -> rows split; weight split on D -> output split on D;
 * weight split on V (ids whole) -> partial sums: each rank looks up the ids in its rows, zero rows
 * for the others (the dispatcher gives the kernel its rows' offset). */
void flow_sbp_rule_embedding(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  flow_sbp_sig *s;
  if ((s = add(l))) { s->in[1] = S(0); s->out[0] = P; }
  for (int i = 0; i < q->in_ndim[0]; i++)
    if ((s = add(l))) { s->in[0] = S(i); s->out[0] = S(i); }
  if ((s = add(l))) { s->in[1] = S(1); s->out[0] = S(q->out_ndim[0] - 1); }
  if ((s = add(l))) { s->in[1] = P; s->out[0] = P; }
}

/* index_select(t, idx) along attrs.axis: split t on any other axis */
void flow_sbp_rule_index_select(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  int nd = q->in_ndim[0], ax = norm_axis(q->attrs->axis, nd);
  flow_sbp_sig *s;
  for (int i = 0; i < nd; i++)
    if (i != ax && (s = add(l))) { s->in[0] = S(i); s->out[0] = S(i); }
  if ((s = add(l))) { s->in[0] = P; s->out[0] = P; }
}

/* scatter_add(t, idx, src) along attrs.axis: rows of idx/src split -> partial sums (t partial
 * too, so it is counted once); any other axis where idx spans t splits all three alike. */
void flow_sbp_rule_scatter_add(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  (void)flags;
  int nd = q->in_ndim[0], ax = norm_axis(q->attrs->axis, nd);
  flow_sbp_sig *s;
  if ((s = add(l))) { s->in[0] = P; s->in[1] = S(ax); s->in[2] = S(ax); s->out[0] = P; }
  for (int d = 0; d < nd; d++)
    if (d != ax && q->in_ndim[1] == nd && q->in_shape[1][d] == q->in_shape[0][d]) all_same(q, l, S(d));
  if ((s = add(l))) { s->in[0] = P; s->in[2] = P; s->out[0] = P; }
}

/* cross_entropy(logits [..., C], target [...]) -> loss, lse [...]; cross_entropy_grad
 * (FLOW_SBP_BACKWARD: logits, target, lse, g, glse) -> dlogits. Rows split on any batch axis:
 * per-row losses stay split, a sum becomes partial. */
void flow_sbp_rule_cross_entropy(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  bool grad = flags & FLOW_SBP_BACKWARD;
  int rows = q->in_ndim[0] - 1;
  for (int i = 0; i < rows; i++) {
    flow_sbp_sig *s = add(l);
    if (!s) return;
    for (int k = 0; k < q->nin; k++) s->in[k] = q->in_ndim[k] > i ? S(i) : B; /* a 0-d g of a sum is B */
    if (grad) s->out[0] = S(i);
    else {
      s->out[0] = q->out_ndim[0] == 0 ? P : S(i);
      s->out[1] = S(i);
    }
  }
}

/* batch_norm (x [N, C, ...] then per-channel weight, bias, running mean and variance) on running
 * statistics: x split on any axis but the channels' keeps the parameters whole; split on the
 * channels, the parameters split with it. batch_norm_grad (FLOW_SBP_BACKWARD: dy, x, then the
 * parameters) gives dx split like x and the weight and bias gradients as partial sums over the
 * rows (or split with the channels). */
void flow_sbp_rule_batch_norm(const flow_sig_query *q, unsigned flags, flow_sig_list *l) {
  bool grad = flags & FLOW_SBP_BACKWARD;
  int rows = grad ? 2 : 1;
  for (int i = 0; i < q->in_ndim[0]; i++) {
    flow_sbp_sig *s = add(l);
    if (!s) return;
    for (int k = 0; k < q->nin; k++) s->in[k] = k < rows ? S(i) : i == 1 ? S(0) : B;
    for (int o = 0; o < q->nout; o++) s->out[o] = o == 0 ? S(i) : i == 1 ? S(0) : P;
  }
}

/* ---- candidates -------------------------------------------------------------------------------- */

bool flow_sbp_candidates(const flow_sbp_rule *rule, const flow_sig_query *q, flow_sig_list *out) {
  out->n = 0;
  all_same(q, out, B);
  if (!rule || q->nin > FLOW_SIG_MAX_IO || q->nout > FLOW_SIG_MAX_IO) return false;
  if (q->attrs && (q->attrs->flags & rule->whole_when)) return true;
  rule->fn(q, rule->flags, out);
  return true;
}
