/* safetensors.h — reading (mmap) and writing safetensors files, single or sharded.
 *
 * A kiln_st_archive is every tensor of a model folder: model.safetensors, or the shards listed in
 * model.safetensors.index.json, or (fallback) every *.safetensors file in the folder. Tensor data
 * points straight into the read-only mappings (nothing is copied), or, opened in_memory, into a
 * copy of each file read into huge-page memory (util/huge_alloc.h: the CPU's GEMVs stream the
 * weights, and on 4 KiB file pages they pay a TLB miss every page). All validation happens at open:
 * header JSON, dtype names, shapes vs byte ranges, offsets inside the file, overlapping ranges,
 * duplicate names across shards. Errors name the file and the tensor.
 */
#ifndef KILN_FORMAT_SAFETENSORS_H
#define KILN_FORMAT_SAFETENSORS_H

#include "format/dtype.h"
#include "kiln.h"

#define KILN_ST_MAX_DIMS 8

typedef struct kiln_st_tensor {
    const char *name;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_ST_MAX_DIMS];
    int64_t numel;
    const void *data; /* into the mapping */
    size_t nbytes;
    int file_index; /* which shard */
} kiln_st_tensor;

typedef struct kiln_st_archive kiln_st_archive;

/* Opens every safetensors file of a model folder (see above). */
kiln_status kiln_st_open_dir(const char *dir, kiln_st_archive **out);
/* Opens one file. */
kiln_status kiln_st_open_file(const char *path, kiln_st_archive **out);
/* The same, reading the files into memory instead of mapping them when in_memory. */
kiln_status kiln_st_open_dir_with(const char *dir, bool in_memory, kiln_st_archive **out);
kiln_status kiln_st_open_file_with(const char *path, bool in_memory, kiln_st_archive **out);
void kiln_st_close(kiln_st_archive *ar);

int kiln_st_count(const kiln_st_archive *ar);
const kiln_st_tensor *kiln_st_at(const kiln_st_archive *ar, int i);
const kiln_st_tensor *kiln_st_find(const kiln_st_archive *ar,
                                   const char *name); /* NULL if absent */
const char *kiln_st_file_path(const kiln_st_archive *ar, int file_index);
/* The "__metadata__" string map of the first file, as a cJSON object (may be NULL). */
const void *kiln_st_metadata(const kiln_st_archive *ar);

/* Parses and validates one file's bytes (the fuzz entry point): header length, header JSON,
 * every tensor's dtype/shape/offsets against size. On success fills a caller-freed table. */
typedef struct kiln_st_header {
    int n_tensors;
    kiln_st_tensor *tensors; /* names malloc'd; data points into bytes */
    void *metadata;          /* cJSON* or NULL */
} kiln_st_header;
kiln_status kiln_st_parse(const uint8_t *bytes, size_t size, const char *label,
                          kiln_st_header *out);
void kiln_st_header_free(kiln_st_header *h);

/* Writer: collect tensors (data copied by reference until finish), then write one file. */
typedef struct kiln_st_writer kiln_st_writer;
kiln_status kiln_st_writer_new(kiln_st_writer **out);
/* data must stay valid until kiln_st_writer_finish; takes ownership if owned is true (free()). */
kiln_status kiln_st_writer_add(kiln_st_writer *w, const char *name, kiln_dtype dtype, int ndim,
                               const int64_t *shape, const void *data, bool owned);
kiln_status kiln_st_writer_set_metadata(kiln_st_writer *w, const char *key, const char *value);
kiln_status kiln_st_writer_finish(kiln_st_writer *w,
                                  const char *path); /* writes (tensors sorted) */
void kiln_st_writer_free(kiln_st_writer *w);

#endif
