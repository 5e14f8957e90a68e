/* File formats: safetensors checkpoints (read/write, with a strict bounds-checked JSON header) and
 * whole-file reading through zlib (plain or gzip-compressed). */
#ifndef FLOW_IO_H
#define FLOW_IO_H

#include <stddef.h>

#include "tensor.h"

/* One checkpoint in memory: named tensors plus the "__metadata__" string map. Safetensors metadata
 * values are strings; the entries that hold a number's text are listed in one more metadata entry,
 * FLOW_IO_NUMBERS_KEY, a JSON array of their keys as a string, so a reader gets numbers back as
 * numbers and strings ("1.10") as they were. Files from other tools have no such entry. */
#define FLOW_IO_NUMBERS_KEY "__flowlua_numbers__"

typedef struct flow_io_file {
  int n;
  char **names;
  flow_tensor **tensors;   /* contiguous CPU tensors, one reference each */
  int nmeta;
  char **meta_keys;
  char **meta_values;
  unsigned char *meta_number;  /* per entry: 1 when the value is a number's text (NULL: none is) */
} flow_io_file;

/* Write a safetensors file: tensors must be contiguous and on the CPU; names must be unique.
 * The file is written to path.."tmp" and renamed over path, so a reader never sees half a file. */
int flow_io_save(const char *path, const flow_io_file *f);
/* Read a safetensors file into *f (zeroed first); on error *f holds nothing and -1 is returned
 * with a message naming the file and what is wrong with it. */
int flow_io_load(const char *path, flow_io_file *f);
void flow_io_file_free(flow_io_file *f);

/* The whole content of a file, gunzipped when it is gzip-compressed (zlib reads plain files
 * unchanged). *data is malloc'd, NUL-terminated; the caller frees it. */
int flow_io_read_file(const char *path, char **data, size_t *len);

#endif
