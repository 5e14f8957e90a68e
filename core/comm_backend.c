/* What the communicator backends share (comm_backend.h): sums, and the handshake's verdict. */
#include "comm_backend.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* ---- sums ------------------------------------------------------------------------------------- */

int flow_comm_sum_check(const char *what, flow_dtype dt) {
  if (dt == FLOW_BOOL)
    return flow_error_set("%s: partial sums of %s tensors are not supported (cast to float32 first)",
                          what, flow_dtype_name(dt));
  return 0;
}

#define ADD_INTO(T) do { T *a_ = acc; const T *x_ = x; for (size_t i = 0; i < n; i++) a_[i] += x_[i]; } while (0)
#define ADD_HALF(TO_F, FROM_F) do { uint16_t *a_ = acc; const uint16_t *x_ = x;             \
    for (size_t i = 0; i < n; i++) a_[i] = FROM_F(TO_F(a_[i]) + TO_F(x_[i])); } while (0)
void flow_comm_add_into(void *acc, const void *x, size_t n, flow_dtype dt) {
  switch (dt) {
  case FLOW_F32: ADD_INTO(float); break;
  case FLOW_F64: ADD_INTO(double); break;
  case FLOW_I64: ADD_INTO(int64_t); break;
  case FLOW_I32: ADD_INTO(int32_t); break;
  case FLOW_BF16: ADD_HALF(flow_bf16_to_float, flow_float_to_bf16); break;
  case FLOW_F16: ADD_HALF(flow_half_to_float, flow_float_to_half); break;
  default: ADD_INTO(uint8_t); break;
  }
}
#undef ADD_HALF
#undef ADD_INTO

int flow_comm_allreduce_by_parts(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt,
                                 flow_comm_reduce_scatterv_fn reduce_scatterv, flow_comm_allgatherv_fn allgatherv) {
  int n = c->size;
  size_t es = flow_dtype_size(dt), *v = malloc(2 * (size_t)n * sizeof *v), off = 0;
  if (!v) return flow_error_set("all-reduce: out of memory");
  for (int q = 0; q < n; q++) {
    v[q] = count / (size_t)n + ((size_t)q < count % (size_t)n);
    v[n + q] = off;
    off += v[q];
  }
  void *part = malloc(v[c->rank] * es + 1);
  int rc = part ? reduce_scatterv(c, send, part, v, dt) : flow_error_set("all-reduce: out of memory");
  if (rc == 0) rc = allgatherv(c, part, v[c->rank], recv, v, v + n, dt);
  free(part);
  free(v);
  return rc;
}

/* ---- the handshake's verdict ------------------------------------------------------------------- */

void flow_comm_record_fill(flow_comm_record *r, unsigned long long seq, long long v, int status, int rank,
                           const char *what, const char *msg) {
  r->seq = seq;
  r->lo = r->hi = v;
  r->status = status;
  r->rank = rank;
  snprintf(r->what, sizeof r->what, "%s", what ? what : "");
  snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
}

/* Append to r's message, as far as it holds. */
static void say(flow_comm_record *r, size_t *len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(flow_comm_record *r, size_t *len, const char *fmt, ...) {
  if (*len >= sizeof r->msg) return;
  va_list ap;
  va_start(ap, fmt);
  *len += (size_t)vsnprintf(r->msg + *len, sizeof r->msg - *len, fmt, ap);
  va_end(ap);
}

void flow_comm_verdict(flow_comm_record *v, const flow_comm *c, unsigned long long seq, const char *what,
                       long long mine, const flow_comm_record *got, const int *state, double waited,
                       int withdrawn_by) {
  int n = c->size;
  bool missing = false;
  flow_comm_record_fill(v, seq, mine, FLOW_HS_OK, c->rank, what, "");
  for (int q = 0; q < n; q++) missing |= q != c->rank && state[q] != FLOW_HS_ARRIVED;
  if (missing) { /* name the ranks that exited, those that did not arrive, and where the others are */
    size_t len = 0;
    for (int kind = FLOW_HS_EXITED; kind >= FLOW_HS_LATE; kind--) {
      int first = 1, last = -1;
      for (int q = 0; q < n; q++)
        if (q != c->rank && state[q] == kind) last = q;
      for (int q = 0; q <= last; q++) {
        if (q == c->rank || state[q] != kind) continue;
        if (first && len) say(v, &len, "; ");
        if (first && kind == FLOW_HS_LATE)
          say(v, &len, flow_comm_interrupted() ? "interrupted after %.0f s waiting for " : "waited %.0f s (FLOW_TIMEOUT) for ",
              waited);
        say(v, &len, first ? "rank %d" : ", %d", q);
        first = 0;
      }
      if (last >= 0)
        say(v, &len, "%s", kind == FLOW_HS_EXITED ? " exited" : ", which did not arrive (stopped, stuck, failed "
            "outside a global op or took another path)");
    }
    say(v, &len, "; rank %d is at %s", c->rank, what);
    for (int q = 0; q < n; q++)
      if (q != c->rank && state[q] == FLOW_HS_ARRIVED) say(v, &len, ", rank %d at %s", q, got[q].what);
    v->status = FLOW_HS_CANCELLED;
  } else if (withdrawn_by >= 0) {
    snprintf(v->msg, sizeof v->msg, "rank %d gave up waiting for this rank, the handshake's leader (FLOW_TIMEOUT)",
             withdrawn_by);
    v->status = FLOW_HS_CANCELLED;
  } else {
    for (int q = 0; q < n; q++) {
      if (q == c->rank) continue;
      if (got[q].status == FLOW_HS_FAILED && v->status == FLOW_HS_OK) {
        v->status = FLOW_HS_FAILED;
        v->rank = q;
        snprintf(v->msg, sizeof v->msg, "%s", got[q].msg);
      }
      if (got[q].lo < v->lo) v->lo = got[q].lo;
      if (got[q].hi > v->hi) v->hi = got[q].hi;
    }
  }
}

static _Thread_local int failed_rank = -1;

int flow_comm_failed_rank(void) { return failed_rank; }
void flow_comm_forget_failure(void) { failed_rank = -1; }

int flow_comm_verdict_result(const flow_comm *c, const char *what, const flow_comm_record *r, long long *min,
                             long long *max) {
  failed_rank = r->status == FLOW_HS_FAILED ? r->rank : -1;
  if (r->status == FLOW_HS_FAILED) {
    return flow_error_set("[rank %d] %s: rank %d failed: %s", c->rank, what, r->rank, flow_error_unranked(r->msg));
  }
  if (r->status == FLOW_HS_CANCELLED)
    return flow_error_set(c->rank == 0 ? "[rank %d] %s: %s" : "[rank %d] %s: rank 0 gave up waiting, so no rank moves "
                          "data here: %s", c->rank, what, r->msg);
  *min = r->lo;
  *max = r->hi;
  return 0;
}

int flow_comm_handshake_minmax(flow_comm *c, long long v, long long *min, long long *max) {
  return c->ops->handshake(c, "agreement check", v, min, max);
}

/* A handshake whose value says "barrier": a rank that meets another's global op here is out of step. */
int flow_comm_handshake_barrier(flow_comm *c) {
  long long lo, hi;
  if (c->ops->handshake(c, "barrier", -2, &lo, &hi) != 0) return -1;
  if (lo != hi)
    return flow_error_set("[rank %d] barrier: another rank is at a global op's handshake here, not at this barrier "
                          "(the ranks took different paths)", c->rank);
  return 0;
}
