/* Error reporting for the C core: functions return a status and leave a message here;
 * the Lua binding raises it as a Lua error. One message per thread. */
#ifndef FLOW_ERROR_H
#define FLOW_ERROR_H

#include <stdarg.h>

#define FLOW_ERROR_MAX 1024   /* bytes of a message, with its terminating zero */

/* Set the current error message (printf-style). Always returns -1 so callers can
 * write `return flow_error_set(...)`. */
int flow_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int flow_error_vset(const char *fmt, va_list ap);
/* Prefix the current message with "<prefix>: " (used when an error bubbles up through an op). */
int flow_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *flow_error_get(void);
/* msg without a leading "[rank r] " (the rank that raised it), for passing it on under another's */
const char *flow_error_unranked(const char *msg);
void flow_error_clear(void);

#endif
