// kerntune paged attention, decode. query [num_seqs, q_heads, D]; key and value caches
// [num_blocks, block_size, kv_heads, D] (the vLLM / TGI layout) in f32, f16 or bf16
// (KT_DTYPE); block_tables [num_seqs, max_blocks] and context_lens [num_seqs] as u32; out
// [num_seqs, q_heads, D] in f32.
//
// Two kernels. kt_paged: grid (partitions, q_heads, num_seqs), KT_THREADS threads; a block
// takes KT_PART tokens of one sequence for one query head: scores into LDS (one token per
// thread at a time), block-wide max and sum, then P·V with consecutive threads on consecutive
// dims, written unnormalised with the partition's max and sum. kt_paged_reduce: grid
// (q_heads, num_seqs), combines the partitions by their log-sum-exp.
#include "prelude.h"

#ifndef KT_PART
#error "KT_PART, KT_THREADS, KT_D and KT_BLOCK must be defined"
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

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_paged(const kt_in* __restrict__ query, const kt_in* __restrict__ key_cache,
         const kt_in* __restrict__ value_cache, const unsigned* __restrict__ block_tables,
         const unsigned* __restrict__ context_lens, float* __restrict__ part_out,
         float* __restrict__ part_max, float* __restrict__ part_sum, int q_heads, int kv_heads,
         int max_blocks, int partitions, float scale) {
    KT_SHARED float qs[KT_D];
    KT_SHARED float scores[KT_PART];
    KT_SHARED float red[KT_WAVES];
    const int tid = KT_TID;
    const int part = KT_BID_X;
    const int h = KT_BID_Y;
    const int seq = KT_BID_Z;
    const int kvh = h / (q_heads / kv_heads);
    const int ctx = (int)context_lens[seq];
    const int t0 = part * KT_PART;
    const int t1 = min(ctx, t0 + KT_PART);
    const long slot = ((long)seq * q_heads + h) * partitions + part;
    if (t0 >= t1) {
        // An empty partition contributes nothing to the reduction.
        if (tid == 0) {
            part_max[slot] = -KT_INF;
            part_sum[slot] = 0.0f;
        }
        for (int x = tid; x < KT_D; x += KT_THREADS) part_out[slot * KT_D + x] = 0.0f;
        return;
    }
    const float log2e = 1.4426950408889634f;
    for (int x = tid; x < KT_D; x += KT_THREADS)
        qs[x] = kt_load(query, ((long)seq * q_heads + h) * KT_D + x) * scale * log2e;
    KT_SYNC();
    const unsigned* table = block_tables + (long)seq * max_blocks;
    float local_max = -KT_INF;
    for (int t = t0 + tid; t < t1; t += KT_THREADS) {
        const long row =
            (((long)table[t / KT_BLOCK] * KT_BLOCK + t % KT_BLOCK) * kv_heads + kvh) * KT_D;
        float dot = 0.0f;
#pragma unroll 8
        for (int x = 0; x < KT_D; ++x) dot = fmaf(qs[x], kt_load(key_cache, row + x), dot);
        scores[t - t0] = dot;
        local_max = fmaxf(local_max, dot);
    }
    const float mx = kt_block_max(local_max, red);
    float local_sum = 0.0f;
    for (int t = t0 + tid; t < t1; t += KT_THREADS) {
        const float p = exp2f(scores[t - t0] - mx);
        scores[t - t0] = p;
        local_sum += p;
    }
    const float sum = kt_block_sum(local_sum, red);
    for (int x = tid; x < KT_D; x += KT_THREADS) {
        float acc = 0.0f;
        for (int t = t0; t < t1; ++t) {
            const long row =
                (((long)table[t / KT_BLOCK] * KT_BLOCK + t % KT_BLOCK) * kv_heads + kvh) * KT_D;
            acc = fmaf(scores[t - t0], kt_load(value_cache, row + x), acc);
        }
        part_out[slot * KT_D + x] = acc;
    }
    if (tid == 0) {
        part_max[slot] = mx;
        part_sum[slot] = sum;
    }
}

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_paged_reduce(const float* __restrict__ part_out, const float* __restrict__ part_max,
                const float* __restrict__ part_sum, float* __restrict__ out, int q_heads,
                int partitions) {
    const int h = KT_BID_X;
    const int seq = KT_BID_Y;
    const long base = ((long)seq * q_heads + h) * partitions;
    float mx = -KT_INF;
    for (int p = 0; p < partitions; ++p) mx = fmaxf(mx, part_max[base + p]);
    float total = 0.0f;
    for (int p = 0; p < partitions; ++p)
        if (part_sum[base + p] > 0.0f) total += part_sum[base + p] * exp2f(part_max[base + p] - mx);
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int x = KT_TID; x < KT_D; x += KT_THREADS) {
        float acc = 0.0f;
        for (int p = 0; p < partitions; ++p)
            if (part_sum[base + p] > 0.0f)
                acc += part_out[(base + p) * KT_D + x] * exp2f(part_max[base + p] - mx);
        out[((long)seq * q_heads + h) * KT_D + x] = acc * inv;
    }
}
