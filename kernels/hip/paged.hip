// kerntune paged attention, decode. query [num_seqs, q_heads, D]; key and value caches
// [num_blocks, block_size, kv_heads, D] (the vLLM / TGI layout) in f32, f16 or bf16
// (KT_DTYPE), or fp8 under a 16-bit query (KT_KV_FP8, kt_cache); block_tables [num_seqs,
// max_blocks] and context_lens [num_seqs] as u32; out [num_seqs, q_heads, DV] in f32. An fp8
// cache's key factor comes folded into `scale`, its value factor is kt_paged_reduce's
// `v_scale` (1 for other caches).
//
// KT_DV (defined below KT_D for multi-head latent attention's decode): one latent cache, each
// token's value the first KT_DV values of its key row; the host passes the key cache as
// `value_cache`, and part_out and out hold KT_DV values a row.
//
// Two kernels. kt_paged: grid (partitions, q_heads, num_seqs), KT_THREADS threads; a block
// takes KT_PART tokens of one sequence for one query head: scores into LDS, block-wide max
// and sum, then P·V, written unnormalised with the partition's max and sum. kt_paged_reduce:
// grid (q_heads, num_seqs), combines the partitions by their log-sum-exp. `window` > 0 (a
// sliding window): a sequence of ctx tokens attends to its last `window` only, and its
// partitions count from the first of them. With sinks (KT_SINKS builds), kt_paged_reduce adds
// each head's sink to its sum (kt_sink_weight). With a soft-cap `softcap` (KT_SOFTCAP builds;
// 0 without), kt_paged caps each score as it becomes a weight, and their maximum (kt_softcap;
// scores carry scale · log2(e), and so does the cap): capped as they were computed, the
// grouped builds of head size 128 spilled. With ALiBi (KT_ALIBI builds; `slopes`, q_heads
// floats, unread without), each score gains its head's slope times the token's distance from
// the new token (kt_alibi), after the cap; as the bias breaks the order a cap alone keeps,
// those builds cap and bias each score where it is computed and take the maximum of the
// results (kt_score_in, kt_score_out).
//
// KT_HEADS > 1 (with KT_LANES 1): a block takes KT_HEADS query heads of one KV head (grid
// (partitions, q_heads / KT_HEADS, num_seqs)), so each key and value row it reads serves all of
// them, where one head a block reads a row once per head (a grouped-query or latent decode's
// whole group: 8 heads on one KV head at Llama-3.1-70B's TP8, 16 on DeepSeek's latent row).
// The scores: a thread per token, each key value it loads multiplied by every head's query
// (from LDS, the same address across the block); each wave then turns heads' rows of scores
// into weights; P·V: consecutive threads on consecutive value dims, each summing every head's.
//
// KT_PAGED_MMA (NVIDIA's tensor cores, 16-bit query): a block takes KT_HEADS query
// heads of one KV head as the rows of one 16-row mma.sync tile (rows past KT_HEADS zero). A
// latent decode's 16 heads multiply 1,088 values a token each, which a thread a token runs
// on CUDA cores at a fraction of the memory's speed; on tensor cores the same block is bound
// by its reads, as FlashMLA's is. The partition passes in tiles of KT_TC = 16 · warps tokens,
// each copied by cp.async into shared memory while the tile before it is multiplied (key
// rows, and value rows but on a latent cache, whose values are the key rows' first KT_DV):
// warp w scores tokens 16w .. 16w + 15 of a tile for all 16 rows (Q·Kᵀ, Q from shared
// memory), the scores meet in shared memory, where each head's online softmax turns them
// into 16-bit weights, and warp w sums P·V into value columns [w, w + 1) · KT_DV / warps.
// An fp8 cache's tiles land as bytes and are widened in shared memory into the query's type.
//
// KT_PAGED_MFMA (CDNA2/CDNA3's matrix cores, 16-bit query): the same block of KT_HEADS heads
// on v_mfma_f32_16x16x16, the heads the columns of Sᵀ = K·Qᵀ (and the rows of O = P·V), so a
// lane's four scores of a head are already P's A fragment. MI250's and MI300X's LDS (64 KiB)
// holds no 576-wide tiles in stages, and a CDNA load is asynchronous until its register is
// read: each wave takes tiles of 16 tokens (w, w + waves, ...) straight from memory into
// registers, key rows as A fragments (16-byte loads of a token's dims), value rows as B
// fragments (four tokens' 16-byte pieces regrouped a column a fragment), with its own
// online softmax; the waves' outputs meet in LDS at the end. Only the query sits in LDS.
//
// KT_LANES 1: a thread per token for the scores (its key row read element by element), and
// for P·V consecutive threads on consecutive dims, each over every token.
// KT_LANES 2 to 32: groups of KT_LANES lanes per token, for the scores and for P·V. A lane
// holds KT_D / KT_LANES dims of the query and of its P·V accumulators, in 16-byte pieces
// (8-byte ones of an fp8 cache) interleaved across the group (piece p of lane l at dims (p·LANES + l)·VEC), so each load of
// a group reads LANES·16 contiguous bytes of a row; a token's dot product meets by shuffles
// inside its group, the groups' P·V sums by shuffles inside each wave and then through LDS.
#include "prelude.h"
#if KT_FP8_IN
#error "fp8 inputs (KT_DTYPE 3, 4) are GEMM operands; attention takes fp8 KV caches (KT_KV_FP8)"
#endif

#ifndef KT_PART
#error "KT_PART, KT_THREADS, KT_D and KT_BLOCK must be defined"
#endif
#ifndef KT_LANES
#define KT_LANES 1
#endif
#ifndef KT_DV
#define KT_DV KT_D
#endif
#ifndef KT_HEADS
#define KT_HEADS 1
#endif
#ifndef KT_PAGED_MMA
#define KT_PAGED_MMA 0
#endif
#ifndef KT_PAGED_MFMA
#define KT_PAGED_MFMA 0
#endif
#if (KT_HEADS > 1 || KT_PAGED_MMA || KT_PAGED_MFMA) && KT_LANES != 1
#error "KT_HEADS > 1, KT_PAGED_MMA and KT_PAGED_MFMA take a thread a token (KT_LANES 1)"
#endif
#if KT_DV > KT_D
#error "KT_DV, the values a row holds, must not exceed KT_D"
#endif

#define KT_WAVES (KT_THREADS / KT_WAVE)

KT_DEVICE float kt_block_max(float v, float* scratch) {
    v = kt_wave_max(v);
    if (KT_TID % KT_WAVE == 0) scratch[KT_TID / KT_WAVE] = v;
    KT_SYNC();
    float r = -KT_INF;
    for (int w = 0; w < KT_WAVES; ++w) r = fmaxf(r, scratch[w]);
    KT_SYNC();
    return r;
}

KT_DEVICE float kt_block_sum(float v, float* scratch) {
    v = kt_wave_sum(v);
    if (KT_TID % KT_WAVE == 0) scratch[KT_TID / KT_WAVE] = v;
    KT_SYNC();
    float r = 0.0f;
    for (int w = 0; w < KT_WAVES; ++w) r += scratch[w];
    KT_SYNC();
    return r;
}

// A block's place in the grid (partitions, q_heads / heads, num_seqs): its sequence, its heads
// h0 .. h0 + heads - 1 (`heads` divides a KV head's group, validated) and their KV head, and
// its partition's tokens [t0, t1), counted from the cache block holding the first token the
// sequence attends to (its window's start, `first`), whose block-table entry is `skip` in:
// partitions starting at `first` itself made ptxas spill three registers of the f32 builds of
// head size 96. Head g's partial slot is slot0 + g · partitions (kt_slot).
struct kt_part {
    // `pos`: the new token's position, the context's last, counted as t0 and t1 are.
    int seq, h0, kvh, skip, t0, t1, pos, partitions;
    long slot0;
};
KT_DEVICE kt_part kt_part_of(const unsigned* context_lens, int heads, int q_heads, int kv_heads,
                             int partitions, int window) {
    kt_part b;
    b.seq = KT_BID_Z;
    b.h0 = KT_BID_Y * heads;
    b.kvh = b.h0 / (q_heads / kv_heads);
    const int len = (int)context_lens[b.seq];
    const int first = window > 0 && len > window ? len - window : 0;
    b.skip = first / KT_BLOCK;
    b.t0 = first % KT_BLOCK + KT_BID_X * KT_PART;
    b.t1 = min(len - b.skip * KT_BLOCK, b.t0 + KT_PART);
    b.pos = len - 1 - b.skip * KT_BLOCK;
    b.partitions = partitions;
    b.slot0 = ((long)b.seq * q_heads + b.h0) * partitions + KT_BID_X;
    return b;
}
KT_DEVICE long kt_slot(const kt_part& b, int g) { return b.slot0 + (long)g * b.partitions; }

// A score `x` (in units of scale · log2(e)) of token t as kept until it becomes a weight: as
// computed, or in ALiBi builds capped and biased by `alibi` (kt_alibi_unit's) for position
// `pos`. kt_score_out gives what the softmax takes of a kept score or of a maximum of them.
KT_DEVICE float kt_score_in(float x, float cap_unit, float alibi, int t, int pos) {
    return KT_ALIBI ? kt_softcap(x, cap_unit) + kt_alibi(alibi, t, pos) : x;
}
KT_DEVICE float kt_score_out(float x, float cap_unit) {
    return KT_ALIBI ? x : kt_softcap(x, cap_unit);
}

// Whether the block's partition holds no token; then its heads' slots say it contributes
// nothing to the reduction.
KT_DEVICE bool kt_empty(const kt_part& b, int heads, float* part_out, float* part_max,
                        float* part_sum) {
    if (b.t0 < b.t1) return false;
    for (int g = 0; g < heads; ++g) {
        if (KT_TID == 0) {
            part_max[kt_slot(b, g)] = -KT_INF;
            part_sum[kt_slot(b, g)] = 0.0f;
        }
        for (int x = KT_TID; x < KT_DV; x += KT_THREADS) part_out[kt_slot(b, g) * KT_DV + x] = 0.0f;
    }
    return true;
}

#if KT_PAGED_MMA

#if !defined(KT_MMA) || KT_DTYPE == 0 || KT_HEADS > 16
#error "KT_PAGED_MMA takes mma.sync, a 16-bit query, and at most 16 heads"
#endif
#define KT_TC (16 * KT_WAVES)
// Rows of 8 halves of padding: the 8 rows of one ldmatrix on distinct banks, every row
// 16-byte aligned for cp.async.
#define KT_LDK (KT_D + 8)
#define KT_LDP (KT_TC + 8)
#if KT_DV < KT_D
// A latent cache: the values are the key rows' first KT_DV, read from the key tile.
#define KT_V_ROWS 0
#define KT_LDV KT_LDK
#else
#define KT_V_ROWS 1
#define KT_LDV (KT_DV + 8)
#endif
// A stage: the tile's key rows [KT_TC][KT_LDK], then its value rows [KT_TC][KT_LDV].
#define KT_STAGE (KT_TC * (KT_LDK + KT_V_ROWS * KT_LDV))
#if KT_KV_FP8
// An fp8 cache's tiles land as they lie, two stages of KT_RAW bytes (key rows [KT_TC][KT_D],
// then value rows [KT_TC][KT_DV]), and are widened into one stage of 16-bit rows for the
// products: the tensor cores take both operands in the query's type.
#define KT_RAW (KT_TC * (KT_D + KT_V_ROWS * KT_DV))
#define KT_TILE_BYTES (2 * KT_RAW + 2 * KT_STAGE)
// Values a 16-byte copy holds, and the strides of the rows it lands in.
#define KT_PIECE 16
#define KT_KROW KT_D
#define KT_VROW KT_DV
#else
#define KT_TILE_BYTES (2 * 2 * KT_STAGE)
#define KT_PIECE 8
#define KT_KROW KT_LDK
#define KT_VROW KT_LDV
#endif
// The value columns each warp sums.
#define KT_WCOLS (KT_DV / KT_WAVES)
#if KT_D % 16 != 0 || KT_WCOLS % 16 != 0 || KT_WCOLS * KT_WAVES != KT_DV
#error "KT_PAGED_MMA needs KT_D a multiple of 16 and KT_DV of 16 columns a warp"
#endif
// The stages, the query tile [16][KT_LDK] and the weights [16][KT_LDP] as 16-bit values, then
// the scores [16][KT_TC] and each row's maximum, sum and correction as f32.
#if !defined(KT_DYN_LDS) || \
    KT_TILE_BYTES + 2 * (16 * KT_LDK + 16 * KT_LDP) + 4 * (16 * KT_TC + 3 * 16) != KT_DYN_LDS
#error "KT_DYN_LDS must be the bytes of the stages, query, weights, scores and row statistics"
#endif

#if KT_KV_FP8
// Sixteen cached bytes as sixteen 16-bit values in the query's type, in order: the f16 an fp8
// byte's bits make (kt_fp8_half_bits, the format's factor on the host) is exact in bf16 too.
KT_DEVICE void kt_widen_fp8_16(const unsigned char* src, unsigned short* dst) {
    const unsigned* const in = reinterpret_cast<const unsigned*>(src);
    unsigned* const out = reinterpret_cast<unsigned*>(dst);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        // Bytes 0 and 1 of the word, then 2 and 3, each pair spread into a word's halves.
        unsigned lo = kt_fp8_half_bits((in[i] & 0xffu) | ((in[i] & 0xff00u) << 8));
        unsigned hi = kt_fp8_half_bits(((in[i] >> 16) & 0xffu) | ((in[i] >> 8) & 0xff0000u));
#if KT_DTYPE == 2
        lo = kt_pack2(kt_f16_f32((unsigned short)(lo & 0xffffu)), kt_f16_f32((unsigned short)(lo >> 16)));
        hi = kt_pack2(kt_f16_f32((unsigned short)(hi & 0xffffu)), kt_f16_f32((unsigned short)(hi >> 16)));
#endif
        out[2 * i] = lo;
        out[2 * i + 1] = hi;
    }
}
#endif

KT_GLOBAL void KT_LAUNCH_BOUNDS_ONE(KT_THREADS)
kt_paged(const kt_in* __restrict__ query, const kt_cache* __restrict__ key_cache,
         const kt_cache* __restrict__ value_cache, const unsigned* __restrict__ block_tables,
         const unsigned* __restrict__ context_lens, float* __restrict__ part_out,
         float* __restrict__ part_max, float* __restrict__ part_sum, int q_heads, int kv_heads,
         int max_blocks, int partitions, float scale, int window, float softcap,
         const float* __restrict__ slopes) {
    // Dynamic shared memory: DeepSeek's two stages of 64 rows of 576 pass the 48 KiB a block
    // declares statically.
    KT_DYNAMIC_SHARED(smem);
#if KT_KV_FP8
    unsigned char* const raws = smem;
    unsigned short* const tiles = reinterpret_cast<unsigned short*>(smem + 2 * KT_RAW);
    unsigned short* const qs = tiles + KT_STAGE;
#else
    unsigned short* const tiles = reinterpret_cast<unsigned short*>(smem);
    unsigned short* const qs = tiles + 2 * KT_STAGE;
#endif
    unsigned short* const ps = qs + 16 * KT_LDK;
    float* const ss = reinterpret_cast<float*>(ps + 16 * KT_LDP);
    float* const row_max = ss + 16 * KT_TC;
    float* const row_sum = row_max + 16;
    float* const row_corr = row_sum + 16;
    const int tid = KT_TID;
    const kt_part b = kt_part_of(context_lens, KT_HEADS, q_heads, kv_heads, partitions, window);
    if (kt_empty(b, KT_HEADS, part_out, part_max, part_sum)) return;
    const int seq = b.seq, h0 = b.h0, kvh = b.kvh, skip = b.skip, t0 = b.t0, t1 = b.t1;
    auto slot = [&](int g) { return kt_slot(b, g); };
    const unsigned* table = block_tables + (long)seq * max_blocks + skip;
    auto row_of = [&](int t) {
        return (((long)table[t / KT_BLOCK] * KT_BLOCK + t % KT_BLOCK) * kv_heads + kvh) * KT_D;
    };
    // The query rows (zero past KT_HEADS) go with the first tile's commit group.
    for (int e = tid; e < 16 * (KT_D / 8); e += KT_THREADS) {
        const int r = e / (KT_D / 8), x = 8 * (e % (KT_D / 8));
        const bool in = r < KT_HEADS;
        kt_cp_async16(qs + r * KT_LDK + x, query + ((long)seq * q_heads + h0 + (in ? r : 0)) * KT_D + x,
                      in ? 16 : 0);
    }
    // Tokens j0 .. j0 + KT_TC - 1 into stage `st`; those past the partition zero-filled (a
    // weight of 0 times a zero row, never times whatever the memory held).
#if KT_KV_FP8
    auto stage_of = [&](int st) { return raws + st * KT_RAW; };
#else
    auto stage_of = [&](int st) { return tiles + st * KT_STAGE; };
#endif
    auto load = [&](int st, int j0) {
        const auto ks = stage_of(st);
        for (int e = tid; e < KT_TC * (KT_D / KT_PIECE); e += KT_THREADS) {
            const int r = e / (KT_D / KT_PIECE), x = KT_PIECE * (e % (KT_D / KT_PIECE));
            const bool in = j0 + r < t1;
            kt_cp_async16(ks + r * KT_KROW + x, key_cache + row_of(in ? j0 + r : t0) + x,
                          in ? 16 : 0);
        }
#if KT_V_ROWS
        const auto vs = ks + KT_TC * KT_KROW;
        for (int e = tid; e < KT_TC * (KT_DV / KT_PIECE); e += KT_THREADS) {
            const int r = e / (KT_DV / KT_PIECE), x = KT_PIECE * (e % (KT_DV / KT_PIECE));
            const bool in = j0 + r < t1;
            kt_cp_async16(vs + r * KT_VROW + x, value_cache + row_of(in ? j0 + r : t0) + x,
                          in ? 16 : 0);
        }
#endif
    };
#if KT_KV_FP8
    // Stage `st`'s bytes widened into the 16-bit rows.
    auto widen = [&](int st) {
        const unsigned char* const ks = stage_of(st);
        for (int e = tid; e < KT_TC * (KT_D / 16); e += KT_THREADS) {
            const int r = e / (KT_D / 16), x = 16 * (e % (KT_D / 16));
            kt_widen_fp8_16(ks + r * KT_D + x, tiles + r * KT_LDK + x);
        }
#if KT_V_ROWS
        for (int e = tid; e < KT_TC * (KT_DV / 16); e += KT_THREADS) {
            const int r = e / (KT_DV / 16), x = 16 * (e % (KT_DV / 16));
            kt_widen_fp8_16(ks + KT_TC * KT_D + r * KT_DV + x, tiles + KT_TC * KT_LDK + r * KT_LDV + x);
        }
#endif
    };
#endif
    load(0, t0);
    kt_cp_async_commit();
    // Rows past KT_HEADS keep weights of 0 and a correction of 1.
    for (int i = tid; i < 16 * KT_LDP; i += KT_THREADS) ps[i] = 0;
    if (tid < 16) {
        row_max[tid] = -KT_INF;
        row_sum[tid] = 0.0f;
        row_corr[tid] = 1.0f;
    }
    const int wave = tid / KT_WAVE;
    const int lane = tid % KT_WAVE;
    const int g = lane / 4, tq = lane % 4;
    // This lane's ldmatrix row addresses, each fragment's a constant past them
    // (kt_ldmatrix_x4_at). Q and P (A fragments): lanes 8q .. 8q + 7 address rows 8·(q % 2) +
    // (0 .. 7), columns 8·(q / 2). K (B fragments of the warp's two 8-token tiles): tokens
    // 16w + 8·(q / 2) + (0 .. 7), dims 8·(q % 2). V (B fragments by a transposing ldmatrix):
    // tokens 8·(q % 2) + (0 .. 7), the warp's columns + 8·(q / 2).
    const unsigned q_at = kt_smem(qs + (8 * ((lane / 8) % 2) + lane % 8) * KT_LDK + 8 * (lane / 16));
    const unsigned p_at = kt_smem(ps + (8 * ((lane / 8) % 2) + lane % 8) * KT_LDP + 8 * (lane / 16));
    const unsigned k_at =
        kt_smem(tiles + (16 * wave + 8 * (lane / 16) + lane % 8) * KT_LDK + 8 * ((lane / 8) % 2));
    const unsigned v_at = kt_smem(tiles + KT_V_ROWS * KT_TC * KT_LDK +
                                  (8 * ((lane / 8) % 2) + lane % 8) * KT_LDV + KT_WCOLS * wave +
                                  8 * (lane / 16));
    const float log2e = 1.4426950408889634f;
    const float unit = scale * log2e;
    const float cap_unit = softcap * log2e;
    // Output tile j: accumulator e is head g + 8·(e / 2), value column KT_WCOLS·w + 8j + 2tq +
    // e % 2.
    float o[KT_WCOLS / 8][4];
#pragma unroll
    for (int j = 0; j < KT_WCOLS / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
    int st = 0;
    for (int j0 = t0; j0 < t1; j0 += KT_TC, st ^= 1) {
        // The next tile into the other stage, which every warp left at the last barrier.
        if (j0 + KT_TC < t1) load(st ^ 1, j0 + KT_TC);
        kt_cp_async_commit();
        kt_cp_async_wait<1>();  // this tile (and the query, with the first)
        KT_SYNC();
#if KT_KV_FP8
        widen(st);
        KT_SYNC();
        // One stage of 16-bit rows.
        const unsigned stage = 0;
#else
        const unsigned stage = 2 * st * KT_STAGE;
#endif
        // Score tile n: accumulator e is head g + 8·(e / 2), token 16w + 8n + 2tq + e % 2.
        float s[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll 4
        for (int kk = 0; kk < KT_D / 16; ++kk) {
            unsigned qa[4], r[4];
            kt_ldmatrix_x4_at(qa, q_at + 2 * 16 * kk);
            kt_ldmatrix_x4_at(r, k_at + stage + 2 * 16 * kk);
            const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            kt_mma(s[0], qa, b0);
            kt_mma(s[1], qa, b1);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                // Rows past KT_HEADS (zero queries) take head h0's slope.
                const int r = g + 8 * (e / 2), i = 16 * wave + 8 * n + 2 * tq + e % 2;
                const float alibi = kt_alibi_unit(slopes, h0 + (r < KT_HEADS ? r : 0), log2e);
                ss[r * KT_TC + i] = kt_score_in(s[n][e] * unit, cap_unit, alibi, j0 + i, b.pos);
            }
        KT_SYNC();
        // Wave w takes heads w, w + WAVES, ...: the tile's maximum (capped, as the other forms
        // cap it), the weights as 16-bit pairs, and the running maximum, sum and correction.
        const int n = min(KT_TC, t1 - j0);
        for (int r = wave; r < KT_HEADS; r += KT_WAVES) {
            float mx = -KT_INF;
            for (int i = lane; i < n; i += KT_WAVE) mx = fmaxf(mx, ss[r * KT_TC + i]);
            const float old = row_max[r];
            const float m = fmaxf(old, kt_score_out(kt_wave_max(mx), cap_unit));
            float sum = 0.0f;
            for (int i = 2 * lane; i < KT_TC; i += 2 * KT_WAVE) {
                const float p0 = i < n ? exp2f(kt_score_out(ss[r * KT_TC + i], cap_unit) - m) : 0.0f;
                const float p1 =
                    i + 1 < n ? exp2f(kt_score_out(ss[r * KT_TC + i + 1], cap_unit) - m) : 0.0f;
                *reinterpret_cast<unsigned*>(ps + r * KT_LDP + i) = kt_pack2(p0, p1);
                sum += p0 + p1;
            }
            sum = kt_wave_sum(sum);
            if (lane == 0) {
                const float corr = exp2f(old - m);
                row_corr[r] = corr;
                row_sum[r] = row_sum[r] * corr + sum;
                row_max[r] = m;
            }
        }
        KT_SYNC();
        const float corr_lo = row_corr[g], corr_hi = row_corr[g + 8];
#pragma unroll
        for (int j = 0; j < KT_WCOLS / 8; ++j) {
            o[j][0] *= corr_lo;
            o[j][1] *= corr_lo;
            o[j][2] *= corr_hi;
            o[j][3] *= corr_hi;
        }
        // P's A fragment of tokens 16c .. 16c + 15, then V's B fragments of the warp's column
        // tiles 2dd and 2dd + 1 by one transposing ldmatrix.
#pragma unroll
        for (int c = 0; c < KT_TC / 16; ++c) {
            unsigned pa[4];
            kt_ldmatrix_x4_at(pa, p_at + 2 * 16 * c);
#pragma unroll
            for (int dd = 0; dd < KT_WCOLS / 16; ++dd) {
                unsigned r[4];
                kt_ldmatrix_x4_trans_at(r, v_at + stage + 2 * (16 * c * KT_LDV + 16 * dd));
                const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                kt_mma(o[2 * dd], pa, b0);
                kt_mma(o[2 * dd + 1], pa, b1);
            }
        }
        KT_SYNC();  // every warp is done with this stage, the scores and the weights
    }
    kt_cp_async_wait<0>();
#pragma unroll
    for (int j = 0; j < KT_WCOLS / 8; ++j) {
        const int x = KT_WCOLS * wave + 8 * j + 2 * tq;
        if (g < KT_HEADS) kt_store8(part_out + slot(g) * KT_DV + x, o[j][0], o[j][1]);
        if (g + 8 < KT_HEADS) kt_store8(part_out + slot(g + 8) * KT_DV + x, o[j][2], o[j][3]);
    }
    if (tid < KT_HEADS) {
        part_max[slot(tid)] = row_max[tid];
        part_sum[slot(tid)] = row_sum[tid];
    }
}

#elif KT_PAGED_MFMA

#if !defined(KT_MFMA) || KT_DTYPE == 0 || KT_WAVE != 64 || KT_HEADS > 16
#error "KT_PAGED_MFMA takes CDNA's MFMA (64-wide waves), a 16-bit query, and at most 16 heads"
#endif
#if KT_D % 32 != 0 || KT_DV % 128 != 0
#error "KT_PAGED_MFMA reads key rows 32 dims a step and value rows 128 columns a step"
#endif
// Query rows of 8 halves of padding (16-byte aligned, their reads spread over banks).
#define KT_LDQ (KT_D + 8)
// The pool: the query rows, 16-bit, while tiles pass; then the waves' sums of one 128-column
// chunk of the heads' outputs, f32.
#define KT_QHALVES (KT_HEADS * KT_LDQ)
#define KT_CHALVES (2 * KT_HEADS * 128)
#define KT_POOL (KT_QHALVES > KT_CHALVES ? KT_QHALVES : KT_CHALVES)

// Eight consecutive values of a cached row in the query's type as two fragments (values 0-3,
// 4-7); an fp8 cache's widened, exactly (3 mantissa bits at most).
KT_DEVICE void kt_row8(const kt_cache* p, kt_frag& lo, kt_frag& hi) {
#if KT_KV_FP8
    float x[8];
    kt_widen_piece(kt_load_piece(p), x);
    lo = kt_pack4(x[0], x[1], x[2], x[3]);
    hi = kt_pack4(x[4], x[5], x[6], x[7]);
#else
    const kt_u32x4 v = kt_load16(p);
    lo = kt_frag_of(v.x, v.y);
    hi = kt_frag_of(v.z, v.w);
#endif
}

// Columns x .. x + 7 of four tokens' value rows (`rows`, element offsets) as eight B
// fragments: fragment j holds column x + j of tokens 0 .. 3, k's order in an MFMA step.
KT_DEVICE void kt_cols8(const kt_cache* v, const long (&rows)[4], int x, kt_frag (&f)[8]) {
#if KT_KV_FP8
    float w[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i) kt_widen_piece(kt_load_piece(v + rows[i] + x), w[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = kt_pack4(w[0][j], w[1][j], w[2][j], w[3][j]);
#else
    unsigned w[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const kt_u32x4 r = kt_load16(v + rows[i] + x);
        w[i][0] = r.x;
        w[i][1] = r.y;
        w[i][2] = r.z;
        w[i][3] = r.w;
    }
    // Word q holds columns 2q (low half) and 2q + 1 (high half).
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        f[2 * q] = kt_frag_of((w[0][q] & 0xffffu) | (w[1][q] << 16),
                              (w[2][q] & 0xffffu) | (w[3][q] << 16));
        f[2 * q + 1] = kt_frag_of((w[0][q] >> 16) | (w[1][q] & 0xffff0000u),
                                  (w[2][q] >> 16) | (w[3][q] & 0xffff0000u));
    }
#endif
}

// Two waves a SIMD at least: each holds its loads in flight while the other multiplies.
KT_GLOBAL void KT_LAUNCH_BOUNDS_WAVES(KT_THREADS, 2)
kt_paged(const kt_in* __restrict__ query, const kt_cache* __restrict__ key_cache,
         const kt_cache* __restrict__ value_cache, const unsigned* __restrict__ block_tables,
         const unsigned* __restrict__ context_lens, float* __restrict__ part_out,
         float* __restrict__ part_max, float* __restrict__ part_sum, int q_heads, int kv_heads,
         int max_blocks, int partitions, float scale, int window, float softcap,
         const float* __restrict__ slopes) {
    KT_SHARED __attribute__((aligned(16))) unsigned short pool[KT_POOL];
    KT_SHARED float wave_max[KT_WAVES][16];
    KT_SHARED float wave_sum[KT_WAVES][16];
    unsigned short* const qs = pool;
    float* const sums = reinterpret_cast<float*>(pool);
    const int tid = KT_TID;
    const kt_part b = kt_part_of(context_lens, KT_HEADS, q_heads, kv_heads, partitions, window);
    if (kt_empty(b, KT_HEADS, part_out, part_max, part_sum)) return;
    const int seq = b.seq, h0 = b.h0, kvh = b.kvh, skip = b.skip, t0 = b.t0, t1 = b.t1;
    auto slot = [&](int g) { return kt_slot(b, g); };
    for (int e = tid; e < KT_HEADS * (KT_D / 8); e += KT_THREADS) {
        const int r = e / (KT_D / 8), x = 8 * (e % (KT_D / 8));
        *reinterpret_cast<kt_u32x4*>(qs + r * KT_LDQ + x) =
            kt_load16(query + ((long)seq * q_heads + h0 + r) * KT_D + x);
    }
    KT_SYNC();
    const unsigned* table = block_tables + (long)seq * max_blocks + skip;
    auto row_of = [&](int t) {
        return (((long)table[t / KT_BLOCK] * KT_BLOCK + t % KT_BLOCK) * kv_heads + kvh) * KT_D;
    };
    const int wave = tid / KT_WAVE;
    const int lane = tid % KT_WAVE;
    // Lane l is column col = l % 16 of each product (a head of Sᵀ = K·Qᵀ, a value column of
    // O = P·V) and passes k values 4·quad .. 4·quad + 3 of each step.
    const int col = lane % 16, quad = lane / 16;
    // Columns past KT_HEADS read head 0's query: their weights make output rows no one
    // stores.
    const unsigned short* const q_at = qs + (col < KT_HEADS ? col : 0) * KT_LDQ + 8 * quad;
    const float log2e = 1.4426950408889634f;
    const float unit = scale * log2e;
    const float cap_unit = softcap * log2e;
    // Head col's ALiBi slope (head h0's past KT_HEADS).
    const float alibi = kt_alibi_unit(slopes, h0 + (col < KT_HEADS ? col : 0), log2e);
    // Output tile (c, j): element e is head 4·quad + e, value column 128c + 8·col + j.
    kt_f32x4 o[KT_DV / 128][8];
#pragma unroll
    for (int c = 0; c < KT_DV / 128; ++c)
#pragma unroll
        for (int j = 0; j < 8; ++j) o[c][j] = kt_f32x4{0.0f, 0.0f, 0.0f, 0.0f};
    // Head col's running maximum, and the sum of this lane's weights of it.
    float run_max = -KT_INF, run_sum = 0.0f;
    // Wave w takes tiles w, w + WAVES, ... of 16 tokens.
    for (int j0 = t0 + 16 * wave; j0 < t1; j0 += 16 * KT_WAVES) {
        // Sᵀ: lane l passes token j0 + col's key dims 32m + 8·quad .. + 7 as two k steps, the
        // query's same dims beside them (a step's dims need only match between the two).
        const long krow = row_of(j0 + col < t1 ? j0 + col : t0);
        kt_f32x4 s = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 2
        for (int m = 0; m < KT_D / 32; ++m) {
            kt_frag k_lo, k_hi;
            kt_row8(key_cache + krow + 32 * m + 8 * quad, k_lo, k_hi);
            const kt_u32x4 q = *reinterpret_cast<const kt_u32x4*>(q_at + 32 * m);
            s = kt_mfma16(k_lo, kt_frag_of(q.x, q.y), s);
            s = kt_mfma16(k_hi, kt_frag_of(q.z, q.w), s);
        }
        // Element e: token j0 + 4·quad + e of head col; its maximum across the four quads.
        float x[4];
        float mx = -KT_INF;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int t = j0 + 4 * quad + e;
            x[e] = t < t1 ? kt_softcap(s[e] * unit, cap_unit) + kt_alibi(alibi, t, b.pos) : -KT_INF;
            mx = fmaxf(mx, x[e]);
        }
        mx = fmaxf(mx, KT_SHFL_XOR(mx, 16));
        mx = fmaxf(mx, KT_SHFL_XOR(mx, 32));
        // Finite: the tile's first token is in the partition.
        const float m = fmaxf(run_max, mx);
        const float corr = exp2f(run_max - m);
        float p[4];
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            p[e] = exp2f(x[e] - m);
            sum += p[e];
        }
        run_sum = run_sum * corr + sum;
        run_max = m;
        // Output rows are heads 4·quad + e, whose corrections lanes 4·quad + e hold.
        float oc[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) oc[e] = KT_SHFL(corr, 4 * quad + e);
#pragma unroll
        for (int c = 0; c < KT_DV / 128; ++c)
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[c][j][e] *= oc[e];
        // O += P·V: this lane's weights are P's row col at k = tokens 4·quad + e, as the A
        // fragment wants them; V's B fragments hold tokens j0 + 4·quad + i of columns
        // 128c + 8·col + j.
        const kt_frag pa = kt_pack4(p[0], p[1], p[2], p[3]);
        long vrows[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int t = j0 + 4 * quad + i;
            vrows[i] = row_of(t < t1 ? t : t0);
        }
#pragma unroll
        for (int c = 0; c < KT_DV / 128; ++c) {
            kt_frag vb[8];
            kt_cols8(value_cache, vrows, 128 * c + 8 * col, vb);
#pragma unroll
            for (int j = 0; j < 8; ++j) o[c][j] = kt_mfma16(pa, vb[j], o[c][j]);
        }
    }
    // Head col's sum over the quads; each wave's maxima and sums to the block.
    run_sum += KT_SHFL_XOR(run_sum, 16);
    run_sum += KT_SHFL_XOR(run_sum, 32);
    if (lane < KT_HEADS) {
        wave_max[wave][lane] = run_max;
        wave_sum[wave][lane] = run_sum;
    }
    KT_SYNC();  // and every wave is done with the query: the pool takes the sums
    // This lane's rows scaled to their head's maximum over the waves (a wave without a tile
    // has -inf, a factor of 0; wave 0 always has one).
    float f[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int h = 4 * quad + e;
        float mb = -KT_INF;
        if (h < KT_HEADS)
            for (int w = 0; w < KT_WAVES; ++w) mb = fmaxf(mb, wave_max[w][h]);
        f[e] = h < KT_HEADS ? exp2f(wave_max[wave][h] - mb) : 0.0f;
    }
    // The waves add their chunks of 128 columns in turn, then the block writes each out.
#pragma unroll
    for (int c = 0; c < KT_DV / 128; ++c) {
        for (int w = 0; w < KT_WAVES; ++w) {
            if (wave == w) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = 4 * quad + e;
                    if (h >= KT_HEADS) continue;
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        float* const at = sums + h * 128 + 8 * col + j;
                        const float v = o[c][j][e] * f[e];
                        *at = w == 0 ? v : *at + v;
                    }
                }
            }
            KT_SYNC();
        }
        for (int i = tid; i < KT_HEADS * 128; i += KT_THREADS)
            part_out[slot(i / 128) * KT_DV + 128 * c + i % 128] = sums[i];
        KT_SYNC();
    }
    if (tid < KT_HEADS) {
        float mb = -KT_INF;
        for (int w = 0; w < KT_WAVES; ++w) mb = fmaxf(mb, wave_max[w][tid]);
        float total = 0.0f;
        for (int w = 0; w < KT_WAVES; ++w) total += wave_sum[w][tid] * exp2f(wave_max[w][tid] - mb);
        part_max[slot(tid)] = mb;
        part_sum[slot(tid)] = total;
    }
}

#elif KT_HEADS > 1

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_paged(const kt_in* __restrict__ query, const kt_cache* __restrict__ key_cache,
         const kt_cache* __restrict__ value_cache, const unsigned* __restrict__ block_tables,
         const unsigned* __restrict__ context_lens, float* __restrict__ part_out,
         float* __restrict__ part_max, float* __restrict__ part_sum, int q_heads, int kv_heads,
         int max_blocks, int partitions, float scale, int window, float softcap,
         const float* __restrict__ slopes) {
    KT_SHARED float qs[KT_HEADS][KT_D];
    KT_SHARED float scores[KT_HEADS][KT_PART];
    const int tid = KT_TID;
    const kt_part b = kt_part_of(context_lens, KT_HEADS, q_heads, kv_heads, partitions, window);
    if (kt_empty(b, KT_HEADS, part_out, part_max, part_sum)) return;
    const int seq = b.seq, h0 = b.h0, kvh = b.kvh, skip = b.skip, t0 = b.t0, t1 = b.t1;
    auto slot = [&](int g) { return kt_slot(b, g); };
    const float log2e = 1.4426950408889634f;
    for (int i = tid; i < KT_HEADS * KT_D; i += KT_THREADS)
        qs[i / KT_D][i % KT_D] =
            kt_load(query, ((long)seq * q_heads + h0) * KT_D + i) * scale * log2e;
    KT_SYNC();
    const unsigned* table = block_tables + (long)seq * max_blocks + skip;
    auto row_of = [&](int t) {
        return (((long)table[t / KT_BLOCK] * KT_BLOCK + t % KT_BLOCK) * kv_heads + kvh) * KT_D;
    };
    for (int t = t0 + tid; t < t1; t += KT_THREADS) {
        const long row = row_of(t);
        float dot[KT_HEADS];
#pragma unroll
        for (int g = 0; g < KT_HEADS; ++g) dot[g] = 0.0f;
        // Two keys' values in flight: with four, ptxas spilled a word or two on sm_90 (16
        // heads; 8 on an fp8 cache) at 48 registers of its 255.
#pragma unroll 2
        for (int x = 0; x < KT_D; ++x) {
            const float k = kt_load_cache(key_cache, row + x);
#pragma unroll
            for (int g = 0; g < KT_HEADS; ++g) dot[g] = fmaf(qs[g][x], k, dot[g]);
        }
#pragma unroll
        for (int g = 0; g < KT_HEADS; ++g)
            scores[g][t - t0] = kt_score_in(dot[g], softcap * log2e,
                                            kt_alibi_unit(slopes, h0 + g, log2e), t, b.pos);
    }
    KT_SYNC();
    // Wave w takes heads w, w + WAVES, ...: a row's maximum (capped, as the one-head kernel
    // caps it), its weights and their sum.
    const int wave = tid / KT_WAVE;
    const int lane = tid % KT_WAVE;
    const int n = t1 - t0;
    const float cap_unit = softcap * log2e;
    for (int g = wave; g < KT_HEADS; g += KT_WAVES) {
        float mx = -KT_INF;
        for (int i = lane; i < n; i += KT_WAVE) mx = fmaxf(mx, scores[g][i]);
        mx = kt_score_out(kt_wave_max(mx), cap_unit);
        float sum = 0.0f;
        for (int i = lane; i < n; i += KT_WAVE) {
            const float p = exp2f(kt_score_out(scores[g][i], cap_unit) - mx);
            scores[g][i] = p;
            sum += p;
        }
        sum = kt_wave_sum(sum);
        if (lane == 0) {
            part_max[slot(g)] = mx;
            part_sum[slot(g)] = sum;
        }
    }
    KT_SYNC();
    for (int x = tid; x < KT_DV; x += KT_THREADS) {
        float acc[KT_HEADS];
#pragma unroll
        for (int g = 0; g < KT_HEADS; ++g) acc[g] = 0.0f;
        for (int t = t0; t < t1; ++t) {
            const float v = kt_load_cache(value_cache, row_of(t) + x);
#pragma unroll
            for (int g = 0; g < KT_HEADS; ++g) acc[g] = fmaf(scores[g][t - t0], v, acc[g]);
        }
#pragma unroll
        for (int g = 0; g < KT_HEADS; ++g) part_out[slot(g) * KT_DV + x] = acc[g];
    }
}

#elif KT_LANES == 1

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_paged(const kt_in* __restrict__ query, const kt_cache* __restrict__ key_cache,
         const kt_cache* __restrict__ value_cache, const unsigned* __restrict__ block_tables,
         const unsigned* __restrict__ context_lens, float* __restrict__ part_out,
         float* __restrict__ part_max, float* __restrict__ part_sum, int q_heads, int kv_heads,
         int max_blocks, int partitions, float scale, int window, float softcap,
         const float* __restrict__ slopes) {
    KT_SHARED float qs[KT_D];
    KT_SHARED float scores[KT_PART];
    KT_SHARED float red[KT_WAVES];
    const int tid = KT_TID;
    const kt_part b = kt_part_of(context_lens, 1, q_heads, kv_heads, partitions, window);
    if (kt_empty(b, 1, part_out, part_max, part_sum)) return;
    const int seq = b.seq, h = b.h0, kvh = b.kvh, skip = b.skip, t0 = b.t0, t1 = b.t1;
    const long slot = b.slot0;
    const float log2e = 1.4426950408889634f;
    const float alibi = kt_alibi_unit(slopes, h, log2e);
    for (int x = tid; x < KT_D; x += KT_THREADS)
        qs[x] = kt_load(query, ((long)seq * q_heads + h) * KT_D + x) * scale * log2e;
    KT_SYNC();
    const unsigned* table = block_tables + (long)seq * max_blocks + skip;
    float local_max = -KT_INF;
    for (int t = t0 + tid; t < t1; t += KT_THREADS) {
        const long row =
            (((long)table[t / KT_BLOCK] * KT_BLOCK + t % KT_BLOCK) * kv_heads + kvh) * KT_D;
        float dot = 0.0f;
#pragma unroll 8
        for (int x = 0; x < KT_D; ++x) dot = fmaf(qs[x], kt_load_cache(key_cache, row + x), dot);
        dot = kt_score_in(dot, softcap * log2e, alibi, t, b.pos);
        scores[t - t0] = dot;
        local_max = fmaxf(local_max, dot);
    }
    // Capped (a cap keeps the order of the scores, so it caps their maximum too) where the
    // scores turn into weights.
    const float cap_unit = softcap * log2e;
    const float mx = kt_score_out(kt_block_max(local_max, red), cap_unit);
    float local_sum = 0.0f;
    for (int t = t0 + tid; t < t1; t += KT_THREADS) {
        const float p = exp2f(kt_score_out(scores[t - t0], cap_unit) - mx);
        scores[t - t0] = p;
        local_sum += p;
    }
    const float sum = kt_block_sum(local_sum, red);
    for (int x = tid; x < KT_DV; x += KT_THREADS) {
        float acc = 0.0f;
        for (int t = t0; t < t1; ++t) {
            const long row =
                (((long)table[t / KT_BLOCK] * KT_BLOCK + t % KT_BLOCK) * kv_heads + kvh) * KT_D;
            acc = fmaf(scores[t - t0], kt_load_cache(value_cache, row + x), acc);
        }
        part_out[slot * KT_DV + x] = acc;
    }
    if (tid == 0) {
        part_max[slot] = mx;
        part_sum[slot] = sum;
    }
}

#else

#define KT_GROUPS (KT_THREADS / KT_LANES)
// Dims a lane owns, and its 16-byte pieces of a row.
#define KT_PER (KT_D / KT_LANES)
#define KT_PIECES (KT_PER / KT_VEC)
// The pieces of a value row's first KT_DV values a lane owns (all of its key pieces but on a
// latent cache).
#define KT_VPIECES (KT_DV / KT_LANES / KT_VEC)
#if KT_LANES > KT_WAVE || KT_PIECES < 1 || KT_PIECES * KT_VEC * KT_LANES != KT_D
#error "KT_LANES must divide the wave, and KT_D must be whole 16-byte pieces for every lane"
#endif
#if KT_VPIECES < 1 || KT_VPIECES * KT_VEC * KT_LANES != KT_DV
#error "KT_DV must be whole 16-byte pieces for every lane"
#endif

// Sum over the lanes of one token group, every lane receiving it.
KT_DEVICE float kt_lanes_sum(float v) {
#pragma unroll
    for (int m = KT_LANES / 2; m > 0; m /= 2) v += KT_SHFL_XOR(v, m);
    return v;
}

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_paged(const kt_in* __restrict__ query, const kt_cache* __restrict__ key_cache,
         const kt_cache* __restrict__ value_cache, const unsigned* __restrict__ block_tables,
         const unsigned* __restrict__ context_lens, float* __restrict__ part_out,
         float* __restrict__ part_max, float* __restrict__ part_sum, int q_heads, int kv_heads,
         int max_blocks, int partitions, float scale, int window, float softcap,
         const float* __restrict__ slopes) {
    KT_SHARED float scores[KT_PART];
    KT_SHARED float red[KT_WAVES];
    KT_SHARED float sums[KT_WAVES][KT_DV];
    const int tid = KT_TID;
    const kt_part b = kt_part_of(context_lens, 1, q_heads, kv_heads, partitions, window);
    if (kt_empty(b, 1, part_out, part_max, part_sum)) return;
    const int seq = b.seq, h = b.h0, kvh = b.kvh, skip = b.skip, t0 = b.t0, t1 = b.t1;
    const long slot = b.slot0;
    const int lane = tid % KT_LANES;
    const int group = tid / KT_LANES;
    // The dims of piece p of this lane start at (p·LANES + lane)·VEC.
    auto dim = [&](int p) { return (p * KT_LANES + lane) * KT_VEC; };
    const float log2e = 1.4426950408889634f;
    const float alibi = kt_alibi_unit(slopes, h, log2e);
    float q[KT_PIECES][KT_VEC];
    const kt_in* qrow = query + ((long)seq * q_heads + h) * KT_D;
#pragma unroll
    for (int p = 0; p < KT_PIECES; ++p) {
        kt_widen16(kt_load16(qrow + dim(p)), q[p]);
#pragma unroll
        for (int e = 0; e < KT_VEC; ++e) q[p][e] *= scale * log2e;
    }
    const unsigned* table = block_tables + (long)seq * max_blocks + skip;
    auto row_of = [&](int t) {
        return (((long)table[t / KT_BLOCK] * KT_BLOCK + t % KT_BLOCK) * kv_heads + kvh) * KT_D;
    };
    float local_max = -KT_INF;
    // Rounds of one token a group, the same number for every lane of a wave (the shuffles
    // need all of them); a group past the end reads the last token and keeps nothing.
    for (int base = t0; base < t1; base += KT_GROUPS) {
        const int t = min(base + group, t1 - 1);
        const long row = row_of(t);
        kt_cache_piece kw[KT_PIECES];
#pragma unroll
        for (int p = 0; p < KT_PIECES; ++p) kw[p] = kt_load_piece(key_cache + row + dim(p));
        float dot = 0.0f;
#pragma unroll
        for (int p = 0; p < KT_PIECES; ++p) {
            float k[KT_VEC];
            kt_widen_piece(kw[p], k);
#pragma unroll
            for (int e = 0; e < KT_VEC; ++e) dot = fmaf(q[p][e], k[e], dot);
        }
        dot = kt_score_in(kt_lanes_sum(dot), softcap * log2e, alibi, t, b.pos);
        if (base + group < t1) {
            if (lane == 0) scores[t - t0] = dot;
            local_max = fmaxf(local_max, dot);
        }
    }
    // Capped (a cap keeps the order of the scores, so it caps their maximum too) where the
    // scores turn into weights.
    const float cap_unit = softcap * log2e;
    const float mx = kt_score_out(kt_block_max(local_max, red), cap_unit);
    float local_sum = 0.0f;
    for (int t = t0 + tid; t < t1; t += KT_THREADS) {
        const float p = exp2f(kt_score_out(scores[t - t0], cap_unit) - mx);
        scores[t - t0] = p;
        local_sum += p;
    }
    // Its barriers also make every probability visible to every group.
    const float sum = kt_block_sum(local_sum, red);
    float acc[KT_VPIECES][KT_VEC];
#pragma unroll
    for (int p = 0; p < KT_VPIECES; ++p)
#pragma unroll
        for (int e = 0; e < KT_VEC; ++e) acc[p][e] = 0.0f;
    for (int t = t0 + group; t < t1; t += KT_GROUPS) {
        const long row = row_of(t);
        const float w = scores[t - t0];
        kt_cache_piece vw[KT_VPIECES];
#pragma unroll
        for (int p = 0; p < KT_VPIECES; ++p) vw[p] = kt_load_piece(value_cache + row + dim(p));
#pragma unroll
        for (int p = 0; p < KT_VPIECES; ++p) {
            float v[KT_VEC];
            kt_widen_piece(vw[p], v);
#pragma unroll
            for (int e = 0; e < KT_VEC; ++e) acc[p][e] = fmaf(w, v[e], acc[p][e]);
        }
    }
    // The groups of a wave sum by shuffles (lanes LANES apart hold the same dims), then the
    // waves through LDS.
#pragma unroll
    for (int p = 0; p < KT_VPIECES; ++p)
#pragma unroll
        for (int e = 0; e < KT_VEC; ++e)
#pragma unroll
            for (int m = KT_LANES; m < KT_WAVE; m *= 2) acc[p][e] += KT_SHFL_XOR(acc[p][e], m);
    const int wave = tid / KT_WAVE;
    if (tid % KT_WAVE < KT_LANES)
#pragma unroll
        for (int p = 0; p < KT_VPIECES; ++p)
#pragma unroll
            for (int e = 0; e < KT_VEC; ++e) sums[wave][dim(p) + e] = acc[p][e];
    KT_SYNC();
    for (int x = tid; x < KT_DV; x += KT_THREADS) {
        float total = 0.0f;
        for (int w = 0; w < KT_WAVES; ++w) total += sums[w][x];
        part_out[slot * KT_DV + x] = total;
    }
    if (tid == 0) {
        part_max[slot] = mx;
        part_sum[slot] = sum;
    }
}

#endif

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_paged_reduce(const float* __restrict__ part_out, const float* __restrict__ part_max,
                const float* __restrict__ part_sum, float* __restrict__ out, int q_heads,
                int partitions, const float* __restrict__ sinks, float v_scale) {
    const int h = KT_BID_X;
    const int seq = KT_BID_Y;
    const long base = ((long)seq * q_heads + h) * partitions;
    float mx = -KT_INF;
    for (int p = 0; p < partitions; ++p) mx = fmaxf(mx, part_max[base + p]);
    float total = 0.0f;
    for (int p = 0; p < partitions; ++p)
        if (part_sum[base + p] > 0.0f) total += part_sum[base + p] * exp2f(part_max[base + p] - mx);
    total += kt_sink_weight(sinks, h, mx);
    const float inv = total > 0.0f ? v_scale / total : 0.0f;
    for (int x = KT_TID; x < KT_DV; x += KT_THREADS) {
        float acc = 0.0f;
        for (int p = 0; p < partitions; ++p)
            if (part_sum[base + p] > 0.0f)
                acc += part_out[(base + p) * KT_DV + x] * exp2f(part_max[base + p] - mx);
        out[((long)seq * q_heads + h) * KT_DV + x] = acc * inv;
    }
}
