/* The C ABI's GPU path on an NVIDIA GPU, as a C or C++ server links it: kt_gpu_open() on a
 * database that `tune --device h200` wrote, A and B in the program's own device memory, each
 * GEMM launched on the program's own CUDA stream through kt_gpu_gemm(), and the result
 * checked against a GEMM computed here. Llama-70B TP8's decode GEMM (n = 1280, k = 8192,
 * bf16, B [N, K]) at m = 16 (tuned by scripts/gpu-check.sh: an exact match), m = 5 (a
 * bucket) and m = 100 (the nearest tuned shape), each whose kernel needs scratch first called
 * with a byte too little (refused), then a bad call's error. Then the same product as an FP8
 * checkpoint's layer runs it (W8A8, E4M3 bytes, scales per token and per channel in device
 * memory) through kt_gpu_gemm_scaled() at m = 16, and kt_gpu_gemm() refusing fp8; and once
 * more block-scaled (DeepSeek-V3's scheme: a scale a token and 128 of k, one a 128 × 128
 * block of B) through kt_gpu_gemm_block_scaled() at m = 16, also tuned by the script; and
 * as a 4-bit GPTQ checkpoint holds it (W4A16, GPTQ's words, a scale a group of 128 of k)
 * through kt_gpu_gemm_int4() at m = 1 and m = 100, untuned (the library's guesses).
 *
 *   cc runtime-lib/examples/cuda_gemm.c -I runtime-lib/include -L DIR -lkerntune -ldl \
 *       -o cuda-gemm
 *   LD_LIBRARY_PATH=DIR ./cuda-gemm tuned.db h200
 *
 * DIR holds a libkerntune.so built with `--features cuda`. The CUDA driver is loaded at run
 * time (dlopen), as the library itself does, so building needs no CUDA headers or libraries.
 * Exits 0 when every result is right, 1 when one is wrong, 2 when there is no usable device.
 *
 * A[i][p] = ((3i + p) % 9 - 4) / 8 and B[j][p] = ((j + 2p) % 7 - 3) / 8 are exact in bf16
 * and every partial sum is a multiple of 1/64 of magnitude at most 1536 (under 2^17 of
 * them, within f32's 24 bits), so any order of summation in f32, split-K included, gives
 * the exact result: the check is equality. In fp8 the bytes hold 8 A[i][p] and 8 B[j][p],
 * whole numbers of at most 3 bits, and every scale is 1/8: exact again (block-scaled, each
 * group's sum too; int4, each word's too). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kerntune.h"

/* The few driver API entry points used, as libcuda.so.1 exports them (CUresult is an int,
 * CUdeviceptr a 64-bit integer, contexts and streams opaque pointers). */
typedef int (*cu_init_t)(unsigned);
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_primary_retain_t)(void **, int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_alloc_t)(uint64_t *, size_t);
typedef int (*cu_free_t)(uint64_t);
typedef int (*cu_htod_t)(uint64_t, const void *, size_t);
typedef int (*cu_dtoh_t)(void *, uint64_t, size_t);
typedef int (*cu_stream_create_t)(void **, unsigned);
typedef int (*cu_stream_t)(void *);

static struct {
    cu_init_t init;
    cu_device_get_t device_get;
    cu_primary_retain_t primary_retain;
    cu_ctx_set_t ctx_set;
    cu_alloc_t alloc;
    cu_free_t free;
    cu_htod_t htod;
    cu_dtoh_t dtoh;
    cu_stream_create_t stream_create;
    cu_stream_t stream_sync;
    cu_stream_t stream_destroy;
} cu;

/* Loads the driver's entry points; 0 on success, else a message on stderr. */
static int load_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "cannot load the CUDA driver (libcuda.so.1): %s\n", dlerror());
        return -1;
    }
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"cuInit", (void **)&cu.init},
        {"cuDeviceGet", (void **)&cu.device_get},
        {"cuDevicePrimaryCtxRetain", (void **)&cu.primary_retain},
        {"cuCtxSetCurrent", (void **)&cu.ctx_set},
        {"cuMemAlloc_v2", (void **)&cu.alloc},
        {"cuMemFree_v2", (void **)&cu.free},
        {"cuMemcpyHtoD_v2", (void **)&cu.htod},
        {"cuMemcpyDtoH_v2", (void **)&cu.dtoh},
        {"cuStreamCreate", (void **)&cu.stream_create},
        {"cuStreamSynchronize", (void **)&cu.stream_sync},
        {"cuStreamDestroy_v2", (void **)&cu.stream_destroy},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (*syms[i].slot == NULL) {
            fprintf(stderr, "the CUDA driver lacks %s\n", syms[i].name);
            return -1;
        }
    }
    return 0;
}

/* A driver call that must succeed: its name and result on failure. */
#define CU(call)                                                                      \
    do {                                                                              \
        int r_ = (call);                                                              \
        if (r_ != 0) {                                                                \
            fprintf(stderr, "%s failed: CUDA error %d\n", #call, r_);                 \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

/* bf16 of a float that bf16 holds exactly: its upper 16 bits. */
static uint16_t bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (uint16_t)(bits >> 16);
}

/* The E4M3 byte of v, a whole number of at most four significant bits (which E4M3 holds
 * exactly): sign, exponent biased by 7, three mantissa bits. */
static uint8_t e4m3(int v) {
    uint8_t sign = v < 0 ? 0x80 : 0;
    unsigned a = (unsigned)(v < 0 ? -v : v), e = 0;
    if (a == 0) return sign;
    while ((a >> e) > 1) e++;
    unsigned mantissa = e >= 3 ? (a >> (e - 3)) & 7 : (a << (3 - e)) & 7;
    return (uint8_t)(sign | ((e + 7) << 3) | mantissa);
}

static float a_at(size_t i, size_t p) { return (float)((int)((3 * i + p) % 9) - 4) / 8.0f; }
static float b_at(size_t j, size_t p) { return (float)((int)((j + 2 * p) % 7) - 3) / 8.0f; }

static const char *match_name(KtMatch m) {
    switch (m) {
    case KT_MATCH_EXACT: return "exact";
    case KT_MATCH_BUCKET: return "bucket";
    case KT_MATCH_NEAREST: return "nearest";
    default: return "default";
    }
}

/* The values of C (m × n) that differ from the exact product of a_at and b_at over k, and
 * the largest difference in `*worst`. */
static long count_wrong(const float *c, size_t m, size_t n, size_t k, double *worst) {
    long wrong = 0;
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            double want = 0.0;
            for (size_t p = 0; p < k; p++) want += (double)a_at(i, p) * b_at(j, p);
            double off = c[i * n + j] - want;
            if (off < 0) off = -off;
            if (off > *worst) *worst = off;
            if (off != 0.0) wrong++;
        }
    return wrong;
}

/* One GEMM of m rows on the device; returns the number of wrong values, or -1 when the
 * library refused the call (its error printed). */
static long gemm_on_device(const KtGpuDispatcher *g, void *stream, size_t m, size_t n,
                           size_t k) {
    uint16_t *a = malloc(m * k * sizeof *a), *b = malloc(n * k * sizeof *b);
    float *c = malloc(m * n * sizeof *c);
    if (a == NULL || b == NULL || c == NULL) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    for (size_t i = 0; i < m; i++)
        for (size_t p = 0; p < k; p++) a[i * k + p] = bf16(a_at(i, p));
    for (size_t j = 0; j < n; j++)
        for (size_t p = 0; p < k; p++) b[j * k + p] = bf16(b_at(j, p));
    uint64_t da, db, dc, ds = 0;
    CU(cu.alloc(&da, m * k * sizeof *a));
    CU(cu.alloc(&db, n * k * sizeof *b));
    CU(cu.alloc(&dc, m * n * sizeof *c));
    CU(cu.htod(da, a, m * k * sizeof *a));
    CU(cu.htod(db, b, n * k * sizeof *b));
    size_t scratch = kt_gpu_gemm_scratch_bytes(g, m, n, k, KT_DTYPE_BF16, true);
    if (scratch > 0) CU(cu.alloc(&ds, scratch));
    KtMatch how = KT_MATCH_DEFAULT;
    int short_ran = 0;
    if (scratch > 0) {
        /* Scratch a byte short is refused before anything runs: the kernel would overrun it. */
        KtStatus short_st = kt_gpu_gemm(g, m, n, k, KT_DTYPE_BF16, true,
                                        (const void *)(uintptr_t)da, (const void *)(uintptr_t)db,
                                        (float *)(uintptr_t)dc, (void *)(uintptr_t)ds,
                                        scratch - 1, stream, &how);
        printf("gemm m=%zu: scratch of %zu bytes, one short: status %d: %s\n", m, scratch,
               (int)short_st, kt_last_error());
        short_ran = short_st != KT_STATUS_INVALID_ARGUMENT;
    }
    KtStatus st = kt_gpu_gemm(g, m, n, k, KT_DTYPE_BF16, true, (const void *)(uintptr_t)da,
                              (const void *)(uintptr_t)db, (float *)(uintptr_t)dc,
                              (void *)(uintptr_t)ds, scratch, stream, &how);
    long wrong = -1;
    if (st != KT_STATUS_OK) {
        printf("gemm m=%zu n=%zu k=%zu: status %d: %s\n", m, n, k, (int)st, kt_last_error());
    } else {
        CU(cu.stream_sync(stream));
        CU(cu.dtoh(c, dc, m * n * sizeof *c));
        double worst = 0.0;
        wrong = count_wrong(c, m, n, k, &worst);
        printf("gemm m=%zu n=%zu k=%zu: match=%s, scratch %zu bytes, %ld of %zu values "
               "wrong (largest error %g)\n",
               m, n, k, match_name(how), scratch, wrong, m * n, worst);
    }
    if (ds != 0) CU(cu.free(ds));
    CU(cu.free(dc));
    CU(cu.free(db));
    CU(cu.free(da));
    free(c);
    free(b);
    free(a);
    return short_ran ? -1 : wrong;
}

/* The product of gemm_on_device() in fp8: A and B as E4M3 bytes of 8 times their values,
 * scales of 1/8 in device memory, through kt_gpu_gemm_scaled() (block 0: m and n scales) or
 * kt_gpu_gemm_block_scaled() (m rows of k / block groups, n / block rows of as many). Returns
 * the number of wrong values, or -1 when the library refused a call it should take or took
 * one it should refuse. */
static long gemm_fp8_on_device(const KtGpuDispatcher *g, void *stream, size_t m, size_t n,
                               size_t k, size_t block) {
    size_t groups = block ? (k + block - 1) / block : 1;
    size_t a_len = m * groups, b_len = block ? (n + block - 1) / block * groups : n;
    uint8_t *a = malloc(m * k), *b = malloc(n * k);
    float *c = malloc(m * n * sizeof *c), *sa = malloc(a_len * sizeof *sa),
          *sb = malloc(b_len * sizeof *sb);
    if (a == NULL || b == NULL || c == NULL || sa == NULL || sb == NULL) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    for (size_t i = 0; i < m; i++)
        for (size_t p = 0; p < k; p++) a[i * k + p] = e4m3((int)(8.0f * a_at(i, p)));
    for (size_t j = 0; j < n; j++)
        for (size_t p = 0; p < k; p++) b[j * k + p] = e4m3((int)(8.0f * b_at(j, p)));
    for (size_t i = 0; i < a_len; i++) sa[i] = 0.125f;
    for (size_t j = 0; j < b_len; j++) sb[j] = 0.125f;
    uint64_t da, db, dc, dsa, dsb, ds = 0;
    CU(cu.alloc(&da, m * k));
    CU(cu.alloc(&db, n * k));
    CU(cu.alloc(&dc, m * n * sizeof *c));
    CU(cu.alloc(&dsa, a_len * sizeof *sa));
    CU(cu.alloc(&dsb, b_len * sizeof *sb));
    CU(cu.htod(da, a, m * k));
    CU(cu.htod(db, b, n * k));
    CU(cu.htod(dsa, sa, a_len * sizeof *sa));
    CU(cu.htod(dsb, sb, b_len * sizeof *sb));
    size_t scratch = block ? kt_gpu_gemm_block_scratch_bytes(g, m, n, k, KT_DTYPE_FP8_E4M3, block)
                           : kt_gpu_gemm_scratch_bytes(g, m, n, k, KT_DTYPE_FP8_E4M3, true);
    if (scratch > 0) CU(cu.alloc(&ds, scratch));
    KtMatch how = KT_MATCH_DEFAULT;
    long wrong = -1;
    /* Without scales the call is refused: kt_gpu_gemm() has none to give. */
    KtStatus plain = kt_gpu_gemm(g, m, n, k, KT_DTYPE_FP8_E4M3, true, (const void *)(uintptr_t)da,
                                 (const void *)(uintptr_t)db, (float *)(uintptr_t)dc,
                                 (void *)(uintptr_t)ds, scratch, stream, &how);
    printf("fp8 gemm through kt_gpu_gemm: status %d: %s\n", (int)plain, kt_last_error());
    KtStatus st =
        block ? kt_gpu_gemm_block_scaled(
                    g, m, n, k, KT_DTYPE_FP8_E4M3, block, (const void *)(uintptr_t)da,
                    (const float *)(uintptr_t)dsa, a_len, (const void *)(uintptr_t)db,
                    (const float *)(uintptr_t)dsb, b_len, (float *)(uintptr_t)dc,
                    (void *)(uintptr_t)ds, scratch, stream, &how)
              : kt_gpu_gemm_scaled(
                    g, m, n, k, KT_DTYPE_FP8_E4M3, true, (const void *)(uintptr_t)da,
                    (const float *)(uintptr_t)dsa, a_len, (const void *)(uintptr_t)db,
                    (const float *)(uintptr_t)dsb, b_len, (float *)(uintptr_t)dc,
                    (void *)(uintptr_t)ds, scratch, stream, &how);
    const char *via = block ? "kt_gpu_gemm_block_scaled" : "kt_gpu_gemm_scaled";
    if (st != KT_STATUS_OK) {
        printf("fp8 gemm m=%zu n=%zu k=%zu (%s): status %d: %s\n", m, n, k, via, (int)st,
               kt_last_error());
    } else {
        CU(cu.stream_sync(stream));
        CU(cu.dtoh(c, dc, m * n * sizeof *c));
        double worst = 0.0;
        wrong = count_wrong(c, m, n, k, &worst);
        printf("fp8 gemm m=%zu n=%zu k=%zu (%s, block %zu): match=%s, scratch %zu bytes, "
               "%ld of %zu values wrong (largest error %g)\n",
               m, n, k, via, block, match_name(how), scratch, wrong, m * n, worst);
    }
    if (ds != 0) CU(cu.free(ds));
    CU(cu.free(dsb));
    CU(cu.free(dsa));
    CU(cu.free(dc));
    CU(cu.free(db));
    CU(cu.free(da));
    free(sb);
    free(sa);
    free(c);
    free(b);
    free(a);
    return plain == KT_STATUS_INVALID_ARGUMENT ? wrong : -1;
}

/* The product of gemm_on_device() as a 4-bit GPTQ checkpoint holds it (W4A16): B[j][p] =
 * (q - 8) / 8 with q = (j + 2p) % 7 + 5, GPTQ's words ([k / 8, n], value i of word (r, j) in
 * bits 4i..4i + 3), a scale of 1/8 for each group of 128 of k and column, zero points of 8
 * given (`zeros` > 0) or left to the library's 8 (NULL), all in device memory, through
 * kt_gpu_gemm_int4(); a scale count of one a column is refused first. Every weight is exact
 * in bf16 and every partial sum as before: the check is equality. Returns the number of
 * wrong values, or -1 when the library refused a call it should take or took one it should
 * refuse. */
static long gemm_int4_on_device(const KtGpuDispatcher *g, void *stream, size_t m, size_t n,
                                size_t k, int zeros) {
    const size_t group = 128, groups = k / group * n;
    uint16_t *a = malloc(m * k * sizeof *a);
    uint32_t *w = calloc(k / 8 * n, sizeof *w);
    float *c = malloc(m * n * sizeof *c), *s = malloc(groups * sizeof *s),
          *z = malloc(groups * sizeof *z);
    if (a == NULL || w == NULL || c == NULL || s == NULL || z == NULL) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    for (size_t i = 0; i < m; i++)
        for (size_t p = 0; p < k; p++) a[i * k + p] = bf16(a_at(i, p));
    for (size_t p = 0; p < k; p++)
        for (size_t j = 0; j < n; j++)
            w[p / 8 * n + j] |= (uint32_t)((j + 2 * p) % 7 + 5) << (4 * (p % 8));
    for (size_t i = 0; i < groups; i++) {
        s[i] = 0.125f;
        z[i] = 8.0f;
    }
    uint64_t da, dw, dc, dsc, dz, ds = 0;
    CU(cu.alloc(&da, m * k * sizeof *a));
    CU(cu.alloc(&dw, k / 8 * n * sizeof *w));
    CU(cu.alloc(&dc, m * n * sizeof *c));
    CU(cu.alloc(&dsc, groups * sizeof *s));
    CU(cu.alloc(&dz, groups * sizeof *z));
    CU(cu.htod(da, a, m * k * sizeof *a));
    CU(cu.htod(dw, w, k / 8 * n * sizeof *w));
    CU(cu.htod(dsc, s, groups * sizeof *s));
    CU(cu.htod(dz, z, groups * sizeof *z));
    size_t scratch = kt_gpu_gemm_int4_scratch_bytes(g, m, n, k, KT_DTYPE_BF16, group);
    if (scratch > 0) CU(cu.alloc(&ds, scratch));
    KtMatch how = KT_MATCH_DEFAULT;
    const float *zp = zeros ? (const float *)(uintptr_t)dz : NULL;
    size_t zeros_len = zeros ? groups : 0;
    /* One scale a column is a per-channel checkpoint's count, not this group's: refused. */
    KtStatus refused = kt_gpu_gemm_int4(
        g, m, n, k, KT_DTYPE_BF16, group, (const void *)(uintptr_t)da,
        (const uint32_t *)(uintptr_t)dw, (const float *)(uintptr_t)dsc, n, zp, zeros_len,
        (float *)(uintptr_t)dc, (void *)(uintptr_t)ds, scratch, stream, &how);
    printf("int4 gemm with %zu scales: status %d: %s\n", n, (int)refused, kt_last_error());
    KtStatus st = kt_gpu_gemm_int4(
        g, m, n, k, KT_DTYPE_BF16, group, (const void *)(uintptr_t)da,
        (const uint32_t *)(uintptr_t)dw, (const float *)(uintptr_t)dsc, groups, zp, zeros_len,
        (float *)(uintptr_t)dc, (void *)(uintptr_t)ds, scratch, stream, &how);
    long wrong = -1;
    if (st != KT_STATUS_OK) {
        printf("int4 gemm m=%zu n=%zu k=%zu: status %d: %s\n", m, n, k, (int)st,
               kt_last_error());
    } else {
        CU(cu.stream_sync(stream));
        CU(cu.dtoh(c, dc, m * n * sizeof *c));
        double worst = 0.0;
        wrong = count_wrong(c, m, n, k, &worst);
        printf("int4 gemm m=%zu n=%zu k=%zu (group %zu, zero points %s): match=%s, scratch %zu "
               "bytes, %ld of %zu values wrong (largest error %g)\n",
               m, n, k, group, zeros ? "given" : "8", match_name(how), scratch, wrong, m * n,
               worst);
    }
    if (ds != 0) CU(cu.free(ds));
    CU(cu.free(dz));
    CU(cu.free(dsc));
    CU(cu.free(dc));
    CU(cu.free(dw));
    CU(cu.free(da));
    free(z);
    free(s);
    free(c);
    free(w);
    free(a);
    return refused == KT_STATUS_INVALID_ARGUMENT ? wrong : -1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DB DEVICE (a database `tune --device DEVICE` wrote)\n",
                argv[0]);
        return 2;
    }
    if (kt_abi_version() != KERNTUNE_ABI_VERSION) {
        fprintf(stderr, "libkerntune speaks C ABI %u, this program was built for %u: rebuild it\n",
                kt_abi_version(), KERNTUNE_ABI_VERSION);
        return 2;
    }
    /* The library first: without the device, or built without CUDA, it says which. */
    KtGpuDispatcher *g = NULL;
    if (kt_gpu_open(argv[1], argv[2], &g) != KT_STATUS_OK) {
        fprintf(stderr, "kt_gpu_open: %s\n", kt_last_error());
        return 2;
    }
    if (load_driver() != 0) {
        kt_gpu_free(g);
        return 2;
    }
    /* The library works in the device's primary context, as the CUDA runtime does; the
     * program's memory and stream live there too. */
    int dev;
    void *ctx, *stream;
    CU(cu.init(0));
    CU(cu.device_get(&dev, 0));
    CU(cu.primary_retain(&ctx, dev));
    CU(cu.ctx_set(ctx));
    CU(cu.stream_create(&stream, 0));

    int failed = 0;
    const size_t rows[] = {16, 5, 100};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        long wrong = gemm_on_device(g, stream, rows[r], 1280, 8192);
        if (wrong != 0) failed = 1;
    }
    /* A reload of the unchanged database loads nothing, and the calls after it run the
     * same builds. */
    if (kt_gpu_reload(g) != KT_STATUS_OK) {
        printf("reload: %s\n", kt_last_error());
        failed = 1;
    } else if (gemm_on_device(g, stream, 16, 1280, 8192) != 0) {
        failed = 1;
    }
    KtStats s;
    KtGpuStats held;
    if (kt_gpu_stats(g, &s, &held) != KT_STATUS_OK) {
        printf("stats: %s\n", kt_last_error());
        failed = 1;
    } else {
        printf("calls: %llu exact, %llu bucket, %llu nearest, %llu default; builds: %llu "
               "launched, %llu loaded, %llu without code, %llu refused\n",
               (unsigned long long)s.exact, (unsigned long long)s.bucket,
               (unsigned long long)s.nearest, (unsigned long long)s.defaults,
               (unsigned long long)held.builds, (unsigned long long)held.resident,
               (unsigned long long)held.missing, (unsigned long long)held.failed);
    }
    if (gemm_fp8_on_device(g, stream, 16, 1280, 8192, 0) != 0) failed = 1;
    if (gemm_fp8_on_device(g, stream, 16, 1280, 8192, 128) != 0) failed = 1;
    /* Int4 weights: a decode step (the skinny kernel on the words) with zero points, a prompt's
     * rows (tiles unpacking them as staged) without. */
    if (gemm_int4_on_device(g, stream, 1, 1280, 8192, 1) != 0) failed = 1;
    if (gemm_int4_on_device(g, stream, 100, 1280, 8192, 0) != 0) failed = 1;
    /* A bad call is an error naming the input, not a crash. */
    KtStatus st = kt_gpu_gemm(g, 0, 1280, 8192, KT_DTYPE_BF16, true, NULL, NULL, NULL, NULL,
                              0, stream, NULL);
    printf("m = 0: status %d: %s\n", (int)st, kt_last_error());
    if (st != KT_STATUS_INVALID_ARGUMENT) failed = 1;
    CU(cu.stream_destroy(stream));
    kt_gpu_free(g);
    printf("%s\n", failed ? "FAILED" : "all results exact");
    return failed;
}
