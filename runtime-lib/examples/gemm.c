/* Opens a tuning database, runs one GEMM through kerntune and prints the result and the
 * dispatch statistics.
 *
 *   cc runtime-lib/examples/gemm.c -I runtime-lib/include -L target/release -lkerntune -o gemm
 *   LD_LIBRARY_PATH=target/release ./gemm kerntune.db
 *
 * A is 3x5 with A[i][p] = i + p, B is stored [N, K] (a Linear layer's weights) with
 * B[j][p] = j - p, so C[i][j] = sum_p (i + p)(j - p). Then it asks for an MI250 through the
 * GPU entry points. */
#include <stdio.h>
#include <stdlib.h>

#include "kerntune.h"

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
