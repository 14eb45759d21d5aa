/* Opens a tuning database, runs one GEMM through kerntune and prints the result and the
 * dispatch statistics.
 *
 *   cc runtime-lib/examples/gemm.c -I runtime-lib/include -L target/release -lkerntune -o gemm
 *   LD_LIBRARY_PATH=target/release ./gemm kerntune.db
 *
 * A is 3x5 with A[i][p] = i + p, B is stored [N, K] (a Linear layer's weights) with
 * B[j][p] = j - p, so C[i][j] = sum_p (i + p)(j - p). The same product in fp8 (W8A8, as an
 * FP8 checkpoint's Linear layers run it): A's and B's values stored as E4M3 bytes divided
 * by per-token and per-channel scales, which kt_gemm_scaled() multiplies back, and as a
 * block-scaled GEMM (kt_gemm_block_scaled(), DeepSeek-V3's FP8 scheme). Then an int4 GEMM
 * (kt_gemm_int4(), a GPTQ checkpoint's weights: 4-bit values packed eight to a word, a scale
 * and a zero point per group of k and column) against the same sum in plain loops, and the
 * same values as an AWQ checkpoint packs them, converted by kt_int4_words() and
 * kt_int4_zeros(). Then it asks for an MI250 through the GPU entry points. */
#include <stdio.h>
#include <stdlib.h>

#include "kerntune.h"

/* The E4M3 byte of v, a whole number of at most four significant bits (which E4M3 holds
 * exactly): sign, exponent biased by 7, three mantissa bits. */
static unsigned char e4m3(int v) {
    unsigned char sign = v < 0 ? 0x80 : 0;
    unsigned a = (unsigned)(v < 0 ? -v : v), e = 0;
    if (a == 0) return sign;
    while ((a >> e) > 1) e++;
    unsigned mantissa = e >= 3 ? (a >> (e - 3)) & 7 : (a << (3 - e)) & 7;
    return (unsigned char)(sign | ((e + 7) << 3) | mantissa);
}

int main(int argc, char **argv) {
    const char *db = argc > 1 ? argv[1] : "kerntune.db";
    /* A program built against another version of the header reads the library's structs
     * wrongly: check before the first call. */
    if (kt_abi_version() != KERNTUNE_ABI_VERSION) {
        fprintf(stderr, "libkerntune speaks C ABI %u, this program was built for %u: rebuild it\n",
                kt_abi_version(), KERNTUNE_ABI_VERSION);
        return 2;
    }
    enum { M = 3, N = 4, K = 5 };
    float a[M * K], b[N * K], c[M * N];
    for (int i = 0; i < M; i++)
        for (int p = 0; p < K; p++) a[i * K + p] = (float)(i + p);
    for (int j = 0; j < N; j++)
        for (int p = 0; p < K; p++) b[j * K + p] = (float)(j - p);

    KtDispatcher *d = NULL;
    if (kt_open(db, &d) != KT_STATUS_OK) {
        fprintf(stderr, "kt_open: %s\n", kt_last_error());
        return 1;
    }
    const char *note = kt_note(d);
    if (note[0] != '\0') fprintf(stderr, "note: %s\n", note);

    KtMatch how;
    if (kt_gemm(d, M, N, K, KT_DTYPE_F32, true, a, b, c, &how) != KT_STATUS_OK) {
        fprintf(stderr, "kt_gemm: %s\n", kt_last_error());
        kt_free(d);
        return 1;
    }
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) printf("%s%g", j ? " " : "", c[i * N + j]);
        printf("\n");
    }
    /* A bad call reports an error instead of crashing. */
    if (kt_gemm(d, 0, N, K, KT_DTYPE_F32, true, a, b, c, NULL) != KT_STATUS_INVALID_ARGUMENT) return 1;
    printf("error: %s\n", kt_last_error());

    /* fp8: A's row i stored as (i + p) / a_scales[i] with a_scales[i] = 2^-i, B's row j as
     * (j - p) / b_scales[j] with b_scales[j] = 1 / 2: whole numbers E4M3 holds, and scales
     * of powers of two, so C is exactly the f32 product's. */
    unsigned char a8[M * K], b8[N * K];
    float a_scales[M], b_scales[N], c8[M * N];
    for (int i = 0; i < M; i++) {
        a_scales[i] = 1.0f / (float)(1 << i);
        for (int p = 0; p < K; p++) a8[i * K + p] = e4m3((i + p) << i);
    }
    for (int j = 0; j < N; j++) {
        b_scales[j] = 0.5f;
        for (int p = 0; p < K; p++) b8[j * K + p] = e4m3((j - p) * 2);
    }
    if (kt_gemm_scaled(d, M, N, K, KT_DTYPE_FP8_E4M3, true, a8, a_scales, M, b8, b_scales, N, c8,
                       NULL) != KT_STATUS_OK) {
        fprintf(stderr, "kt_gemm_scaled: %s\n", kt_last_error());
        kt_free(d);
        return 1;
    }
    for (int i = 0; i < M * N; i++)
        if (c8[i] != c[i]) {
            fprintf(stderr, "fp8 C[%d] = %g, not %g\n", i, c8[i], c[i]);
            kt_free(d);
            return 1;
        }
    printf("fp8: matches\n");
    /* An fp8 GEMM without its scales, or with a count that is neither 1 nor M, is refused. */
    if (kt_gemm(d, M, N, K, KT_DTYPE_FP8_E4M3, true, a8, b8, c8, NULL) !=
        KT_STATUS_INVALID_ARGUMENT)
        return 1;
    printf("error: %s\n", kt_last_error());
    if (kt_gemm_scaled(d, M, N, K, KT_DTYPE_FP8_E4M3, true, a8, a_scales, 2, b8, b_scales, N, c8,
                       NULL) != KT_STATUS_INVALID_ARGUMENT)
        return 1;
    printf("error: %s\n", kt_last_error());
    /* The same bytes block-scaled, in blocks of 32: K = 5 is one group of k and N = 4 one
     * block of weights, so A's scales are its M per-token ones and B's the one 1 / 2. */
    float b_block[1] = {0.5f};
    if (kt_gemm_block_scaled(d, M, N, K, KT_DTYPE_FP8_E4M3, 32, a8, a_scales, M, b8, b_block, 1,
                             c8, NULL) != KT_STATUS_OK) {
        fprintf(stderr, "kt_gemm_block_scaled: %s\n", kt_last_error());
        kt_free(d);
        return 1;
    }
    for (int i = 0; i < M * N; i++)
        if (c8[i] != c[i]) {
            fprintf(stderr, "block-scaled fp8 C[%d] = %g, not %g\n", i, c8[i], c[i]);
            kt_free(d);
            return 1;
        }
    printf("fp8 blocks: matches\n");
    /* One scale per output channel is not a block's. */
    if (kt_gemm_block_scaled(d, M, N, K, KT_DTYPE_FP8_E4M3, 32, a8, a_scales, M, b8, b_scales, N,
                             c8, NULL) != KT_STATUS_INVALID_ARGUMENT)
        return 1;
    printf("error: %s\n", kt_last_error());

    /* int4: A 3x16 (A[i][p] = i - p), values q[p][j] = (3p + j) % 16 packed as GPTQ packs
     * them (word (p / 8, j), bits 4 (p % 8) up), groups of 8: scales of 1/2 and 1/4, zero
     * points 7 and 9, so every product is exact in float. */
    enum { QK = 16, GROUP = 8 };
    float a4[M * QK], scales4[(QK / GROUP) * N], zeros4[(QK / GROUP) * N], c4[M * N], want[M * N];
    unsigned words[(QK / 8) * N] = {0};
    for (int i = 0; i < M; i++)
        for (int p = 0; p < QK; p++) a4[i * QK + p] = (float)(i - p);
    for (int p = 0; p < QK; p++)
        for (int j = 0; j < N; j++) words[(p / 8) * N + j] |= (unsigned)((3 * p + j) % 16) << (4 * (p % 8));
    for (int g = 0; g < QK / GROUP; g++)
        for (int j = 0; j < N; j++) {
            scales4[g * N + j] = g == 0 ? 0.5f : 0.25f;
            zeros4[g * N + j] = g == 0 ? 7.0f : 9.0f;
        }
    for (int sym = 0; sym < 2; sym++) {
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float sum = 0;
                for (int p = 0; p < QK; p++) {
                    float zero = sym ? 8.0f : zeros4[(p / GROUP) * N + j];
                    float q = (float)((3 * p + j) % 16);
                    sum += a4[i * QK + p] * scales4[(p / GROUP) * N + j] * (q - zero);
                }
                want[i * N + j] = sum;
            }
        /* Symmetric checkpoints pass no zero points: 8 throughout. */
        if (kt_gemm_int4(d, M, N, QK, KT_DTYPE_F32, GROUP, a4, words, scales4, (QK / GROUP) * N,
                         sym ? NULL : zeros4, sym ? 0 : (QK / GROUP) * N, c4, NULL) != KT_STATUS_OK) {
            fprintf(stderr, "kt_gemm_int4: %s\n", kt_last_error());
            kt_free(d);
            return 1;
        }
        for (int i = 0; i < M * N; i++)
            if (c4[i] != want[i]) {
                fprintf(stderr, "int4 C[%d] = %g, not %g\n", i, c4[i], want[i]);
                kt_free(d);
                return 1;
            }
    }
    printf("int4: matches\n");
    /* One scale per column is not one per group and column. */
    if (kt_gemm_int4(d, M, N, QK, KT_DTYPE_F32, GROUP, a4, words, scales4, N, NULL, 0, c4, NULL) !=
        KT_STATUS_INVALID_ARGUMENT)
        return 1;
    printf("error: %s\n", kt_last_error());
    /* The same values as an AWQ checkpoint holds them, eight columns (n = 8) a word in the
     * order 0, 2, 4, 6, 1, 3, 5, 7: qweight [k, n / 8], qzeros [k / group, n / 8] with zero
     * points (5g + 3j) % 16, made the words and zero points kt_gemm_int4() takes once, as a
     * server loads the model. */
    enum { AN = 8 };
    static const int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    unsigned qweight[QK * (AN / 8)] = {0}, qzeros[(QK / GROUP) * (AN / 8)] = {0};
    unsigned awq_words[(QK / 8) * AN];
    float awq_zeros[(QK / GROUP) * AN], awq_scales[(QK / GROUP) * AN], c_awq[M * AN];
    for (int p = 0; p < QK; p++)
        for (int i = 0; i < 8; i++) qweight[p] |= (unsigned)((3 * p + awq_order[i]) % 16) << (4 * i);
    for (int g = 0; g < QK / GROUP; g++) {
        for (int i = 0; i < 8; i++) qzeros[g] |= (unsigned)((5 * g + 3 * awq_order[i]) % 16) << (4 * i);
        for (int j = 0; j < AN; j++) awq_scales[g * AN + j] = g == 0 ? 0.5f : 0.25f;
    }
    if (kt_int4_words(KT_INT4_FORMAT_AWQ, qweight, QK * (AN / 8), QK, AN, awq_words,
                      (QK / 8) * AN) != KT_STATUS_OK ||
        kt_int4_zeros(KT_INT4_FORMAT_AWQ, qzeros, (QK / GROUP) * (AN / 8), QK / GROUP, AN,
                      awq_zeros, (QK / GROUP) * AN) != KT_STATUS_OK ||
        kt_gemm_int4(d, M, AN, QK, KT_DTYPE_F32, GROUP, a4, awq_words, awq_scales,
                     (QK / GROUP) * AN, awq_zeros, (QK / GROUP) * AN, c_awq, NULL) != KT_STATUS_OK) {
        fprintf(stderr, "awq: %s\n", kt_last_error());
        kt_free(d);
        return 1;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < AN; j++) {
            float sum = 0;
            for (int p = 0; p < QK; p++)
                sum += a4[i * QK + p] * (p < GROUP ? 0.5f : 0.25f) *
                       (float)((3 * p + j) % 16 - (5 * (p / GROUP) + 3 * j) % 16);
            if (c_awq[i * AN + j] != sum) {
                fprintf(stderr, "awq C[%d][%d] = %g, not %g\n", i, j, c_awq[i * AN + j], sum);
                kt_free(d);
                return 1;
            }
        }
    printf("int4 awq: matches\n");

    KtStats s;
    kt_stats(d, &s);
    printf("match=%d exact=%llu bucket=%llu nearest=%llu defaults=%llu loaded=%llu\n", (int)how,
           (unsigned long long)s.exact, (unsigned long long)s.bucket,
           (unsigned long long)s.nearest, (unsigned long long)s.defaults,
           (unsigned long long)s.loaded);
    kt_free(d);
    kt_free(NULL);

    /* The same database serves GPUs through kt_gpu_open(); without the device (or a library
     * built without its vendor's backend) it says which is missing. */
    KtGpuDispatcher *g = NULL;
    KtStatus st = kt_gpu_open(db, "mi250", &g);
    if (st == KT_STATUS_OK) {
        printf("gpu: opened\n");
        kt_gpu_free(g);
    } else {
        printf("gpu: status=%d %s\n", (int)st, kt_last_error());
    }
    return 0;
}
