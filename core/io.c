/* safetensors read/write, whole-file reading through zlib, and token files (see io.h).
 * safetensors layout: u64 little-endian header length N, N bytes of JSON, then the raw little-endian data;
 * each tensor's JSON entry gives dtype, shape and [begin, end) byte offsets into the data. */
#include "io.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "device.h"
#include "error.h"

/* A JSON header larger than this is taken as a corrupt length field, not a real checkpoint. */
#define HEADER_MAX ((uint64_t)100 << 20)

static const struct { flow_dtype d; const char *name; } st_dtypes[] = {
  {FLOW_F32, "F32"}, {FLOW_F64, "F64"}, {FLOW_F16, "F16"}, {FLOW_BF16, "BF16"},
  {FLOW_I64, "I64"}, {FLOW_I32, "I32"}, {FLOW_U8, "U8"}, {FLOW_BOOL, "BOOL"},
};

static const char *st_dtype_name(flow_dtype d) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (st_dtypes[i].d == d) return st_dtypes[i].name;
  return NULL;
}

void flow_io_file_free(flow_io_file *f) {
  for (int i = 0; i < f->n; i++) {
    free(f->names[i]);
    if (f->tensors[i]) flow_tensor_decref(f->tensors[i]);
  }
  for (int i = 0; i < f->nmeta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->names);
  free(f->tensors);
  free(f->meta_keys);
  free(f->meta_values);
  free(f->meta_number);
  memset(f, 0, sizeof *f);
}

/* ---------------------------------------------------------------- growable buffer */

typedef struct buf { char *p; size_t len, cap; int oom; } buf;

static void buf_put(buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (b->len + n + 1 > cap) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return; }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void buf_str(buf *b, const char *s) { buf_put(b, s, strlen(s)); }

/* A JSON string literal: quotes, backslashes and control characters escaped; other bytes
 * (UTF-8 included) copied as they are. */
static void buf_json_string(buf *b, const char *s) {
  buf_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[8];
    if (*p == '"') buf_put(b, "\\\"", 2);
    else if (*p == '\\') buf_put(b, "\\\\", 2);
    else if (*p == '\n') buf_put(b, "\\n", 2);
    else if (*p == '\t') buf_put(b, "\\t", 2);
    else if (*p == '\r') buf_put(b, "\\r", 2);
    else if (*p < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", *p); buf_put(b, esc, 6); }
    else buf_put(b, (const char *)p, 1);
  }
  buf_put(b, "\"", 1);
}

/* ---------------------------------------------------------------- writing */

static void put_u64le(unsigned char *out, uint64_t v) {
  for (int i = 0; i < 8; i++) out[i] = (unsigned char)(v >> (8 * i));
}

static int build_header(const flow_io_file *f, buf *h) {
  buf_str(h, "{");
  int first = 1;
  if (f->nmeta > 0) {
    buf numbers = {0}; /* the JSON array of the number entries' keys */
    buf_str(h, "\"__metadata__\":{");
    for (int i = 0; i < f->nmeta; i++) {
      if (strcmp(f->meta_keys[i], FLOW_IO_NUMBERS_KEY) == 0) {
        free(numbers.p);
        return flow_error_set("save: the metadata key '%s' is reserved", FLOW_IO_NUMBERS_KEY);
      }
      if (i) buf_str(h, ",");
      buf_json_string(h, f->meta_keys[i]);
      buf_str(h, ":");
      buf_json_string(h, f->meta_values[i]);
      if (f->meta_number && f->meta_number[i]) {
        buf_str(&numbers, numbers.len ? "," : "[");
        buf_json_string(&numbers, f->meta_keys[i]);
      }
    }
    if (numbers.len) {
      buf_str(&numbers, "]");
      buf_str(h, ",\"" FLOW_IO_NUMBERS_KEY "\":");
      buf_put(&numbers, "", 1);
      if (!numbers.oom) buf_json_string(h, numbers.p);
      h->oom |= numbers.oom;
    }
    free(numbers.p);
    buf_str(h, "}");
    first = 0;
  }
  uint64_t off = 0;
  for (int i = 0; i < f->n; i++) {
    const flow_tensor *t = f->tensors[i];
    if (strcmp(f->names[i], "__metadata__") == 0)
      return flow_error_set("save: '__metadata__' is reserved and cannot name a tensor");
    if (t->device.type != FLOW_CPU || !flow_tensor_is_contiguous(t))
      return flow_error_set("save: tensor '%s' must be a contiguous CPU tensor", f->names[i]);
    char num[48];
    if (!first) buf_str(h, ",");
    first = 0;
    buf_json_string(h, f->names[i]);
    buf_str(h, ":{\"dtype\":\"");
    buf_str(h, st_dtype_name(t->dtype));
    buf_str(h, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t->shape[d]);
      buf_str(h, num);
    }
    uint64_t end = off + flow_tensor_nbytes(t);
    snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)end);
    buf_str(h, num);
    off = end;
  }
  buf_str(h, "}");
  while (h->len % 8) buf_str(h, " "); /* the data then starts 8-byte aligned, as safetensors pads */
  if (h->oom) return flow_error_set("save: out of memory building the header");
  return 0;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A name that appears twice among n, or NULL (sorting a copy: n log n, for files of 100k entries).
 * *oom is set when the copy cannot be made. */
static const char *duplicate_name(char *const *names, int n, int *oom) {
  *oom = 0;
  if (n < 2) return NULL;
  char **sorted = malloc((size_t)n * sizeof *sorted);
  if (!sorted) { *oom = 1; return NULL; }
  memcpy(sorted, names, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_name);
  const char *dup = NULL;
  for (int i = 1; i < n && !dup; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0) dup = sorted[i];
  free(sorted);
  return dup;
}

int flow_io_save(const char *path, const flow_io_file *f) {
  int oom;
  const char *dup = duplicate_name(f->names, f->n, &oom);
  if (oom) return flow_error_set("save: out of memory");
  if (dup) return flow_error_set("save: name '%s' appears twice", dup);
  buf h = {0};
  if (build_header(f, &h) != 0) { free(h.p); return -1; }
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 5);
  if (!tmp) { free(h.p); return flow_error_set("save: out of memory"); }
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ".tmp", 5);
  FILE *fp = fopen(tmp, "wb");
  if (!fp) {
    flow_error_set("save: cannot open '%s' for writing: %s", tmp, strerror(errno));
    free(tmp); free(h.p);
    return -1;
  }
  unsigned char len8[8];
  put_u64le(len8, h.len);
  int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(h.p, 1, h.len, fp) == h.len;
  for (int i = 0; ok && i < f->n; i++) {
    size_t nb = flow_tensor_nbytes(f->tensors[i]);
    ok = fwrite(flow_tensor_data(f->tensors[i]), 1, nb, fp) == nb;
  }
  int err = errno;
  if (fclose(fp) != 0 && ok) { ok = 0; err = errno; }
  free(h.p);
  if (!ok) {
    flow_error_set("save: writing '%s' failed: %s", tmp, strerror(err));
    remove(tmp);
    free(tmp);
    return -1;
  }
  if (rename(tmp, path) != 0) {
    flow_error_set("save: cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    remove(tmp);
    free(tmp);
    return -1;
  }
  free(tmp);
  return 0;
}

/* ---------------------------------------------------------------- the JSON header parser */

/* A strict recursive-descent reader for the one shape of JSON a safetensors header has.
 * Every read is bounds-checked against end; errors name the byte offset in the header. */
typedef struct jp {
  const char *p, *start, *end;
  const char *path;
} jp;

static int jp_fail(jp *j, const char *what) {
  return flow_error_set("load: '%s': bad header JSON at byte %ld: %s", j->path, (long)(j->p - j->start), what);
}

static void jp_ws(jp *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int jp_expect(jp *j, char c) {
  jp_ws(j);
  if (j->p >= j->end || *j->p != c) {
    char what[32];
    snprintf(what, sizeof what, "expected '%c'", c);
    return jp_fail(j, what);
  }
  j->p++;
  return 0;
}

/* Is the next non-blank character c? Consumes it when it is. */
static int jp_accept(jp *j, char c) {
  jp_ws(j);
  if (j->p < j->end && *j->p == c) { j->p++; return 1; }
  return 0;
}

static int hex4(const char *p, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return -1;
  }
  *out = v;
  return 0;
}

static void put_utf8(buf *b, unsigned cp) {
  char u[4];
  size_t n;
  if (cp < 0x80) { u[0] = (char)cp; n = 1; }
  else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
  else if (cp < 0x10000) {
    u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
  } else {
    u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
  }
  buf_put(b, u, n);
}

/* A string literal into a malloc'd, NUL-terminated *out. NUL bytes (\u0000) are refused:
 * names and metadata are C strings here. */
static int jp_string(jp *j, char **out) {
  if (jp_expect(j, '"') != 0) return -1;
  buf b = {0};
  buf_put(&b, "", 0);
  while (1) {
    if (j->p >= j->end) { free(b.p); return jp_fail(j, "unterminated string"); }
    unsigned char c = (unsigned char)*j->p++;
    if (c == '"') break;
    if (c < 0x20) { free(b.p); return jp_fail(j, "control character in string"); }
    if (c != '\\') { buf_put(&b, (const char *)&c, 1); continue; }
    if (j->p >= j->end) { free(b.p); return jp_fail(j, "unterminated escape"); }
    char e = *j->p++;
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e && simple) {
      static const char repl[] = "\"\\/\b\f\n\r\t";
      buf_put(&b, &repl[simple - "\"\\/bfnrt"], 1);
      continue;
    }
    unsigned cp;
    if (e != 'u' || j->end - j->p < 4 || hex4(j->p, &cp) != 0) { free(b.p); return jp_fail(j, "bad escape"); }
    j->p += 4;
    if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair encodes one code point above U+FFFF */
      unsigned lo;
      if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || hex4(j->p + 2, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF) {
        free(b.p);
        return jp_fail(j, "unpaired surrogate");
      }
      j->p += 6;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if ((cp >= 0xDC00 && cp < 0xE000) || cp == 0) {
      free(b.p);
      return jp_fail(j, cp ? "unpaired surrogate" : "NUL character in string");
    }
    put_utf8(&b, cp);
  }
  if (b.oom) { free(b.p); return flow_error_set("load: out of memory"); }
  *out = b.p;
  return 0;
}

/* A non-negative integer (no sign, fraction or exponent: shapes and offsets are whole). */
static int jp_uint(jp *j, uint64_t *out) {
  jp_ws(j);
  if (j->p >= j->end || *j->p < '0' || *j->p > '9') return jp_fail(j, "expected a non-negative integer");
  uint64_t v = 0;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
    if (v > (UINT64_MAX - 9) / 10) return jp_fail(j, "integer too large");
    v = v * 10 + (uint64_t)(*j->p++ - '0');
  }
  if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')) return jp_fail(j, "expected an integer");
  *out = v;
  return 0;
}

/* [u, u, ...] into out[0..max); *n gets the count. */
static int jp_uint_list(jp *j, uint64_t *out, int max, int *n) {
  if (jp_expect(j, '[') != 0) return -1;
  *n = 0;
  if (jp_accept(j, ']')) return 0;
  do {
    if (*n == max) return jp_fail(j, "list too long");
    if (jp_uint(j, &out[(*n)++]) != 0) return -1;
  } while (jp_accept(j, ','));
  return jp_expect(j, ']');
}

typedef struct entry {
  flow_dtype dtype;
  int ndim;
  int64_t shape[FLOW_MAX_DIMS];
  uint64_t begin, end;
} entry;

static int parse_entry(jp *j, const char *name, entry *e) {
  int have_dtype = 0, have_shape = 0, have_off = 0;
  if (jp_expect(j, '{') != 0) return -1;
  if (jp_accept(j, '}')) return jp_fail(j, "empty tensor entry");
  do {
    char *key;
    if (jp_string(j, &key) != 0) return -1;
    int rc = jp_expect(j, ':');
    if (rc == 0 && strcmp(key, "dtype") == 0) {
      char *dt;
      rc = jp_string(j, &dt);
      if (rc == 0) {
        size_t i, n = sizeof st_dtypes / sizeof st_dtypes[0];
        for (i = 0; i < n && strcmp(st_dtypes[i].name, dt) != 0; i++) {}
        if (i == n) rc = flow_error_set("load: '%s': tensor '%s' has unsupported dtype '%s' (expected F32, F64, F16, BF16, I64, I32, U8 or BOOL)", j->path, name, dt);
        else e->dtype = st_dtypes[i].d;
        free(dt);
      }
      have_dtype = 1;
    } else if (rc == 0 && strcmp(key, "shape") == 0) {
      uint64_t s[FLOW_MAX_DIMS];
      rc = jp_uint_list(j, s, FLOW_MAX_DIMS, &e->ndim);
      for (int d = 0; rc == 0 && d < e->ndim; d++) {
        if (s[d] > ((uint64_t)1 << 48)) rc = jp_fail(j, "dimension too large");
        e->shape[d] = (int64_t)s[d];
      }
      have_shape = 1;
    } else if (rc == 0 && strcmp(key, "data_offsets") == 0) {
      uint64_t o[2];
      int n;
      rc = jp_uint_list(j, o, 2, &n);
      if (rc == 0 && n != 2) rc = jp_fail(j, "data_offsets needs two integers");
      e->begin = o[0];
      e->end = o[1];
      have_off = 1;
    } else if (rc == 0) {
      rc = flow_error_set("load: '%s': tensor '%s' has unknown field '%s'", j->path, name, key);
    }
    free(key);
    if (rc != 0) return -1;
  } while (jp_accept(j, ','));
  if (jp_expect(j, '}') != 0) return -1;
  if (!have_dtype || !have_shape || !have_off)
    return flow_error_set("load: '%s': tensor '%s' lacks %s", j->path, name,
                          !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
  return 0;
}

static int grow(void **arr, int n, size_t es) {
  if (n & (n - 1)) return 0; /* capacity doubles at powers of two */
  void *p = realloc(*arr, (size_t)(n ? 2 * n : 1) * es);
  if (!p) return flow_error_set("load: out of memory");
  *arr = p;
  return 0;
}

static int parse_metadata(jp *j, flow_io_file *f) {
  if (jp_expect(j, '{') != 0) return -1;
  if (jp_accept(j, '}')) return 0;
  do {
    char *k = NULL, *v = NULL;
    if (jp_string(j, &k) != 0 || jp_expect(j, ':') != 0 || jp_string(j, &v) != 0 ||
        grow((void **)&f->meta_keys, f->nmeta, sizeof(char *)) != 0 ||
        grow((void **)&f->meta_values, f->nmeta, sizeof(char *)) != 0) {
      free(k);
      free(v);
      return -1;
    }
    f->meta_keys[f->nmeta] = k;
    f->meta_values[f->nmeta++] = v;
  } while (jp_accept(j, ','));
  return jp_expect(j, '}');
}

static int cmp_key(const void *a, const void *b) { return strcmp(**(char **const *)a, **(char **const *)b); }

/* Take the FLOW_IO_NUMBERS_KEY entry out of f's metadata and mark the entries it names. Its value
 * must be a JSON array of strings, each the key of another entry. Keys are looked up in a sorted
 * index, so a hostile file with many entries stays fast. */
static int mark_numbers(const char *path, flow_io_file *f) {
  int at = -1;
  for (int i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta_keys[i], FLOW_IO_NUMBERS_KEY) == 0) {
      if (at >= 0) return flow_error_set("load: '%s': metadata '%s' appears twice", path, FLOW_IO_NUMBERS_KEY);
      at = i;
    }
  if (at < 0) return 0;
  char *list = f->meta_values[at];
  free(f->meta_keys[at]);
  f->meta_keys[at] = f->meta_keys[f->nmeta - 1];
  f->meta_values[at] = f->meta_values[--f->nmeta];
  char ***index = malloc(sizeof *index * (size_t)(f->nmeta + 1));
  f->meta_number = calloc((size_t)f->nmeta + 1, 1);
  if (!index || !f->meta_number) { free(index); free(list); return flow_error_set("load: out of memory"); }
  for (int i = 0; i < f->nmeta; i++) index[i] = &f->meta_keys[i];
  qsort(index, (size_t)f->nmeta, sizeof *index, cmp_key);
  char where[4200]; /* errors read "load: 'path': metadata '...': bad header JSON at byte ..." */
  snprintf(where, sizeof where, "%.4000s': metadata '%s", path, FLOW_IO_NUMBERS_KEY);
  jp j = {list, list, list + strlen(list), where};
  int rc = jp_expect(&j, '[');
  if (rc == 0 && !jp_accept(&j, ']')) {
    do {
      char *k;
      if ((rc = jp_string(&j, &k)) != 0) break;
      char **key = &k, ***hit = bsearch(&key, index, (size_t)f->nmeta, sizeof *index, cmp_key);
      if (hit) f->meta_number[*hit - f->meta_keys] = 1;
      else rc = flow_error_set("load: '%s': names '%s', which is not a metadata entry", where, k);
      free(k);
    } while (rc == 0 && jp_accept(&j, ','));
    if (rc == 0) rc = jp_expect(&j, ']');
  }
  jp_ws(&j);
  if (rc == 0 && j.p != j.end) rc = jp_fail(&j, "trailing characters after the list of keys");
  free(index);
  free(list);
  return rc;
}

/* ---------------------------------------------------------------- reading */

static int read_tensor(FILE *fp, const char *path, const char *name, const entry *e, uint64_t data_start,
                       uint64_t data_len, flow_tensor **out) {
  char s[128];
  uint64_t want = flow_dtype_size(e->dtype);
  for (int d = 0; d < e->ndim; d++) { /* a corrupt shape must not overflow the byte count */
    uint64_t n = (uint64_t)e->shape[d];
    if (n && want > UINT64_MAX / n)
      return flow_error_set("load: '%s': tensor '%s' has shape %s, too large", path, name,
                            flow_shape_str(e->ndim, e->shape, s, sizeof s));
    want *= n;
  }
  if (e->begin > e->end || e->end > data_len)
    return flow_error_set("load: '%s': tensor '%s' has data_offsets [%llu, %llu] outside the %llu data bytes (truncated file?)",
                          path, name, (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)data_len);
  if (e->end - e->begin != want)
    return flow_error_set("load: '%s': tensor '%s' (%s %s) needs %llu bytes but data_offsets give %llu", path, name,
                          st_dtype_name(e->dtype), flow_shape_str(e->ndim, e->shape, s, sizeof s),
                          (unsigned long long)want, (unsigned long long)(e->end - e->begin));
  flow_tensor *t = flow_tensor_new(e->dtype, FLOW_DEVICE_CPU, e->ndim, e->shape);
  if (!t) return flow_error_prefix("load: '%s': tensor '%s'", path, name);
  if (want && (fseeko(fp, (off_t)(data_start + e->begin), SEEK_SET) != 0 || fread(flow_tensor_data(t), 1, want, fp) != want)) {
    flow_tensor_decref(t);
    return flow_error_set("load: '%s': reading tensor '%s' failed (truncated file?)", path, name);
  }
  *out = t;
  return 0;
}

static const entry *sort_entries_base;
static int cmp_begin(const void *a, const void *b) {
  uint64_t x = sort_entries_base[*(const int *)a].begin, y = sort_entries_base[*(const int *)b].begin;
  return x < y ? -1 : x > y;
}

/* safetensors requires disjoint data ranges: entries that alias the same bytes would let a small
 * file ask for any amount of memory. Ranges are checked in order of their start (n log n). */
static int check_ranges(const char *path, const flow_io_file *f, const entry *es) {
  if (f->n < 2) return 0;
  int *order = malloc((size_t)f->n * sizeof *order);
  if (!order) return flow_error_set("load: out of memory");
  for (int i = 0; i < f->n; i++) order[i] = i;
  sort_entries_base = es;
  qsort(order, (size_t)f->n, sizeof *order, cmp_begin);
  int rc = 0;
  for (int k = 1; k < f->n && rc == 0; k++) {
    const entry *a = &es[order[k - 1]], *b = &es[order[k]];
    if (b->begin < a->end)
      rc = flow_error_set("load: '%s': tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap (data ranges must be disjoint)",
                          path, f->names[order[k - 1]], (unsigned long long)a->begin, (unsigned long long)a->end,
                          f->names[order[k]], (unsigned long long)b->begin, (unsigned long long)b->end);
  }
  free(order);
  return rc;
}

static int load_open(FILE *fp, const char *path, flow_io_file *f) {
  if (fseeko(fp, 0, SEEK_END) != 0) return flow_error_set("load: '%s': cannot seek: %s", path, strerror(errno));
  uint64_t size = (uint64_t)ftello(fp);
  rewind(fp);
  unsigned char len8[8];
  if (size < 8 || fread(len8, 1, 8, fp) != 8)
    return flow_error_set("load: '%s' is not a safetensors file (%llu bytes, shorter than the 8-byte header length)", path, (unsigned long long)size);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++) hlen |= (uint64_t)len8[i] << (8 * i);
  if (hlen < 2 || hlen > HEADER_MAX || hlen > size - 8)
    return flow_error_set("load: '%s' is not a valid safetensors file (header length %llu, file size %llu)", path,
                          (unsigned long long)hlen, (unsigned long long)size);
  char *hdr = malloc(hlen);
  if (!hdr) return flow_error_set("load: out of memory");
  if (fread(hdr, 1, hlen, fp) != hlen) {
    free(hdr);
    return flow_error_set("load: '%s': cannot read the header", path);
  }
  /* The whole header is parsed and checked before any tensor is allocated. */
  entry *es = NULL;
  jp j = {hdr, hdr, hdr + hlen, path};
  int rc = jp_expect(&j, '{');
  if (rc == 0 && !jp_accept(&j, '}')) {
    do {
      char *name;
      if ((rc = jp_string(&j, &name)) != 0) break;
      if ((rc = jp_expect(&j, ':')) != 0) { free(name); break; }
      if (strcmp(name, "__metadata__") == 0) {
        free(name);
        if ((rc = parse_metadata(&j, f)) != 0) break;
        continue;
      }
      entry e;
      rc = parse_entry(&j, name, &e);
      if (rc == 0) rc = grow((void **)&f->names, f->n, sizeof(char *));
      if (rc == 0) rc = grow((void **)&f->tensors, f->n, sizeof(flow_tensor *));
      if (rc == 0) rc = grow((void **)&es, f->n, sizeof(entry));
      if (rc != 0) { free(name); break; }
      f->names[f->n] = name;
      f->tensors[f->n] = NULL;
      es[f->n++] = e;
    } while (rc == 0 && jp_accept(&j, ','));
    if (rc == 0) rc = jp_expect(&j, '}');
  }
  jp_ws(&j);
  if (rc == 0 && j.p != j.end) rc = jp_fail(&j, "trailing characters after the header object");
  free(hdr);
  if (rc == 0) rc = mark_numbers(path, f);
  if (rc == 0) {
    int oom;
    const char *dup = duplicate_name(f->names, f->n, &oom);
    if (oom) rc = flow_error_set("load: out of memory");
    else if (dup) rc = flow_error_set("load: '%s': tensor '%s' appears twice", path, dup);
  }
  if (rc == 0) rc = check_ranges(path, f, es);
  for (int i = 0; rc == 0 && i < f->n; i++)
    rc = read_tensor(fp, path, f->names[i], &es[i], 8 + hlen, size - 8 - hlen, &f->tensors[i]);
  free(es);
  return rc;
}

/* Open path for reading as `op` only if it is a regular file: a FIFO would block the open or the
 * read forever, and a device such as /dev/zero never ends. O_NONBLOCK keeps the open itself from
 * waiting on a FIFO's writer. Returns the descriptor, or -1 with a message. */
static int open_regular(const char *op, const char *path) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return flow_error_set("%s: cannot open '%s': %s", op, path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return flow_error_set("%s: cannot stat '%s': %s", op, path, strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return flow_error_set("%s: '%s' is not a regular file (a directory, FIFO or device)", op, path);
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

int flow_io_load(const char *path, flow_io_file *f) {
  memset(f, 0, sizeof *f);
  int fd = open_regular("load", path);
  if (fd < 0) return -1;
  FILE *fp = fdopen(fd, "rb");
  if (!fp) { close(fd); return flow_error_set("load: cannot open '%s': %s", path, strerror(errno)); }
  int rc = load_open(fp, path, f);
  fclose(fp);
  if (rc != 0) flow_io_file_free(f);
  return rc;
}

/* The text is capped at the host allocation limit (a gzip bomb stops there, not at out-of-memory),
 * and at `max` bytes: a prefix of a file is read (and, gzipped, unpacked) without the rest. */
int flow_io_read_file(const char *path, size_t max, char **data, size_t *len) {
  int fd = open_regular("read_file", path);
  if (fd < 0) return -1;
  size_t cap = flow_device_cpu_max_alloc();
  bool capped = max < cap; /* stop at max, and not as an error */
  if (capped) cap = max;
  gzFile gz = gzdopen(fd, "rb");
  if (!gz) { close(fd); return flow_error_set("read_file: cannot open '%s': out of memory", path); }
  buf b = {0};
  buf_put(&b, "", 0);
  char chunk[1 << 16];
  int n;
  for (;;) {
    size_t want = capped && cap - b.len < sizeof chunk ? cap - b.len : sizeof chunk;
    if (want == 0) { n = 0; break; }
    if ((n = gzread(gz, chunk, (unsigned)want)) <= 0 || b.len + (size_t)n > cap) break;
    buf_put(&b, chunk, (size_t)n);
  }
  if (n < 0 || b.oom || n > 0) {
    int errnum;
    const char *msg = gzerror(gz, &errnum);
    if (n > 0) flow_error_set("read_file: '%s' holds more than %zu bytes (the host allocation limit; FLOW_MAX_ALLOC_BYTES)", path, cap);
    else flow_error_set("read_file: reading '%s' failed: %s", path, b.oom ? "out of memory" : msg);
    gzclose(gz);
    free(b.p);
    return -1;
  }
  gzclose(gz);
  *data = b.p;
  *len = b.len;
  return 0;
}

/* ---------------------------------------------------------------- token files */

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Bytes a token for a shard's magic and version; 0 for a pair llm.c does not write. */
static int shard_width(uint32_t magic, uint32_t version) {
  if (magic == FLOW_IO_SHARD_MAGIC) return version == 1 ? 2 : version == 2 ? 4 : 0;
  if (magic == FLOW_IO_SHARD_MAGIC_LLAMA3) return version == 7 ? 4 : 0;
  return 0;
}

static int is_shard_magic(uint32_t magic) {
  return magic == FLOW_IO_SHARD_MAGIC || magic == FLOW_IO_SHARD_MAGIC_LLAMA3;
}

/* Read up to n bytes at offset off; returns the count read (short only at the end of the file). */
static ssize_t pread_full(int fd, unsigned char *p, size_t n, off_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, p + got, n - got, off + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* Check the header of the shard open as fd (size bytes) and map its tokens into t. */
static int shard_open(int fd, const char *path, off_t size, flow_io_tokens *t) {
  unsigned char h[FLOW_IO_SHARD_HEADER];
  ssize_t got = pread_full(fd, h, sizeof h, 0);
  if (got < 0) return flow_error_set("data: reading '%s' failed: %s", path, strerror(errno));
  if (got < (ssize_t)sizeof h)
    return flow_error_set("data: '%s' is too short for an llm.c shard header (%d bytes)", path, (int)got);
  uint32_t magic = le32(h), version = le32(h + 4);
  int32_t count = (int32_t)le32(h + 8);
  if (!is_shard_magic(magic))
    return flow_error_set("data: '%s' has magic %d, expected %d (an llm.c .bin shard)", path, (int32_t)magic,
                          FLOW_IO_SHARD_MAGIC);
  int width = shard_width(magic, version);
  if (!width)
    return flow_error_set("data: '%s' has shard version %d, expected %s", path, (int32_t)version,
                          magic == FLOW_IO_SHARD_MAGIC ? "1 (uint16) or 2 (uint32)" : "7");
  int64_t held = (int64_t)size - FLOW_IO_SHARD_HEADER;
  if (count < 0 || held != (int64_t)width * count)
    return flow_error_set("data: '%s' says %d tokens but holds %lld bytes of tokens", path, count, (long long)held);
  t->width = width;
  t->count = count;
  if (count == 0) return 0;
  void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED) return flow_error_set("data: cannot map '%s': %s", path, strerror(errno));
  t->map = m;
  t->map_len = (size_t)size;
  t->data = (const unsigned char *)m + FLOW_IO_SHARD_HEADER;
  return 0;
}

int flow_io_tokens_open(const char *path, flow_io_tokens *t) {
  memset(t, 0, sizeof *t);
  int fd = open_regular("data", path);
  if (fd < 0) return -1;
  struct stat st;
  unsigned char head[4];
  int rc = fstat(fd, &st);
  ssize_t got = rc == 0 ? pread_full(fd, head, sizeof head, 0) : -1;
  if (got < 0) {
    int err = errno;
    close(fd);
    return flow_error_set("data: reading '%s' failed: %s", path, strerror(err));
  }
  size_t n = strlen(path);
  if ((n >= 4 && strcmp(path + n - 4, ".bin") == 0) || (got == 4 && is_shard_magic(le32(head)))) {
    rc = shard_open(fd, path, st.st_size, t);
    close(fd); /* the mapping outlives the descriptor */
    return rc;
  }
  close(fd);
  size_t len;
  if (flow_io_read_file(path, SIZE_MAX, &t->text, &len) != 0) return -1;
  t->data = (const unsigned char *)t->text;
  t->count = (int64_t)len;
  t->width = 1;
  return 0;
}

void flow_io_tokens_read(const flow_io_tokens *t, int64_t start, int64_t n, int64_t *out) {
  const unsigned char *p = t->data + start * t->width;
  switch (t->width) {
  case 1: for (int64_t i = 0; i < n; i++) out[i] = p[i]; break;
  case 2: for (int64_t i = 0; i < n; i++) out[i] = (int64_t)(p[2 * i] | p[2 * i + 1] << 8); break;
  default: for (int64_t i = 0; i < n; i++) out[i] = (int64_t)le32(p + 4 * i); break;
  }
}

void flow_io_tokens_close(flow_io_tokens *t) {
  if (t->map) munmap(t->map, t->map_len);
  free(t->text);
  memset(t, 0, sizeof *t);
}
