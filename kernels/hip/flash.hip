// kerntune flash attention, forward (prefill). Q [batch, q_len, q_heads, D], K and V
// [batch, kv_len, kv_heads, D] in f32, f16 or bf16 (KT_DTYPE); out [batch, q_len, q_heads, D]
// in f32 (V and out of KT_DV where value heads are narrower, below). GQA/MQA: query head h reads kv head h / (q_heads / kv_heads). Causal with
// q_len < kv_len aligns the queries to the end of the keys, as in chunked prefill.
//
// Grid (q_heads · batch, ceil(q_len / BR)), one block per KT_BR query rows of one head (half
// as many tiles, two a block, when paired; q_heads · KT_SPLIT · batch wide when the keys are
// split, x = h + q_heads · (run + SPLIT · b)). Block y takes the query tile counted from the
// last: blocks start in x order, then y, so a causal mask's longest tiles, of every head and
// key run, start first and the short ones fill in behind them (kt_tile; NVIDIA and AMD
// both hand out blocks in that order in practice, though neither promises it). Key and
// value tiles of KT_BC rows are staged in LDS and shared by the block's rows; the softmax is
// online, in base 2. Causal blocks stop at the last tile any of their rows may see. With a
// sliding window (KT_WINDOW builds, causal; its size `window` an argument), the query at
// position pos sees keys pos + 1 - window ..= pos: blocks start at the tile holding their
// first row's first key (kt_first_tile), and rows mask the keys their window has passed.
// Builds without KT_WINDOW hold none of that code: its registers made ptxas spill the
// warp-specialized 128 by 128 wgmma tiles. With sinks (KT_SINKS builds), each head's sink
// logit (`sinks`, q_heads floats; unread without) joins a row's sum where the row is
// normalized (kt_sink_weight), and only there. With a soft-cap `softcap` (KT_SOFTCAP builds;
// 0 without), every score is capped (kt_softcap) before its mask. With ALiBi (KT_ALIBI
// builds, causal; `slopes`, q_heads floats, unread without), every score gains its head's
// slope times the key's distance from the row's position (kt_alibi), after the cap: the
// positions are those of the mask (a row's `seen` keys end at its own).
//
//
// KT_VARIANT 0, rows: KT_BR × KT_LANES threads; each query row is held by KT_LANES neighbouring
//   lanes, lane j owning dims j, j + LANES, ... of q and of the output row (so the lanes' LDS
//   reads are consecutive), with dot products summed across the lanes by shuffles. Tiles in
//   LDS as f32, the scale folded into q. Every vendor and dtype.
// KT_VARIANT 1, mma (NVIDIA sm_80+, f16 and bf16): KT_BR / 16 warps, each owning 16 query
//   rows (KT_LANES 2), or KT_BR / 32 warps of 32 rows, two row tiles of 16 (KT_LANES 1); with
//   KT_PAIRED (causal), each block takes two query tiles in turn, x and its mirror, on a
//   grid half as wide: a causal tile's work grows with x, and on an H200 unpaired blocks left
//   the multiprocessors idle for nearly half the kernel, waiting for the last tiles. With
//   KT_SPLIT > 1, each query tile's keys are split over that many blocks instead, each writing
//   its rows' unnormalized partial results for kt_flash_reduce to combine.
//   S = Q·Kᵀ by mma.sync.m16n8k16 with Q's fragments in registers (or, 32 rows a warp past
//   head size 64, read from a Q tile in shared memory) and K 16-bit in shared memory; the
//   scores' accumulators are the A fragments of P·V once rounded to 16 bits (the m16n8
//   accumulator layout is the m16k16 operand layout, two tiles at a time). K and V tiles
//   arrive by 16-byte cp.async, each waited for only when used (the next K tile loads during
//   the softmax and P·V, the next V tile during Q·Kᵀ), and B fragments come by ldmatrix (V's
//   transposed). A thread holds two rows of each row tile (g and g + 8 of its 16); row maxima
//   and sums combine the four threads of a row by shuffles. With KT_WG (sm_90), both products
//   by warpgroup MMA instead (below): the same fragments and accumulators, 64 rows a
//   warpgroup.
// KT_VARIANT 2, MFMA (AMD CDNA2/3, f16 and bf16): KT_BR / 32 waves, each owning 32 query rows.
//   The transposed scores Sᵀ = K·Qᵀ by v_mfma_f32_32x32x8 (K 16-bit in LDS as the A operand,
//   Qᵀ's fragments in registers), so that a lane's accumulators hold one query's scores for
//   the keys that lane passes as the B operand of Oᵀ += Vᵀ·Pᵀ: P is rounded to 16 bits in
//   place, Vᵀ read from LDS as the A operand. A lane holds one query (lane % 32); its two
//   half-waves combine maxima and sums by one shuffle.
#include "prelude.h"
#if KT_FP8_IN
#error "fp8 inputs (KT_DTYPE 3, 4) are GEMM operands; attention takes fp8 KV caches (KT_KV_FP8)"
#endif

#ifndef KT_BR
#error "KT_BR, KT_BC, KT_LANES, KT_D and KT_VARIANT must be defined"
#endif
// Value heads narrower than the keys (KT_DV, latent attention's prefill: keys of 192, values
// of 128): V is [batch, kv_len, kv_heads, KT_DV] and out [batch, q_len, q_heads, KT_DV].
#ifndef KT_DV
#define KT_DV KT_D
#endif
#if KT_DV % KT_LANES != 0
#error "KT_LANES must divide KT_DV"
#endif
#if KT_D % KT_LANES != 0
#error "KT_LANES must divide KT_D"
#endif

// The query tile of block y, of `launched` along y: the last first. On an H200 a
// 2048-query Llama-70B TP8 prefill has 128 tiles of 128 rows for 132 multiprocessors; split
// over two blocks each, first tiles first left the longest runs to start behind the short
// ones (a greedy schedule of its 256 blocks ends after 14 tiles' time, against 9 longest
// first, where the whole divided evenly is 8.2).
KT_DEVICE int kt_tile(int launched) { return launched - 1 - KT_BID_Y; }

#ifndef KT_WINDOW
#define KT_WINDOW 0
#endif

// The first key of the tile holding the first key query `i` (shifted by `shift`) sees in its
// window (without one, key 0).
KT_DEVICE int kt_first_tile(int i, int shift, int window) {
    return KT_WINDOW ? max(0, i + shift + 1 - window) / KT_BC * KT_BC : 0;
}

// How far back query rows reach: the window, or without one further than any key.
KT_DEVICE int kt_reach(int window) { return KT_WINDOW ? window : 0x40000000; }

#if KT_VARIANT == 0

#define KT_THREADS (KT_BR * KT_LANES)
#define KT_PER_LANE (KT_D / KT_LANES)
#define KT_PER_LANE_V (KT_DV / KT_LANES)

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_flash(const kt_in* __restrict__ q, const kt_in* __restrict__ k, const kt_in* __restrict__ v,
         float* __restrict__ out, int q_len, int kv_len, int q_heads, int kv_heads, int causal,
         float scale, int window, const float* __restrict__ sinks, float softcap,
         const float* __restrict__ slopes) {
    KT_SHARED float ks[KT_BC][KT_D];
    KT_SHARED float vs[KT_BC][KT_DV];
    const int tid = KT_TID;
    const int lane = tid % KT_LANES;
    const int h = KT_BID_X % q_heads;
    const int b = KT_BID_X / q_heads;
    const int kvh = h / (q_heads / kv_heads);
    const int qt = kt_tile((q_len + KT_BR - 1) / KT_BR);
    const int i = qt * KT_BR + tid / KT_LANES;
    const bool live = i < q_len;
    const float log2e = 1.4426950408889634f;
    // The cap in the scores' units (scale · log2(e) folded into q).
    const float cap_unit = softcap * log2e;
    const float alibi_unit = kt_alibi_unit(slopes, h, log2e);

    float qr[KT_PER_LANE], o[KT_PER_LANE_V];
    const long row = ((long)b * q_len + (live ? i : 0)) * q_heads + h;
#pragma unroll
    for (int x = 0; x < KT_PER_LANE; ++x)
        qr[x] = live ? kt_load(q, row * KT_D + lane + KT_LANES * x) * scale * log2e : 0.0f;
#pragma unroll
    for (int x = 0; x < KT_PER_LANE_V; ++x) o[x] = 0.0f;
    float mx = -KT_INF, sum = 0.0f;
    // Keys row i may see: all, or up to its position aligned to the end of the keys, and
    // with a window from `reach` keys before that end.
    const int shift = kv_len - q_len;
    const int seen = causal ? min(kv_len, i + shift + 1) : kv_len;
    const int reach = kt_reach(window);
    const int block_last = min(q_len, qt * KT_BR + KT_BR) - 1;
    const int block_seen = causal ? min(kv_len, block_last + shift + 1) : kv_len;

    for (int j0 = kt_first_tile(qt * KT_BR, shift, window); j0 < block_seen; j0 += KT_BC) {
        for (int e = tid; e < KT_BC * KT_D; e += KT_THREADS) {
            const int r = e / KT_D, x = e % KT_D;
            const int j = j0 + r;
            const long at = ((long)b * kv_len + j) * kv_heads + kvh;
            ks[r][x] = j < kv_len ? kt_load(k, at * KT_D + x) : 0.0f;
            if (x < KT_DV) vs[r][x] = j < kv_len ? kt_load(v, at * KT_DV + x) : 0.0f;
        }
        KT_SYNC();
        float s[KT_BC];
        float tile_max = -KT_INF;
#pragma unroll
        for (int r = 0; r < KT_BC; ++r) {
            float dot = 0.0f;
#pragma unroll
            for (int x = 0; x < KT_PER_LANE; ++x)
                dot = fmaf(qr[x], ks[r][lane + KT_LANES * x], dot);
#pragma unroll
            for (int m = KT_LANES / 2; m > 0; m /= 2) dot += KT_SHFL_XOR(dot, m);
            const bool visible = live && j0 + r < seen && (!KT_WINDOW || j0 + r >= seen - reach);
            s[r] = visible ? kt_softcap(dot, cap_unit) + kt_alibi(alibi_unit, j0 + r, seen - 1)
                           : -KT_INF;
            tile_max = fmaxf(tile_max, s[r]);
        }
        if (tile_max > -KT_INF) {
            const float m_new = fmaxf(mx, tile_max);
            const float correction = exp2f(mx - m_new);
            sum *= correction;
#pragma unroll
            for (int x = 0; x < KT_PER_LANE_V; ++x) o[x] *= correction;
#pragma unroll
            for (int r = 0; r < KT_BC; ++r) {
                const float p = exp2f(s[r] - m_new);
                sum += p;
#pragma unroll
                for (int x = 0; x < KT_PER_LANE_V; ++x)
                    o[x] = fmaf(p, vs[r][lane + KT_LANES * x], o[x]);
            }
            mx = m_new;
        }
        KT_SYNC();
    }
    if (live) {
        const float total = sum + kt_sink_weight(sinks, h, mx);
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
#pragma unroll
        for (int x = 0; x < KT_PER_LANE_V; ++x) out[row * KT_DV + lane + KT_LANES * x] = o[x] * inv;
    }
}

#elif KT_VARIANT == 1

#if !defined(KT_MMA)
#error "the mma variant needs NVIDIA sm_80+ (or the host emulator of one)"
#endif
#if KT_DTYPE == 0
#error "the mma variant takes f16 or bf16 inputs"
#endif
#if KT_D % 16 != 0 || KT_DV % 16 != 0 || KT_BR % 16 != 0 || KT_BC % 16 != 0
#error "the mma variant needs KT_D, KT_DV, KT_BR and KT_BC multiples of 16"
#endif
#ifndef KT_PAIRED
#define KT_PAIRED 0
#endif
#ifndef KT_SPLIT
#define KT_SPLIT 1
#endif
#if KT_SPLIT > 1 && KT_PAIRED
#error "paired query tiles take no split of the keys: KT_SPLIT must be 1"
#endif

#ifndef KT_WG
#define KT_WG 0
#endif
#ifndef KT_SPEC
#define KT_SPEC 0
#endif
#ifndef KT_PINGPONG
#define KT_PINGPONG 0
#endif
#if KT_PINGPONG && !KT_SPEC
#error "the turns (KT_PINGPONG) are the warp-specialized tiles' multiplying warpgroups'"
#endif
#ifndef KT_TMA
#define KT_TMA 0
#endif
#if KT_TMA && !KT_SPEC
#error "the tensor-memory copies (KT_TMA) are the warp-specialized tiles' producer's"
#endif

#ifndef KT_SPLIT_REGS
#define KT_SPLIT_REGS 0
#endif
// Row tiles of 16 a warp (KT_MR): one with KT_LANES 2 (two threads a row), two with KT_LANES
// 1 (32 rows a warp, FlashAttention-2's layout). Each K or V fragment read from shared
// memory then feeds both row tiles' products: at 16 rows a warp every ldmatrix.x4 (512
// bytes, 4 cycles of a multiprocessor's shared memory) serves two mma.sync, about what the
// tensor cores take in 3, and a 128 by 128 tile's eight warps read 512 KiB. Q's fragments
// stay in registers up to head size 64 (32 a thread); beyond, O and S need the
// registers, and Q waits in shared memory, its fragments read by ldmatrix each step. (16-row
// warps keep Q in registers at every head size, as the launch's shared bytes assume.)
#if KT_LANES == 2
#define KT_MR 1
#elif KT_LANES == 1
#define KT_MR 2
#else
#error "the mma variant takes KT_LANES 2 (16 rows a warp) or 1 (32 rows a warp)"
#endif
#if KT_MR > 1 && (KT_WG || KT_BR % 32 != 0)
#error "32 rows a warp (KT_LANES 1) are mma.sync tiles of whole warps: KT_BR % 32 == 0, no KT_WG"
#endif
#define KT_Q_SHARED (KT_MR > 1 && KT_D > 64)
#if KT_SPEC
// Warp-specialized (KT_SPEC, with KT_WG): a producer warpgroup before the two multiplying
// ones copies each K and V tile into one of KT_STAGES stages; the multiplying warpgroups
// (64 query rows each) share no block barrier, each stage handed over by mbarriers (full once
// the producer's copies of it have landed; empty once both warpgroups' products with it are
// done, one thread of each arriving), so one warpgroup's softmax can run beside the other's
// products while the next tiles arrive, the overlap FlashAttention-3 builds on. With
// KT_SPLIT_REGS (128-key tiles or head size 128) the producer, which needs few registers,
// gives them to the others (setmaxnreg): 128 · 40 + 256 · 232 of the 65536, all 168 a thread
// the block launches with (the build says so, and the compile is refused if ptxas leaves the
// kernel fewer: the pool would not hold what the multiplying warpgroups ask for). At 64 by
// 64 every thread fits in its even share. With KT_PINGPONG the two multiplying warpgroups
// also take turns to issue their products (FlashAttention-3's ping-pong), handed over by two
// more mbarriers: warpgroup 0 first, each passing the turn once its products are issued, so
// one's products have the tensor cores while the other's softmax runs; the turns order only
// the issue, never data. With KT_TMA the producer's first thread copies by the tensor-memory
// copy engine instead: a stage is D / 64 boxes of K and as many of V (4D tensor maps of
// [batch, kv_len, kv_heads, D], a box one head's BC keys by 64 dims, written 128-byte
// swizzled as the descriptors read them, zeros past the keys), their bytes counted on the
// stage's full mbarrier; it needs so few registers that the split is 24 / 240.
#if !KT_WG || KT_PAIRED || KT_BR != 128
#error "the warp-specialized flash takes the wgmma tiles of 128 rows, unpaired"
#endif
#define KT_STAGES 2
#define KT_THREADS (2 * KT_BR + 128)
#define KT_COPIERS 128
#else
#define KT_STAGES 1
#define KT_THREADS (KT_LANES * KT_BR)
#define KT_COPIERS KT_THREADS
#endif
#define KT_QK (KT_D / 16)   // k steps of Q·Kᵀ
#define KT_ST (KT_BC / 8)   // 8-key tiles of S
#define KT_OT (KT_DV / 8)   // 8-dim tiles of O
#if KT_WG
// KT_WG (NVIDIA sm_90): the two products by warpgroup MMA instead, wgmma.mma_async with A
// from registers (Q's fragments, then P's: the same m16k16 fragments as mma.sync's, a warp's
// 16 rows each, a warpgroup's 64) and B from shared memory: K k-major for S = Q·Kᵀ (all BC
// keys in one instruction a 16-dim step), V n-major for O += P·V (all D dims in one a 16-key
// step). K and V tiles in rows of 64 dims (128 bytes, swizzled as the descriptors' 128-byte
// mode reads them), D / 64 column blocks of BC rows: dim x of key j at element
// (x / 64)·BC·64 + j·64 + x % 64, its 16-byte piece XORed with j % 8 (address bits 7 to 9);
// the tiles start on a 1024-byte boundary (1 KiB more shared memory to round up to one).
#if !defined(KT_WGMMA)
#error "the wgmma flash needs NVIDIA sm_90a (or the host emulator of one)"
#endif
#if (KT_D != 64 && KT_D != 128) || (KT_BC != 64 && KT_BC != 128) || KT_BR % 64 != 0
#error "the wgmma flash takes KT_D and KT_BC of 64 or 128 and whole warpgroups (KT_BR % 64 == 0)"
#endif
#if KT_DV != KT_D
#error "the wgmma flash takes value heads as wide as the keys (KT_DV == KT_D)"
#endif
#define KT_TILE (KT_BC * KT_D)
#define KT_ALIGN 1024
#if !defined(KT_DYN_LDS) || \
    KT_STAGES * 2 * 2 * KT_TILE + KT_ALIGN + 16 * KT_STAGES * KT_SPEC + 16 * KT_PINGPONG != KT_DYN_LDS
#error "KT_DYN_LDS must be the bytes of the K and V tiles, their alignment and mbarriers, as the launch passes them"
#endif
#else
// K and V tiles [BC][D + 8] each (V's first DV dims used), then with KT_Q_SHARED the Q tile
// [BR][D + 8], in dynamic
// shared memory of KT_DYN_LDS bytes (the launch passes the same). 8 halves of padding put
// the 8 rows of one ldmatrix on distinct banks and keep every row 16-byte aligned for
// cp.async.
#define KT_LDD (KT_D + 8)
#if !defined(KT_DYN_LDS) || 2 * (2 * KT_BC + KT_BR * KT_Q_SHARED) * KT_LDD != KT_DYN_LDS
#error "KT_DYN_LDS must be the bytes of the K and V (and Q) tiles, as the launch passes them"
#endif
#endif

// Split (KT_SPLIT > 1): the keys' tiles fall into KT_SPLIT equal runs of whole tiles, the
// same for every query tile, and the run `c` of the block's x (h + q_heads · (c + SPLIT · b))
// is its part of its query tile. Key run c spans keys [c · kt_run(kv_len), (c + 1) · kt_run(kv_len)).
KT_DEVICE int kt_run(int kv_len) {
    return KT_BC * (((kv_len + KT_BC - 1) / KT_BC + KT_SPLIT - 1) / KT_SPLIT);
}

// Split, `part_out` holds the runs' unnormalized output rows, slot
// ((b · SPLIT + c) · q_len + i) · q_heads + h (the block's rows) of KT_DV floats each, and
// `part_max` / `part_sum` the rows' maxima (of the scaled scores, base 2) and sums in the
// same slots; kt_flash_reduce combines them. A row whose keys all lie in the first run is
// written to `out` by that run's block and left alone by kt_flash_reduce: in a causal mask
// split in two, half the rows, whose partial results would otherwise cross the memory twice.
KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_flash(const kt_in* __restrict__ q, const kt_in* __restrict__ k, const kt_in* __restrict__ v,
         float* __restrict__ out,
#if KT_SPLIT > 1
         float* __restrict__ part_out, float* __restrict__ part_max,
         float* __restrict__ part_sum,
#endif
         int q_len, int kv_len, int q_heads, int kv_heads, int causal, float scale, int window,
         const float* __restrict__ sinks, float softcap, const float* __restrict__ slopes
#if KT_TMA
         ,
         const KT_GRID_CONSTANT kt_tmap k_map, const KT_GRID_CONSTANT kt_tmap v_map
#endif
) {
    // Dynamic shared memory: 128-key tiles of head size 128 pass the 48 KiB a block declares
    // statically.
    KT_DYNAMIC_SHARED(smem);
#if KT_WG
    // Stage st's K tile, then its V tile (one stage unless warp-specialized).
    unsigned short* const stages =
        reinterpret_cast<unsigned short*>(smem + (KT_ALIGN - kt_smem(smem) % KT_ALIGN) % KT_ALIGN);
    unsigned short* ks = stages;
    [[maybe_unused]] unsigned short* vs = ks + KT_TILE;
#else
    unsigned short(*ks)[KT_LDD] = reinterpret_cast<unsigned short(*)[KT_LDD]>(smem);
    unsigned short(*vs)[KT_LDD] = reinterpret_cast<unsigned short(*)[KT_LDD]>(smem + 2 * KT_BC * KT_LDD);
    [[maybe_unused]] unsigned short(*qs)[KT_LDD] =
        reinterpret_cast<unsigned short(*)[KT_LDD]>(smem + 4 * KT_BC * KT_LDD);
#endif
    // Warp-specialized, the producer's threads are -128 .. -1, the multiplying ones from 0.
    const int tid = KT_TID - 128 * KT_SPEC;
    const int lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    // x = h + q_heads · (run + SPLIT · b).
    const int h = KT_BID_X % q_heads;
    const int b = KT_BID_X / q_heads / KT_SPLIT;
    const int kvh = h / (q_heads / kv_heads);
    const float qscale = scale * 1.4426950408889634f;
    // The head's ALiBi slope in the unscaled scores' units, read once: a float held through
    // the key loop, where the slopes' address and the head were two registers more.
    const float alibi_unit = kt_alibi_unit(slopes, h, 1.0f / scale);
    const int shift = kv_len - q_len;
#if KT_SPLIT > 1
    const int run = KT_BID_X / q_heads % KT_SPLIT;
    const int run_begin = run * kt_run(kv_len);
    const int run_end = run_begin + kt_run(kv_len);
#else
    const int run_begin = 0, run_end = kv_len;
#endif
    // Paired (KT_PAIRED, causal only): this block takes query tile x, then its mirror
    // tiles - 1 - x, so that every block sees about the same number of keys; else one tile.
    // Passing to the mirror needs no barrier of its own: the last key tile's closing barrier
    // has every warp done with the shared tiles before the mirror's first copies.
    const int tiles = (q_len + KT_BR - 1) / KT_BR;
    const int first = kt_tile(KT_PAIRED ? (tiles + 1) / 2 : tiles);
#pragma unroll 1
    for (int pass = 0; pass <= KT_PAIRED; ++pass) {
        const int qt = pass == 0 ? first : tiles - 1 - first;
        if (pass == 1 && qt <= first) break;  // the middle tile of an odd count: done once
        const int block_last = min(q_len, qt * KT_BR + KT_BR) - 1;
        // Keys this block reads: its run's, up to the last any of its rows may see. A run
        // wholly past them leaves the block nothing: its rows' slots are never read.
        const int block_seen = min(run_end, causal ? min(kv_len, block_last + shift + 1) : kv_len);
        // And from the tile holding the first key its first row sees (its window's start).
        const int key_begin = max(run_begin, kt_first_tile(qt * KT_BR, shift, window));
        if (KT_SPLIT > 1 && key_begin >= block_seen) return;
        // Key or value rows j0 .. j0 + BC (of `dims` values: KT_D, or KT_DV for values) of this
        // KV head into `dst`, 16 bytes a copy; rows past the keys zero-filled. Consecutive
        // threads take consecutive pieces of a row.
#if KT_WG
        auto load = [&](unsigned short* dst, const kt_in* src, int j0, int dims) {
#else
        auto load = [&](unsigned short (*dst)[KT_LDD], const kt_in* src, int j0, int dims) {
#endif
            // The tile's shared address and this KV head's first key, once: each piece is
            // then an offset from both (kt_cp_async16_at).
            const unsigned to = kt_smem(dst);
            const kt_in* const head = src + ((long)b * kv_len * kv_heads + kvh) * dims;
            for (int e = KT_TID % KT_COPIERS; e < KT_BC * (dims / 8); e += KT_COPIERS) {
                const int r = e / (dims / 8), x = 8 * (e % (dims / 8));
                const int j = j0 + r;
                const bool in = j < kv_len;
#if KT_WG
                const int byte = 2 * ((x / 64) * KT_BC * 64 + r * 64 + x % 64);
                const unsigned at = to + (byte ^ (((byte >> 7) & 7) << 4));
#else
                const unsigned at = to + 2 * (r * KT_LDD + x);
#endif
                kt_cp_async16_at(at, head + (long)(in ? j : 0) * kv_heads * dims + x, in ? 16 : 0);
            }
        };
#if KT_SPEC
        unsigned long long* const full =
            reinterpret_cast<unsigned long long*>(stages + KT_STAGES * 2 * KT_TILE);
        unsigned long long* const empty = full + KT_STAGES;
        [[maybe_unused]] unsigned long long* const turn = empty + KT_STAGES;
        if (KT_TID == 0) {
            for (int st = 0; st < KT_STAGES; ++st) {
                // Full: the producer's 128 cp.async arrivals, or its one thread's expect_tx.
                kt_mbar_init(&full[st], KT_TMA ? 1 : 128);
                kt_mbar_init(&empty[st], KT_BR / 64);
            }
#if KT_PINGPONG
            // One arrival a turn: the other warpgroup's first thread, its products issued.
            for (int w = 0; w < 2; ++w) kt_mbar_init(&turn[w], 1);
#endif
            kt_fence_mbar_init();
        }
        KT_SYNC();
        if (tid < 0) {
            // The producer: key tile it into stage it % STAGES in round it / STAGES, once
            // both warpgroups are done with the tile before it there (the first round finds
            // every stage empty).
#if KT_SPLIT_REGS
            kt_setmaxnreg_dec<KT_TMA ? 24 : 40>();
#endif
#if KT_TMA
            if (tid != -128) return;
            for (int j0 = key_begin, it = 0; j0 < block_seen; j0 += KT_BC, ++it) {
                const int st = it % KT_STAGES;
                kt_mbar_wait(&empty[st], ((it / KT_STAGES) & 1) ^ 1);
                kt_mbar_expect_tx(&full[st], 2 * KT_TILE * 2);
                // Not unrolled: unrolled, ptxas spilled two registers of the split builds.
#pragma unroll 1
                for (int cb = 0; cb < KT_D / 64; ++cb) {
                    kt_tma_load_4d(stages + 2 * st * KT_TILE + cb * KT_BC * 64, &k_map, 64 * cb,
                                   kvh, j0, b, &full[st]);
                    kt_tma_load_4d(stages + (2 * st + 1) * KT_TILE + cb * KT_BC * 64, &v_map,
                                   64 * cb, kvh, j0, b, &full[st]);
                }
            }
#else
            for (int j0 = key_begin, it = 0; j0 < block_seen; j0 += KT_BC, ++it) {
                const int st = it % KT_STAGES;
                kt_mbar_wait(&empty[st], ((it / KT_STAGES) & 1) ^ 1);
                load(stages + 2 * st * KT_TILE, k, j0, KT_D);
                load(stages + (2 * st + 1) * KT_TILE, v, j0, KT_DV);
                kt_cp_async_mbar_arrive(&full[st]);
            }
            kt_cp_async_wait_all();
#endif
            return;
        }
#if KT_SPLIT_REGS
        kt_setmaxnreg_inc<KT_TMA ? 240 : 232>();
#endif
#endif
        const int row0 = qt * KT_BR + (tid / 32) * 16 * KT_MR;

        // Row slot 2m + r of this thread is row g + 8·r of its warp's row tile m (16 rows
        // each); `seen` keys of each are visible.
        int seen[2 * KT_MR];
        auto row = [&](int m, int r) { return row0 + 16 * m + g + 8 * r; };
        // Row slot 2m + r's (batch, position, head) row, and its first element in q and in out
        // (whose rows hold KT_DV), computed where used: held through the key loop, its
        // registers made the split TMA builds spill.
        auto slot = [&](int m, int r) {
            const int i = row(m, r);
            return ((long)b * q_len + (i < q_len ? i : 0)) * q_heads + h;
        };
        auto qrow = [&](int m, int r) { return slot(m, r) * KT_D; };
        auto orow = [&](int m, int r) { return slot(m, r) * KT_DV; };
#pragma unroll
        for (int x = 0; x < 2 * KT_MR; ++x) {
            const int i = row(x / 2, x % 2);
            seen[x] = i >= q_len ? 0 : (causal ? min(kv_len, i + shift + 1) : kv_len);
        }
#if !KT_Q_SHARED
        // Q's A fragments: register x of step s of row tile m holds row g + 8·(x % 2), dims
        // 16s + 2t + 8·(x / 2) and the next.
        unsigned qf[KT_MR][KT_QK][4];
#pragma unroll
        for (int m = 0; m < KT_MR; ++m)
#pragma unroll
            for (int s = 0; s < KT_QK; ++s)
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    const int r = x % 2;
                    const long at = qrow(m, r) + 16 * s + 2 * t + 8 * (x / 2);
                    qf[m][s][x] = row(m, r) < q_len
                                      ? (unsigned)q[at] | ((unsigned)q[at + 1] << 16)
                                      : 0u;
                }
#endif

        float o[KT_MR][KT_OT][4];
#pragma unroll
        for (int m = 0; m < KT_MR; ++m)
#pragma unroll
            for (int d = 0; d < KT_OT; ++d)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[m][d][e] = 0.0f;
        float mx[2 * KT_MR], sum[2 * KT_MR];
#pragma unroll
        for (int x = 0; x < 2 * KT_MR; ++x) {
            mx[x] = -KT_INF;
            sum[x] = 0.0f;
        }

        // Keys every row of the warp sees: tiles wholly below them need no mask, nor, with a
        // window, from the first its last row sees on (`passed`). A row of `seen` keys sees
        // from key seen - reach on (its seen is its position + 1).
        const int open = row0 + 16 * KT_MR - 1 < q_len
                             ? (causal ? min(kv_len, row0 + shift + 1) : kv_len)
                             : 0;
        const int reach = kt_reach(window);
        const int passed = max(0, row0 + 16 * KT_MR + shift - reach);
        // One key tile's online softmax: its scores `s` (from key j0) masked past each row's
        // last visible key, the rows' maxima and sums brought up to date, `s` made the tile's
        // probabilities, and `corr` what O's rows are to be scaled by (left to the caller:
        // pipelined, O's products may still be in flight). The scores stay unscaled until the
        // exponent, which takes scale and maximum in one multiply-add (the scale is positive:
        // the maximum of the scaled scores is the scaled maximum); only tiles past a row's
        // last key are masked, the causal diagonal's and the keys' end, and with a window
        // tiles holding keys some row's window has passed.
        // Row tile m's rows are slots 2m and 2m + 1.
        auto softmax = [&](float (&s)[KT_ST][4], int m, int j0, float (&corr)[2]) {
            if (KT_SOFTCAP) {
                // The cap in the unscaled scores' units.
                const float cap_unit = softcap / scale;
#pragma unroll
                for (int n = 0; n < KT_ST; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[n][e] = kt_softcap(s[n][e], cap_unit);
            }
            if (KT_ALIBI) {
                // Each row's bias at this thread's first key of the tile (a row at position
                // seen - 1, causal), then a whole number of slopes more a key: two registers
                // where a distance a score made the warp-specialized tiles spill.
                float at[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) at[r] = kt_alibi(alibi_unit, j0 + 2 * t, seen[2 * m + r] - 1);
#pragma unroll
                for (int n = 0; n < KT_ST; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        s[n][e] += fmaf(alibi_unit, (float)(8 * n + e % 2), at[e / 2]);
            }
            if (j0 + KT_BC > open || (KT_WINDOW && j0 < passed)) {
#pragma unroll
                for (int n = 0; n < KT_ST; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int j = j0 + 8 * n + 2 * t + e % 2, sn = seen[2 * m + e / 2];
                        if (j >= sn || (KT_WINDOW && j < sn - reach)) s[n][e] = -KT_INF;
                    }
            }
            float tile_max[2] = {-KT_INF, -KT_INF};
#pragma unroll
            for (int n = 0; n < KT_ST; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[n][e]);
            float base[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // The four threads of a row are lanes 4g .. 4g + 3.
                tile_max[r] = fmaxf(tile_max[r], KT_SHFL_XOR(tile_max[r], 1));
                tile_max[r] = fmaxf(tile_max[r], KT_SHFL_XOR(tile_max[r], 2));
                const float m_new = fmaxf(mx[2 * m + r], tile_max[r] * qscale);
                // A row with nothing visible yet keeps zeros: exp2(-inf - 0) = 0.
                base[r] = m_new == -KT_INF ? 0.0f : m_new;
                corr[r] = kt_exp2(mx[2 * m + r] - base[r]);
                sum[2 * m + r] *= corr[r];
                mx[2 * m + r] = m_new;
            }
#pragma unroll
            for (int n = 0; n < KT_ST; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[n][e] = kt_exp2(fmaf(s[n][e], qscale, -base[e / 2]));
                    sum[2 * m + e / 2] += s[n][e];
                }
        };
        auto rescale = [&](int m, const float (&corr)[2]) {
#pragma unroll
            for (int d = 0; d < KT_OT; ++d)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[m][d][e] *= corr[e / 2];
        };
#if KT_WG
        // O's accumulators are the warpgroup's 64 × D, dims 8d .. 8d + 7 in 4d .. 4d + 3 as
        // mma.sync's; S tile n of 8 keys is accumulators 4n .. 4n + 3 of its 64 × BC.
        float(&ow)[KT_D / 2] = *reinterpret_cast<float(*)[KT_D / 2]>(&o[0][0][0]);
        auto flat = [](float(&s)[KT_ST][4]) -> float(&)[KT_BC / 2] {
            return *reinterpret_cast<float(*)[KT_BC / 2]>(&s[0][0]);
        };
        // S = Q·Kᵀ with the K tile at `ks` into `s`, issued (the caller commits); the step's
        // 16 dims sit in one 128-byte row.
        auto issue_scores = [&](float (&s)[KT_ST][4]) {
#pragma unroll
            for (int n = 0; n < KT_ST; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
            kt_wgmma_fence();
#pragma unroll
            for (int st = 0; st < KT_QK; ++st)
                kt_wgmma_rs<0>(flat(s), qf[0][st],
                               kt_wgmma_desc(ks + (16 * st / 64) * KT_BC * 64 + 16 * st % 64, 16,
                                             1024, 1));
        };
        // P's A fragments for keys 16c .. 16c + 15 are S tiles 2c and 2c + 1, all packed
        // before the products are issued: the instructions read them after their issue, so
        // each step's keep registers of their own until the wait.
        unsigned pw[KT_BC / 16][4];
        auto pack = [&](const float (&s)[KT_ST][4]) {
#pragma unroll
            for (int c = 0; c < KT_BC / 16; ++c) {
                pw[c][0] = kt_pack2(s[2 * c][0], s[2 * c][1]);
                pw[c][1] = kt_pack2(s[2 * c][2], s[2 * c][3]);
                pw[c][2] = kt_pack2(s[2 * c + 1][0], s[2 * c + 1][1]);
                pw[c][3] = kt_pack2(s[2 * c + 1][2], s[2 * c + 1][3]);
            }
        };
        // O += P·V with the V tile at `vt`, issued (the caller commits). V n-major: a 16-key
        // step's rows 16c .. 16c + 15 of column block 0, the column blocks (64 dims, the
        // swizzle atom) BC rows apart (the leading offset), groups of 8 keys 1024 bytes apart.
        auto issue_products = [&](const unsigned short* vt) {
            kt_wgmma_fence();
#pragma unroll
            for (int c = 0; c < KT_BC / 16; ++c)
                kt_wgmma_rs<1>(ow, pw[c], kt_wgmma_desc(vt + 16 * c * 64, 2 * KT_BC * 64, 1024, 1));
        };
#endif
#if KT_SPEC
        // Pipelined within each warpgroup too (FlashAttention-3's second overlap): the next
        // tile's scores are issued before this tile's products, so their softmax runs while
        // the products do, and O is rescaled once the products are done. `s` holds a tile's
        // scores, then its probabilities until they are packed.
        const int key_tiles = block_seen > key_begin ? (block_seen - key_begin + KT_BC - 1) / KT_BC : 0;
        // Tile `it`'s K tile, once it and its V tile (after it) have landed in their stage;
        // the proxy fence hands the producer's copies to wgmma's reads.
        auto arrived = [&](int it) {
            const int stage = it % KT_STAGES;
            kt_mbar_wait(&full[stage], (it / KT_STAGES) & 1);
#if !KT_TMA
            kt_fence_async_shared();  // TMA writes through the async proxy already
#endif
            return stages + 2 * stage * KT_TILE;
        };
#if KT_PINGPONG
        // Turn k of warpgroup w waits for the other's turn k (w = 1) or k - 1 (w = 0: its
        // first wait, on parity 1 of a fresh mbarrier, returns at once); both take key_tiles
        // turns, the first tile's scores and then one a tile with the next tile's scores. The
        // last tile's products go without: a wait there made ptxas spill two registers of
        // the split builds of head size 64. The turn passes without a branch: one between a
        // wgmma's issue and its wait would make ptxas serialize them.
        auto take_turn = [&](int k) {
            const int wg = tid / 128;
            kt_mbar_wait(&turn[wg], (k & 1) ^ (wg == 0 ? 1 : 0));
        };
        auto pass_turn = [&] { kt_mbar_arrive_if(&turn[1 - tid / 128], tid % 128 == 0); };
#else
        auto take_turn = [](int) {};
        auto pass_turn = [] {};
#endif
        float s[KT_ST][4];
        float corr[2];
        if (key_tiles > 0) {
            ks = arrived(0);
            take_turn(0);
            issue_scores(s);
            kt_wgmma_commit();
            pass_turn();
            kt_wgmma_wait<0>();
            kt_wgmma_fence_operand(flat(s));
            softmax(s, 0, key_begin, corr);  // O is zero yet: nothing to rescale
        }
        // Every tile but the last has a next, its scores issued beside this tile's products
        // (the last's, below, without: no branch inside the pipeline, which ptxas would
        // otherwise serialize).
        for (int it = 0; it + 1 < key_tiles; ++it) {
            // This tile's probabilities packed, `s` takes the next tile's scores, issued
            // first: commit groups complete in order, and the softmax waits for them.
            pack(s);
            const unsigned short* const v_tile = ks + KT_TILE;
            ks = arrived(it + 1);
            take_turn(it + 1);
            issue_scores(s);
            kt_wgmma_commit();
            issue_products(v_tile);
            kt_wgmma_commit();
            pass_turn();
            kt_wgmma_wait<1>();  // the next tile's scores; this tile's products run on
            kt_wgmma_fence_operand(flat(s));
            softmax(s, 0, key_begin + (it + 1) * KT_BC, corr);
            kt_wgmma_wait<0>();
            kt_wgmma_fence_operand(ow);
            // The warpgroup's products with this stage are done: back to the producer.
            if (tid % 128 == 0) kt_mbar_arrive(&empty[it % KT_STAGES]);
            rescale(0, corr);
        }
        if (key_tiles > 0) {
            pack(s);
            issue_products(ks + KT_TILE);
            kt_wgmma_commit();
            kt_wgmma_wait<0>();
            kt_wgmma_fence_operand(ow);
        }
#else
        // K and V tiles travel as separate commit groups, so each is waited for only when used:
        // the next K tile loads during the softmax and P·V, the next V tile during Q·Kᵀ. A
        // shared Q tile goes first, in a group of its own, waited for with the first K tile.
        if (block_seen > key_begin) {
#if KT_Q_SHARED
            for (int e = KT_TID; e < KT_BR * (KT_D / 8); e += KT_THREADS) {
                const int r = e / (KT_D / 8), x = 8 * (e % (KT_D / 8));
                const int i = qt * KT_BR + r;
                const long at = (((long)b * q_len + (i < q_len ? i : 0)) * q_heads + h) * KT_D + x;
                kt_cp_async16(&qs[r][x], q + at, i < q_len ? 16 : 0);
            }
            kt_cp_async_commit();
#endif
            load(ks, k, key_begin, KT_D);
            kt_cp_async_commit();
            load(vs, v, key_begin, KT_DV);
            kt_cp_async_commit();
        }
#if !KT_WG
        // This lane's ldmatrix row addresses in the K, V (and Q) tiles, each fragment's a
        // constant past them (kt_ldmatrix_x4_at).
        const unsigned k_at = kt_smem(&ks[8 * (lane / 16) + lane % 8][8 * ((lane / 8) % 2)]);
        const unsigned v_at = kt_smem(&vs[8 * ((lane / 8) % 2) + lane % 8][8 * (lane / 16)]);
#if KT_Q_SHARED
        const unsigned q_at =
            kt_smem(&qs[row0 - qt * KT_BR + 8 * ((lane / 8) % 2) + lane % 8][8 * (lane / 16)]);
#endif
#endif
        for (int j0 = key_begin; j0 < block_seen; j0 += KT_BC) {
            kt_cp_async_wait<1>();  // this K tile (its V tile may still be in flight)
#if KT_WG
            kt_fence_async_shared();  // the copies, to wgmma's reads
#endif
            KT_SYNC();
#if KT_WG
            // S tile n: accumulator e is row g + 8·(e / 2), key j0 + 8n + 2t + e % 2.
            float s[KT_ST][4];
            issue_scores(s);
            kt_wgmma_commit();
            kt_wgmma_wait<0>();
            kt_wgmma_fence_operand(flat(s));
#else
            // Row tile m's S tile n: accumulator e is row 16m + g + 8·(e / 2) of the warp's,
            // key j0 + 8n + 2t + e % 2.
            float s[KT_MR][KT_ST][4];
#pragma unroll
            for (int m = 0; m < KT_MR; ++m)
#pragma unroll
                for (int n = 0; n < KT_ST; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[m][n][e] = 0.0f;
#pragma unroll
            for (int st = 0; st < KT_QK; ++st) {
                // Q's A fragments of this 16-dim step, each row tile's.
                unsigned qa[KT_MR][4];
#pragma unroll
                for (int m = 0; m < KT_MR; ++m) {
#if KT_Q_SHARED
                    // Lanes 8q .. 8q + 7 address rows 16m + 8·(q % 2) + (0 .. 7) of the warp's,
                    // dims 16st + 8·(q / 2).
                    kt_ldmatrix_x4_at(qa[m], q_at + 2 * (16 * m * KT_LDD + 16 * st));
#else
#pragma unroll
                    for (int x = 0; x < 4; ++x) qa[m][x] = qf[m][st][x];
#endif
                }
                // B fragments of tiles 2nn and 2nn + 1 by one ldmatrix, for every row tile:
                // lanes 8q .. 8q + 7 address keys 16nn + 8·(q / 2) + (0 .. 7), dims
                // 16st + 8·(q % 2).
#pragma unroll
                for (int nn = 0; nn < KT_ST / 2; ++nn) {
                    unsigned r[4];
                    kt_ldmatrix_x4_at(r, k_at + 2 * (16 * nn * KT_LDD + 16 * st));
                    const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                    for (int m = 0; m < KT_MR; ++m) {
                        kt_mma(s[m][2 * nn], qa[m], b0);
                        kt_mma(s[m][2 * nn + 1], qa[m], b1);
                    }
                }
            }
#endif
            KT_SYNC();  // every warp is done with this K tile: load the next over it
            if (j0 + KT_BC < block_seen) load(ks, k, j0 + KT_BC, KT_D);
            kt_cp_async_commit();
#if KT_WG
            float corr[2];
            softmax(s, 0, j0, corr);
            rescale(0, corr);
#else
#pragma unroll
            for (int m = 0; m < KT_MR; ++m) {
                float corr[2];
                softmax(s[m], m, j0, corr);
                rescale(m, corr);
            }
#endif
            kt_cp_async_wait<1>();  // this V tile (the next K tile may still be in flight)
#if KT_WG
            kt_fence_async_shared();
#endif
            KT_SYNC();
#if KT_WG
            pack(s);
            issue_products(vs);
            kt_wgmma_commit();
            kt_wgmma_wait<0>();
            kt_wgmma_fence_operand(ow);
#else
            // V's B fragments of dim tiles 2dd and 2dd + 1 by one transposing ldmatrix, for
            // every row tile: lanes 8q .. 8q + 7 address keys 16c + 8·(q % 2) + (0 .. 7), dims
            // 16dd + 8·(q / 2).
#pragma unroll
            for (int c = 0; c < KT_BC / 16; ++c) {
                unsigned pf[KT_MR][4];
#pragma unroll
                for (int m = 0; m < KT_MR; ++m) {
                    pf[m][0] = kt_pack2(s[m][2 * c][0], s[m][2 * c][1]);
                    pf[m][1] = kt_pack2(s[m][2 * c][2], s[m][2 * c][3]);
                    pf[m][2] = kt_pack2(s[m][2 * c + 1][0], s[m][2 * c + 1][1]);
                    pf[m][3] = kt_pack2(s[m][2 * c + 1][2], s[m][2 * c + 1][3]);
                }
#pragma unroll
                for (int dd = 0; dd < KT_OT / 2; ++dd) {
                    unsigned r[4];
                    kt_ldmatrix_x4_trans_at(r, v_at + 2 * (16 * c * KT_LDD + 16 * dd));
                    const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                    for (int m = 0; m < KT_MR; ++m) {
                        kt_mma(o[m][2 * dd], pf[m], b0);
                        kt_mma(o[m][2 * dd + 1], pf[m], b1);
                    }
                }
            }
#endif
            KT_SYNC();  // every warp is done with this V tile: load the next over it
            if (j0 + KT_BC < block_seen) load(vs, v, j0 + KT_BC, KT_DV);
            kt_cp_async_commit();
        }
#endif
#pragma unroll
        for (int x = 0; x < 2 * KT_MR; ++x) {
            const int m = x / 2, r = x % 2;
            sum[x] += KT_SHFL_XOR(sum[x], 1);
            sum[x] += KT_SHFL_XOR(sum[x], 2);
            if (row(m, r) >= q_len) continue;
#if KT_SPLIT > 1
            // A row whose keys lie in one run is written to `out` by that run's block (and
            // left alone by the others); the others' rows leave each run's share.
            const int first_run = KT_WINDOW ? max(0, seen[x] - reach) / kt_run(kv_len) : 0;
            if (first_run == (seen[x] - 1) / kt_run(kv_len) && run != first_run) continue;
            if (run != first_run || seen[x] > run_end) {
                // This run's share, unnormalized.
                const long slot =
                    ((long)(b * KT_SPLIT + run) * q_len + row(m, r)) * q_heads + h;
                if (t == 0) {
                    part_max[slot] = mx[x];
                    part_sum[slot] = sum[x];
                }
#pragma unroll
                for (int d = 0; d < KT_OT; ++d) {
                    part_out[slot * KT_DV + 8 * d + 2 * t] = o[m][d][2 * r];
                    part_out[slot * KT_DV + 8 * d + 2 * t + 1] = o[m][d][2 * r + 1];
                }
                continue;
            }
#endif
            const float total = sum[x] + kt_sink_weight(sinks, h, mx[x]);
            const float inv = total > 0.0f ? 1.0f / total : 0.0f;
#pragma unroll
            for (int d = 0; d < KT_OT; ++d) {
                out[orow(m, r) + 8 * d + 2 * t] = o[m][d][2 * r] * inv;
                out[orow(m, r) + 8 * d + 2 * t + 1] = o[m][d][2 * r + 1] * inv;
            }
        }
    }  // pass
}

#if KT_SPLIT > 1
// The split runs' partial results combined into the output, one thread an output element:
// the runs holding keys the row sees, in order (so results do not depend on scheduling),
// each scaled from its own maximum to the largest. Rows of one run are kt_flash's; rows
// that see no key get zeros here (their tile's blocks may all have stopped at once).
KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_flash_reduce(const float* __restrict__ part_out, const float* __restrict__ part_max,
                const float* __restrict__ part_sum, float* __restrict__ out, int q_len,
                int kv_len, int q_heads, int kv_heads, int causal, int batch, int window,
                const float* __restrict__ sinks) {
    (void)kv_heads;
    const long rows = (long)batch * q_len * q_heads;
    const long e = (long)KT_BID_X * KT_THREADS + KT_TID;
    if (e >= rows * KT_DV) return;
    // Row (b · q_len + i) · q_heads + h; its slot of run c is (b · SPLIT + c) · per + rest.
    const long row = e / KT_DV, per = (long)q_len * q_heads;
    const long b = row / per, rest = row % per;
    const int i = (int)(rest / q_heads);
    const int seen = causal ? min(kv_len, i + kv_len - q_len + 1) : kv_len;
    // The runs holding the keys the row sees: from its window's start to its last key.
    const int first = seen <= 0 || !KT_WINDOW ? 0 : max(0, seen - kt_reach(window)) / kt_run(kv_len);
    const int runs = seen <= 0 ? 0 : min(KT_SPLIT, (seen + kt_run(kv_len) - 1) / kt_run(kv_len));
    if (runs - first == 1) return;
    float m = -KT_INF;
    for (int c = first; c < runs; ++c) m = fmaxf(m, part_max[(b * KT_SPLIT + c) * per + rest]);
    float num = 0.0f, den = 0.0f;
    for (int c = first; c < runs; ++c) {
        const long slot = (b * KT_SPLIT + c) * per + rest;
        const float w = exp2f(part_max[slot] - m);
        num = fmaf(w, part_out[slot * KT_DV + e % KT_DV], num);
        den = fmaf(w, part_sum[slot], den);
    }
    den += kt_sink_weight(sinks, (int)(rest % q_heads), m);
    out[e] = den > 0.0f ? num / den : 0.0f;
}
#endif

#elif KT_VARIANT == 2

#if !defined(KT_MFMA)
#error "the MFMA variant needs gfx90a or gfx94x (or the host emulator of one)"
#endif
#if KT_DTYPE == 0
#error "the MFMA variant takes f16 or bf16 inputs"
#endif
#if KT_D % 32 != 0 || KT_DV % 32 != 0 || KT_BR % 32 != 0 || KT_BC % 32 != 0
#error "the MFMA variant needs KT_D, KT_DV, KT_BR and KT_BC multiples of 32"
#endif

#define KT_THREADS (2 * KT_BR)
#define KT_QK (KT_D / 8)    // k steps of K·Qᵀ
#define KT_ST (KT_BC / 32)  // 32-key tiles of Sᵀ
#define KT_OT (KT_DV / 32)  // 32-dim tiles of Oᵀ
// 4 halves of padding keep 8-byte fragment reads aligned and spread the 32 rows over banks.
#define KT_LDD (KT_D + 4)
#define KT_LDC (KT_BC + 4)
// 16-byte pieces of 8 dims of a key tile's K (and as many of V) a thread loads.
#define KT_PIECES ((KT_BC * (KT_D / 8) + KT_THREADS - 1) / KT_THREADS)

#ifndef KT_PREFETCH
#define KT_PREFETCH 0
#endif

// Piece e (8 dims of a key, consecutive pieces along the key's row) of key tile j0's K and
// V (none past V's KT_DV dims); zeros past the keys.
KT_DEVICE void kt_mfma_kv_fetch_one(kt_u32x4& kp, kt_u32x4& vp, const kt_in* k, const kt_in* v,
                                    int b, int kv_len, int kv_heads, int kvh, int j0, int e) {
    const int j = j0 + e / (KT_D / 8), x = (e % (KT_D / 8)) * 8;
    kt_u32x4 z;
    z.x = z.y = z.z = z.w = 0u;
    kp = vp = z;
    if (j < kv_len) {
        const long at = ((long)b * kv_len + j) * kv_heads + kvh;
        kp = kt_load16(k + at * KT_D + x);
        if (x < KT_DV) vp = kt_load16(v + at * KT_DV + x);
    }
}

// Piece e into LDS: K's into its row as two 8-byte halves (rows of KT_LDD halves are 8-byte
// aligned), V's transposed.
KT_DEVICE void kt_mfma_kv_stage_one(unsigned short (*ks)[KT_LDD], unsigned short (*vt)[KT_LDC],
                                    const kt_u32x4& kp, const kt_u32x4& vp, int e) {
    const int r = e / (KT_D / 8), x = (e % (KT_D / 8)) * 8;
    const unsigned kw[4] = {kp.x, kp.y, kp.z, kp.w};
    __builtin_memcpy(&ks[r][x], kw, 8);
    __builtin_memcpy(&ks[r][x + 4], kw + 2, 8);
    if (x >= KT_DV) return;
    const unsigned vw[4] = {vp.x, vp.y, vp.z, vp.w};
#pragma unroll
    for (int d = 0; d < 8; ++d) vt[x + d][r] = (unsigned short)(vw[d / 2] >> (16 * (d % 2)));
}

// A thread's pieces of key tile j0 (piece tid + t · threads for each t), into registers.
KT_DEVICE void kt_mfma_kv_fetch(kt_u32x4 (&kp)[KT_PIECES], kt_u32x4 (&vp)[KT_PIECES],
                                const kt_in* k, const kt_in* v, int b, int kv_len,
                                int kv_heads, int kvh, int j0, int tid) {
#pragma unroll
    for (int t = 0; t < KT_PIECES; ++t)
        if (tid + t * KT_THREADS < KT_BC * (KT_D / 8))
            kt_mfma_kv_fetch_one(kp[t], vp[t], k, v, b, kv_len, kv_heads, kvh, j0,
                                 tid + t * KT_THREADS);
}

// The pieces kt_mfma_kv_fetch loaded, into LDS.
KT_DEVICE void kt_mfma_kv_stage(unsigned short (*ks)[KT_LDD], unsigned short (*vt)[KT_LDC],
                                const kt_u32x4 (&kp)[KT_PIECES],
                                const kt_u32x4 (&vp)[KT_PIECES], int tid) {
#pragma unroll
    for (int t = 0; t < KT_PIECES; ++t)
        if (tid + t * KT_THREADS < KT_BC * (KT_D / 8))
            kt_mfma_kv_stage_one(ks, vt, kp[t], vp[t], tid + t * KT_THREADS);
}

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_flash(const kt_in* __restrict__ q, const kt_in* __restrict__ k, const kt_in* __restrict__ v,
         float* __restrict__ out, int q_len, int kv_len, int q_heads, int kv_heads, int causal,
         float scale, int window, const float* __restrict__ sinks, float softcap,
         const float* __restrict__ slopes) {
    KT_SHARED __attribute__((aligned(16))) unsigned short ks[KT_BC][KT_LDD];
    KT_SHARED __attribute__((aligned(16))) unsigned short vt[KT_DV][KT_LDC];
    const int tid = KT_TID;
    const int lane = tid % 64;
    const int half = lane / 32, col = lane % 32;
    const int h = KT_BID_X % q_heads;
    const int b = KT_BID_X / q_heads;
    const int kvh = h / (q_heads / kv_heads);
    const int qt = kt_tile((q_len + KT_BR - 1) / KT_BR);
    const int i = qt * KT_BR + (tid / 64) * 32 + col;
    const bool live = i < q_len;
    const float qscale = scale * 1.4426950408889634f;
    const int shift = kv_len - q_len;
    const int seen = live ? (causal ? min(kv_len, i + shift + 1) : kv_len) : 0;
    // This lane's (batch, position, head) row: its query at row · KT_D, its output at
    // row · KT_DV.
    const long row = ((long)b * q_len + (live ? i : 0)) * q_heads + h;
    const long qrow = row * KT_D;

    // Qᵀ's B fragments: step s is dims 8s + 4·half .. + 3 of this lane's query.
    kt_frag qf[KT_QK];
#pragma unroll
    for (int s = 0; s < KT_QK; ++s) qf[s] = kt_frag_at(q + qrow + 8 * s + 4 * half);
    kt_f32x16 o[KT_OT];
#pragma unroll
    for (int d = 0; d < KT_OT; ++d)
#pragma unroll
        for (int e = 0; e < 16; ++e) o[d][e] = 0.0f;
    float mx = -KT_INF, sum = 0.0f;

    // Keys every query of the wave sees: tiles wholly below them need no mask, nor, with a
    // window, from the first its last query sees on (`passed`); a query sees from key
    // seen - reach on.
    const int first = qt * KT_BR + (tid / 64) * 32;
    const int open = first + 31 < q_len ? (causal ? min(kv_len, first + shift + 1) : kv_len) : 0;
    const int reach = kt_reach(window);
    const int passed = max(0, first + 32 + shift - reach);
    const int block_last = min(q_len, qt * KT_BR + KT_BR) - 1;
    const int block_seen = causal ? min(kv_len, block_last + shift + 1) : kv_len;
    const int key_begin = kt_first_tile(qt * KT_BR, shift, window);
#if KT_PREFETCH
    // The next key tile's 16-byte pieces of K and V are loaded into registers while this one
    // is multiplied, and written to LDS after it: a wave a SIMD hides no load latency.
    kt_u32x4 kp[KT_PIECES], vp[KT_PIECES];
    if (block_seen > key_begin)
        kt_mfma_kv_fetch(kp, vp, k, v, b, kv_len, kv_heads, kvh, key_begin, tid);
#endif
    for (int j0 = key_begin; j0 < block_seen; j0 += KT_BC) {
#if KT_PREFETCH
        kt_mfma_kv_stage(ks, vt, kp, vp, tid);
        KT_SYNC();
        if (j0 + KT_BC < block_seen)
            kt_mfma_kv_fetch(kp, vp, k, v, b, kv_len, kv_heads, kvh, j0 + KT_BC, tid);
#else
        // A piece at a time: few registers, the loads' latency exposed.
        for (int e = tid; e < KT_BC * (KT_D / 8); e += KT_THREADS) {
            kt_u32x4 kp, vp;
            kt_mfma_kv_fetch_one(kp, vp, k, v, b, kv_len, kv_heads, kvh, j0, e);
            kt_mfma_kv_stage_one(ks, vt, kp, vp, e);
        }
        KT_SYNC();
#endif
        // Sᵀ tile n: accumulator e is key j0 + 32n + 8·(e / 4) + 4·half + e % 4. The scores
        // stay unscaled until the exponent, which takes scale and maximum in one multiply-add
        // (the scale is positive); only tiles past a query's last key are masked, and those
        // holding keys some query's window has passed.
        kt_f32x16 s[KT_ST];
        float tile_max = -KT_INF;
        const bool masked = j0 + KT_BC > open || (KT_WINDOW && j0 < passed);
#pragma unroll
        for (int n = 0; n < KT_ST; ++n) {
#pragma unroll
            for (int e = 0; e < 16; ++e) s[n][e] = 0.0f;
#pragma unroll
            for (int st = 0; st < KT_QK; ++st)
                s[n] = kt_mfma(kt_frag_at(&ks[32 * n + col][8 * st + 4 * half]), qf[st], s[n]);
            if (KT_SOFTCAP)
#pragma unroll
                for (int e = 0; e < 16; ++e) s[n][e] = kt_softcap(s[n][e], softcap / scale);
            if (KT_ALIBI)
#pragma unroll
                for (int e = 0; e < 16; ++e)
                    s[n][e] += kt_alibi(kt_alibi_unit(slopes, h, 1.0f / scale),
                                        j0 + 32 * n + 8 * (e / 4) + 4 * half + e % 4, seen - 1);
            if (masked) {
#pragma unroll
                for (int e = 0; e < 16; ++e) {
                    const int j = j0 + 32 * n + 8 * (e / 4) + 4 * half + e % 4;
                    if (j >= seen || (KT_WINDOW && j < seen - reach)) s[n][e] = -KT_INF;
                }
            }
#pragma unroll
            for (int e = 0; e < 16; ++e) tile_max = fmaxf(tile_max, s[n][e]);
        }
        tile_max = fmaxf(tile_max, KT_SHFL_XOR(tile_max, 32));
        const float m_new = fmaxf(mx, tile_max * qscale);
        // A query with nothing visible yet keeps zeros: exp2(-inf - 0) = 0.
        const float base = m_new == -KT_INF ? 0.0f : m_new;
        const float correction = exp2f(mx - base);
        sum *= correction;
#pragma unroll
        for (int d = 0; d < KT_OT; ++d)
#pragma unroll
            for (int e = 0; e < 16; ++e) o[d][e] *= correction;
        mx = m_new;
#pragma unroll
        for (int n = 0; n < KT_ST; ++n)
#pragma unroll
            for (int e = 0; e < 16; ++e) {
                s[n][e] = exp2f(fmaf(s[n][e], qscale, -base));
                sum += s[n][e];
            }
        // Pᵀ's B fragment for keys 8c .. 8c + 7 is accumulators 4·(c % 4) .. + 3 of tile c / 4.
#pragma unroll
        for (int c = 0; c < KT_BC / 8; ++c) {
            const int n = c / 4, e = 4 * (c % 4);
            const kt_frag pf = kt_pack4(s[n][e], s[n][e + 1], s[n][e + 2], s[n][e + 3]);
#pragma unroll
            for (int d = 0; d < KT_OT; ++d)
                o[d] = kt_mfma(kt_frag_at(&vt[32 * d + col][8 * c + 4 * half]), pf, o[d]);
        }
        KT_SYNC();
    }
    sum += KT_SHFL_XOR(sum, 32);
    if (live) {
        const float total = sum + kt_sink_weight(sinks, h, mx);
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        // Oᵀ tile d: accumulator e is dim 32d + 8·(e / 4) + 4·half + e % 4.
#pragma unroll
        for (int d = 0; d < KT_OT; ++d)
#pragma unroll
            for (int e = 0; e < 16; ++e)
                out[row * KT_DV + 32 * d + 8 * (e / 4) + 4 * half + e % 4] = o[d][e] * inv;
    }
}

#else
#error "KT_VARIANT must be 0 (rows), 1 (mma) or 2 (MFMA)"
#endif
