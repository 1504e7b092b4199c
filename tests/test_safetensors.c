/* test_safetensors.c — the safetensors reader against every shared fixture (counts, dtypes,
 * shapes from config facts), writer round-trip (byte-identical rewrite), and a table of corrupt
 * files that must each fail with the right status and a message naming file and tensor. */
#include "format/safetensors.h"

#include "test_util.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Facts read independently (python: json header of each fixture) — tensor count and per-dtype
 * counts. */
static const struct {
    const char *dir;
    int n, n_bf16, n_f16, n_u32;
    const char *format;
} fixtures[] = {
    {"fixtures/gemma3_text", 54, 54, 0, 0, "pt"},
    {"fixtures/gemma3_text-mlx-q4g32", 112, 25, 58, 29, "mlx"},
    {"fixtures/gemma3_text-mlx-q8g64", 112, 25, 58, 29, "mlx"},
    {"fixtures/gemma4_text", 73, 73, 0, 0, "pt"},
    {"fixtures/llama", 30, 30, 0, 0, "pt"},
    {"fixtures/llama-mlx-q4g32", 76, 7, 46, 23, "mlx"},
    {"fixtures/llama-mlx-q8g64", 76, 7, 46, 23, "mlx"},
    {"fixtures/llama-tied", 29, 29, 0, 0, "pt"},
    {"fixtures/qwen2", 39, 39, 0, 0, "pt"},
    {"fixtures/qwen3", 36, 36, 0, 0, "pt"},
    {"fixtures/qwen3-mlx-q4g32", 82, 13, 46, 23, "mlx"},
    {"fixtures/qwen3-mlx-q8g64", 82, 13, 46, 23, "mlx"},
    {"fixtures/qwen3_5_text", 53, 53, 0, 0, "pt"},
    {"fixtures/qwen3_moe", 102, 102, 0, 0, "pt"},
    {"fixtures/qwen3_moe-mlx-q4g32", 91, 13, 52, 26, "mlx"},
    {"fixtures/qwen3_moe-mlx-q8g64", 91, 13, 52, 26, "mlx"},
    {"fixtures/qwen3_next", 153, 153, 0, 0, "pt"},
    {"fixtures/qwen3_next-mlx-q4g32", 165, 21, 96, 48, "mlx"},
    {"fixtures/qwen3_next-mlx-q8g64", 165, 21, 96, 48, "mlx"},
    {"models/demo-bf16", 90, 90, 0, 0, "pt"},
};

static void test_fixtures(void) {
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        kiln_st_archive *ar = NULL;
        CHECK_OK(kiln_st_open_dir(test_shared(fixtures[f].dir), &ar));
        if (!ar) continue;
        int counts[KILN_DT_COUNT] = {0};
        for (int i = 0; i < kiln_st_count(ar); i++) {
            const kiln_st_tensor *t = kiln_st_at(ar, i);
            counts[t->dtype]++;
            CHECK(kiln_st_find(ar, t->name) == t);
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
            CHECK(numel == t->numel && t->nbytes == (size_t)numel * kiln_dtype_size(t->dtype));
        }
        CHECK_MSG(kiln_st_count(ar) == fixtures[f].n, "%s: %d tensors", fixtures[f].dir,
                  kiln_st_count(ar));
        CHECK(counts[KILN_DT_BF16] == fixtures[f].n_bf16);
        CHECK(counts[KILN_DT_F16] == fixtures[f].n_f16);
        CHECK(counts[KILN_DT_U32] == fixtures[f].n_u32);
        const cJSON *md = kiln_st_metadata(ar);
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(md, "format");
        CHECK(cJSON_IsString(fmt) && strcmp(fmt->valuestring, fixtures[f].format) == 0);
        CHECK(kiln_st_find(ar, "no.such.tensor") == NULL);
        /* every fixture has vocab 512 (demo: 8192) and hidden 128 (demo: 384) */
        const kiln_st_tensor *emb = kiln_st_find(ar, "model.embed_tokens.weight");
        bool demo = strstr(fixtures[f].dir, "demo") != NULL;
        CHECK(emb && emb->ndim == 2 && emb->shape[0] == (demo ? 8192 : 512));
        if (emb && emb->dtype == KILN_DT_U32) {
            int bits = strstr(fixtures[f].dir, "q4") ? 4 : 8;
            CHECK(emb->shape[1] == 128 * bits / 32);
        } else if (emb) {
            CHECK(emb->shape[1] == (demo ? 384 : 128));
        }
        kiln_st_close(ar);
    }
    /* qwen3 layer 0 shapes follow from config: q [heads*head_dim, hidden], k [kv*head_dim, hidden],
     * gate [intermediate, hidden] */
    kiln_st_archive *ar = NULL;
    CHECK_OK(kiln_st_open_file(test_shared("fixtures/qwen3/model.safetensors"), &ar));
    const kiln_st_tensor *q = kiln_st_find(ar, "model.layers.0.self_attn.q_proj.weight");
    const kiln_st_tensor *k = kiln_st_find(ar, "model.layers.2.self_attn.k_proj.weight");
    const kiln_st_tensor *g = kiln_st_find(ar, "model.layers.1.mlp.gate_proj.weight");
    CHECK(q && q->shape[0] == 4 * 32 && q->shape[1] == 128 && q->dtype == KILN_DT_BF16);
    CHECK(k && k->shape[0] == 2 * 32 && k->shape[1] == 128);
    CHECK(g && g->shape[0] == 256 && g->shape[1] == 128);
    CHECK(kiln_st_file_path(ar, 0) && strstr(kiln_st_file_path(ar, 0), "model.safetensors"));
    CHECK(kiln_st_file_path(ar, 1) == NULL);
    kiln_st_close(ar);
}

static void test_writer_roundtrip(void) {
    char path1[512], path2[512];
    snprintf(path1, sizeof path1, "%s/rt1.safetensors", test_tmpdir());
    snprintf(path2, sizeof path2, "%s/rt2.safetensors", test_tmpdir());
    uint64_t rng = 42;
    float *a = malloc(6 * 5 * sizeof *a);
    for (int i = 0; i < 30; i++) a[i] = test_rand_normal(&rng);
    uint16_t b[7] = {1, 2, 3, 65535, 0, 9, 11};
    int64_t c = -5;
    kiln_st_writer *w = NULL;
    CHECK_OK(kiln_st_writer_new(&w));
    int64_t shape_a[2] = {6, 5}, shape_b[1] = {7}, shape_e[2] = {0, 3};
    CHECK_OK(kiln_st_writer_add(w, "z.last", KILN_DT_F32, 2, shape_a, a, true));
    CHECK_OK(kiln_st_writer_add(w, "a.first", KILN_DT_BF16, 1, shape_b, b, false));
    CHECK_OK(kiln_st_writer_add(w, "m.scalar \"quoted\"", KILN_DT_I64, 0, NULL, &c, false));
    CHECK_OK(kiln_st_writer_add(w, "m.empty", KILN_DT_F16, 2, shape_e, NULL, false));
    CHECK_OK(kiln_st_writer_set_metadata(w, "format", "mlx"));
    CHECK_OK(kiln_st_writer_finish(w, path1));
    kiln_st_writer_free(w);

    size_t len = 0;
    uint8_t *bytes = (uint8_t *)test_read_file(path1, &len);
    CHECK(bytes && len >= 8);
    if (!bytes) return;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | bytes[i];
    CHECK(hlen % 8 == 0);                        /* padded like HF */
    CHECK(len == 8 + hlen + 30 * 4 + 7 * 2 + 8); /* header + data, nothing else */
    CHECK(bytes[8 + hlen - 1] == ' ' || bytes[8 + hlen - 1] == '}');
    /* layout: 8-byte elements first (aligned), then f32, then the bf16 tensor last */
    CHECK(memcmp(bytes + 8 + hlen, &c, sizeof c) == 0);
    CHECK(memcmp(bytes + len - sizeof b, b, sizeof b) == 0);
    /* header keys in name order */
    char *hdr = strndup((const char *)bytes + 8, hlen);
    CHECK(strstr(hdr, "a.first") < strstr(hdr, "m.empty") &&
          strstr(hdr, "m.empty") < strstr(hdr, "z.last"));
    free(hdr);
    free(bytes);

    kiln_st_archive *ar = NULL;
    CHECK_OK(kiln_st_open_file(path1, &ar));
    if (!ar) return;
    CHECK(kiln_st_count(ar) == 4);
    const kiln_st_tensor *ta = kiln_st_find(ar, "z.last");
    CHECK(ta && ta->dtype == KILN_DT_F32 && ta->ndim == 2 && ta->shape[0] == 6 &&
          ta->shape[1] == 5);
    uint64_t rng2 = 42;
    bool same = ta != NULL;
    for (int i = 0; ta && i < 30; i++)
        same &= ((const float *)ta->data)[i] == test_rand_normal(&rng2);
    CHECK(same);
    const kiln_st_tensor *ts = kiln_st_find(ar, "m.scalar \"quoted\"");
    CHECK(ts && ts->ndim == 0 && ts->numel == 1 && *(const int64_t *)ts->data == -5);
    const kiln_st_tensor *te = kiln_st_find(ar, "m.empty");
    CHECK(te && te->numel == 0 && te->nbytes == 0);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(kiln_st_metadata(ar), "format");
    CHECK(cJSON_IsString(fmt) && strcmp(fmt->valuestring, "mlx") == 0);

    /* rewrite from the reopened archive: identical bytes */
    CHECK_OK(kiln_st_writer_new(&w));
    for (int i = 0; i < kiln_st_count(ar); i++) {
        const kiln_st_tensor *t = kiln_st_at(ar, i);
        CHECK_OK(kiln_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, false));
    }
    CHECK_OK(kiln_st_writer_set_metadata(w, "format", "mlx"));
    CHECK_OK(kiln_st_writer_finish(w, path2));
    kiln_st_writer_free(w);
    kiln_st_close(ar);
    size_t l1, l2;
    char *f1 = test_read_file(path1, &l1), *f2 = test_read_file(path2, &l2);
    CHECK(f1 && f2 && l1 == l2 && memcmp(f1, f2, l1) == 0);
    free(f1);
    free(f2);

    /* a fixture rewritten through the writer reopens with identical tensors */
    CHECK_OK(kiln_st_open_dir(test_shared("fixtures/qwen3"), &ar));
    CHECK_OK(kiln_st_writer_new(&w));
    for (int i = 0; ar && i < kiln_st_count(ar); i++) {
        const kiln_st_tensor *t = kiln_st_at(ar, i);
        CHECK_OK(kiln_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, false));
    }
    CHECK_OK(kiln_st_writer_finish(w, path2));
    kiln_st_writer_free(w);
    kiln_st_archive *ar2 = NULL;
    CHECK_OK(kiln_st_open_file(path2, &ar2));
    if (ar && ar2) {
        CHECK(kiln_st_count(ar2) == kiln_st_count(ar));
        int mismatches = 0;
        for (int i = 0; i < kiln_st_count(ar); i++) {
            const kiln_st_tensor *t = kiln_st_at(ar, i), *u = kiln_st_find(ar2, t->name);
            if (!u || u->dtype != t->dtype || u->nbytes != t->nbytes ||
                memcmp(u->data, t->data, t->nbytes) != 0)
                mismatches++;
        }
        CHECK(mismatches == 0);
    }
    kiln_st_close(ar);
    kiln_st_close(ar2);

    /* writer refuses a duplicate name */
    CHECK_OK(kiln_st_writer_new(&w));
    CHECK_OK(kiln_st_writer_add(w, "x", KILN_DT_U8, 1, shape_b, b, false));
    CHECK_OK(kiln_st_writer_add(w, "x", KILN_DT_U8, 1, shape_b, b, false));
    CHECK_ERR(kiln_st_writer_finish(w, path2), KILN_ERR_INVALID_ARG, "'x'");
    kiln_st_writer_free(w);
}

/* Writes a file from a header string and data_len zero bytes; hlen_override != 0 replaces the
 * length prefix. */
static void write_raw(const char *path, const char *header, size_t data_len,
                      uint64_t hlen_override) {
    size_t hl = strlen(header);
    size_t total = 8 + hl + data_len;
    uint8_t *buf = calloc(1, total);
    uint64_t v = hlen_override ? hlen_override : hl;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(v >> (8 * i));
    memcpy(buf + 8, header, hl);
    CHECK(test_write_file(path, buf, total));
    free(buf);
}

static void check_msg_has(const char *a, const char *b) {
    CHECK_MSG(strstr(kiln_last_error(), a) && (!b || strstr(kiln_last_error(), b)),
              "message '%s' should name '%s' and '%s'", kiln_last_error(), a, b ? b : "");
}

static void test_corrupt_files(void) {
    char path[600];
    static const struct {
        const char *name;
        const char *header;
        size_t data_len;
        uint64_t hlen_override;
        kiln_status want;
        const char *tensor; /* must appear in the message (NULL: file-level error) */
    } cases[] = {
        {"header_past_eof", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         1000, KILN_ERR_FORMAT, NULL},
        {"not_json", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],", 8, 0, KILN_ERR_FORMAT, NULL},
        {"unknown_dtype",
         "{\"w.unk\":{\"dtype\":\"F8_E4M3X\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, 0,
         KILN_ERR_FORMAT, "w.unk"},
        {"shape_bytes_mismatch",
         "{\"w.mis\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12, 0,
         KILN_ERR_FORMAT, "w.mis"},
        {"offsets_past_end",
         "{\"w.past\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, 0,
         KILN_ERR_FORMAT, "w.past"},
        {"overlap",
         "{\"a.one\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b.two\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, 0, KILN_ERR_FORMAT, "b.two"},
        {"duplicate",
         "{\"dup.w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"dup.w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
         4, 0, KILN_ERR_FORMAT, "dup.w"},
        {"negative_dim", "{\"w.neg\":{\"dtype\":\"U8\",\"shape\":[-2],\"data_offsets\":[0,2]}}", 2,
         0, KILN_ERR_FORMAT, "w.neg"},
        {"missing_offsets", "{\"w.nooff\":{\"dtype\":\"U8\",\"shape\":[2]}}", 2, 0, KILN_ERR_FORMAT,
         "w.nooff"},
        {"huge_shape",
         "{\"w.huge\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,4]"
         "}}",
         4, 0, KILN_ERR_FORMAT, "w.huge"},
        {"not_object", "[1,2,3]", 0, 0, KILN_ERR_FORMAT, NULL},
        {"bad_metadata", "{\"__metadata__\":{\"format\":3}}", 0, 0, KILN_ERR_FORMAT, "format"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/%s.safetensors", test_tmpdir(), cases[i].name);
        write_raw(path, cases[i].header, cases[i].data_len, cases[i].hlen_override);
        kiln_st_archive *ar = NULL;
        char fname[128];
        snprintf(fname, sizeof fname, "%s.safetensors", cases[i].name);
        const char *file_name = fname;
        CHECK_ERR(kiln_st_open_file(path, &ar), cases[i].want, file_name);
        if (cases[i].tensor) check_msg_has(fname, cases[i].tensor);
        CHECK(ar == NULL);
    }

    /* truncated: a valid fixture file cut short, and one cut inside the 8-byte prefix */
    size_t len = 0;
    char *whole = test_read_file(test_shared("fixtures/qwen3/model.safetensors"), &len);
    CHECK(whole != NULL);
    if (whole) {
        snprintf(path, sizeof path, "%s/truncated.safetensors", test_tmpdir());
        CHECK(test_write_file(path, whole, len - 100));
        kiln_st_archive *ar = NULL;
        CHECK_ERR(kiln_st_open_file(path, &ar), KILN_ERR_FORMAT, "past end of file");
        /* the tensor with the highest offset: named in the message */
        check_msg_has("truncated.safetensors", "tensor '");
        CHECK(test_write_file(path, whole, 5));
        CHECK_ERR(kiln_st_open_file(path, &ar), KILN_ERR_FORMAT, "truncated.safetensors");
        free(whole);
    }
}

static void write_shard(const char *dir, const char *file, const char *const *names, int n) {
    static const float data[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    kiln_st_writer *w = NULL;
    CHECK_OK(kiln_st_writer_new(&w));
    for (int i = 0; i < n; i++)
        CHECK_OK(kiln_st_writer_add(w, names[i], KILN_DT_F32, 1, shape, data, false));
    CHECK_OK(kiln_st_writer_finish(w, path));
    kiln_st_writer_free(w);
}

static void write_index(const char *dir, const char *json) {
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    CHECK(test_write_file(path, json, strlen(json)));
}

static void test_sharded(void) {
    static const char *shard1[] = {"model.embed_tokens.weight",
                                   "model.layers.0.mlp.up_proj.weight"};
    static const char *shard2[] = {"model.layers.3.mlp.up_proj.weight", "lm_head.weight"};
    const char *f1 = "model-00001-of-00002.safetensors", *f2 = "model-00002-of-00002.safetensors";
    char dir[600];
    kiln_st_archive *ar = NULL;

    /* valid: index maps four tensors over two shards */
    snprintf(dir, sizeof dir, "%s/sharded_ok", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    write_shard(dir, f1, shard1, 2);
    write_shard(dir, f2, shard2, 2);
    write_index(dir, "{\"metadata\":{},\"weight_map\":{"
                     "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                     "\"model.layers.0.mlp.up_proj.weight\":\"model-00001-of-00002.safetensors\","
                     "\"model.layers.3.mlp.up_proj.weight\":\"model-00002-of-00002.safetensors\","
                     "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}");
    CHECK_OK(kiln_st_open_dir(dir, &ar));
    if (ar) {
        CHECK(kiln_st_count(ar) == 4);
        const kiln_st_tensor *t = kiln_st_find(ar, "lm_head.weight");
        CHECK(t && strstr(kiln_st_file_path(ar, t->file_index), f2));
        t = kiln_st_find(ar, "model.embed_tokens.weight");
        CHECK(t && strstr(kiln_st_file_path(ar, t->file_index), f1));
        CHECK(t && ((const float *)t->data)[3] == 4.0f);
        kiln_st_close(ar);
    }

    /* index names a shard that does not exist */
    snprintf(dir, sizeof dir, "%s/sharded_missing", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    write_shard(dir, f1, shard1, 2);
    write_index(
        dir, "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
             "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}");
    CHECK_ERR(kiln_st_open_dir(dir, &ar), KILN_ERR_NOT_FOUND, f2);

    /* index maps a tensor to a shard that does not hold it */
    snprintf(dir, sizeof dir, "%s/sharded_absent", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    write_shard(dir, f1, shard1, 2);
    write_shard(dir, f2, shard2, 2);
    write_index(
        dir, "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
             "\"model.layers.9.mlp.up_proj.weight\":\"model-00002-of-00002.safetensors\"}}");
    CHECK_ERR(kiln_st_open_dir(dir, &ar), KILN_ERR_FORMAT, "model.layers.9.mlp.up_proj.weight");
    check_msg_has(f2, "model.safetensors.index.json");

    /* a corrupt second shard: the error names that shard and the tensor */
    snprintf(dir, sizeof dir, "%s/sharded_corrupt", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    write_shard(dir, f1, shard1, 2);
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, f2);
    write_raw(path,
              "{\"model.layers.3.mlp.up_proj.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_"
              "offsets\":[0,16]}}",
              8, 0);
    CHECK_ERR(kiln_st_open_dir(dir, &ar), KILN_ERR_FORMAT, "past end of file");
    check_msg_has(f2, "model.layers.3.mlp.up_proj.weight");

    /* no index, no model.safetensors: every *.safetensors, sorted; duplicates across files fail */
    snprintf(dir, sizeof dir, "%s/glob_dup", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    write_shard(dir, "b.safetensors", shard2, 2);
    write_shard(dir, "a.safetensors", shard1, 2);
    CHECK_OK(kiln_st_open_dir(dir, &ar));
    if (ar) {
        CHECK(kiln_st_count(ar) == 4);
        CHECK(strstr(kiln_st_file_path(ar, 0), "a.safetensors") != NULL);
        kiln_st_close(ar);
    }
    write_shard(dir, "c.safetensors", shard1, 1);
    CHECK_ERR(kiln_st_open_dir(dir, &ar), KILN_ERR_FORMAT, "model.embed_tokens.weight");
    check_msg_has("c.safetensors", "a.safetensors");

    snprintf(dir, sizeof dir, "%s/empty", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    CHECK_ERR(kiln_st_open_dir(dir, &ar), KILN_ERR_NOT_FOUND, "no .safetensors");
    CHECK_ERR(kiln_st_open_dir("/nonexistent/kiln", &ar), KILN_ERR_NOT_FOUND, "/nonexistent/kiln");
}

/* Lookup stays fast with many tensors (hash table): 20000 names found in well under a second. */
static void test_many_tensors(void) {
    kiln_st_writer *w = NULL;
    static const uint8_t byte = 7;
    int64_t shape[1] = {1};
    CHECK_OK(kiln_st_writer_new(&w));
    char name[64];
    for (int i = 0; i < 20000; i++) {
        snprintf(name, sizeof name, "model.layers.%d.w", i);
        CHECK_OK(kiln_st_writer_add(w, name, KILN_DT_U8, 1, shape, &byte, false));
    }
    char path[600];
    snprintf(path, sizeof path, "%s/many.safetensors", test_tmpdir());
    CHECK_OK(kiln_st_writer_finish(w, path));
    kiln_st_writer_free(w);
    kiln_st_archive *ar = NULL;
    CHECK_OK(kiln_st_open_file(path, &ar));
    int found = 0;
    for (int i = 0; ar && i < 20000; i++) {
        snprintf(name, sizeof name, "model.layers.%d.w", i);
        const kiln_st_tensor *t = kiln_st_find(ar, name);
        found += t && strcmp(t->name, name) == 0 && *(const uint8_t *)t->data == 7;
    }
    CHECK(found == 20000);
    kiln_st_close(ar);
}

/* Read into memory (kiln_st_open_dir_with in_memory) vs mapped: the same tensors, byte for byte,
 * from other addresses, for the fixtures, the sharded folder of test_sharded and a file past the
 * 2 MiB size where the copy moves to huge-page memory (its data a pattern, not zeros). */
static void same_archive(const char *dir) {
    kiln_st_archive *a = NULL, *b = NULL;
    CHECK_OK(kiln_st_open_dir_with(dir, false, &a));
    CHECK_OK(kiln_st_open_dir_with(dir, true, &b));
    if (a && b) {
        CHECK_MSG(kiln_st_count(a) == kiln_st_count(b) && kiln_st_count(a) > 0,
                  "%s: %d vs %d tensors", dir, kiln_st_count(a), kiln_st_count(b));
        int bad = 0;
        for (int i = 0; i < kiln_st_count(a) && i < kiln_st_count(b); i++) {
            const kiln_st_tensor *x = kiln_st_at(a, i), *y = kiln_st_at(b, i);
            bad += strcmp(x->name, y->name) != 0 || x->dtype != y->dtype ||
                   x->nbytes != y->nbytes || x->data == y->data ||
                   memcmp(x->data, y->data, x->nbytes) != 0;
        }
        CHECK_MSG(bad == 0, "%s: %d tensors differ between mapped and in-memory", dir, bad);
    }
    kiln_st_close(a);
    kiln_st_close(b);
}

static void test_in_memory(void) {
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++)
        same_archive(test_shared(fixtures[f].dir));
    char dir[600];
    snprintf(dir, sizeof dir, "%s/sharded_ok", test_tmpdir());
    same_archive(dir);
    snprintf(dir, sizeof dir, "%s/big", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    enum { N = 3 << 18 }; /* 3 MiB of f32 */
    const char *hdr =
        "{\"big\":{\"dtype\":\"F32\",\"shape\":[786432],\"data_offsets\":[0,3145728]}}";
    size_t hl = strlen(hdr), total = 8 + hl + (size_t)N * 4;
    uint8_t *buf = calloc(1, total);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    for (int i = 0; i < N; i++) {
        float v = (float)i * 0.5f;
        memcpy(buf + 8 + hl + 4 * (size_t)i, &v, 4);
    }
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(test_write_file(path, buf, total));
    free(buf);
    same_archive(dir);
    kiln_st_archive *ar = NULL;
    CHECK_OK(kiln_st_open_dir_with(dir, true, &ar));
    const kiln_st_tensor *t = ar ? kiln_st_find(ar, "big") : NULL;
    float last = 0.0f; /* the data starts right after the header: not 4-byte aligned */
    if (t) memcpy(&last, (const uint8_t *)t->data + 4 * (size_t)(N - 1), sizeof last);
    CHECK(t && last == (float)(N - 1) * 0.5f);
    kiln_st_close(ar);
}

int main(void) {
    test_fixtures();
    test_writer_roundtrip();
    test_corrupt_files();
    test_sharded();
    test_in_memory();
    test_many_tensors();
    return test_finish();
}
