/* Thread-local error message buffer (see error.h). */
#include "error.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char msg[FLOW_ERROR_MAX];

int flow_error_vset(const char *fmt, va_list ap) {
  vsnprintf(msg, sizeof msg, fmt, ap);
  return -1;
}

int flow_error_set(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  flow_error_vset(fmt, ap);
  va_end(ap);
  return -1;
}

int flow_error_prefix(const char *fmt, ...) {
  char prefix[256], old[FLOW_ERROR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, msg, sizeof old);
  size_t n = strlen(prefix);
  if (n + 2 >= sizeof msg) n = sizeof msg - 3;
  memcpy(msg, prefix, n);
  memcpy(msg + n, ": ", 2);
  memcpy(msg + n + 2, old, sizeof msg - n - 3);
  msg[sizeof msg - 1] = '\0';
  return -1;
}

const char *flow_error_get(void) { return msg[0] ? msg : "unknown error"; }

void flow_error_clear(void) { msg[0] = '\0'; }

const char *flow_error_unranked(const char *msg) {
  const char *tail = strncmp(msg, "[rank ", 6) == 0 ? strstr(msg, "] ") : NULL;
  return tail ? tail + 2 : msg;
}
