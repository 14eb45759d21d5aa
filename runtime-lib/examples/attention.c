/* A server's attention calls through kerntune's C ABI, for a model whose layers look back a
 * bounded distance (Gemma 2 and 3, gpt-oss, Mistral 7B v0.1), add a learned sink to each
 * head's softmax (gpt-oss), soft-cap the scores (Gemma 2) or bias them by distance (ALiBi:
 * Bloom, MPT, Baichuan 13B): a prefill chunk by flash attention and a decode step by paged
 * attention, each with and without a sliding window, with sinks, with a soft-cap and with
 * ALiBi, a decode step on an fp8 cache (vLLM's
 * --kv-cache-dtype fp8) under bf16 queries, and one on a latent cache (DeepSeek's multi-head
 * latent attention: one cache, each value the first v_head_dim of its key row), and a prefill
 * chunk with value heads narrower than the keys (that attention's prefill), checked against
 * plain loops here.
 *
 *   cc runtime-lib/examples/attention.c -I runtime-lib/include -L target/release -lkerntune -lm \
 *       -o attention
 *   LD_LIBRARY_PATH=target/release ./attention kerntune.db
 *
 * Prints a line per call (the largest difference from the loops) and exits 0 when all are
 * within 1e-4, 1 when one is not, 2 when the library's ABI is not this header's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kerntune.h"

enum { D = 16, HQ = 4, HKV = 2, BS = 8 };

/* Inputs with no pattern the kernels could lean on, in [-1, 1]. */
static float value(unsigned i) {
    i = i * 2654435761u + 12345u;
    return (float)((i >> 8) % 2001) / 1000.0f - 1.0f;
}

/* Each query head's sink logit, for the calls with sinks. */
static const float SINKS[HQ] = {0.5f, -1.0f, 2.5f, 1.0f};

/* Each query head's ALiBi slope, for the calls with ALiBi: a model of 4 heads' (2^-2h). */
static const float SLOPES[HQ] = {0.25f, 0.0625f, 0.015625f, 0.00390625f};

/* Softmax attention of one query row over `n` keys and values at `keys[t]` (row offsets),
 * the last of them at the query's own position, with a sink logit `sink` in the softmax
 * (-INFINITY for none): a key whose value is zero; scores capped at `cap` (0 for none), then
 * biased by `slope` times the key's distance back (0 for none). */
static void attend(const float *q, const float *k, const float *v, const size_t *keys, size_t n,
                   double sink, double cap, double slope, double *out) {
    double mx = sink, sum = 0.0, s[1024];
    for (size_t t = 0; t < n; t++) {
        double dot = 0.0;
        for (int x = 0; x < D; x++) dot += (double)q[x] * k[keys[t] + x];
        s[t] = dot / sqrt((double)D);
        if (cap > 0.0) s[t] = cap * tanh(s[t] / cap);
        s[t] -= slope * (double)(n - 1 - t);
        if (s[t] > mx) mx = s[t];
    }
    for (int x = 0; x < D; x++) out[x] = 0.0;
    if (sink > -INFINITY) sum = exp(sink - mx);
    for (size_t t = 0; t < n; t++) {
        const double p = exp(s[t] - mx);
        sum += p;
        for (int x = 0; x < D; x++) out[x] += p * v[keys[t] + x];
    }
    for (int x = 0; x < D; x++) out[x] /= sum;
}

/* Flash attention of Q_LEN queries aligned to the end of KV_LEN keys, causal. */
static int flash(KtDispatcher *d, size_t window, const float *sinks, float cap,
                 const float *slopes) {
    enum { Q_LEN = 9, KV_LEN = 40 };
    static float q[Q_LEN * HQ * D], k[KV_LEN * HKV * D], v[KV_LEN * HKV * D], o[Q_LEN * HQ * D];
    for (unsigned i = 0; i < Q_LEN * HQ * D; i++) q[i] = value(i);
    for (unsigned i = 0; i < KV_LEN * HKV * D; i++) k[i] = value(7 * i + 1), v[i] = value(5 * i + 2);
    KtFlashProblem p = {.batch = 1, .q_len = Q_LEN, .kv_len = KV_LEN, .q_heads = HQ,
                        .kv_heads = HKV, .head_dim = D, .causal = true, .scale = 0.0f,
                        .dtype = KT_DTYPE_F32, .window = window, .sinks = sinks,
                        .softcap = cap, .alibi_slopes = slopes};
    const char *with = sinks ? " sinks" : cap > 0.0f ? " softcap" : slopes ? " alibi" : "";
    if (kt_flash_attention(d, &p, q, k, v, o, NULL) != KT_STATUS_OK) {
        printf("flash window=%zu%s: %s\n", window, with, kt_last_error());
        return 0;
    }
    double worst = 0.0, want[D];
    size_t keys[KV_LEN];
    for (size_t i = 0; i < Q_LEN; i++)
        for (size_t h = 0; h < HQ; h++) {
            const size_t pos = i + KV_LEN - Q_LEN, first = window && pos + 1 > window ? pos + 1 - window : 0;
            for (size_t j = first; j <= pos; j++) keys[j - first] = (j * HKV + h / (HQ / HKV)) * D;
            attend(&q[(i * HQ + h) * D], k, v, keys, pos + 1 - first, sinks ? sinks[h] : -INFINITY,
                   cap, slopes ? slopes[h] : 0.0, want);
            for (int x = 0; x < D; x++) worst = fmax(worst, fabs(o[(i * HQ + h) * D + x] - want[x]));
        }
    printf("flash window=%zu%s: max difference %.1e\n", window, with, worst);
    return worst <= 1e-4;
}

/* A prefill chunk whose value heads hold DV of the keys' D values (latent attention's prefill:
 * keys of 192, values of 128); V and the output rows hold DV. */
static int flash_narrow(KtDispatcher *d) {
    enum { DV = 8, Q_LEN = 9, KV_LEN = 40 };
    static float q[Q_LEN * HQ * D], k[KV_LEN * HKV * D], v[KV_LEN * HKV * DV], o[Q_LEN * HQ * DV];
    /* V widened to rows of D for the loops, zero past DV. */
    static float vd[KV_LEN * HKV * D];
    for (unsigned i = 0; i < Q_LEN * HQ * D; i++) q[i] = value(i + 3);
    for (unsigned i = 0; i < KV_LEN * HKV * D; i++) k[i] = value(7 * i + 1);
    for (unsigned i = 0; i < KV_LEN * HKV * DV; i++) {
        v[i] = value(5 * i + 2);
        vd[i / DV * D + i % DV] = v[i];
    }
    KtFlashProblem p = {.batch = 1, .q_len = Q_LEN, .kv_len = KV_LEN, .q_heads = HQ,
                        .kv_heads = HKV, .head_dim = D, .causal = true, .dtype = KT_DTYPE_F32,
                        .v_head_dim = DV};
    if (kt_flash_attention(d, &p, q, k, v, o, NULL) != KT_STATUS_OK) {
        printf("flash v_head_dim=%d: %s\n", DV, kt_last_error());
        return 0;
    }
    double worst = 0.0, want[D];
    size_t keys[KV_LEN];
    for (size_t i = 0; i < Q_LEN; i++)
        for (size_t h = 0; h < HQ; h++) {
            const size_t pos = i + KV_LEN - Q_LEN;
            for (size_t j = 0; j <= pos; j++) keys[j] = (j * HKV + h / (HQ / HKV)) * D;
            attend(&q[(i * HQ + h) * D], k, vd, keys, pos + 1, -INFINITY, 0.0, 0.0, want);
            for (int x = 0; x < DV; x++) worst = fmax(worst, fabs(o[(i * HQ + h) * DV + x] - want[x]));
        }
    printf("flash v_head_dim=%d: max difference %.1e\n", DV, worst);
    /* Values wider than the keys are no model's: refused by name. */
    p.v_head_dim = D + 1;
    const int refused = kt_flash_attention(d, &p, q, k, v, o, NULL) == KT_STATUS_INVALID_ARGUMENT;
    printf("error: %s\n", kt_last_error());
    return worst <= 1e-4 && refused;
}

/* An OCP E4M3 byte's value (no NaN byte is ever written here). */
static double e4m3(unsigned char b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return b & 0x80 ? -v : v;
}

/* One decode step on fp8 caches: bf16 queries, E4M3 bytes each scaled per tensor. The loops
 * read the same bytes and bf16 values, widened. */
static int paged_fp8(KtDispatcher *d) {
    enum { SEQS = 2, CTX = 37, MAX_BLOCKS = (CTX + BS - 1) / BS, BLOCKS = SEQS * MAX_BLOCKS };
    enum { CACHE = BLOCKS * BS * HKV * D };
    static uint16_t q[SEQS * HQ * D];
    static unsigned char kc[CACHE], vc[CACHE];
    static float qf[SEQS * HQ * D], kf[CACHE], vf[CACHE], o[SEQS * HQ * D];
    const float k_scale = 0.25f, v_scale = 0.125f;
    uint32_t tables[SEQS * MAX_BLOCKS], lens[SEQS] = {CTX, 9};
    for (unsigned i = 0; i < SEQS * HQ * D; i++) {
        /* bf16: the top half of an f32. */
        union { float f; uint32_t u; } x = {.f = value(3 * i)};
        q[i] = (uint16_t)(x.u >> 16);
        x.u = (uint32_t)q[i] << 16;
        qf[i] = x.f;
    }
    for (unsigned i = 0; i < CACHE; i++) {
        /* Exponents up to 7: values within +-1.875 before the scales. */
        kc[i] = (unsigned char)((11 * i + 4) * 2654435761u >> 24) & 0xbf;
        vc[i] = (unsigned char)((13 * i + 9) * 2654435761u >> 24) & 0xbf;
        kf[i] = (float)(e4m3(kc[i]) * k_scale);
        vf[i] = (float)(e4m3(vc[i]) * v_scale);
    }
    for (unsigned b = 0; b < SEQS * MAX_BLOCKS; b++) tables[b] = BLOCKS - 1 - b;
    KtPagedProblem p = {.num_seqs = SEQS, .context_len = CTX, .q_heads = HQ, .kv_heads = HKV,
                        .head_dim = D, .block_size = BS, .dtype = KT_DTYPE_BF16,
                        .kv_dtype = KT_KV_CACHE_DTYPE_FP8_E4M3, .k_scale = k_scale,
                        .v_scale = v_scale};
    if (kt_paged_attention(d, &p, q, kc, vc, BLOCKS, tables, MAX_BLOCKS, lens, o, NULL) !=
        KT_STATUS_OK) {
        printf("paged fp8: %s\n", kt_last_error());
        return 0;
    }
    double worst = 0.0, want[D];
    size_t keys[CTX];
    for (size_t s = 0; s < SEQS; s++)
        for (size_t h = 0; h < HQ; h++) {
            for (size_t t = 0; t < lens[s]; t++) {
                const size_t row = (size_t)tables[s * MAX_BLOCKS + t / BS] * BS + t % BS;
                keys[t] = (row * HKV + h / (HQ / HKV)) * D;
            }
            attend(&qf[(s * HQ + h) * D], kf, vf, keys, lens[s], -INFINITY, 0.0, 0.0, want);
            for (int x = 0; x < D; x++) worst = fmax(worst, fabs(o[(s * HQ + h) * D + x] - want[x]));
        }
    printf("paged fp8_e4m3: max difference %.1e\n", worst);
    /* A scale that is not positive is refused by name. */
    p.v_scale = -1.0f;
    const int refused = kt_paged_attention(d, &p, q, kc, vc, BLOCKS, tables, MAX_BLOCKS, lens, o,
                                           NULL) == KT_STATUS_INVALID_ARGUMENT;
    printf("error: %s\n", kt_last_error());
    return worst <= 1e-4 && refused;
}

/* One decode step on a latent cache: HQ query heads on one cached row of D values per token,
 * whose first DV are its value; no value cache is passed, and the output rows hold DV. */
static int paged_latent(KtDispatcher *d) {
    enum { DV = 12, SEQS = 2, CTX = 29, MAX_BLOCKS = (CTX + BS - 1) / BS };
    enum { BLOCKS = SEQS * MAX_BLOCKS, CACHE = BLOCKS * BS * D };
    static float q[SEQS * HQ * D], kc[CACHE], o[SEQS * HQ * DV];
    uint32_t tables[SEQS * MAX_BLOCKS], lens[SEQS] = {CTX, 10};
    for (unsigned i = 0; i < SEQS * HQ * D; i++) q[i] = value(3 * i + 1);
    for (unsigned i = 0; i < CACHE; i++) kc[i] = value(17 * i + 5);
    for (unsigned b = 0; b < SEQS * MAX_BLOCKS; b++) tables[b] = BLOCKS - 1 - b;
    KtPagedProblem p = {.num_seqs = SEQS, .context_len = CTX, .q_heads = HQ, .kv_heads = 1,
                        .head_dim = D, .block_size = BS, .dtype = KT_DTYPE_F32,
                        .v_head_dim = DV};
    if (kt_paged_attention(d, &p, q, kc, NULL, BLOCKS, tables, MAX_BLOCKS, lens, o, NULL) !=
        KT_STATUS_OK) {
        printf("paged latent: %s\n", kt_last_error());
        return 0;
    }
    double worst = 0.0, want[D];
    size_t keys[CTX];
    for (size_t s = 0; s < SEQS; s++)
        for (size_t h = 0; h < HQ; h++) {
            for (size_t t = 0; t < lens[s]; t++)
                keys[t] = ((size_t)tables[s * MAX_BLOCKS + t / BS] * BS + t % BS) * D;
            /* The loops take all D values of each row; the first DV are the output. */
            attend(&q[(s * HQ + h) * D], kc, kc, keys, lens[s], -INFINITY, 0.0, 0.0, want);
            for (int x = 0; x < DV; x++) worst = fmax(worst, fabs(o[(s * HQ + h) * DV + x] - want[x]));
        }
    printf("paged latent v_head_dim=%d: max difference %.1e\n", DV, worst);
    /* A value cache beside the latent one would go unread: refused by name. */
    static float other[CACHE];
    const int refused = kt_paged_attention(d, &p, q, kc, other, BLOCKS, tables, MAX_BLOCKS, lens,
                                           o, NULL) == KT_STATUS_INVALID_ARGUMENT;
    printf("error: %s\n", kt_last_error());
    return worst <= 1e-4 && refused;
}

/* One decode step of SEQS sequences of their own lengths on a paged cache. */
static int paged(KtDispatcher *d, size_t window, const float *sinks, float cap,
                 const float *slopes) {
    enum { SEQS = 3, CTX = 50, MAX_BLOCKS = (CTX + BS - 1) / BS, BLOCKS = SEQS * MAX_BLOCKS };
    static float q[SEQS * HQ * D], kc[BLOCKS * BS * HKV * D], vc[BLOCKS * BS * HKV * D], o[SEQS * HQ * D];
    uint32_t tables[SEQS * MAX_BLOCKS], lens[SEQS] = {CTX, 1, 23};
    for (unsigned i = 0; i < SEQS * HQ * D; i++) q[i] = value(3 * i);
    for (unsigned i = 0; i < BLOCKS * BS * HKV * D; i++) kc[i] = value(11 * i + 4), vc[i] = value(13 * i + 9);
    /* Blocks in reverse order, as a server's allocator may hand them out. */
    for (unsigned b = 0; b < SEQS * MAX_BLOCKS; b++) tables[b] = BLOCKS - 1 - b;
    KtPagedProblem p = {.num_seqs = SEQS, .context_len = CTX, .q_heads = HQ, .kv_heads = HKV,
                        .head_dim = D, .block_size = BS, .scale = 0.0f, .dtype = KT_DTYPE_F32,
                        .window = window, .sinks = sinks, .softcap = cap,
                        .alibi_slopes = slopes};
    const char *with = sinks ? " sinks" : cap > 0.0f ? " softcap" : slopes ? " alibi" : "";
    if (kt_paged_attention(d, &p, q, kc, vc, BLOCKS, tables, MAX_BLOCKS, lens, o, NULL) !=
        KT_STATUS_OK) {
        printf("paged window=%zu%s: %s\n", window, with, kt_last_error());
        return 0;
    }
    double worst = 0.0, want[D];
    size_t keys[CTX];
    for (size_t s = 0; s < SEQS; s++)
        for (size_t h = 0; h < HQ; h++) {
            const size_t ctx = lens[s], first = window && ctx > window ? ctx - window : 0;
            for (size_t t = first; t < ctx; t++) {
                const size_t row = (size_t)tables[s * MAX_BLOCKS + t / BS] * BS + t % BS;
                keys[t - first] = (row * HKV + h / (HQ / HKV)) * D;
            }
            attend(&q[(s * HQ + h) * D], kc, vc, keys, ctx - first, sinks ? sinks[h] : -INFINITY,
                   cap, slopes ? slopes[h] : 0.0, want);
            for (int x = 0; x < D; x++) worst = fmax(worst, fabs(o[(s * HQ + h) * D + x] - want[x]));
        }
    printf("paged window=%zu%s: max difference %.1e\n", window, with, worst);
    return worst <= 1e-4;
}

int main(int argc, char **argv) {
    /* A library built from another header would read these structs wrongly: check first. */
    if (kt_abi_version() != KERNTUNE_ABI_VERSION) {
        fprintf(stderr, "libkerntune speaks C ABI %u, this program was built for %u: rebuild it\n",
                kt_abi_version(), KERNTUNE_ABI_VERSION);
        return 2;
    }
    KtDispatcher *d = NULL;
    if (kt_open(argc > 1 ? argv[1] : "kerntune.db", &d) != KT_STATUS_OK) {
        fprintf(stderr, "kt_open: %s\n", kt_last_error());
        return 1;
    }
    /* A cap of 0.3, under most of these scores, so that it bends every one. */
    int ok = flash(d, 0, NULL, 0, NULL) & flash(d, 6, NULL, 0, NULL) & flash(d, 6, SINKS, 0, NULL) &
             flash(d, 0, NULL, 0.3f, NULL) & flash(d, 0, NULL, 0, SLOPES) & flash_narrow(d) &
             paged(d, 0, NULL, 0, NULL) & paged(d, 20, NULL, 0, NULL) & paged(d, 0, SINKS, 0, NULL) &
             paged(d, 20, NULL, 0.3f, NULL) & paged(d, 20, NULL, 0, SLOPES) & paged_fp8(d) &
             paged_latent(d);
    /* A window without the causal mask looks back from nothing: refused by name. */
    KtFlashProblem bad = {.batch = 1, .q_len = 4, .kv_len = 4, .q_heads = 1, .kv_heads = 1,
                          .head_dim = D, .causal = false, .dtype = KT_DTYPE_F32, .window = 2};
    float x[4 * D] = {0}, out[4 * D];
    ok &= kt_flash_attention(d, &bad, x, x, x, out, NULL) == KT_STATUS_INVALID_ARGUMENT;
    printf("error: %s\n", kt_last_error());
    kt_free(d);
    return ok ? 0 : 1;
}
