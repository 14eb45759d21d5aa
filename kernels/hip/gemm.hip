// kerntune GEMM: C[M,N] (f32) = A[M,K] · B, B either [K,N] row-major (KT_B_NK = 0) or [N,K]
// as a Linear layer stores its weights (KT_B_NK = 1). Inputs f32, f16 or bf16 (KT_DTYPE),
// accumulation f32. Grid: (ceil(N / BN), ceil(M / BM)), one block per BM×BN tile of C.
//
// KT_VARIANT 0, tiled: each thread owns a TM×TN register tile; A and B tiles of depth BK are
//   staged in LDS as f32 (widened once on load), A transposed so a thread's TM values of one
//   k are contiguous. Threads = (BM / TM) · (BN / TN).
// KT_VARIANT 1, MFMA (CDNA2/3, f16 and bf16): each wave owns TM×TN tiles of 32×32 computed
//   by v_mfma_f32_32x32x8; A and B tiles stay 16-bit in LDS, k contiguous, so each lane reads
//   its four k values in one 8-byte load. Threads = 64 · (BM / (32·TM)) · (BN / (32·TN)).
// KT_VARIANT 2, mma (NVIDIA sm_80+, f16 and bf16): each warp owns TM×TN tiles of 16×8
//   computed by mma.sync.aligned.m16n8k16 (f32 accumulation); A and B tiles stay 16-bit in
//   shared memory, k contiguous, so each fragment register is one 4-byte load. Threads =
//   32 · (BM / (16·TM)) · (BN / (8·TN)).
#include "prelude.h"

#ifndef KT_BM
#error "KT_BM, KT_BN, KT_BK, KT_TM, KT_TN, KT_VARIANT and KT_B_NK must be defined"
#endif

#if KT_VARIANT == 0

#define KT_THREADS ((KT_BM / KT_TM) * (KT_BN / KT_TN))
// One float of padding keeps the column walks of the staging loops off a single LDS bank.
#define KT_PAD 1

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_gemm(const kt_in* __restrict__ a, const kt_in* __restrict__ b, float* __restrict__ c,
        int m, int n, int k) {
    KT_SHARED float as[KT_BK][KT_BM + KT_PAD];
    KT_SHARED float bs[KT_BK][KT_BN + KT_PAD];
    const int tid = KT_TID;
    const int tx = tid % (KT_BN / KT_TN);
    const int ty = tid / (KT_BN / KT_TN);
    const int row0 = KT_BID_Y * KT_BM;
    const int col0 = KT_BID_X * KT_BN;
    float acc[KT_TM][KT_TN];
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < k; k0 += KT_BK) {
        // Consecutive threads read consecutive k of one row of A: coalesced.
        for (int i = tid; i < KT_BM * KT_BK; i += KT_THREADS) {
            const int r = i / KT_BK, kk = i % KT_BK;
            const int gr = row0 + r, gk = k0 + kk;
            as[kk][r] = (gr < m && gk < k) ? kt_load(a, (long)gr * k + gk) : 0.0f;
        }
        for (int i = tid; i < KT_BN * KT_BK; i += KT_THREADS) {
#if KT_B_NK
            const int col = i / KT_BK, kk = i % KT_BK;
            const int gc = col0 + col, gk = k0 + kk;
            bs[kk][col] = (gc < n && gk < k) ? kt_load(b, (long)gc * k + gk) : 0.0f;
#else
            const int kk = i / KT_BN, col = i % KT_BN;
            const int gc = col0 + col, gk = k0 + kk;
            bs[kk][col] = (gc < n && gk < k) ? kt_load(b, (long)gk * n + gc) : 0.0f;
#endif
        }
        KT_SYNC();
#pragma unroll 4
        for (int kk = 0; kk < KT_BK; ++kk) {
            float av[KT_TM], bv[KT_TN];
#pragma unroll
            for (int i = 0; i < KT_TM; ++i) av[i] = as[kk][ty * KT_TM + i];
#pragma unroll
            for (int j = 0; j < KT_TN; ++j) bv[j] = bs[kk][tx * KT_TN + j];
#pragma unroll
            for (int i = 0; i < KT_TM; ++i)
#pragma unroll
                for (int j = 0; j < KT_TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        KT_SYNC();
    }
#pragma unroll
    for (int i = 0; i < KT_TM; ++i) {
        const int gr = row0 + ty * KT_TM + i;
        if (gr >= m) continue;
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) {
            const int gc = col0 + tx * KT_TN + j;
            if (gc < n) c[(long)gr * n + gc] = acc[i][j];
        }
    }
}

#elif KT_VARIANT == 1

#if !defined(KT_MFMA)
#error "the MFMA variant needs gfx90a or gfx94x (or the host emulator of one)"
#endif
#if KT_DTYPE == 0
#error "the MFMA variant takes f16 or bf16 inputs"
#endif

#define KT_WAVES_M (KT_BM / (32 * KT_TM))
#define KT_WAVES_N (KT_BN / (32 * KT_TN))
#define KT_THREADS (64 * KT_WAVES_M * KT_WAVES_N)

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_gemm(const kt_in* __restrict__ a, const kt_in* __restrict__ b, float* __restrict__ c,
        int m, int n, int k) {
    // k contiguous for both operands; 4 halves of padding keep 8-byte reads aligned and
    // spread the 32 rows of a fragment over the banks.
    KT_SHARED unsigned short as[KT_BM][KT_BK + 4];
    KT_SHARED unsigned short bs[KT_BN][KT_BK + 4];
    const int tid = KT_TID;
    const int lane = tid % 64;
    const int wave = tid / 64;
    const int wm = (wave / KT_WAVES_N) * 32 * KT_TM;
    const int wn = (wave % KT_WAVES_N) * 32 * KT_TN;
    const int row0 = KT_BID_Y * KT_BM;
    const int col0 = KT_BID_X * KT_BN;
    kt_f32x16 acc[KT_TM][KT_TN];
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j)
#pragma unroll
            for (int e = 0; e < 16; ++e) acc[i][j][e] = 0.0f;

    for (int k0 = 0; k0 < k; k0 += KT_BK) {
        for (int i = tid; i < KT_BM * KT_BK; i += KT_THREADS) {
            const int r = i / KT_BK, kk = i % KT_BK;
            const int gr = row0 + r, gk = k0 + kk;
            as[r][kk] = (gr < m && gk < k) ? a[(long)gr * k + gk] : (unsigned short)0;
        }
        for (int i = tid; i < KT_BN * KT_BK; i += KT_THREADS) {
#if KT_B_NK
            const int col = i / KT_BK, kk = i % KT_BK;
            const int gc = col0 + col, gk = k0 + kk;
            bs[col][kk] = (gc < n && gk < k) ? b[(long)gc * k + gk] : (unsigned short)0;
#else
            const int kk = i / KT_BN, col = i % KT_BN;
            const int gc = col0 + col, gk = k0 + kk;
            bs[col][kk] = (gc < n && gk < k) ? b[(long)gk * n + gc] : (unsigned short)0;
#endif
        }
        KT_SYNC();
        // Lane l holds row (or column) l % 32 and k values 4·(l / 32) .. +4 of each 32×8 step.
#pragma unroll
        for (int kk = 0; kk < KT_BK; kk += 8) {
            const int kl = kk + 4 * (lane / 32);
            kt_frag af[KT_TM], bf[KT_TN];
#pragma unroll
            for (int i = 0; i < KT_TM; ++i) af[i] = kt_frag_at(&as[wm + 32 * i + lane % 32][kl]);
#pragma unroll
            for (int j = 0; j < KT_TN; ++j) bf[j] = kt_frag_at(&bs[wn + 32 * j + lane % 32][kl]);
#pragma unroll
            for (int i = 0; i < KT_TM; ++i)
#pragma unroll
                for (int j = 0; j < KT_TN; ++j) acc[i][j] = kt_mfma(af[i], bf[j], acc[i][j]);
        }
        KT_SYNC();
    }
    // Accumulator element e of lane l: row 8·(e / 4) + 4·(l / 32) + e % 4, column l % 32.
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j)
#pragma unroll
            for (int e = 0; e < 16; ++e) {
                const int gr = row0 + wm + 32 * i + 8 * (e / 4) + 4 * (lane / 32) + e % 4;
                const int gc = col0 + wn + 32 * j + lane % 32;
                if (gr < m && gc < n) c[(long)gr * n + gc] = acc[i][j][e];
            }
}

#elif KT_VARIANT == 2

#if !defined(KT_MMA)
#error "the mma variant needs NVIDIA sm_80+ (or the host emulator of one)"
#endif
#if KT_DTYPE == 0
#error "the mma variant takes f16 or bf16 inputs"
#endif

#define KT_WARPS_M (KT_BM / (16 * KT_TM))
#define KT_WARPS_N (KT_BN / (8 * KT_TN))
#define KT_THREADS (32 * KT_WARPS_M * KT_WARPS_N)
// 8 halves of padding: rows of a fragment (stride BK + 8 halves) land on distinct banks.
#define KT_LDK (KT_BK + 8)

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_gemm(const kt_in* __restrict__ a, const kt_in* __restrict__ b, float* __restrict__ c,
        int m, int n, int k) {
    KT_SHARED __attribute__((aligned(16))) unsigned short as[KT_BM][KT_LDK];
    KT_SHARED __attribute__((aligned(16))) unsigned short bs[KT_BN][KT_LDK];
    const int tid = KT_TID;
    const int lane = tid % 32;
    const int warp = tid / 32;
    // The PTX fragment layout: lane = 4·group + thread-in-group.
    const int g = lane / 4, t = lane % 4;
    const int wm = (warp / KT_WARPS_N) * 16 * KT_TM;
    const int wn = (warp % KT_WARPS_N) * 8 * KT_TN;
    const int row0 = KT_BID_Y * KT_BM;
    const int col0 = KT_BID_X * KT_BN;
    float acc[KT_TM][KT_TN][4];
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    for (int k0 = 0; k0 < k; k0 += KT_BK) {
        for (int i = tid; i < KT_BM * KT_BK; i += KT_THREADS) {
            const int r = i / KT_BK, kk = i % KT_BK;
            const int gr = row0 + r, gk = k0 + kk;
            as[r][kk] = (gr < m && gk < k) ? a[(long)gr * k + gk] : (unsigned short)0;
        }
        for (int i = tid; i < KT_BN * KT_BK; i += KT_THREADS) {
#if KT_B_NK
            const int col = i / KT_BK, kk = i % KT_BK;
            const int gc = col0 + col, gk = k0 + kk;
            bs[col][kk] = (gc < n && gk < k) ? b[(long)gc * k + gk] : (unsigned short)0;
#else
            const int kk = i / KT_BN, col = i % KT_BN;
            const int gc = col0 + col, gk = k0 + kk;
            bs[col][kk] = (gc < n && gk < k) ? b[(long)gk * n + gc] : (unsigned short)0;
#endif
        }
        KT_SYNC();
#pragma unroll
        for (int kk = 0; kk < KT_BK; kk += 16) {
            // A (row-major 16×16): rows g and g + 8, k pairs 2t and 2t + 8.
            // B (column-major 16×8): column g, k pairs 2t and 2t + 8.
            unsigned af[KT_TM][4], bf[KT_TN][2];
#pragma unroll
            for (int i = 0; i < KT_TM; ++i) {
                const unsigned short* r = &as[wm + 16 * i + g][kk + 2 * t];
                af[i][0] = kt_pair(r);
                af[i][1] = kt_pair(r + 8 * KT_LDK);
                af[i][2] = kt_pair(r + 8);
                af[i][3] = kt_pair(r + 8 * KT_LDK + 8);
            }
#pragma unroll
            for (int j = 0; j < KT_TN; ++j) {
                const unsigned short* col = &bs[wn + 8 * j + g][kk + 2 * t];
                bf[j][0] = kt_pair(col);
                bf[j][1] = kt_pair(col + 8);
            }
#pragma unroll
            for (int i = 0; i < KT_TM; ++i)
#pragma unroll
                for (int j = 0; j < KT_TN; ++j) kt_mma(acc[i][j], af[i], bf[j]);
        }
        KT_SYNC();
    }
    // Accumulator e of lane (g, t): row g + 8·(e / 2), column 2t + e % 2.
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int gr = row0 + wm + 16 * i + g + 8 * (e / 2);
                const int gc = col0 + wn + 8 * j + 2 * t + e % 2;
                if (gr < m && gc < n) c[(long)gr * n + gc] = acc[i][j][e];
            }
}

#else
#error "KT_VARIANT must be 0 (tiled), 1 (MFMA) or 2 (mma)"
#endif
