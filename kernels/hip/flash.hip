// kerntune flash attention, forward (prefill). Q [batch, q_len, q_heads, D], K and V
// [batch, kv_len, kv_heads, D] in f32, f16 or bf16 (KT_DTYPE); out [batch, q_len, q_heads, D]
// in f32. GQA/MQA: query head h reads kv head h / (q_heads / kv_heads). Causal with
// q_len < kv_len aligns the queries to the end of the keys, as in chunked prefill.
//
// Grid (ceil(q_len / BR), q_heads, batch); KT_BR × KT_LANES threads: each query row is held by
// KT_LANES neighbouring lanes, lane j owning dims j, j + LANES, ... of q and of the output row
// (so the lanes' LDS reads are consecutive), with dot products summed across the lanes by
// shuffles. Key and value tiles of KT_BC rows are staged in LDS as f32 and shared by the
// block's rows; the softmax is online, in base 2 with the scale folded into q. Causal blocks
// stop at the last tile any of their rows may see.
#include "prelude.h"

#ifndef KT_BR
#error "KT_BR, KT_BC, KT_LANES and KT_D must be defined"
#endif
#if KT_D % KT_LANES != 0
#error "KT_LANES must divide KT_D"
#endif

#define KT_THREADS (KT_BR * KT_LANES)
#define KT_PER_LANE (KT_D / KT_LANES)

KT_GLOBAL void KT_LAUNCH_BOUNDS(KT_THREADS)
kt_flash(const kt_in* __restrict__ q, const kt_in* __restrict__ k, const kt_in* __restrict__ v,
         float* __restrict__ out, int q_len, int kv_len, int q_heads, int kv_heads, int causal,
         float scale) {
    KT_SHARED float ks[KT_BC][KT_D];
    KT_SHARED float vs[KT_BC][KT_D];
    const int tid = KT_TID;
    const int lane = tid % KT_LANES;
    const int h = KT_BID_Y;
    const int b = KT_BID_Z;
    const int kvh = h / (q_heads / kv_heads);
    const int i = KT_BID_X * KT_BR + tid / KT_LANES;
    const bool live = i < q_len;
    const float log2e = 1.4426950408889634f;

    float qr[KT_PER_LANE], o[KT_PER_LANE];
    const long qrow = (((long)b * q_len + (live ? i : 0)) * q_heads + h) * KT_D;
#pragma unroll
    for (int x = 0; x < KT_PER_LANE; ++x) {
        qr[x] = live ? kt_load(q, qrow + lane + KT_LANES * x) * scale * log2e : 0.0f;
        o[x] = 0.0f;
    }
    float mx = -KT_INF, sum = 0.0f;
    // Keys row i may see: all, or up to its position aligned to the end of the keys.
    const int shift = kv_len - q_len;
    const int seen = causal ? min(kv_len, i + shift + 1) : kv_len;
    const int block_last = min(q_len, KT_BID_X * KT_BR + KT_BR) - 1;
    const int block_seen = causal ? min(kv_len, block_last + shift + 1) : kv_len;

    for (int j0 = 0; j0 < block_seen; j0 += KT_BC) {
        for (int e = tid; e < KT_BC * KT_D; e += KT_THREADS) {
            const int r = e / KT_D, x = e % KT_D;
            const int j = j0 + r;
            const long at = (((long)b * kv_len + j) * kv_heads + kvh) * KT_D + x;
            ks[r][x] = j < kv_len ? kt_load(k, at) : 0.0f;
            vs[r][x] = j < kv_len ? kt_load(v, at) : 0.0f;
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
            s[r] = (live && j0 + r < seen) ? dot : -KT_INF;
            tile_max = fmaxf(tile_max, s[r]);
        }
        if (tile_max > -KT_INF) {
            const float m_new = fmaxf(mx, tile_max);
            const float correction = exp2f(mx - m_new);
            sum *= correction;
#pragma unroll
            for (int x = 0; x < KT_PER_LANE; ++x) o[x] *= correction;
#pragma unroll
            for (int r = 0; r < KT_BC; ++r) {
                const float p = exp2f(s[r] - m_new);
                sum += p;
#pragma unroll
                for (int x = 0; x < KT_PER_LANE; ++x)
                    o[x] = fmaf(p, vs[r][lane + KT_LANES * x], o[x]);
            }
            mx = m_new;
        }
        KT_SYNC();
    }
    if (live) {
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
        for (int x = 0; x < KT_PER_LANE; ++x) out[qrow + lane + KT_LANES * x] = o[x] * inv;
    }
}
