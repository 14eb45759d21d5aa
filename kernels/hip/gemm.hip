// kerntune GEMM: C[M,N] (f32) = A[M,K] · B, B either [K,N] row-major (KT_B_NK = 0) or [N,K]
// as a Linear layer stores its weights (KT_B_NK = 1). Inputs f32, f16 or bf16 (KT_DTYPE),
// accumulation f32. Grid: (ceil(N / BN), ceil(M / BM)), one block per BM×BN tile of C.
//
// fp8 inputs (KT_DTYPE 3 and 4, W8A8: every variant) take five more arguments after the
// sizes, and C is stored scaled
// (KT_SCALED): element (i, j) times factor · a_scales[i · a_step] · b_scales[j · b_step],
// each step 0 (one scale for the tensor) or 1 (one for each row of A, column of C), `factor`
// the square of the readings' (prelude). The one-stage matrix-core variants stage the bytes'
// f16 readings in shared memory and multiply them as f16; the pipelined mma and wgmma tiles
// copy the bytes as they lie and multiply them by mma.sync m16n8k32 (sm_89 and later, OCP
// E4M3 or E5M2) or wgmma m64nNk32 (sm_90a), whose products are the values themselves (no
// factor), as the pipelined MFMA tiles' v_mfma_f32_32x32x16_fp8_fp8 on CDNA3 (E4M3 FNUZ).
//
// KT_VARIANT 0, tiled: each thread owns a TM×TN register tile; A and B tiles of depth BK are
//   staged in LDS as f32 (widened once on load), A transposed so a thread's TM values of one
//   k are contiguous. Threads = (BM / TM) · (BN / TN).
// KT_VARIANT 1, MFMA (CDNA2/3, f16 and bf16): each wave owns TM×TN tiles of 32×32 computed
//   by v_mfma_f32_32x32x8; A and B tiles stay 16-bit in LDS, k contiguous, so each lane reads
//   its four k values in one 8-byte load. Threads = 64 · (BM / (32·TM)) · (BN / (32·TN)).
//   KT_STAGES 1: element loads of any size. KT_STAGES 2 (B [N,K], k % 8 == 0): 16-byte loads
//   (global_load_dwordx4) of the next k tile into registers while this one is multiplied
//   from LDS, written to the other of two LDS tiles after it: one barrier a k tile.
// KT_VARIANT 2, mma (NVIDIA sm_80+, f16 and bf16): each warp owns TM×TN tiles of 16×8
//   computed by mma.sync.aligned.m16n8k16 (f32 accumulation); A and B tiles stay 16-bit in
//   shared memory. Threads = 32 · (BM / (16·TM)) · (BN / (8·TN)). KT_STAGES 1: plain loads,
//   k contiguous, each fragment register one 4-byte load. KT_STAGES 2 to 4: that many tiles
//   in flight, copied by 16-byte cp.async (rows of 8 elements: k % 8 == 0, and n % 8 == 0
//   for a [K,N] B, which the space checks) and read by ldmatrix.
// KT_VARIANT 3, wgmma (NVIDIA sm_90a, f16, bf16 and OCP fp8, B [N,K]): each warpgroup of 4
//   warps owns TM tiles of 64×TN computed by wgmma.mma_async.m64nNk16 (N = TN; fp8:
//   m64nNk32, on tiles of bytes laid out as 16-bit ones of half the depth) straight from shared
//   memory, stored there as 8×8 core matrices or (KT_SWIZZLE 32, 64 or 128) as rows of that
//   many bytes, swizzled as the descriptors' mode of that width reads them. Of KT_STAGES (3 or 4) k tiles in shared memory,
//   one is being multiplied, the products of the one before may still be in flight, and the
//   rest are arriving by 16-byte cp.async. Threads = 128 · (BM / (64·TM)) · (BN / TN).
// KT_VARIANT 4, skinny (every vendor and dtype, B [N,K], decode: a few rows of A): no shared
//   memory; each group of 32 lanes owns TN weight rows (columns of C) and all BM rows of A,
//   every lane a 16-byte piece of each row per step, KT_BK / (32·16 bytes) steps of weight
//   loads issued before their products; the group's partial sums meet by shuffles. The
//   weights are read once, in place, fully coalesced, as the GEMV kernels of vendors' BLAS
//   and serving stacks do for decode. Threads = 32 · (BN / TN).
//
// Block-scaled fp8 (KT_BLOCK > 0: DeepSeek-V3's and Qwen3's FP8 checkpoints, B [N, K]): one
// scale for each row of A and group of KT_BLOCK of k (a_scales [M, groups], a_step = groups)
// and one for each KT_BLOCK × KT_BLOCK block of B (b_scales [ceil(N / KT_BLOCK), groups],
// b_step = groups), which enter as k is read, not once on C: the tiled variant folds both into
// the values it stages (as the CPU's stream kernel folds them into its rows), the skinny
// variant scales each 16-byte piece's products (a piece lies in one group: KT_BLOCK is a
// multiple of 32), and the mma, MFMA and (not warp-specialized) wgmma tiles (each k tile
// inside one group: KT_BK divides KT_BLOCK) accumulate a group's products apart and add them
// to the sums times the group's scales once its last k tile is multiplied (DeepGEMM's
// promotion; wgmma waits for the group's products first). C is then stored times the
// readings' factor only (none for the tiles that multiply the bytes themselves).
//
// Int4 weights (KT_INT4 = the group, W4A16: GPTQ's, AWQ's and compressed-tensors' 4-bit
// checkpoints; f32, f16 or bf16 A): B is GPTQ's `qweight`, [K/8, N] words, value i of word
// (r, j) being q[8r + i, j] in bits 4i..4i+3, with f32 scales and zero points [K/group, N]
// (b_zeros NULL: 8 throughout), weight (q - z)·s. The tiled, one-stage mma and one-stage
// MFMA variants unpack a word a thread as they stage B's k tile (f32, or rounded to A's
// 16-bit type for the matrix cores, as the CPU's dequantizing pass rounds them); the skinny
// variant reads the words in place for decode: each group of 32 lanes owns KT_TN columns and
// every lane a word row of them a step, TN consecutive words, each group of k's products
// summed apart and scaled once, s·(Σ a·q − z·Σ a).
//
// Split-K (KT_SPLIT > 1, every variant): block z of the grid takes the z-th of KT_SPLIT runs
// of whole k tiles and writes its partial C to slice z of `c`, a workspace of KT_SPLIT·M·N
// floats; kt_gemm_reduce then adds the slices into C in order z = 0, 1, ..., so results do not
// depend on scheduling.
#include "prelude.h"

#ifndef KT_BM
#error "KT_BM, KT_BN, KT_BK, KT_TM, KT_TN, KT_VARIANT and KT_B_NK must be defined"
#endif
#ifndef KT_SPLIT
#define KT_SPLIT 1
#endif
#ifndef KT_STAGES
#define KT_STAGES 1
#endif
#ifndef KT_SWIZZLE
#define KT_SWIZZLE 0
#endif
#if KT_STAGES != 1 && KT_VARIANT == 0
#error "the tiled variant does not pipeline its k tiles: KT_STAGES must be 1"
#endif
#if KT_FP8_IN && KT_STAGES != 1 && !KT_B_NK
#error "pipelined fp8 tiles read B as [N, K]"
#endif
#ifndef KT_BLOCK
#define KT_BLOCK 0
#endif
#if KT_BLOCK && !(KT_FP8_IN && KT_B_NK)
#error "block-scaled fp8 (KT_BLOCK) takes fp8 inputs and B as [N, K]"
#endif
#if KT_BLOCK && KT_VARIANT != 0 && KT_VARIANT != 4 && KT_BLOCK % KT_BK != 0
#error "the matrix-core tiles promote whole k tiles: KT_BK must divide KT_BLOCK"
#endif
#if KT_BLOCK && KT_VARIANT == 3 && defined(KT_SPECIALIZED) && KT_SPECIALIZED
#error "the warp-specialized wgmma tiles take no blocks: their products run across k tiles"
#endif

#ifndef KT_INT4
#define KT_INT4 0
#endif
#if KT_INT4
#if KT_FP8_IN || KT_B_NK || KT_BLOCK
#error "int4 weights (KT_INT4) take f32, f16 or bf16 A and GPTQ's [K/8, N] words as B"
#endif
#if KT_STAGES != 1 || KT_VARIANT == 3 || KT_INT4 % 8 != 0
#error "int4 weights: one stage of the tiled, mma, MFMA or skinny variant; a group of whole words"
#endif
#if KT_VARIANT != 4 && KT_BK % 8 != 0
#error "int4 weights are staged a word (8 values of k) at a time: KT_BK must be a multiple of 8"
#endif
typedef unsigned kt_b;
#else
typedef kt_in kt_b;
#endif

#if KT_FP8_IN
#define KT_SCALE_PARAMS                                                                      \
    , const float* __restrict__ a_scales, int a_step, const float* __restrict__ b_scales,    \
        int b_step, float factor
// The same passed on to a function of the kernel's.
#define KT_SCALE_ARGS , a_scales, a_step, b_scales, b_step, factor
#if KT_BLOCK
// The scales of row `row` of A and of weight row (column of C) `col` for group `g` of k: the
// blocks' scales are in the sums, C takes the readings' factor only.
#define KT_A_GROUP_SCALE(row, g) (a_scales[(long)(row) * a_step + (g)])
#define KT_B_GROUP_SCALE(col, g) (b_scales[(long)((col) / KT_BLOCK) * b_step + (g)])
#if KT_STAGES > 1
#define KT_ROW_SCALE(row) 1.0f
#else
#define KT_ROW_SCALE(row) factor
#endif
#elif KT_STAGES > 1
// The pipelined mma, wgmma and MFMA tiles multiply the bytes' values themselves: no readings'
// factor.
#define KT_ROW_SCALE(row) (a_scales[(row) * a_step])
#else
#define KT_ROW_SCALE(row) (factor * a_scales[(row) * a_step])
#endif
#if KT_BLOCK
#define KT_COL_SCALE(col) 1.0f
#else
#define KT_COL_SCALE(col) (b_scales[(col) * b_step])
#endif
// A row's or column's scale where it lies inside the matrix (`end` rows or columns), else 0
// (nothing is stored there): behind its test, the compiler keeps each load to its stores
// instead of fetching a whole tile's column scales at once (a wgmma 128x256 tile: 255
// registers a thread against 192).
#define KT_ROW_SCALE_IN(row, end) ((row) < (end) ? KT_ROW_SCALE(row) : 0.0f)
#define KT_COL_SCALE_IN(col, end) ((col) < (end) ? KT_COL_SCALE(col) : 0.0f)
#else
#if KT_INT4
// The groups' scales and zero points, [K/group, N] each (zero points NULL: 8); they enter as
// B is unpacked, so C is stored as summed.
#define KT_SCALE_PARAMS , const float* __restrict__ b_scales, const float* __restrict__ b_zeros
#define KT_SCALE_ARGS , b_scales, b_zeros
#else
#define KT_SCALE_PARAMS
#define KT_SCALE_ARGS
#endif
#define KT_ROW_SCALE(row) 1.0f
#define KT_COL_SCALE(col) 1.0f
#define KT_ROW_SCALE_IN(row, end) 1.0f
#define KT_COL_SCALE_IN(col, end) 1.0f
#endif
#define KT_SCALED(v, row, col) ((v) * (KT_ROW_SCALE(row) * KT_COL_SCALE(col)))

// The k range [*begin, *end) of this block's split, in whole k tiles.
KT_DEVICE void kt_split_range(int k, int* begin, int* end) {
    const int tiles = (k + KT_BK - 1) / KT_BK;
    const int per = (tiles + KT_SPLIT - 1) / KT_SPLIT;
    *begin = KT_BID_Z * per * KT_BK;
    *end = min(k, *begin + per * KT_BK);
}

#if KT_INT4
// Weight row k's group's scale and zero point of column `col`, as (q − z)·s takes them.
#define KT_INT4_AT(k, col) ((long)((k) / KT_INT4) * n + (col))
#define KT_INT4_ZERO(at) (b_zeros ? b_zeros[at] : 8.0f)
// Value `e` of a word as a float: the bits or'ed into the mantissa of 2^23, minus 2^23 (exact),
// where an int-to-float conversion runs at a quarter of the rate on NVIDIA.
KT_DEVICE float kt_nibble(unsigned w, int e) {
    return KT_BITS_F32(0x4b000000u | ((w >> (4 * e)) & 15u)) - 8388608.0f;
}

// B's k tile at k0 (KT_BK deep, KT_BN wide from col0), unpacked: `threads` threads a word
// each, consecutive ones on consecutive columns (one coalesced row of words), every value
// handed to `store(col, kk, weight)`; zeros past n or the split's end `ke` (a multiple of 8,
// so a word is wholly in or out).
template <class Store>
KT_DEVICE void kt_int4_stage(const unsigned* __restrict__ b, const float* __restrict__ b_scales,
                             const float* __restrict__ b_zeros, int n, int k0, int ke, int col0,
                             int tid, int threads, Store store) {
    for (int i = tid; i < (KT_BK / 8) * KT_BN; i += threads) {
        const int w = i / KT_BN, col = i % KT_BN;
        const int gc = col0 + col, gk = k0 + 8 * w;
        const bool in = gc < n && gk < ke;
        const unsigned word = in ? b[(long)(gk / 8) * n + gc] : 0u;
        const long at = KT_INT4_AT(gk, min(gc, n - 1));
        const float s = in ? b_scales[at] : 0.0f;
        const float z = in ? KT_INT4_ZERO(at) : 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) store(col, 8 * w + e, (kt_nibble(word, e) - z) * s);
    }
}

#if KT_DTYPE != 0
// A weight rounded to A's 16-bit type (to nearest even) for the matrix cores: bf16 in integer
// arithmetic on every vendor (the weights are finite), f16 by the vendor's conversion.
KT_DEVICE unsigned short kt_narrow(float x) {
#if KT_DTYPE == 2
    unsigned u;
#if defined(KT_HOST)
    __builtin_memcpy(&u, &x, sizeof u);
#else
    u = __float_as_uint(x);
#endif
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
#elif defined(KT_HOST)
    return kt_host::f32_f16(x);
#elif defined(KT_HIP)
    return __half_as_ushort(__float2half(x));
#else
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#endif
}
#endif
#endif

#if KT_VARIANT == 0

#define KT_THREADS ((KT_BM / KT_TM) * (KT_BN / KT_TN))
// One float of padding keeps the column walks of the staging loops off a single LDS bank.
#define KT_PAD 1

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_gemm(const kt_in* __restrict__ a, const kt_b* __restrict__ b, float* __restrict__ c,
        int m, int n, int k KT_SCALE_PARAMS) {
    KT_SHARED float as[KT_BK][KT_BM + KT_PAD];
    KT_SHARED float bs[KT_BK][KT_BN + KT_PAD];
    const int tid = KT_TID;
    const int tx = tid % (KT_BN / KT_TN);
    const int ty = tid / (KT_BN / KT_TN);
    const int row0 = KT_BID_Y * KT_BM;
    const int col0 = KT_BID_X * KT_BN;
    int kb, ke;
    kt_split_range(k, &kb, &ke);
    c += (long)KT_BID_Z * m * n;
    float acc[KT_TM][KT_TN];
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) acc[i][j] = 0.0f;

    for (int k0 = kb; k0 < ke; k0 += KT_BK) {
        // Consecutive threads read consecutive k of one row of A: coalesced.
        for (int i = tid; i < KT_BM * KT_BK; i += KT_THREADS) {
            const int r = i / KT_BK, kk = i % KT_BK;
            const int gr = row0 + r, gk = k0 + kk;
#if KT_BLOCK
            as[kk][r] = (gr < m && gk < ke)
                            ? kt_load(a, (long)gr * k + gk) * KT_A_GROUP_SCALE(gr, gk / KT_BLOCK)
                            : 0.0f;
#else
            as[kk][r] = (gr < m && gk < ke) ? kt_load(a, (long)gr * k + gk) : 0.0f;
#endif
        }
#if KT_INT4
        kt_int4_stage(b, b_scales, b_zeros, n, k0, ke, col0, tid, KT_THREADS,
                      [&](int col, int kk, float w) { bs[kk][col] = w; });
#else
        for (int i = tid; i < KT_BN * KT_BK; i += KT_THREADS) {
#if KT_B_NK
            const int col = i / KT_BK, kk = i % KT_BK;
            const int gc = col0 + col, gk = k0 + kk;
#if KT_BLOCK
            bs[kk][col] = (gc < n && gk < ke)
                              ? kt_load(b, (long)gc * k + gk) * KT_B_GROUP_SCALE(gc, gk / KT_BLOCK)
                              : 0.0f;
#else
            bs[kk][col] = (gc < n && gk < ke) ? kt_load(b, (long)gc * k + gk) : 0.0f;
#endif
#else
            const int kk = i / KT_BN, col = i % KT_BN;
            const int gc = col0 + col, gk = k0 + kk;
            bs[kk][col] = (gc < n && gk < ke) ? kt_load(b, (long)gk * n + gc) : 0.0f;
#endif
        }
#endif
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
    // fp8: each column's scale read once (a column past n reads the last one, unstored).
    float col_scale[KT_TN];
#pragma unroll
    for (int j = 0; j < KT_TN; ++j) col_scale[j] = KT_COL_SCALE(min(col0 + tx * KT_TN + j, n - 1));
#pragma unroll
    for (int i = 0; i < KT_TM; ++i) {
        const int gr = row0 + ty * KT_TM + i;
        if (gr >= m) continue;
        const float row_scale = KT_ROW_SCALE(gr);
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) {
            const int gc = col0 + tx * KT_TN + j;
            if (gc < n) c[(long)gr * n + gc] = acc[i][j] * (row_scale * col_scale[j]);
        }
    }
}

#elif KT_VARIANT == 1

#if !defined(KT_MFMA)
#error "the MFMA variant needs gfx90a or gfx94x (or the host emulator of one)"
#endif
#if KT_DTYPE == 0
#error "the MFMA variant takes f16, bf16 or fp8 inputs"
#endif

#define KT_WAVES_M (KT_BM / (32 * KT_TM))
#define KT_WAVES_N (KT_BN / (32 * KT_TN))
#define KT_THREADS (64 * KT_WAVES_M * KT_WAVES_N)

#if KT_STAGES == 2
#if !KT_B_NK
#error "the pipelined MFMA variant takes B as [N, K] (both operands k-major)"
#endif
// The tiles' depth in 16-bit words (KT_BKW, as the pipelined mma variant's): fp8 bytes go
// two to a word, where v_mfma_f32_32x32x16_fp8_fp8 wants them.
#if KT_FP8_IN
#define KT_BKW (KT_BK / 2)
#define KT_MFMA_STEP kt_mfma_fp8
#else
#define KT_BKW KT_BK
#define KT_MFMA_STEP kt_mfma
#endif
#define KT_LDK (KT_BKW + 8)
// 16-byte pieces of 8 words a row of a k tile, and how many of A's and B's a thread loads.
#define KT_KPIECES (KT_BKW / 8)
#define KT_A_PIECES ((KT_BM * KT_KPIECES + KT_THREADS - 1) / KT_THREADS)
#define KT_B_PIECES ((KT_BN * KT_KPIECES + KT_THREADS - 1) / KT_THREADS)

// The k tile at k0 of ROWS rows from row0 of a k-major operand of `limit` rows, in 16-byte
// pieces into registers, consecutive threads on consecutive pieces of a row; zeros past the
// rows or the split's end (k % 8 == 0, so a piece is wholly in or out).
template <int ROWS, int PER>
KT_DEVICE void kt_mfma_fetch(kt_u32x4 (&r)[PER], const unsigned short* src, int row0, int limit,
                             int k, int k0, int ke, int tid) {
#pragma unroll
    for (int t = 0; t < PER; ++t) {
        const int p = tid + t * KT_THREADS;
        const int row = p / KT_KPIECES, gk = k0 + (p % KT_KPIECES) * 8;
        kt_u32x4 v;
        v.x = v.y = v.z = v.w = 0u;
        if (p < ROWS * KT_KPIECES && row0 + row < limit && gk < ke)
            v = kt_load16(src + (long)(row0 + row) * k + gk);
        r[t] = v;
    }
}

// The pieces kt_mfma_fetch loaded, into an LDS tile of the same rows.
template <int ROWS, int PER>
KT_DEVICE void kt_mfma_stage(unsigned short (*dst)[KT_LDK], const kt_u32x4 (&r)[PER], int tid) {
#pragma unroll
    for (int t = 0; t < PER; ++t) {
        const int p = tid + t * KT_THREADS;
        if (p < ROWS * KT_KPIECES)
            *reinterpret_cast<kt_u32x4*>(&dst[p / KT_KPIECES][(p % KT_KPIECES) * 8]) = r[t];
    }
}
#elif KT_STAGES == 1
// One stage: the k tile in values, widened to 16 bits as staged.
#define KT_BKW KT_BK
#define KT_MFMA_STEP kt_mfma
#else
#error "the MFMA variant takes 1 or 2 stages"
#endif

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_gemm(const kt_in* __restrict__ a, const kt_b* __restrict__ b, float* __restrict__ c,
        int m, int n, int k KT_SCALE_PARAMS) {
#if KT_STAGES == 1
    // k contiguous for both operands; 4 halves of padding keep 8-byte reads aligned and
    // spread the 32 rows of a fragment over the banks.
    KT_SHARED unsigned short as_[1][KT_BM][KT_BK + 4];
    KT_SHARED unsigned short bs_[1][KT_BN][KT_BK + 4];
#else
    // Two tiles of each; 8 halves of padding keep every row's 16-byte pieces aligned.
    KT_SHARED __attribute__((aligned(16))) unsigned short as_[2][KT_BM][KT_LDK];
    KT_SHARED __attribute__((aligned(16))) unsigned short bs_[2][KT_BN][KT_LDK];
#endif
    const int tid = KT_TID;
    const int lane = tid % 64;
    const int wave = tid / 64;
    const int wm = (wave / KT_WAVES_N) * 32 * KT_TM;
    const int wn = (wave % KT_WAVES_N) * 32 * KT_TN;
    const int row0 = KT_BID_Y * KT_BM;
    const int col0 = KT_BID_X * KT_BN;
    int kb, ke;
    kt_split_range(k, &kb, &ke);
    c += (long)KT_BID_Z * m * n;
    kt_f32x16 acc[KT_TM][KT_TN];
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j)
#pragma unroll
            for (int e = 0; e < 16; ++e) acc[i][j][e] = 0.0f;
#if KT_BLOCK
    // Block-scaled: a group's products, added to `acc` times its scales after its last k tile
    // (rows and columns as the store below has them; a tile's 32 columns lie in one block).
    kt_f32x16 part[KT_TM][KT_TN];
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j)
#pragma unroll
            for (int e = 0; e < 16; ++e) part[i][j][e] = 0.0f;
    auto promote = [&](int group) {
#pragma unroll
        for (int i = 0; i < KT_TM; ++i)
#pragma unroll
            for (int j = 0; j < KT_TN; ++j) {
                const float sb = KT_B_GROUP_SCALE(min(col0 + wn + 32 * j, n - 1), group);
#pragma unroll
                for (int e = 0; e < 16; ++e) {
                    const int gr = row0 + wm + 32 * i + 8 * (e / 4) + 4 * (lane / 32) + e % 4;
                    const float sa = KT_A_GROUP_SCALE(min(gr, m - 1), group);
                    acc[i][j][e] = fmaf(part[i][j][e], sa * sb, acc[i][j][e]);
                    part[i][j][e] = 0.0f;
                }
            }
    };
#define KT_MFMA_ACC part
#else
#define KT_MFMA_ACC acc
#endif

#if KT_STAGES == 2
    // The operands as 16-bit words (fp8: two bytes each; k and the split's range, multiples
    // of 16 bytes, in words too), as the loop below counts k.
    const unsigned short* const aw = reinterpret_cast<const unsigned short*>(a);
    const unsigned short* const bw = reinterpret_cast<const unsigned short*>(b);
    const int kw = k * (int)sizeof(kt_in) / 2;
    const int kbl = kb * (int)sizeof(kt_in) / 2, kel = ke * (int)sizeof(kt_in) / 2;
    kt_u32x4 ra[KT_A_PIECES], rb[KT_B_PIECES];
    // Uniform over the block: a split with no k tiles only meets the barrier.
    if (kbl < kel) {
        kt_mfma_fetch<KT_BM, KT_A_PIECES>(ra, aw, row0, m, kw, kbl, kel, tid);
        kt_mfma_fetch<KT_BN, KT_B_PIECES>(rb, bw, col0, n, kw, kbl, kel, tid);
        kt_mfma_stage<KT_BM, KT_A_PIECES>(as_[0], ra, tid);
        kt_mfma_stage<KT_BN, KT_B_PIECES>(bs_[0], rb, tid);
    }
    KT_SYNC();
    int st = 0;
#else
    const int kbl = kb, kel = ke;
#endif
    for (int k0 = kbl; k0 < kel; k0 += KT_BKW) {
#if KT_STAGES == 1
        unsigned short(*as)[KT_BK + 4] = as_[0];
        unsigned short(*bs)[KT_BK + 4] = bs_[0];
        for (int i = tid; i < KT_BM * KT_BK; i += KT_THREADS) {
            const int r = i / KT_BK, kk = i % KT_BK;
            const int gr = row0 + r, gk = k0 + kk;
            as[r][kk] =
                (gr < m && gk < ke) ? kt_core_bits(a[(long)gr * k + gk]) : (unsigned short)0;
        }
#if KT_INT4
        kt_int4_stage(b, b_scales, b_zeros, n, k0, ke, col0, tid, KT_THREADS,
                      [&](int col, int kk, float w) { bs[col][kk] = kt_narrow(w); });
#else
        for (int i = tid; i < KT_BN * KT_BK; i += KT_THREADS) {
#if KT_B_NK
            const int col = i / KT_BK, kk = i % KT_BK;
            const int gc = col0 + col, gk = k0 + kk;
            bs[col][kk] =
                (gc < n && gk < ke) ? kt_core_bits(b[(long)gc * k + gk]) : (unsigned short)0;
#else
            const int kk = i / KT_BN, col = i % KT_BN;
            const int gc = col0 + col, gk = k0 + kk;
            bs[col][kk] =
                (gc < n && gk < ke) ? kt_core_bits(b[(long)gk * n + gc]) : (unsigned short)0;
#endif
        }
#endif
        KT_SYNC();
#else
        // The next tile's loads go out before this tile's products, and land in the other
        // LDS tiles after them: the barrier closing the last tile ended every read of those.
        const bool more = k0 + KT_BKW < kel;
        if (more) {
            kt_mfma_fetch<KT_BM, KT_A_PIECES>(ra, aw, row0, m, kw, k0 + KT_BKW, kel, tid);
            kt_mfma_fetch<KT_BN, KT_B_PIECES>(rb, bw, col0, n, kw, k0 + KT_BKW, kel, tid);
        }
        unsigned short(*as)[KT_LDK] = as_[st];
        unsigned short(*bs)[KT_LDK] = bs_[st];
#endif
        // Lane l holds row (or column) l % 32 and k values 4·(l / 32) .. +4 of each 32×8 step
        // (fp8: words, two bytes each, of a 32×16 step).
#pragma unroll
        for (int kk = 0; kk < KT_BKW; kk += 8) {
            const int kl = kk + 4 * (lane / 32);
            kt_frag af[KT_TM], bf[KT_TN];
#pragma unroll
            for (int i = 0; i < KT_TM; ++i) af[i] = kt_frag_at(&as[wm + 32 * i + lane % 32][kl]);
#pragma unroll
            for (int j = 0; j < KT_TN; ++j) bf[j] = kt_frag_at(&bs[wn + 32 * j + lane % 32][kl]);
#pragma unroll
            for (int i = 0; i < KT_TM; ++i)
#pragma unroll
                for (int j = 0; j < KT_TN; ++j)
                    KT_MFMA_ACC[i][j] = KT_MFMA_STEP(af[i], bf[j], KT_MFMA_ACC[i][j]);
        }
#if KT_BLOCK
        {
            // This k tile's first value (k0 counts words where the tiles hold bytes).
            const int kv = k0 * (KT_BK / KT_BKW);
            if ((kv + KT_BK) % KT_BLOCK == 0 || k0 + KT_BKW >= kel) promote(kv / KT_BLOCK);
        }
#endif
#if KT_STAGES == 2
        if (more) {
            kt_mfma_stage<KT_BM, KT_A_PIECES>(as_[st ^ 1], ra, tid);
            kt_mfma_stage<KT_BN, KT_B_PIECES>(bs_[st ^ 1], rb, tid);
        }
        st ^= 1;
#endif
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
                if (gr < m && gc < n) c[(long)gr * n + gc] = KT_SCALED(acc[i][j][e], gr, gc);
            }
}

#elif KT_VARIANT == 2

#if !defined(KT_MMA)
#error "the mma variant needs NVIDIA sm_80+ (or the host emulator of one)"
#endif
#if KT_DTYPE == 0
#error "the mma variant takes f16, bf16 or fp8 inputs"
#endif

#define KT_WARPS_M (KT_BM / (16 * KT_TM))
#define KT_WARPS_N (KT_BN / (8 * KT_TN))
#define KT_THREADS (32 * KT_WARPS_M * KT_WARPS_N)
#if KT_STAGES == 1
// 8 halves of padding: rows of a fragment (stride BK + 8 halves) land on distinct banks.
#define KT_LDK (KT_BK + 8)
#else
#if KT_STAGES > 4
#error "KT_STAGES must be 1 to 4"
#endif
#if KT_TN % 2 != 0
#error "the pipelined mma variant reads the B fragments of two n tiles at once: KT_TN must be even"
#endif
// The tiles' depth in 16-bit words: fp8 bytes go two to a word, laid out (and copied, and
// read by ldmatrix) as 16-bit values of half the depth, which is where m16n8k32 wants them.
#if KT_FP8_IN
#define KT_BKW (KT_BK / 2)
#define KT_MMA_STEP kt_mma_k32
#else
#define KT_BKW KT_BK
#define KT_MMA_STEP kt_mma
#endif
// A [stage][BM][BKW + 8]; B [stage][BN][BKW + 8] (N×K) or [stage][BK][BN + 8] (K×N), in
// dynamic shared memory of KT_DYN_LDS bytes (the launch passes the same). The 8 words of
// padding put the 8 rows of one ldmatrix on distinct banks and keep every row 16-byte aligned
// for cp.async.
#define KT_LDA (KT_BKW + 8)
#if KT_B_NK
#define KT_B_ROWS KT_BN
#define KT_LDB (KT_BKW + 8)
#else
#define KT_B_ROWS KT_BK
#define KT_LDB (KT_BN + 8)
#endif
#if !defined(KT_DYN_LDS) || 2 * KT_STAGES * (KT_BM * KT_LDA + KT_B_ROWS * KT_LDB) != KT_DYN_LDS
#error "KT_DYN_LDS must be the bytes of the pipelined tiles, as the launch passes them"
#endif
#endif

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_gemm(const kt_in* __restrict__ a, const kt_b* __restrict__ b, float* __restrict__ c,
        int m, int n, int k KT_SCALE_PARAMS) {
#if KT_STAGES == 1
    KT_SHARED __attribute__((aligned(16))) unsigned short as[KT_BM][KT_LDK];
    KT_SHARED __attribute__((aligned(16))) unsigned short bs[KT_BN][KT_LDK];
#else
    // Dynamic shared memory: the stages may exceed the 48 KiB a block declares statically.
    KT_DYNAMIC_SHARED(smem);
    unsigned short(*as)[KT_BM][KT_LDA] = reinterpret_cast<unsigned short(*)[KT_BM][KT_LDA]>(smem);
    unsigned short(*bs)[KT_B_ROWS][KT_LDB] = reinterpret_cast<unsigned short(*)[KT_B_ROWS][KT_LDB]>(
        smem + 2 * KT_STAGES * KT_BM * KT_LDA);
#endif
    const int tid = KT_TID;
    const int lane = tid % 32;
    const int warp = tid / 32;
    // The PTX fragment layout: lane = 4·group + thread-in-group.
    const int g = lane / 4, t = lane % 4;
    const int wm = (warp / KT_WARPS_N) * 16 * KT_TM;
    const int wn = (warp % KT_WARPS_N) * 8 * KT_TN;
    const int row0 = KT_BID_Y * KT_BM;
    const int col0 = KT_BID_X * KT_BN;
    int kb, ke;
    kt_split_range(k, &kb, &ke);
    c += (long)KT_BID_Z * m * n;
    float acc[KT_TM][KT_TN][4];
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
#if KT_BLOCK
    // Block-scaled: a group's products, added to `acc` times its scales after its last k tile
    // (rows and columns as the store below has them; a tile's 8 columns lie in one block).
    float part[KT_TM][KT_TN][4];
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[i][j][e] = 0.0f;
    auto promote = [&](int group) {
#pragma unroll
        for (int i = 0; i < KT_TM; ++i) {
            float sa[2];
#pragma unroll
            for (int h = 0; h < 2; ++h)
                sa[h] = KT_A_GROUP_SCALE(min(row0 + wm + 16 * i + g + 8 * h, m - 1), group);
#pragma unroll
            for (int j = 0; j < KT_TN; ++j) {
                const float sb = KT_B_GROUP_SCALE(min(col0 + wn + 8 * j, n - 1), group);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[i][j][e] = fmaf(part[i][j][e], sa[e / 2] * sb, acc[i][j][e]);
                    part[i][j][e] = 0.0f;
                }
            }
        }
    };
#define KT_MMA_ACC part
#else
#define KT_MMA_ACC acc
#endif

#if KT_STAGES == 1
    for (int k0 = kb; k0 < ke; k0 += KT_BK) {
        for (int i = tid; i < KT_BM * KT_BK; i += KT_THREADS) {
            const int r = i / KT_BK, kk = i % KT_BK;
            const int gr = row0 + r, gk = k0 + kk;
            as[r][kk] =
                (gr < m && gk < ke) ? kt_core_bits(a[(long)gr * k + gk]) : (unsigned short)0;
        }
#if KT_INT4
        kt_int4_stage(b, b_scales, b_zeros, n, k0, ke, col0, tid, KT_THREADS,
                      [&](int col, int kk, float w) { bs[col][kk] = kt_narrow(w); });
#else
        for (int i = tid; i < KT_BN * KT_BK; i += KT_THREADS) {
#if KT_B_NK
            const int col = i / KT_BK, kk = i % KT_BK;
            const int gc = col0 + col, gk = k0 + kk;
            bs[col][kk] =
                (gc < n && gk < ke) ? kt_core_bits(b[(long)gc * k + gk]) : (unsigned short)0;
#else
            const int kk = i / KT_BN, col = i % KT_BN;
            const int gc = col0 + col, gk = k0 + kk;
            bs[col][kk] =
                (gc < n && gk < ke) ? kt_core_bits(b[(long)gk * n + gc]) : (unsigned short)0;
#endif
        }
#endif
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
                for (int j = 0; j < KT_TN; ++j) kt_mma(KT_MMA_ACC[i][j], af[i], bf[j]);
        }
#if KT_BLOCK
        if ((k0 + KT_BK) % KT_BLOCK == 0 || k0 + KT_BK >= ke) promote(k0 / KT_BLOCK);
#endif
        KT_SYNC();
    }
#else
    // The operands as 16-bit words (fp8: two bytes each; k and the split's range, multiples
    // of 16 bytes, in words too).
    const unsigned short* const aw = reinterpret_cast<const unsigned short*>(a);
    const unsigned short* const bw = reinterpret_cast<const unsigned short*>(b);
    const int kw = k * (int)sizeof(kt_in) / 2, kbw = kb * (int)sizeof(kt_in) / 2;
    const int kew = ke * (int)sizeof(kt_in) / 2;
    // Copies the k tile at k0 into stage st, 16 bytes a copy, each an offset from the stage's
    // tiles' shared addresses; chunks outside the matrix or this split's k range are
    // zero-filled (a row of 8 lies wholly inside or outside, as k, and n for a K×N B, are
    // multiples of 8).
    auto load = [&](int st, int k0) {
        const unsigned a_to = kt_smem(&as[st][0][0]), b_to = kt_smem(&bs[st][0][0]);
        for (int i = tid; i < KT_BM * (KT_BKW / 8); i += KT_THREADS) {
            const int r = i / (KT_BKW / 8), ch = 8 * (i % (KT_BKW / 8));
            const int gr = row0 + r, gk = k0 + ch;
            const bool in = gr < m && gk < kew;
            kt_cp_async16_at(a_to + 2 * (r * KT_LDA + ch),
                             in ? aw + ((long)gr * kw + gk) : aw, in ? 16 : 0);
        }
#if KT_B_NK
        for (int i = tid; i < KT_BN * (KT_BKW / 8); i += KT_THREADS) {
            const int r = i / (KT_BKW / 8), ch = 8 * (i % (KT_BKW / 8));
            const int gc = col0 + r, gk = k0 + ch;
            const bool in = gc < n && gk < kew;
            kt_cp_async16_at(b_to + 2 * (r * KT_LDB + ch),
                             in ? bw + ((long)gc * kw + gk) : bw, in ? 16 : 0);
        }
#else
        for (int i = tid; i < KT_BKW * (KT_BN / 8); i += KT_THREADS) {
            const int r = i / (KT_BN / 8), ch = 8 * (i % (KT_BN / 8));
            const int gk = k0 + r, gc = col0 + ch;
            const bool in = gk < kew && gc < n;
            kt_cp_async16_at(b_to + 2 * (r * KT_LDB + ch),
                             in ? bw + ((long)gk * n + gc) : bw, in ? 16 : 0);
        }
#endif
    };
    const int tiles = kew > kbw ? (kew - kbw + KT_BKW - 1) / KT_BKW : 0;
    // This lane's ldmatrix row addresses in stage 0's A and B tiles; a fragment's is a
    // constant past them, plus its stage's offset (kt_ldmatrix_x4_at).
    const unsigned a_at = kt_smem(&as[0][wm + lane % 16][8 * (lane / 16)]);
#if KT_B_NK
    const unsigned b_at = kt_smem(&bs[0][wn + 8 * (lane / 16) + lane % 8][8 * ((lane / 8) % 2)]);
#else
    const unsigned b_at = kt_smem(&bs[0][8 * ((lane / 8) % 2) + lane % 8][wn + 8 * (lane / 16)]);
#endif
    // Tiles 0 .. STAGES-2 in flight before the first product, one commit group each (empty
    // groups past the end keep the count that the waits rely on).
#pragma unroll
    for (int st = 0; st < KT_STAGES - 1; ++st) {
        if (st < tiles) load(st, kbw + st * KT_BKW);
        kt_cp_async_commit();
    }
    for (int tile = 0; tile < tiles; ++tile) {
        // This thread's copies of `tile` have landed; after the barrier everyone's have, and
        // every warp is done with the stage the next copies overwrite (read last iteration).
        kt_cp_async_wait<KT_STAGES - 2>();
        KT_SYNC();
        const int next = tile + KT_STAGES - 1;
        if (next < tiles) load(next % KT_STAGES, kbw + next * KT_BKW);
        kt_cp_async_commit();
        const int st = tile % KT_STAGES;
        const unsigned a_st = a_at + 2 * st * KT_BM * KT_LDA;
        const unsigned b_st = b_at + 2 * st * KT_B_ROWS * KT_LDB;
#pragma unroll
        for (int kk = 0; kk < KT_BKW; kk += 16) {
            // Lanes 8q .. 8q + 7 address the rows of 8×8 matrix q. A: matrices (rows 0-7,
            // k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) are fragment registers 0-3.
            // B: (n 0-7, k 0-7), (0-7, 8-15) of tile 2jj, then the same of tile 2jj + 1.
            unsigned af[KT_TM][4], bf[KT_TN][2];
#pragma unroll
            for (int i = 0; i < KT_TM; ++i)
                kt_ldmatrix_x4_at(af[i], a_st + 2 * (16 * i * KT_LDA + kk));
#pragma unroll
            for (int jj = 0; jj < KT_TN / 2; ++jj) {
                unsigned r[4];
#if KT_B_NK
                kt_ldmatrix_x4_at(r, b_st + 2 * (16 * jj * KT_LDB + kk));
#else
                // Rows of the K×N tile are k: transposed, each lane gets a k pair of one n.
                kt_ldmatrix_x4_trans_at(r, b_st + 2 * (kk * KT_LDB + 16 * jj));
#endif
                bf[2 * jj][0] = r[0];
                bf[2 * jj][1] = r[1];
                bf[2 * jj + 1][0] = r[2];
                bf[2 * jj + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < KT_TM; ++i)
#pragma unroll
                for (int j = 0; j < KT_TN; ++j) KT_MMA_STEP(KT_MMA_ACC[i][j], af[i], bf[j]);
        }
#if KT_BLOCK
        {
            // This k tile's first value (the split starts on a whole tile).
            const int kv = kb + tile * KT_BK;
            if ((kv + KT_BK) % KT_BLOCK == 0 || tile + 1 == tiles) promote(kv / KT_BLOCK);
        }
#endif
    }
#endif
    // Accumulator e of lane (g, t): row g + 8·(e / 2), column 2t + e % 2. A lane's two
    // neighbouring columns go as one 8-byte store where n is even (every pair then aligned):
    // a row's four lanes fill a 32-byte sector, where single floats left half of each unused
    // (Nsight Compute on an H200).
#pragma unroll
    for (int i = 0; i < KT_TM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const int gr = row0 + wm + 16 * i + g + 8 * (e / 2);
                const int gc = col0 + wn + 8 * j + 2 * t;
                if (gr >= m) continue;
                float* const at = c + (long)gr * n + gc;
                if (gc + 1 < n && n % 2 == 0) {
                    kt_store8(at, KT_SCALED(acc[i][j][e], gr, gc),
                              KT_SCALED(acc[i][j][e + 1], gr, gc + 1));
                } else {
                    if (gc < n) at[0] = KT_SCALED(acc[i][j][e], gr, gc);
                    if (gc + 1 < n) at[1] = KT_SCALED(acc[i][j][e + 1], gr, gc + 1);
                }
            }
}

#elif KT_VARIANT == 3

#if !defined(KT_WGMMA)
#error "the wgmma variant needs NVIDIA sm_90a (or the host emulator of one)"
#endif
#if KT_DTYPE == 0 || !KT_B_NK
#error "the wgmma variant takes f16, bf16 or fp8 (OCP) inputs and B as [N, K]"
#endif
#if KT_STAGES < 3 || KT_STAGES > 4
#error "the wgmma variant takes 3 or 4 stages: one multiplied, one finishing, the rest copied"
#endif

// Shared memory and the k loop count 16-bit words: fp8 bytes go two to a word, so the 16-bit
// layouts (core matrices of 8 rows of 16 bytes, swizzled rows, TMA boxes of 64 words) hold
// twice the values, and a word step of 16 is m64nNk32's 32 bytes.
#if KT_FP8_IN
#define KT_BKW (KT_BK / 2)
#else
#define KT_BKW KT_BK
#endif

#ifndef KT_SPECIALIZED
#define KT_SPECIALIZED 0
#endif
#ifndef KT_TMA
#define KT_TMA 0
#endif
#ifndef KT_BLOCK_TILES
#define KT_BLOCK_TILES 1
#endif
#if KT_BLOCK_TILES > 1 && !KT_SPECIALIZED
#error "a block takes several C tiles only in the specialized variant (KT_BLOCK_TILES 1)"
#endif
#if KT_TMA && !(KT_SPECIALIZED && KT_SWIZZLE == 128 && KT_BKW == 64)
#error "TMA boxes feed the specialized variant: KT_SWIZZLE 128, KT_BK 64 words (128 fp8 values)"
#endif
#ifndef KT_CLUSTER
#define KT_CLUSTER 1
#endif
#if KT_CLUSTER != 1 && !(KT_CLUSTER == 2 && KT_TMA && KT_BN % 16 == 0)
#error "clusters of 2 blocks share B's tile by TMA multicast (KT_TMA, KT_BN a multiple of 16)"
#endif
#define KT_WG_N (KT_BN / KT_TN)
// The warpgroups that multiply; specialized, a producer warpgroup (threads 0 .. 127) before
// them copies every tile, else all of them copy.
#define KT_CONSUMERS (128 * (KT_BM / (64 * KT_TM)) * KT_WG_N)
#define KT_THREADS (KT_CONSUMERS + 128 * KT_SPECIALIZED)
#define KT_COPIERS (KT_SPECIALIZED ? 128 : KT_THREADS)
#if KT_SWIZZLE
#if KT_SWIZZLE != 32 && KT_SWIZZLE != 64 && KT_SWIZZLE != 128 || (2 * KT_BKW) % KT_SWIZZLE
#error "KT_SWIZZLE must be 32, 64 or 128 bytes, dividing a k tile's rows"
#endif
// Swizzled rows: a tile of R rows by BK stores k in column blocks of KT_ATOM (a swizzled
// row of KT_SWIZZLE bytes), R·ATOM elements apart; row r of a block at r·ATOM; and 16-byte
// piece p of that row at piece p ^ (offset bits 7 up), as the descriptors' swizzle mode of
// that width reads it (kt_swizzled). Tiles start on 1024-byte boundaries (the kernel rounds
// its shared memory up to one), so an offset in a tile has the address's bits 4 to 9. Eight
// rows are 8·SWIZZLE bytes (the stride offset); a k step's 32 bytes stay in one row, so the
// leading offset is unused (1, as for every swizzled k-major operand).
#define KT_ATOM (KT_SWIZZLE / 2)
#define KT_LBO 16
#define KT_SBO (8 * KT_SWIZZLE)
#define KT_LAYOUT (KT_SWIZZLE == 128 ? 1 : KT_SWIZZLE == 64 ? 2 : 3)
#define KT_ALIGN 1024
#else
// Core matrices: a tile of R rows by BK stores core matrix (rows 8·rc .., k 8·kc ..) at
// element (rc · BK/8 + kc) · 64, row r of it 16 bytes after row r - 1: cores adjacent in k
// are 128 bytes apart (the descriptors' leading offset), cores adjacent in rows BK · 16
// (their stride offset).
#define KT_LBO 128
#define KT_SBO (KT_BKW * 16)
#define KT_LAYOUT 0
#define KT_ALIGN 0
#endif
// A [stage][BM·BK], then B [stage][BN·BK], in dynamic shared memory (KT_ALIGN more, for
// rounding its start up); specialized, then each stage's two mbarriers.
#define KT_TILE_BYTES (2 * KT_STAGES * (KT_BM + KT_BN) * KT_BKW)
#if !defined(KT_DYN_LDS) || KT_TILE_BYTES + KT_ALIGN + 16 * KT_STAGES * KT_SPECIALIZED != KT_DYN_LDS
#error "KT_DYN_LDS must be the bytes of the pipelined tiles, as the launch passes them"
#endif

// The C tile `id` of a block's KT_BLOCK_TILES (x · KT_BLOCK_TILES on): its first row and
// column. In clusters, ids count columns of KT_CLUSTER tiles one above the other (m tiles in
// units of KT_CLUSTER · BM), the block of rank r taking the r-th of its cluster's column.
// Blocks start in launch order, so a wave of them is a run of consecutive ids. Row by
// row of tiles, a wave of 132 would take 4 or 5 rows of m tiles across all of N and read
// every weight of B from memory once per wave; here consecutive ids walk the m tiles of a
// band of KT_RASTER first, then the next n tile: a wave reads the band's rows of A and a few
// n tiles of B, and the next waves find A still in L2. 16 tiles of 128 rows against the n
// tiles they pair with balances the two for 128×256 tiles on 132 SMs.
#define KT_RASTER 16
KT_DEVICE void kt_tile_origin(int id, int m, int n, int* row0, int* col0) {
    const int tiles_m = (m + KT_CLUSTER * KT_BM - 1) / (KT_CLUSTER * KT_BM);
    const int tiles_n = (n + KT_BN - 1) / KT_BN;
    const int band = id / (KT_RASTER * tiles_n), first = band * KT_RASTER;
    const int rows = min(KT_RASTER, tiles_m - first), in = id - first * tiles_n;
#if KT_CLUSTER > 1
    *row0 = ((first + in % rows) * KT_CLUSTER + kt_cluster_rank()) * KT_BM;
#else
    *row0 = (first + in % rows) * KT_BM;
#endif
    *col0 = (in / rows) * KT_BN;
}

#if KT_SWIZZLE
// The byte offset where the hardware's swizzle puts byte offset `at` of a tile.
KT_DEVICE int kt_swizzled(int at) { return at ^ (((at >> 7) & (KT_SWIZZLE / 16 - 1)) << 4); }
#endif

// The element offset, in a tile of R rows, that a descriptor starts at for rows r .. r + 8n
// (r % 8 == 0) and k 16·kk .. 16·kk + 16.
template <int R>
KT_DEVICE int kt_start(int r, int kk) {
#if KT_SWIZZLE
    return (16 * kk / KT_ATOM) * R * KT_ATOM + r * KT_ATOM + 16 * kk % KT_ATOM;
#else
    // The core matrices kc = 2·kk and 2·kk + 1.
    return (r / 8) * (KT_BKW / 8) * 64 + 128 * kk;
#endif
}

// Copies rows r0 .. r0 + R of `src` ([rows, k] row-major, in words as every k here), k0 ..
// k0 + BKW, into the tile at
// `dst`, 16 bytes a copy. Swizzled: consecutive threads take consecutive pieces of a row, so
// a quarter-warp reads 128 contiguous bytes and writes 8 distinct banks' worth. Core
// matrices: 8 consecutive threads fill the 8 rows of one (128 contiguous bytes of shared
// memory), reading 16 bytes of each of 8 rows. Pieces outside the matrix or past `ke` are
// zero-filled (k % 8 == 0 in words: a piece lies wholly inside or outside).
template <int R>
KT_DEVICE void kt_load_tile(unsigned short* dst, const unsigned short* src, int r0, int rows,
                            int k, int k0, int ke, int tid) {
    // The tile's shared address once; each piece an offset from it (kt_cp_async16_at).
    const unsigned base = kt_smem(dst);
    for (int i = tid; i < R * (KT_BKW / 8); i += KT_COPIERS) {
#if KT_SWIZZLE
        const int p = i % (KT_BKW / 8), r = i / (KT_BKW / 8);
        const int gr = r0 + r, gk = k0 + 8 * p;
        const int at = 2 * ((8 * p / KT_ATOM) * R * KT_ATOM + r * KT_ATOM) + 16 * (p % (KT_ATOM / 8));
        const unsigned to = base + kt_swizzled(at);
#else
        const int r8 = i % 8, kc = (i / 8) % (KT_BKW / 8), rc = i / KT_BKW;
        const int gr = r0 + 8 * rc + r8, gk = k0 + 8 * kc;
        const unsigned to = base + 2 * ((rc * (KT_BKW / 8) + kc) * 64 + r8 * 8);
#endif
        const bool in = gr < rows && gk < ke;
        kt_cp_async16_at(to, in ? src + ((long)gr * k + gk) : src, in ? 16 : 0);
    }
}

// C tile rows of warpgroup `wg` of the multiplying ones: its accumulators into C (fp8: scaled,
// each row's and column's scale read once). A thread's two neighbouring columns go as one
// 8-byte store where n is even (every pair then aligned).
KT_DEVICE void kt_store_acc(float (&acc)[KT_TM][KT_TN / 2], float* c, int m, int n, int row0,
                            int col0, int wg, int ctid KT_SCALE_PARAMS) {
    const int wm = (wg / KT_WG_N) * 64 * KT_TM;
    const int wn = (wg % KT_WG_N) * KT_TN;
    // The accumulator layout: warp w of the warpgroup, lane = 4·group + t.
    const int w = (ctid / 32) % 4, g = (ctid % 32) / 4, t = ctid % 4;
#pragma unroll
    for (int i = 0; i < KT_TM; ++i) {
        const int r0 = row0 + wm + 64 * i + 16 * w + g;
        // The thread's two rows (g and g + 8 of its warp's 16) and below its two columns.
        const float rs[2] = {KT_ROW_SCALE_IN(r0, m), KT_ROW_SCALE_IN(r0 + 8, m)};
#pragma unroll
        for (int j = 0; j < KT_TN / 8; ++j) {
            const int gc = col0 + wn + 8 * j + 2 * t;
            const float cs[2] = {KT_COL_SCALE_IN(gc, n), KT_COL_SCALE_IN(gc + 1, n)};
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const int gr = r0 + 8 * (e / 2);
                if (gr >= m) continue;
                const float v0 = acc[i][4 * j + e] * (rs[e / 2] * cs[0]);
                const float v1 = acc[i][4 * j + e + 1] * (rs[e / 2] * cs[1]);
                float* const at = c + (long)gr * n + gc;
                if (gc + 1 < n && n % 2 == 0) {
                    kt_store8(at, v0, v1);
                } else {
                    if (gc < n) at[0] = v0;
                    if (gc + 1 < n) at[1] = v1;
                }
            }
        }
    }
}

// Issues stage `st`'s products for warpgroup `wg` of the multiplying ones, one commit group.
KT_DEVICE void kt_issue(float (&acc)[KT_TM][KT_TN / 2], const unsigned short* as,
                        const unsigned short* bs, int st, int wg) {
    const int wm = (wg / KT_WG_N) * 64 * KT_TM;
    const int wn = (wg % KT_WG_N) * KT_TN;
    const unsigned short* at = as + st * KT_BM * KT_BKW;
    const unsigned short* bt = bs + st * KT_BN * KT_BKW;
    kt_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KT_BKW / 16; ++kk) {
        const unsigned long long bd =
            kt_wgmma_desc(bt + kt_start<KT_BN>(wn, kk), KT_LBO, KT_SBO, KT_LAYOUT);
#pragma unroll
        for (int i = 0; i < KT_TM; ++i)
            kt_wgmma(acc[i],
                     kt_wgmma_desc(at + kt_start<KT_BM>(wm + 64 * i, kk), KT_LBO, KT_SBO,
                                   KT_LAYOUT),
                     bd);
    }
    kt_wgmma_commit();
}

// With TMA, `a_map` and `b_map` describe A [m, k] and B [n, k] in boxes of BM and BN rows by
// 64 of k (gpu/launch.rs).
#if KT_CLUSTER > 1
KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS) KT_CLUSTER_DIMS(KT_CLUSTER)
#else
KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
#endif
kt_gemm(const kt_in* __restrict__ a, const kt_b* __restrict__ b, float* __restrict__ c,
        int m, int n, int k KT_SCALE_PARAMS
#if KT_TMA
        , const KT_GRID_CONSTANT kt_tmap a_map, const KT_GRID_CONSTANT kt_tmap b_map
#endif
) {
    KT_DYNAMIC_SHARED(smem);
#if KT_ALIGN
    unsigned short* const as =
        reinterpret_cast<unsigned short*>(smem + (KT_ALIGN - kt_smem(smem) % KT_ALIGN) % KT_ALIGN);
#else
    unsigned short* const as = reinterpret_cast<unsigned short*>(smem);
#endif
    unsigned short* const bs = as + KT_STAGES * KT_BM * KT_BKW;
    const int tid = KT_TID;
    int kb, ke;
    kt_split_range(k, &kb, &ke);
    c += (long)KT_BID_Z * m * n;
    // From here on k counts 16-bit words as the tiles do (fp8: two bytes each, k a multiple
    // of 16 bytes); TMA boxes too, whose maps describe the operands as 16-bit (gpu/launch.rs).
    const int kw = k * (int)sizeof(kt_in) / 2;
    kb = kb * (int)sizeof(kt_in) / 2;
    ke = ke * (int)sizeof(kt_in) / 2;
    const int tiles = ke > kb ? (ke - kb + KT_BKW - 1) / KT_BKW : 0;
    // This block's C tiles: KT_BLOCK_TILES from first on, fewer in the last block (in
    // clusters, the cluster's columns of tiles, each block its row of them).
    const int c_tiles =
        ((m + KT_CLUSTER * KT_BM - 1) / (KT_CLUSTER * KT_BM)) * ((n + KT_BN - 1) / KT_BN);
    const int first = KT_BID_X / KT_CLUSTER * KT_BLOCK_TILES;
    const int mine = min(KT_BLOCK_TILES, c_tiles - first);
    // (TMA copies without it.)
    [[maybe_unused]] auto load = [&](int st, int k0, int copier, int row0, int col0) {
        kt_load_tile<KT_BM>(as + st * KT_BM * KT_BKW, reinterpret_cast<const unsigned short*>(a),
                            row0, m, kw, k0, ke, copier);
        kt_load_tile<KT_BN>(bs + st * KT_BN * KT_BKW, reinterpret_cast<const unsigned short*>(b),
                            col0, n, kw, k0, ke, copier);
    };
    float acc[KT_TM][KT_TN / 2];
#if KT_SPECIALIZED
    // Stage st is full once the producer's copies of it have landed (each of its 128
    // threads' cp.async; with TMA, the bytes of its two boxes), and empty once every
    // multiplying warpgroup is done with its products: one thread of each arrives once its
    // wait returns, since a warpgroup's products are one operation for all its threads (as
    // CUTLASS's pipelines signal, instead of 128 arrivals a warpgroup on one mbarrier). Both
    // sides count the k tiles of all the block's C tiles in one sequence `it`: stage
    // it % STAGES, in round it / STAGES.
    unsigned long long* const full = reinterpret_cast<unsigned long long*>(bs + KT_STAGES * KT_BN * KT_BKW);
    unsigned long long* const empty = full + KT_STAGES;
    if (tid == 0) {
        for (int st = 0; st < KT_STAGES; ++st) {
            kt_mbar_init(&full[st], KT_TMA ? 1 : 128);
            kt_mbar_init(&empty[st], KT_CONSUMERS / 128 * KT_CLUSTER);
        }
        kt_fence_mbar_init();
    }
#if KT_CLUSTER > 1
    // No block of the cluster arrives on another's mbarriers or copies into its shared
    // memory before that block has initialized them.
    kt_cluster_sync();
#else
    KT_SYNC();
#endif
    if (tid < 128) {
        // The producer: tile by tile into the stages in turn, each once the products of the
        // tile before in that stage are done (the first round finds every stage empty), on
        // into the next C tile's while the multiplying warpgroups store the last one's.
#if KT_TMA
        // One thread issues every box; the copy engine does the rest, zeros past the edges.
        // A split's k range is whole tiles (kt_split_range) but for the last split's end,
        // which is k itself: no box reads into the next split's range.
        if (tid == 0)
#endif
        for (int ct = 0, it = 0; ct < mine; ++ct) {
            int row0, col0;
            kt_tile_origin(first + ct, m, n, &row0, &col0);
            for (int tile = 0; tile < tiles; ++tile, ++it) {
                const int st = it % KT_STAGES;
                kt_mbar_wait(&empty[st], ((it / KT_STAGES) & 1) ^ 1);
#if KT_TMA
                kt_mbar_expect_tx(&full[st], 2 * (KT_BM + KT_BN) * KT_BKW);
                kt_tma_load(as + st * KT_BM * KT_BKW, &a_map, kb + tile * KT_BKW, row0, &full[st]);
#if KT_CLUSTER > 1
                // This block's share of B's tile, into every block of the cluster (whose
                // stage the same `empty` wait found free: each block's consumers hand their
                // stages back to every producer of the cluster).
                {
                    const int part = kt_cluster_rank() * (KT_BN / KT_CLUSTER);
                    kt_tma_load_multicast(bs + st * KT_BN * KT_BKW + part * KT_BKW, &b_map,
                                          kb + tile * KT_BKW, col0 + part, &full[st],
                                          (1u << KT_CLUSTER) - 1);
                }
#else
                kt_tma_load(bs + st * KT_BN * KT_BKW, &b_map, kb + tile * KT_BKW, col0, &full[st]);
#endif
#else
                load(st, kb + tile * KT_BKW, tid, row0, col0);
                kt_cp_async_mbar_arrive(&full[st]);
#endif
            }
        }
#if !KT_TMA
        kt_cp_async_wait_all();
#endif
#if KT_CLUSTER > 1
        // Blocks leave together: none while another may still arrive on its mbarriers.
        kt_cluster_sync();
#endif
        return;
    }
    const int ctid = tid - 128;
#else
    const int ctid = tid;
#endif
    const int wg = ctid / 128;
#if KT_SPECIALIZED
    const bool signals = ctid % 128 == 0;
    // A stage handed back to the producer of every block of the cluster (their multicast
    // copies write it).
    auto release = [](unsigned long long* bar) {
#if KT_CLUSTER > 1
        for (int r = 0; r < KT_CLUSTER; ++r) kt_mbar_arrive_cluster(bar, r);
#else
        kt_mbar_arrive(bar);
#endif
    };
    for (int ct = 0, it = 0; ct < mine; ++ct) {
        int row0, col0;
        kt_tile_origin(first + ct, m, n, &row0, &col0);
#pragma unroll
        for (int i = 0; i < KT_TM; ++i) {
#pragma unroll
            for (int e = 0; e < KT_TN / 2; ++e) acc[i][e] = 0.0f;
            kt_wgmma_fence_operand(acc[i]);
        }
        for (int tile = 0; tile < tiles; ++tile, ++it) {
            const int st = it % KT_STAGES;
            // The tile has landed. The proxy fence hands the producer's cp.async copies to
            // wgmma's reads; TMA writes through the async proxy that wgmma reads by, and its
            // bytes are visible once the phase completes.
            kt_mbar_wait(&full[st], (it / KT_STAGES) & 1);
#if !KT_TMA
            kt_fence_async_shared();
#endif
            kt_issue(acc, as, bs, st, wg);
            // The tile before is done: its stage goes back to the producer while this one's
            // products run.
            kt_wgmma_wait<1>();
            if (tile > 0 && signals) release(&empty[(it - 1) % KT_STAGES]);
        }
        kt_wgmma_wait<0>();
        // The C tile's last stage goes back too, so the producer fills it with the next C
        // tile's k tiles while these results are stored.
        if (tiles > 0 && signals) release(&empty[(it - 1) % KT_STAGES]);
#pragma unroll
        for (int i = 0; i < KT_TM; ++i) kt_wgmma_fence_operand(acc[i]);
        kt_store_acc(acc, c, m, n, row0, col0, wg, ctid KT_SCALE_ARGS);
    }
#if KT_CLUSTER > 1
    kt_cluster_sync();
#endif
#else
    int row0, col0;
    kt_tile_origin(KT_BID_X, m, n, &row0, &col0);
#pragma unroll
    for (int i = 0; i < KT_TM; ++i) {
#pragma unroll
        for (int e = 0; e < KT_TN / 2; ++e) acc[i][e] = 0.0f;
        kt_wgmma_fence_operand(acc[i]);
    }
    // Of the STAGES stages, one holds the tile being multiplied, one the tile before it, whose
    // products may still be in flight, and the rest tiles being copied: STAGES - 2 ahead.
#pragma unroll
    for (int st = 0; st < KT_STAGES - 2; ++st) {
        if (st < tiles) load(st, kb + st * KT_BKW, tid, row0, col0);
        kt_cp_async_commit();
    }
#if KT_BLOCK
    // Block-scaled: the products of a group's k tiles go to `part`; once its last tile is
    // issued, the warpgroup waits for them and adds them to `acc` times the group's scales
    // (rows and columns as kt_store_acc has them; 8 columns lie in one block).
    float part[KT_TM][KT_TN / 2];
#pragma unroll
    for (int i = 0; i < KT_TM; ++i) {
#pragma unroll
        for (int e = 0; e < KT_TN / 2; ++e) part[i][e] = 0.0f;
        kt_wgmma_fence_operand(part[i]);
    }
    auto promote = [&](int group) {
        const int wm = (wg / KT_WG_N) * 64 * KT_TM;
        const int wn = (wg % KT_WG_N) * KT_TN;
        const int w = (ctid / 32) % 4, g = (ctid % 32) / 4, t = ctid % 4;
#pragma unroll
        for (int i = 0; i < KT_TM; ++i) {
            kt_wgmma_fence_operand(part[i]);
            const int r0 = row0 + wm + 64 * i + 16 * w + g;
            const float sa[2] = {KT_A_GROUP_SCALE(min(r0, m - 1), group),
                                 KT_A_GROUP_SCALE(min(r0 + 8, m - 1), group)};
#pragma unroll
            for (int j = 0; j < KT_TN / 8; ++j) {
                const float sb = KT_B_GROUP_SCALE(min(col0 + wn + 8 * j + 2 * t, n - 1), group);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[i][4 * j + e] = fmaf(part[i][4 * j + e], sa[e / 2] * sb, acc[i][4 * j + e]);
                    part[i][4 * j + e] = 0.0f;
                }
            }
            kt_wgmma_fence_operand(part[i]);
        }
    };
#define KT_WGMMA_ACC part
#else
#define KT_WGMMA_ACC acc
#endif
    for (int tile = 0; tile < tiles; ++tile) {
        // This thread's copies of `tile` have landed; the proxy fence hands them to wgmma's
        // reads (the async proxy); after the barrier everyone's have, and every warpgroup has
        // waited for the products of tile - 2 (below, in the last iteration), whose stage the
        // next copies overwrite.
        kt_cp_async_wait<KT_STAGES - 3>();
        kt_fence_async_shared();
        KT_SYNC();
        const int next = tile + KT_STAGES - 2;
        if (next < tiles) load(next % KT_STAGES, kb + next * KT_BKW, tid, row0, col0);
        kt_cp_async_commit();
        kt_issue(KT_WGMMA_ACC, as, bs, tile % KT_STAGES, wg);
#if KT_BLOCK
        // This tile's first value (kb and the tiles count words where they hold bytes).
        const int kv = (kb + tile * KT_BKW) * (KT_BK / KT_BKW);
        if ((kv + KT_BK) % KT_BLOCK == 0 || tile + 1 == tiles) {
            kt_wgmma_wait<0>();
            promote(kv / KT_BLOCK);
            continue;
        }
#endif
        // This tile's products stay in flight while the next tile is prepared and issued.
        kt_wgmma_wait<1>();
    }
    kt_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < KT_TM; ++i) kt_wgmma_fence_operand(acc[i]);
    kt_store_acc(acc, c, m, n, row0, col0, wg, ctid KT_SCALE_ARGS);
#endif
}

#elif KT_VARIANT == 4

#if KT_TM != 1
#error "the skinny variant takes KT_TM 1"
#endif
// Lane groups of 32 on every vendor (half a CDNA wave): shuffles with masks below 32 stay
// inside a group on 64-wide waves too.
#define KT_GROUPS (KT_BN / KT_TN)
#define KT_THREADS (32 * KT_GROUPS)

KT_DEVICE float kt_group_sum(float v) {
#pragma unroll
    for (int m = 16; m > 0; m /= 2) v += KT_SHFL_XOR(v, m);
    return v;
}

// Every lane of a group ends with the group's sums; lane i·TN + j (BM·TN is at most 32) writes
// element (i, j) times `scale`.
KT_DEVICE void kt_skinny_store(float (&acc)[KT_BM][KT_TN], float* __restrict__ c, int m, int n,
                               int row0, int col0, int lane, float scale) {
#pragma unroll
    for (int i = 0; i < KT_BM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) {
            const float sum = kt_group_sum(acc[i][j]);
            if (lane == i * KT_TN + j && row0 + i < m && col0 + j < n)
                c[(long)(row0 + i) * n + col0 + j] = sum * scale;
        }
}

#if KT_INT4
// Int4 decode: each group of 32 lanes owns KT_TN consecutive columns; lane l takes word rows
// l, l + 32, ... of each k tile (KT_BK / 8 rows), TN consecutive words of each (one 32-byte
// sector at TN 8), and the 8 values of A's rows under it in one or two 16-byte loads.
#define KT_UNROLL (KT_BK / 256)
#if KT_UNROLL < 1 || KT_UNROLL * 256 != KT_BK
#error "the int4 skinny variant's KT_BK must be 32 lanes times a word's 8 values times a whole unroll"
#endif

// The 8 values of A at `p` (16-byte aligned), widened.
KT_DEVICE void kt_load8(const kt_in* p, float (&x)[8]) {
#if KT_DTYPE == 0
    float lo[4], hi[4];
    kt_widen16(kt_load16(p), lo);
    kt_widen16(kt_load16(p + 4), hi);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        x[e] = lo[e];
        x[e + 4] = hi[e];
    }
#else
    kt_widen16(kt_load16(p), x);
#endif
}

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_gemm(const kt_in* __restrict__ a, const kt_b* __restrict__ b, float* __restrict__ c,
        int m, int n, int k KT_SCALE_PARAMS) {
    const int lane = KT_TID % 32;
    const int row0 = KT_BID_Y * KT_BM;
    const int col0 = KT_BID_X * KT_BN + (KT_TID / 32) * KT_TN;
    int kb, ke;
    kt_split_range(k, &kb, &ke);
    c += (long)KT_BID_Z * m * n;
    // Columns past n read the last one and are not written (every load unconditional).
    int col[KT_TN];
#pragma unroll
    for (int j = 0; j < KT_TN; ++j) col[j] = min(col0 + j, n - 1);
    float acc[KT_BM][KT_TN];
#pragma unroll
    for (int i = 0; i < KT_BM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) acc[i][j] = 0.0f;
    // One word row `r` of this lane's columns (k = 8r .. 8r + 7, inside one group): the sums
    // of a·q and of a over its 8 values, then s·(Σ a·q − z·Σ a) into each column's sums.
    auto step = [&](const unsigned (&w)[KT_TN], int r) {
        float s[KT_TN], z[KT_TN], q[KT_TN][8];
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) {
            const long at = KT_INT4_AT(8 * r, col[j]);
            s[j] = b_scales[at];
            z[j] = KT_INT4_ZERO(at);
#pragma unroll
            for (int e = 0; e < 8; ++e) q[j][e] = kt_nibble(w[j], e);
        }
#pragma unroll
        for (int i = 0; i < KT_BM; ++i) {
            float av[8];
            kt_load8(a + (long)min(row0 + i, m - 1) * k + 8 * r, av);
            float sa = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) sa += av[e];
#pragma unroll
            for (int j = 0; j < KT_TN; ++j) {
                float t = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e) t = fmaf(av[e], q[j][e], t);
                acc[i][j] = fmaf(s[j], t - z[j] * sa, acc[i][j]);
            }
        }
    };
    // Whole tiles: KT_UNROLL · KT_TN word loads a lane issued before their products.
    const int re = ke / 8;
    int r0 = kb / 8;
    for (; r0 + KT_BK / 8 <= re; r0 += KT_BK / 8) {
        unsigned w[KT_UNROLL][KT_TN];
#pragma unroll
        for (int u = 0; u < KT_UNROLL; ++u)
#pragma unroll
            for (int j = 0; j < KT_TN; ++j) w[u][j] = b[(long)(r0 + 32 * u + lane) * n + col[j]];
#pragma unroll
        for (int u = 0; u < KT_UNROLL; ++u) step(w[u], r0 + 32 * u + lane);
    }
    // The split's last partial tile.
    for (int r = r0 + lane; r < re; r += 32) {
        unsigned w[KT_TN];
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) w[j] = b[(long)r * n + col[j]];
        step(w, r);
    }
    kt_skinny_store(acc, c, m, n, row0, col0, lane, 1.0f);
}

#else
#if !KT_B_NK
#error "the skinny variant reads B as [N, K] (int4 weights: GPTQ's words)"
#endif
#define KT_UNROLL (KT_BK / (32 * KT_VEC))
#if KT_UNROLL < 1 || KT_UNROLL * 32 * KT_VEC != KT_BK
#error "the skinny variant's KT_BK must be 32 lanes times 16 bytes times a whole unroll"
#endif

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_gemm(const kt_in* __restrict__ a, const kt_b* __restrict__ b, float* __restrict__ c,
        int m, int n, int k KT_SCALE_PARAMS) {
    const int lane = KT_TID % 32;
    const int row0 = KT_BID_Y * KT_BM;
    const int col0 = KT_BID_X * KT_BN + (KT_TID / 32) * KT_TN;
    int kb, ke;
    kt_split_range(k, &kb, &ke);
    c += (long)KT_BID_Z * m * n;
    // Rows past m or n (bm is a power of two) read the last row and are not written: every
    // load is unconditional, which keeps ptxas from spilling around branches. A's row
    // addresses are computed where used (a pointer per row would hold a register pair each
    // for the whole loop; on CDNA they spilled scalar registers at 16 rows).
    const kt_in* brow[KT_TN];
#pragma unroll
    for (int j = 0; j < KT_TN; ++j) brow[j] = b + (long)min(col0 + j, n - 1) * k;
    float acc[KT_BM][KT_TN];
#pragma unroll
    for (int i = 0; i < KT_BM; ++i)
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) acc[i][j] = 0.0f;
    // One step: this lane's 16 bytes at `x` of every weight row, then of every row of A.
    auto step = [&](const kt_u32x4 (&bw)[KT_TN], int x) {
        float bv[KT_TN][KT_VEC];
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) kt_widen16(bw[j], bv[j]);
#if KT_BLOCK
        // The piece's group: its products summed apart, then scaled into the sums.
        const int g = x / KT_BLOCK;
        float bscale[KT_TN];
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) bscale[j] = KT_B_GROUP_SCALE(min(col0 + j, n - 1), g);
#endif
#pragma unroll
        for (int i = 0; i < KT_BM; ++i) {
            float av[KT_VEC];
            kt_widen16(kt_load16(a + (long)min(row0 + i, m - 1) * k + x), av);
#if KT_BLOCK
            const float ascale = KT_A_GROUP_SCALE(min(row0 + i, m - 1), g);
#pragma unroll
            for (int j = 0; j < KT_TN; ++j) {
                float piece = 0.0f;
#pragma unroll
                for (int e = 0; e < KT_VEC; ++e) piece = fmaf(av[e], bv[j][e], piece);
                acc[i][j] = fmaf(piece, ascale * bscale[j], acc[i][j]);
            }
#else
#pragma unroll
            for (int j = 0; j < KT_TN; ++j)
#pragma unroll
                for (int e = 0; e < KT_VEC; ++e) acc[i][j] = fmaf(av[e], bv[j][e], acc[i][j]);
#endif
        }
    };
    // Whole tiles: the weights' KT_UNROLL · KT_TN loads of 16 bytes a lane issued together,
    // so that many bytes of the weight stream are in flight per lane.
    int k0 = kb;
    for (; k0 + KT_BK <= ke; k0 += KT_BK) {
        kt_u32x4 bw[KT_UNROLL][KT_TN];
#pragma unroll
        for (int u = 0; u < KT_UNROLL; ++u)
#pragma unroll
            for (int j = 0; j < KT_TN; ++j)
                bw[u][j] = kt_load16(brow[j] + k0 + (32 * u + lane) * KT_VEC);
#pragma unroll
        for (int u = 0; u < KT_UNROLL; ++u) step(bw[u], k0 + (32 * u + lane) * KT_VEC);
    }
    // The split's last partial tile: k % KT_VEC == 0, so a 16-byte piece is wholly inside.
    for (int x = k0 + lane * KT_VEC; x < ke; x += 32 * KT_VEC) {
        kt_u32x4 bw[KT_TN];
#pragma unroll
        for (int j = 0; j < KT_TN; ++j) bw[j] = kt_load16(brow[j] + x);
        step(bw, x);
    }
    // For fp8, the lane writing element (i, j) scales it by that row's and column's scales (a
    // lane past the block's elements reads the last ones, unused).
    const float scale = KT_ROW_SCALE(min(row0 + lane / KT_TN, m - 1)) *
                        KT_COL_SCALE(min(col0 + lane % KT_TN, n - 1));
    kt_skinny_store(acc, c, m, n, row0, col0, lane, scale);
}
#endif

#else
#error "KT_VARIANT must be 0 (tiled), 1 (MFMA), 2 (mma), 3 (wgmma) or 4 (skinny)"
#endif

#if KT_SPLIT > 1
// C = the sum of the KT_SPLIT partial slices, added in slice order.
KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_gemm_reduce(const float* __restrict__ ws, float* __restrict__ c, int mn) {
    const long i = (long)KT_BID_X * KT_THREADS + KT_TID;
    if (i >= mn) return;
    float sum = 0.0f;
#pragma unroll
    for (int z = 0; z < KT_SPLIT; ++z) sum += ws[(long)z * mn + i];
    c[i] = sum;
}
#endif
