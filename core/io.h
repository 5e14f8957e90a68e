/* File formats: safetensors checkpoints (read/write, with a strict bounds-checked JSON header),
 * whole-file reading through zlib (plain or gzip-compressed), and token files for language-model
 * data (llm.c .bin shards, mapped rather than read). */
#ifndef FLOW_IO_H
#define FLOW_IO_H

#include <stddef.h>
#include <stdint.h>

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
int flow_io_read_file(const char *path, size_t max, char **data, size_t *len);

/* ---------------------------------------------------------------- token files */

/* llm.c's shard magics: GPT-2 shards (version 1 holds uint16 tokens, version 2 uint32) and
 * Llama 3 shards (version 7, uint32). */
#define FLOW_IO_SHARD_MAGIC 20240520
#define FLOW_IO_SHARD_MAGIC_LLAMA3 20240801
#define FLOW_IO_SHARD_HEADER 1024  /* 256 int32: magic, version, token count, then zeros */

/* The tokens of one file. An llm.c shard is mapped (mmap), so a shard of any size costs address
 * space, not memory, and only the windows read are paged in; a text file is read whole (gunzipped),
 * one token a byte. */
typedef struct flow_io_tokens {
  const unsigned char *data;  /* the first token */
  int64_t count;
  int width;                  /* bytes a token, little-endian: 1 (text), 2 or 4 (shards) */
  void *map;                  /* a shard's mapping, map_len bytes (NULL: text, or no tokens) */
  size_t map_len;
  char *text;                 /* a text file's bytes (malloc'd; NULL for a shard) */
} flow_io_tokens;

/* Open path as tokens: a shard when its name ends in .bin or its first 4 bytes are a shard magic,
 * else text. A shard's header must give a known magic and version and a count that matches the
 * file's size; errors name the file and what is wrong. */
int flow_io_tokens_open(const char *path, flow_io_tokens *t);
/* out[i] = token start + i, for i < n; the caller keeps start + n <= count. */
void flow_io_tokens_read(const flow_io_tokens *t, int64_t start, int64_t n, int64_t *out);
void flow_io_tokens_close(flow_io_tokens *t);

#endif
