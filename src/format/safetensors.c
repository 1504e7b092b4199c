/* safetensors.c — owns the safetensors reader (mmap, header validation, sharded folders, name
 * lookup by hash table) and writer (sorted tensors, space-padded 8-byte-aligned header).
 *
 * File layout: u64 little-endian header length N, N bytes of JSON header, then the data section.
 * Each header entry is {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]} with offsets
 * relative to the data section; "__metadata__" is an optional string->string map.
 */
#include "format/safetensors.h"

#include "util/huge_alloc.h"

#include "util/log.h"
#include "util/status.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Headers larger than this are refused (HF's own limit is 100 MB). */
#define ST_MAX_HEADER_BYTES ((uint64_t)100 * 1024 * 1024)
/* JSON numbers are doubles: offsets and dims above 2^53 cannot be represented exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0

/* ---------------------------------------------------------------------------------------------
 * Name hash table (open addressing, linear probing), shared by the parser (duplicate check) and
 * the archive (lookup). Slots hold index+1 (0 = empty).
 * ------------------------------------------------------------------------------------------- */

typedef struct name_table {
    int *slots; /* [cap] */
    size_t cap; /* power of two */
} name_table;

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static bool name_table_init(name_table *t, size_t n) {
    t->cap = 16;
    while (t->cap < 2 * n + 1) t->cap *= 2;
    t->slots = calloc(t->cap, sizeof *t->slots);
    return t->slots != NULL;
}

/* Finds name; if absent and insert_index >= 0, inserts it. Returns the existing index or -1. */
static int name_table_lookup(name_table *t, const char *name,
                             const char *(*name_at)(const void *, int), const void *ctx,
                             int insert_index) {
    size_t mask = t->cap - 1;
    for (size_t i = hash_name(name) & mask;; i = (i + 1) & mask) {
        int v = t->slots[i];
        if (v == 0) {
            if (insert_index >= 0) t->slots[i] = insert_index + 1;
            return -1;
        }
        if (strcmp(name_at(ctx, v - 1), name) == 0) return v - 1;
    }
}

static const char *tensor_name_at(const void *ctx, int i) {
    return ((const kiln_st_tensor *)ctx)[i].name;
}

/* ---------------------------------------------------------------------------------------------
 * Parsing one file's bytes
 * ------------------------------------------------------------------------------------------- */

static bool json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= ST_MAX_JSON_INT) || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

typedef struct range_ref {
    uint64_t begin, end;
    int index;
} range_ref;

static int range_cmp(const void *a, const void *b) {
    const range_ref *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index - y->index;
}

void kiln_st_header_free(kiln_st_header *h) {
    if (!h) return;
    for (int i = 0; i < h->n_tensors; i++) free((char *)h->tensors[i].name);
    free(h->tensors);
    cJSON_Delete(h->metadata);
    memset(h, 0, sizeof *h);
}

/* Validates one header entry and fills t (name not set). */
static kiln_status parse_entry(const cJSON *entry, const char *label, const char *name,
                               uint64_t data_size, kiln_st_tensor *t, uint64_t *begin_out,
                               uint64_t *end_out) {
    if (!cJSON_IsObject(entry))
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", label,
                          name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsString(dtype))
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"",
                          label, name);
    if (kiln_dtype_parse(dtype->valuestring, &t->dtype) != 0)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.32s'", label, name,
                          dtype->valuestring);
    if (!cJSON_IsArray(shape))
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': missing or non-array \"shape\"", label,
                          name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > KILN_ST_MAX_DIMS)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': %d dimensions (max %d)", label,
                          name, ndim, KILN_ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t numel = 1;
    bool overflow = false;
    int d = 0;
    for (const cJSON *dim = shape->child; dim; dim = dim->next, d++) {
        uint64_t v;
        if (!json_uint(dim, &v))
            return kiln_error(KILN_ERR_FORMAT,
                              "%s: tensor '%s': shape[%d] is not a non-negative integer", label,
                              name, d);
        t->shape[d] = (int64_t)v;
        if (v != 0 && numel > (uint64_t)INT64_MAX / v)
            overflow = true;
        else
            numel *= v;
    }
    if (overflow)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': shape element count overflows", label,
                          name);
    /* a zero dimension makes numel 0 even if another product overflowed above: recompute */
    for (d = 0; d < ndim; d++)
        if (t->shape[d] == 0) numel = 0;
    t->numel = (int64_t)numel;
    size_t esize = kiln_dtype_size(t->dtype);
    if (numel > (uint64_t)INT64_MAX / esize)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': byte size overflows", label, name);
    uint64_t nbytes = numel * esize;

    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': missing \"data_offsets\" [begin, end]",
                          label, name);
    uint64_t begin, end;
    if (!json_uint(offsets->child, &begin) || !json_uint(offsets->child->next, &end))
        return kiln_error(KILN_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets are not non-negative integers", label,
                          name);
    if (end < begin)
        return kiln_error(KILN_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] end before begin", label,
                          name, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_size)
        return kiln_error(KILN_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] past end of file (data "
                          "section %llu bytes)",
                          label, name, (unsigned long long)begin, (unsigned long long)end,
                          (unsigned long long)data_size);
    if (end - begin != nbytes)
        return kiln_error(KILN_ERR_FORMAT,
                          "%s: tensor '%s': shape/dtype need %llu bytes but data_offsets [%llu, "
                          "%llu] span %llu",
                          label, name, (unsigned long long)nbytes, (unsigned long long)begin,
                          (unsigned long long)end, (unsigned long long)(end - begin));
    t->nbytes = (size_t)nbytes;
    *begin_out = begin;
    *end_out = end;
    return KILN_OK;
}

kiln_status kiln_st_parse(const uint8_t *bytes, size_t size, const char *label,
                          kiln_st_header *out) {
    memset(out, 0, sizeof *out);
    if (!label) label = "safetensors";
    if (size < 8)
        return kiln_error(KILN_ERR_FORMAT, "%s: file too small (%zu bytes) to hold a header", label,
                          size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i];
    if (hlen > size - 8)
        return kiln_error(KILN_ERR_FORMAT, "%s: header length %llu past end of file (size %zu)",
                          label, (unsigned long long)hlen, size);
    if (hlen > ST_MAX_HEADER_BYTES)
        return kiln_error(KILN_ERR_FORMAT, "%s: header length %llu exceeds the %llu-byte limit",
                          label, (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER_BYTES);
    if (hlen < 2)
        return kiln_error(KILN_ERR_FORMAT, "%s: header length %llu is too small for JSON", label,
                          (unsigned long long)hlen);
    const uint8_t *data = bytes + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;

    const char *parse_end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)bytes + 8, (size_t)hlen, &parse_end, 0);
    if (!root)
        return kiln_error(KILN_ERR_FORMAT, "%s: header is not valid JSON (near byte %td)", label,
                          parse_end ? parse_end - (const char *)bytes : (ptrdiff_t)-1);
    /* only trailing spaces (HF padding) may follow the JSON object */
    for (const char *p = parse_end; p && p < (const char *)bytes + 8 + hlen; p++) {
        if (*p != ' ' && *p != '\n' && *p != '\t' && *p != '\r' && *p != 0) {
            cJSON_Delete(root);
            return kiln_error(KILN_ERR_FORMAT, "%s: unexpected bytes after the header JSON", label);
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln_error(KILN_ERR_FORMAT, "%s: header JSON is not an object", label);
    }

    int n_entries = cJSON_GetArraySize(root);
    kiln_status st = KILN_OK;
    range_ref *ranges = NULL;
    name_table names = {0};
    out->tensors = calloc((size_t)n_entries + 1, sizeof *out->tensors);
    ranges = calloc((size_t)n_entries + 1, sizeof *ranges);
    if (!out->tensors || !ranges || !name_table_init(&names, (size_t)n_entries)) {
        st = kiln_error(KILN_ERR_OOM, "%s: out of memory for %d header entries", label, n_entries);
        goto done;
    }
    bool seen_metadata = false;
    for (cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string ? e->string : "";
        if (strcmp(name, "__metadata__") == 0) {
            if (seen_metadata) {
                st = kiln_error(KILN_ERR_FORMAT, "%s: duplicate \"__metadata__\"", label);
                goto done;
            }
            seen_metadata = true;
            if (!cJSON_IsObject(e)) {
                st = kiln_error(KILN_ERR_FORMAT, "%s: \"__metadata__\" is not an object", label);
                goto done;
            }
            for (cJSON *m = e->child; m; m = m->next) {
                if (!cJSON_IsString(m)) {
                    st = kiln_error(KILN_ERR_FORMAT, "%s: __metadata__ key '%.64s' is not a string",
                                    label, m->string ? m->string : "");
                    goto done;
                }
            }
            out->metadata = cJSON_Duplicate(e, 1);
            if (!out->metadata) {
                st = kiln_error(KILN_ERR_OOM, "%s: out of memory", label);
                goto done;
            }
            continue;
        }
        kiln_st_tensor *t = &out->tensors[out->n_tensors];
        uint64_t begin = 0, end = 0;
        st = parse_entry(e, label, name, data_size, t, &begin, &end);
        if (st != KILN_OK) goto done;
        t->name = strdup(name);
        if (!t->name) {
            st = kiln_error(KILN_ERR_OOM, "%s: out of memory", label);
            goto done;
        }
        out->n_tensors++;
        if (name_table_lookup(&names, name, tensor_name_at, out->tensors, out->n_tensors - 1) >=
            0) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': duplicate name in header", label,
                            name);
            goto done;
        }
        t->data = data + begin;
        ranges[out->n_tensors - 1] = (range_ref){begin, end, out->n_tensors - 1};
    }
    qsort(ranges, (size_t)out->n_tensors, sizeof *ranges, range_cmp);
    for (int i = 1; i < out->n_tensors; i++) {
        const range_ref *a = &ranges[i - 1], *b = &ranges[i];
        if (b->begin < a->end && b->end > b->begin) {
            st = kiln_error(
                KILN_ERR_FORMAT,
                "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' [%llu, %llu]",
                label, out->tensors[b->index].name, (unsigned long long)b->begin,
                (unsigned long long)b->end, out->tensors[a->index].name,
                (unsigned long long)a->begin, (unsigned long long)a->end);
            goto done;
        }
    }
done:
    free(ranges);
    free(names.slots);
    cJSON_Delete(root);
    if (st != KILN_OK) kiln_st_header_free(out);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Archive: one or more mapped files, every tensor in one table
 * ------------------------------------------------------------------------------------------- */

typedef struct st_file {
    char *path;
    void *map; /* [size]: a read-only mapping, or (in_memory) a huge-page buffer holding a copy */
    size_t size;
    bool in_memory;
    kiln_st_header header;
} st_file;

struct kiln_st_archive {
    int n_files;
    st_file *files; /* [n_files] */
    int n_tensors;
    kiln_st_tensor *all; /* [n_tensors]; names borrowed from the file headers */
    name_table index;
};

void kiln_st_close(kiln_st_archive *ar) {
    if (!ar) return;
    for (int i = 0; i < ar->n_files; i++) {
        st_file *f = &ar->files[i];
        kiln_st_header_free(&f->header);
        if (f->map && f->in_memory)
            kiln_huge_free(f->map, f->size);
        else if (f->map)
            munmap(f->map, f->size);
        free(f->path);
    }
    free(ar->files);
    free(ar->all);
    free(ar->index.slots);
    free(ar);
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* The whole file into a huge-page buffer: pread until size bytes (a short file or a read error is
 * an error naming the file). */
static kiln_status read_whole(int fd, const char *path, size_t size, void **out) {
    uint8_t *buf = kiln_huge_alloc(size);
    if (!buf) return kiln_error(KILN_ERR_OOM, "%s: out of memory reading %zu bytes", path, size);
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, buf + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            kiln_status st =
                r < 0 ? kiln_error(KILN_ERR_IO, "%s: read failed at byte %zu: %s", path, got,
                                   strerror(errno))
                      : kiln_error(KILN_ERR_IO, "%s: file ended at byte %zu of %zu while reading",
                                   path, got, size);
            kiln_huge_free(buf, size);
            return st;
        }
        got += (size_t)r;
    }
    *out = buf;
    return KILN_OK;
}

/* Maps (or, in_memory, reads) and parses one file into f. */
static kiln_status map_file(const char *path, bool in_memory, st_file *f) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiln_error(errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO, "%s: cannot open: %s",
                          path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return kiln_error(KILN_ERR_IO, "%s: not a regular file", path);
    }
    f->size = (size_t)sb.st_size;
    const char *label = base_name(path);
    if (f->size < 8) {
        close(fd);
        return kiln_error(KILN_ERR_FORMAT, "%s: file too small (%zu bytes) to hold a header", label,
                          f->size);
    }
    void *m = NULL;
    if (in_memory) {
        kiln_status rs = read_whole(fd, path, f->size, &m);
        close(fd);
        if (rs != KILN_OK) {
            f->size = 0;
            return rs;
        }
        f->in_memory = true;
    } else {
        m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (m == MAP_FAILED) {
            f->size = 0;
            return kiln_error(KILN_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        }
    }
    f->map = m;
    return kiln_st_parse(m, f->size, label, &f->header);
}

/* Builds the flat table and the name index over every opened file; rejects cross-file dups. */
static kiln_status build_index(kiln_st_archive *ar) {
    int total = 0;
    for (int i = 0; i < ar->n_files; i++) total += ar->files[i].header.n_tensors;
    ar->all = calloc((size_t)total + 1, sizeof *ar->all);
    if (!ar->all || !name_table_init(&ar->index, (size_t)total))
        return kiln_error(KILN_ERR_OOM, "out of memory indexing %d tensors", total);
    for (int i = 0; i < ar->n_files; i++) {
        const kiln_st_header *h = &ar->files[i].header;
        for (int j = 0; j < h->n_tensors; j++) {
            kiln_st_tensor *t = &ar->all[ar->n_tensors];
            *t = h->tensors[j];
            t->file_index = i;
            int prev =
                name_table_lookup(&ar->index, t->name, tensor_name_at, ar->all, ar->n_tensors);
            if (prev >= 0)
                return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': also defined in %s",
                                  base_name(ar->files[i].path), t->name,
                                  base_name(ar->files[ar->all[prev].file_index].path));
            ar->n_tensors++;
        }
    }
    return KILN_OK;
}

static kiln_status open_paths(char **paths, int n, bool in_memory, kiln_st_archive **out) {
    kiln_st_archive *ar = calloc(1, sizeof *ar);
    if (!ar) return kiln_error(KILN_ERR_OOM, "out of memory");
    ar->files = calloc((size_t)n + 1, sizeof *ar->files);
    if (!ar->files) {
        free(ar);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && st == KILN_OK; i++) {
        st = map_file(paths[i], in_memory, &ar->files[i]);
        ar->n_files = i + 1;
    }
    if (st == KILN_OK) st = build_index(ar);
    if (st != KILN_OK) {
        kiln_st_close(ar);
        return st;
    }
    *out = ar;
    return KILN_OK;
}

kiln_status kiln_st_open_file_with(const char *path, bool in_memory, kiln_st_archive **out) {
    *out = NULL;
    char *p = (char *)path;
    return open_paths(&p, 1, in_memory, out);
}

kiln_status kiln_st_open_file(const char *path, kiln_st_archive **out) {
    return kiln_st_open_file_with(path, false, out);
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", dir, name);
    return s;
}

static void free_paths(char **paths, int n) {
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

static int str_ptr_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *read_text_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                buf[n] = 0;
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

/* Sharded folder: model.safetensors.index.json's weight_map names the shard of every tensor. */
static kiln_status open_indexed(const char *dir, const char *index_path, bool in_memory,
                                kiln_st_archive **out) {
    size_t len = 0;
    char *text = read_text_file(index_path, &len);
    if (!text) return kiln_error(KILN_ERR_IO, "%s: cannot read: %s", index_path, strerror(errno));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const char *label = "model.safetensors.index.json";
    if (!root) return kiln_error(KILN_ERR_FORMAT, "%s: not valid JSON", label);
    kiln_status st = KILN_OK;
    char **names = NULL, **paths = NULL;
    int n_files = 0;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        st = kiln_error(KILN_ERR_FORMAT, "%s: missing object \"weight_map\"", label);
        goto done;
    }
    int n_map = cJSON_GetArraySize(map);
    names = calloc((size_t)n_map + 1, sizeof *names);
    if (!names) {
        st = kiln_error(KILN_ERR_OOM, "%s: out of memory", label);
        goto done;
    }
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/')) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: weight_map entry '%s' is not a plain file name",
                            label, e->string ? e->string : "");
            goto done;
        }
        bool seen = false;
        for (int i = 0; i < n_files && !seen; i++) seen = strcmp(names[i], e->valuestring) == 0;
        if (!seen) names[n_files++] = e->valuestring;
    }
    if (n_files == 0) {
        st = kiln_error(KILN_ERR_FORMAT, "%s: weight_map is empty", label);
        goto done;
    }
    qsort(names, (size_t)n_files, sizeof *names, str_ptr_cmp);
    paths = calloc((size_t)n_files, sizeof *paths);
    if (!paths) {
        st = kiln_error(KILN_ERR_OOM, "%s: out of memory", label);
        goto done;
    }
    for (int i = 0; i < n_files; i++) {
        if (!(paths[i] = path_join(dir, names[i]))) {
            st = kiln_error(KILN_ERR_OOM, "%s: out of memory", label);
            goto done;
        }
        if (access(paths[i], F_OK) != 0) {
            st = kiln_error(KILN_ERR_NOT_FOUND,
                            "%s: shard '%s' listed in weight_map does not exist", label, names[i]);
            goto done;
        }
    }
    st = open_paths(paths, n_files, in_memory, out);
    if (st != KILN_OK) goto done;
    for (const cJSON *e = map->child; e; e = e->next) {
        const kiln_st_tensor *t = kiln_st_find(*out, e->string);
        if (!t || strcmp(base_name((*out)->files[t->file_index].path), e->valuestring) != 0) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': mapped to %s but not found there",
                            label, e->string, e->valuestring);
            kiln_st_close(*out);
            *out = NULL;
            goto done;
        }
    }
done:
    if (paths) free_paths(paths, n_files);
    free(names);
    cJSON_Delete(root);
    return st;
}

kiln_status kiln_st_open_dir_with(const char *dir, bool in_memory, kiln_st_archive **out) {
    *out = NULL;
    char *index_path = path_join(dir, "model.safetensors.index.json");
    char *single_path = path_join(dir, "model.safetensors");
    kiln_status st;
    if (!index_path || !single_path) {
        st = kiln_error(KILN_ERR_OOM, "out of memory");
    } else if (access(index_path, F_OK) == 0) {
        st = open_indexed(dir, index_path, in_memory, out);
    } else if (access(single_path, F_OK) == 0) {
        st = kiln_st_open_file_with(single_path, in_memory, out);
    } else {
        /* fallback: every *.safetensors in the folder, in name order */
        DIR *d = opendir(dir);
        if (!d) {
            st = kiln_error(errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO,
                            "%s: cannot open model folder: %s", dir, strerror(errno));
        } else {
            char **paths = NULL;
            int n = 0, cap = 0;
            st = KILN_OK;
            struct dirent *e;
            while ((e = readdir(d)) && st == KILN_OK) {
                size_t len = strlen(e->d_name);
                if (len <= 12 || strcmp(e->d_name + len - 12, ".safetensors") != 0) continue;
                if (n == cap) {
                    cap = cap ? cap * 2 : 8;
                    char **np = realloc(paths, (size_t)cap * sizeof *paths);
                    if (!np) {
                        st = kiln_error(KILN_ERR_OOM, "out of memory");
                        break;
                    }
                    paths = np;
                }
                if (!(paths[n] = path_join(dir, e->d_name)))
                    st = kiln_error(KILN_ERR_OOM, "oom");
                else
                    n++;
            }
            closedir(d);
            if (st == KILN_OK && n == 0)
                st = kiln_error(KILN_ERR_NOT_FOUND, "%s: no .safetensors files in model folder",
                                dir);
            if (st == KILN_OK) {
                qsort(paths, (size_t)n, sizeof *paths, str_ptr_cmp);
                st = open_paths(paths, n, in_memory, out);
            }
            free_paths(paths, n);
        }
    }
    free(index_path);
    free(single_path);
    return st;
}

kiln_status kiln_st_open_dir(const char *dir, kiln_st_archive **out) {
    return kiln_st_open_dir_with(dir, false, out);
}

int kiln_st_count(const kiln_st_archive *ar) {
    return ar ? ar->n_tensors : 0;
}

const kiln_st_tensor *kiln_st_at(const kiln_st_archive *ar, int i) {
    return ar && i >= 0 && i < ar->n_tensors ? &ar->all[i] : NULL;
}

const kiln_st_tensor *kiln_st_find(const kiln_st_archive *ar, const char *name) {
    if (!ar || !name || !ar->index.slots) return NULL;
    int i = name_table_lookup((name_table *)&ar->index, name, tensor_name_at, ar->all, -1);
    return i >= 0 ? &ar->all[i] : NULL;
}

const char *kiln_st_file_path(const kiln_st_archive *ar, int file_index) {
    return ar && file_index >= 0 && file_index < ar->n_files ? ar->files[file_index].path : NULL;
}

const void *kiln_st_metadata(const kiln_st_archive *ar) {
    return ar && ar->n_files > 0 ? ar->files[0].header.metadata : NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------------------------- */

typedef struct writer_entry {
    char *name;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
    bool owned;
} writer_entry;

struct kiln_st_writer {
    writer_entry *entries; /* [n] */
    int n, cap;
    cJSON *metadata; /* string map */
};

kiln_status kiln_st_writer_new(kiln_st_writer **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return kiln_error(KILN_ERR_OOM, "out of memory");
    return KILN_OK;
}

void kiln_st_writer_free(kiln_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->entries[i].name);
        if (w->entries[i].owned) free((void *)w->entries[i].data);
    }
    free(w->entries);
    cJSON_Delete(w->metadata);
    free(w);
}

kiln_status kiln_st_writer_add(kiln_st_writer *w, const char *name, kiln_dtype dtype, int ndim,
                               const int64_t *shape, const void *data, bool owned) {
    if ((unsigned)dtype >= KILN_DT_COUNT || ndim < 0 || ndim > KILN_ST_MAX_DIMS || !name ||
        !*name || strcmp(name, "__metadata__") == 0) {
        if (owned) free((void *)data);
        return kiln_error(KILN_ERR_INVALID_ARG,
                          "safetensors writer: tensor '%s': bad name, dtype or ndim %d",
                          name ? name : "(null)", ndim);
    }
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || (shape[d] && numel > (uint64_t)INT64_MAX / (uint64_t)shape[d])) {
            if (owned) free((void *)data);
            return kiln_error(KILN_ERR_INVALID_ARG, "safetensors writer: tensor '%s': bad shape",
                              name);
        }
        numel *= (uint64_t)shape[d];
    }
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 64;
        writer_entry *ne = realloc(w->entries, (size_t)cap * sizeof *ne);
        if (!ne) {
            if (owned) free((void *)data);
            return kiln_error(KILN_ERR_OOM, "out of memory");
        }
        w->entries = ne;
        w->cap = cap;
    }
    writer_entry *e = &w->entries[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) {
        if (owned) free((void *)data);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    e->dtype = dtype;
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++) e->shape[d] = shape[d];
    e->data = data;
    e->nbytes = (size_t)(numel * kiln_dtype_size(dtype));
    e->owned = owned;
    w->n++;
    return KILN_OK;
}

kiln_status kiln_st_writer_set_metadata(kiln_st_writer *w, const char *key, const char *value) {
    if (!w->metadata && !(w->metadata = cJSON_CreateObject()))
        return kiln_error(KILN_ERR_OOM, "out of memory");
    cJSON *s = cJSON_CreateString(value);
    if (!s) return kiln_error(KILN_ERR_OOM, "out of memory");
    if (cJSON_GetObjectItemCaseSensitive(w->metadata, key))
        cJSON_ReplaceItemInObjectCaseSensitive(w->metadata, key, s);
    else
        cJSON_AddItemToObject(w->metadata, key, s);
    return KILN_OK;
}

/* A growable text buffer for the header. */
typedef struct text_buf {
    char *s;
    size_t len, cap;
    bool failed;
} text_buf;

static void tb_put(text_buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->failed = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void tb_str(text_buf *b, const char *s) {
    tb_put(b, s, strlen(s));
}

static void tb_json_string(text_buf *b, const char *s) {
    tb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            tb_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            tb_put(b, esc, 6);
        } else {
            tb_put(b, (const char *)&c, 1);
        }
    }
    tb_put(b, "\"", 1);
}

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const writer_entry *)a)->name, ((const writer_entry *)b)->name);
}

/* Data layout order (as HF's serializer): larger element size first, then by name, so every
 * tensor starts aligned to its element size (the data section itself starts 8-aligned). */
static int layout_cmp(const void *a, const void *b) {
    const writer_entry *x = *(const writer_entry *const *)a, *y = *(const writer_entry *const *)b;
    size_t sx = kiln_dtype_size(x->dtype), sy = kiln_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

kiln_status kiln_st_writer_finish(kiln_st_writer *w, const char *path) {
    qsort(w->entries, (size_t)w->n, sizeof *w->entries, entry_cmp);
    for (int i = 1; i < w->n; i++)
        if (strcmp(w->entries[i - 1].name, w->entries[i].name) == 0)
            return kiln_error(KILN_ERR_INVALID_ARG, "%s: tensor '%s' added twice", path,
                              w->entries[i].name);
    /* offsets in layout order; header keys in name order */
    const writer_entry **layout = malloc(((size_t)w->n + 1) * sizeof *layout);
    uint64_t *offsets = malloc(((size_t)w->n + 1) * sizeof *offsets);
    if (!layout || !offsets) {
        free(layout);
        free(offsets);
        return kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
    }
    for (int i = 0; i < w->n; i++) layout[i] = &w->entries[i];
    qsort(layout, (size_t)w->n, sizeof *layout, layout_cmp);
    uint64_t offset = 0;
    for (int i = 0; i < w->n; i++) {
        offsets[layout[i] - w->entries] = offset;
        offset += layout[i]->nbytes;
    }
    text_buf b = {0};
    char num[64];
    tb_str(&b, "{");
    bool first = true;
    if (w->metadata) {
        tb_str(&b, "\"__metadata__\":{");
        for (cJSON *m = w->metadata->child; m; m = m->next) {
            if (m != w->metadata->child) tb_str(&b, ",");
            tb_json_string(&b, m->string);
            tb_str(&b, ":");
            tb_json_string(&b, m->valuestring);
        }
        tb_str(&b, "}");
        first = false;
    }
    for (int i = 0; i < w->n; i++) {
        const writer_entry *e = &w->entries[i];
        if (!first) tb_str(&b, ",");
        first = false;
        tb_json_string(&b, e->name);
        tb_str(&b, ":{\"dtype\":\"");
        tb_str(&b, kiln_dtype_name(e->dtype));
        tb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)e->shape[d]);
            tb_str(&b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offsets[i],
                 (unsigned long long)(offsets[i] + e->nbytes));
        tb_str(&b, num);
    }
    free(offsets);
    tb_str(&b, "}");
    while (!b.failed && b.len % 8 != 0) tb_str(&b, " ");
    if (b.failed) {
        free(b.s);
        free(layout);
        return kiln_error(KILN_ERR_OOM, "%s: out of memory building header", path);
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(b.s);
        free(layout);
        return kiln_error(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t len_bytes[8];
    for (int i = 0; i < 8; i++) len_bytes[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
    bool ok = fwrite(len_bytes, 1, 8, f) == 8 && fwrite(b.s, 1, b.len, f) == b.len;
    for (int i = 0; i < w->n && ok; i++)
        if (layout[i]->nbytes)
            ok = fwrite(layout[i]->data, 1, layout[i]->nbytes, f) == layout[i]->nbytes;
    free(layout);
    int saved = errno;
    if (fclose(f) != 0) ok = false;
    free(b.s);
    if (!ok) {
        unlink(path);
        return kiln_error(KILN_ERR_IO, "%s: write failed: %s", path,
                          strerror(saved ? saved : errno));
    }
    return KILN_OK;
}
