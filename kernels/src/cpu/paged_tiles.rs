//! The two halves of a paged-attention task in tiles of 16 keys (`key_tiles` configs,
//! AVX-512, every cache type): scores `Q·Kᵀ` without horizontal sums per token, and `P·V`
//! with query-row sums held in registers. [`super::paged`] owns the tasks, the softmax and
//! the partitions; [`super::paged_elems`] how each cache type is read and multiplied.
//!
//! Scores: the query rows of a KV head share the lanes of one vector (each row a few
//! consecutive 32-bit words: f32 values, or pairs of bf16), and each key row's matching words
//! are broadcast against it, so every key row is read once for all query rows and every
//! multiply-add does useful work whatever the group size. Sixteen tokens' sums are then
//! transposed once, turning lanes into tokens. The query is used as given (bf16 stays bf16)
//! and the scale is applied to the f32 sums.
//!
//! `P·V`: for 32 head-dim values at a time, up to 8 query rows keep their sums in 16
//! registers while the value rows of a 64-token chunk (16 KiB of bf16 at d = 128, in L1)
//! stream past; each value vector is loaded once for all rows. f32 values meet f32 weights
//! in FMAs; bf16 values go two tokens to a pair, against the two weights rounded to bf16.

use std::arch::x86_64::*;

use super::leaf::prefetch;
use super::paged_elems::{
    lanes16, Bf16Bits, Bf16Pairs, F16Bits, F32Words, Fp8Bytes, TileElem, Widened,
};

/// Tokens ahead whose key rows are prefetched into L2: four tiles, four blocks of 16. Value
/// rows are prefetched a chunk ([`V_CHUNK`]) ahead. Both are requested a line at a time as
/// the line of the same position in the current rows is read: the miss buffers hold about
/// two dozen lines, and a burst of a tile's 64 (or a chunk's 256) requests stalled the loop
/// until they drained. 128 tokens measured no different (two Zen 4 cores, cold, Llama-70B
/// TP8's and Llama-3.1-8B's decode).
const AHEAD: usize = 64;
/// Tokens per score tile: one vector of scores per query row.
pub(super) const TILE: usize = 16;
/// Query rows whose sums stay in registers together.
const ROWS: usize = 8;
/// Tokens whose value rows are reused from L1 across the passes over the head dimension.
const V_CHUNK: usize = 64;
/// Cache row strides (bytes, every KV head of a token) from which a chunk is
/// [`ALIASED_CHUNK`] tokens: a head's bytes of rows a power of two apart fall into a few of the
/// L1's sets (at 2 KiB, eight of its 64), and 64 rows' lines overflow their ways before the
/// next pass over the head dimension reuses them. Two threads, cold, 8 sequences × 4096
/// tokens, 32 query heads on 8 KV heads, d = 128, whole rows: bf16 11.0 ms in turns of 32
/// against 12.6 (256: 11.2 against 15.5); 4 KV heads, 16 sequences, 11.6–11.7 against
/// 12.9; d = 64, 8 KV heads, 5.3–5.5 against 5.7; one KV head (256-byte rows) the same.
const ALIASED_STRIDE: usize = 1024;
/// A chunk's tokens on such rows.
const ALIASED_CHUNK: usize = 16;

/// Tokens of a value chunk on rows `stride` bytes apart (the AVX2 kernels too).
pub(super) fn value_chunk(stride: usize) -> usize {
    if stride >= ALIASED_STRIDE {
        ALIASED_CHUNK
    } else {
        V_CHUNK
    }
}

/// Calls `f::<R>(args)` for `R = rows` (1 to [`ROWS`]): the row count is a const generic so
/// each row group's sums are an array LLVM keeps in registers.
macro_rules! by_rows {
    ($rows:expr, $f:ident::<$e:ty>($($arg:expr),*)) => {
        match $rows {
            8 => $f::<$e, 8>($($arg),*),
            7 => $f::<$e, 7>($($arg),*),
            6 => $f::<$e, 6>($($arg),*),
            5 => $f::<$e, 5>($($arg),*),
            4 => $f::<$e, 4>($($arg),*),
            3 => $f::<$e, 3>($($arg),*),
            2 => $f::<$e, 2>($($arg),*),
            _ => $f::<$e, 1>($($arg),*),
        }
    };
}

pub(super) use by_rows;

/// Where a task's key or value rows lie: token `i` of the task is context token `first + i`,
/// row `(first + i) % 2^shift` of block `table[(first + i) >> shift]`. A plain struct rather
/// than a closure: its two loads and three integer operations inline into the loops that
/// fetch and prefetch rows, where a closure call cost more than the row's arithmetic.
#[derive(Clone, Copy)]
pub struct Rows {
    /// The cache's first byte of this task's KV head.
    pub base: *const u8,
    /// The sequence's block table.
    pub table: *const u32,
    /// The task's first context token.
    pub first: usize,
    /// log2 of the block size.
    pub shift: u32,
    /// Bytes from one token's row to the next within a block.
    pub stride: usize,
}

impl Rows {
    /// Token `i`'s row.
    ///
    /// # Safety
    /// The block table entry of token `first + i` exists and names a block inside the cache.
    #[inline(always)]
    pub(super) unsafe fn at(&self, i: usize) -> *const u8 {
        let t = self.first + i;
        // SAFETY: the caller's contract.
        unsafe {
            let block = *self.table.add(t >> self.shift) as usize;
            let row = (block << self.shift) + (t & ((1 << self.shift) - 1));
            self.base.add(row * self.stride)
        }
    }
}

/// One task's buffers, as every tile kernel's entry point takes them: `q` holds `rows` query
/// rows of `d` values; the `n` tokens' keys and values are read through `key` and `value`;
/// `scores` holds `rows` rows `ld >= n` apart, to receive the scores times `scale`; `scratch`
/// is the kernel's own (its size is the kernel's to say); `P·V`, over the first `dv <= d`
/// values of each value row, is added to `acc` (`rows` rows `d` apart, zeroed by the caller).
/// `dv` is below `d` on a latent cache only (the AMX kernel takes `dv = d`).
#[derive(Clone, Copy)]
pub struct Task {
    pub q: *const u8,
    pub rows: usize,
    pub d: usize,
    pub dv: usize,
    pub n: usize,
    pub key: Rows,
    pub value: Rows,
    pub scale: f32,
    pub scores: *mut f32,
    pub ld: usize,
    pub scratch: *mut u32,
    pub acc: *mut f32,
    /// The query rows are laid out in `scratch` already, by the call before on the same
    /// rows and scratch (a `whole_rows` task's heads take turns a block at a time, and laying
    /// the rows out each turn cost as much as the turn's arithmetic). The tile kernels here
    /// skip laying them out; the AMX kernel lays its heads out once a task and ignores it.
    pub q_ready: bool,
    /// Tokens past `n` that the rows go on to (`key.at(i)` and `value.at(i)` valid for
    /// `i < n + ahead`): the next turns of a `whole_rows` task's head, whose rows the tile
    /// kernels prefetch as they prefetch their own. A turn is shorter than the prefetch
    /// distance, so without them each turn requested nothing ahead and read its rows cold.
    /// The AMX kernel prefetches every head's rows itself and ignores it.
    pub ahead: usize,
}

/// Scratch words for `rows` query rows of head dimension `d` laid out for [`scores`] (per
/// group of up to 16 rows, a vector of 16 words per step of at most `d / E::PER_WORD`
/// steps), then a tile of key rows widened to f32 where the cache holds 16-bit values that are
/// not multiplied as bf16 pairs.
pub fn q_words<E: TileElem>(d: usize, rows: usize) -> usize {
    rows.div_ceil(16) * (d / E::PER_WORD).max(1) * 16 + TILE * d
}

/// `scores[r · ld + i] = scale · q_r · k_i` for `rows` query rows and `n` tokens.
///
/// Query rows go in groups of up to 16, each padded to `R` rows, a power of two, so a
/// vector holds `U = 16 / R` words of every row: lane `r · U + u` holds word `s · U + u` of
/// row `r` at step `s` (laid out once per task in `qs`). Against it, the same `U` words of
/// one key row broadcast to every row's lanes: one multiply-add per token and step, and each
/// token's 16 lanes hold `U` partial sums of each row. After the steps, one transpose of the
/// 16 tokens' sums turns lanes into tokens, and adding each row's `U` vectors gives its 16
/// scores.
///
/// # Safety
/// The CPU has AVX-512F/BW/VL (and AVX-512-BF16 for bf16 pairs); `d` is a multiple of
/// `E::PER_WORD`; `q` holds `rows` rows of `d` values (read unaligned: a 16-bit buffer need
/// only be 2-byte aligned); `key.at(i)` points at `d` readable values for `i < n` and
/// names a row of the cache for `i < reach` (`reach >= n`: those rows are prefetched);
/// `scores` is writable for `rows` rows of `n` at `ld` apart; `qs` holds
/// [`q_words`]`(d, rows)` words.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores<E: TileElem>(
    q: *const u8,
    rows: usize,
    d: usize,
    (n, reach): (usize, usize),
    key: Rows,
    scale: f32,
    scores: *mut f32,
    ld: usize,
    qs: *mut u32,
    q_ready: bool,
) {
    let words = d / E::PER_WORD;
    let groups = rows.div_ceil(16);
    // SAFETY: the caller's contract on the query and `qs`.
    unsafe {
        for g in (0..groups).filter(|_| !q_ready) {
            let g_rows = 16.min(rows - 16 * g);
            let u = 16 / g_rows.next_power_of_two();
            let dst = qs.add(g * words * 16);
            for (s, w0) in (0..words).step_by(u).enumerate() {
                for lane in 0..16 {
                    let (r, w) = (lane / u, w0 + lane % u);
                    let word = if r < g_rows && w < words {
                        E::query_word(q.add((16 * g + r) * d * E::QUERY_BYTES), w)
                    } else {
                        0
                    };
                    dst.add(16 * s + lane).write(word);
                }
            }
        }
    }
    for i0 in (0..n).step_by(TILE) {
        let live = TILE.min(n - i0);
        // SAFETY: the caller's contract on keys, `qs` and the scores.
        unsafe {
            // Plain loops fill the arrays: `std::array::from_fn` was left a call and a copy.
            // Tokens past `n` read token 0's row; their scores are not stored.
            let mut rows_at = [key.at(i0); TILE];
            for (t, row) in rows_at.iter_mut().enumerate().take(live).skip(1) {
                *row = key.at(i0 + t);
            }
            let mut ahead = [std::ptr::null::<u8>(); TILE];
            let mut ahead_live = TILE.min(reach.saturating_sub(i0 + AHEAD));
            for (t, row) in ahead.iter_mut().enumerate().take(ahead_live) {
                *row = key.at(i0 + AHEAD + t);
            }
            let staging = qs.add(groups * words * 16).cast::<f32>();
            if E::stage_keys(&mut rows_at, live, d, staging, &ahead[..ahead_live]) {
                ahead_live = 0;
            }
            for g in 0..groups {
                let g_rows = 16.min(rows - 16 * g);
                let qg = qs.add(g * words * 16).cast_const();
                let sg = scores.add(16 * g * ld + i0);
                let ahead = if g == 0 { &ahead[..ahead_live] } else { &[] };
                let args = (qg, words, &rows_at, ahead, g_rows, scale, sg, ld, live);
                match 16 / g_rows.next_power_of_two() {
                    1 => score_tile::<E, 1>(args),
                    2 => score_tile::<E, 2>(args),
                    4 => score_tile::<E, 4>(args),
                    8 => score_tile::<E, 8>(args),
                    _ => score_tile::<E, 16>(args),
                }
            }
        }
    }
}

/// `U` consecutive words at `p` in every group of `U` lanes; `n < U` of them (the rest 0).
#[inline(always)]
unsafe fn broadcast<const U: usize>(p: *const u8, n: usize) -> __m512i {
    // SAFETY: the caller vouches for `min(n, U)` words at `p`; the masked load reads no more.
    unsafe {
        if n < U {
            let v = _mm512_maskz_loadu_epi32(lanes16(n), p.cast());
            let idx = _mm512_and_si512(
                _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                _mm512_set1_epi32(U as i32 - 1),
            );
            return _mm512_permutexvar_epi32(idx, v);
        }
        match U {
            1 => _mm512_set1_epi32(p.cast::<i32>().read_unaligned()),
            2 => _mm512_set1_epi64(p.cast::<i64>().read_unaligned()),
            4 => _mm512_broadcast_i32x4(_mm_loadu_si128(p.cast())),
            8 => _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast())),
            _ => _mm512_loadu_si512(p.cast()),
        }
    }
}

/// One tile's scores for a group of `g_rows <= 16 / U` query rows, `qs` laid out for `U`
/// words per step; the `ahead` rows are prefetched a line at a time as the tile's rows are.
#[inline(always)]
#[allow(clippy::type_complexity)]
unsafe fn score_tile<E: TileElem, const U: usize>(
    (qs, words, rows_at, ahead, g_rows, scale, scores, ld, live): (
        *const u32,
        usize,
        &[*const u8; TILE],
        &[*const u8],
        usize,
        f32,
        *mut f32,
        usize,
        usize,
    ),
) {
    // SAFETY: `scores`' contract, narrowed to one group and tile.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); TILE];
        for (s, w0) in (0..words).step_by(U).enumerate() {
            let qv = _mm512_loadu_si512(qs.add(16 * s).cast());
            let at = 4 * w0;
            for (a, row) in acc.iter_mut().zip(rows_at) {
                *a = E::madd(*a, qv, broadcast::<U>(row.add(at), words - w0));
            }
            if at % 64 == 0 {
                for row in ahead {
                    prefetch::<_, true>(row.add(at), 64);
                }
            }
        }
        // Lanes to tokens: `acc[l]` now holds lane `l` of every token's sums.
        let mut t: [__m512i; TILE] = std::mem::transmute(acc);
        super::transpose::transpose16(&mut t);
        let t: [__m512; TILE] = std::mem::transmute(t);
        let (sv, store) = (_mm512_set1_ps(scale), lanes16(live));
        for r in 0..g_rows {
            let mut sum = t[r * U];
            for x in &t[r * U + 1..(r + 1) * U] {
                sum = _mm512_add_ps(sum, *x);
            }
            _mm512_mask_storeu_ps(scores.add(r * ld), store, _mm512_mul_ps(sum, sv));
        }
    }
}

/// `acc[r · d + x] += Σ_i p[r · ld + i] · v_i[x]` for `rows` rows, `x < dv` and `n` tokens,
/// the weights already packed by [`TileElem::pack_weights`].
///
/// # Safety
/// As [`scores`]; `value.at(i)` points at `dv` readable values for `i < n`, at a row of the
/// cache for `i < reach`; `p` holds `rows` rows of packed weights at `ld` words apart; `acc`
/// holds `rows × d`, `dv <= d`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate<E: TileElem>(
    p: *const u32,
    ld: usize,
    rows: usize,
    (d, dv): (usize, usize),
    (n, reach): (usize, usize),
    value: Rows,
    acc: *mut f32,
) {
    let lanes = E::lanes();
    // SAFETY: plain vector loads of the permutations' indices.
    let (to_lanes, from_lanes) = unsafe {
        let mut inverse = [0u32; 32];
        for (i, &x) in lanes.iter().enumerate() {
            inverse[x as usize] = i as u32;
        }
        (
            [
                _mm512_loadu_si512(lanes.as_ptr().cast()),
                _mm512_loadu_si512(lanes.as_ptr().add(16).cast()),
            ],
            [
                _mm512_loadu_si512(inverse.as_ptr().cast()),
                _mm512_loadu_si512(inverse.as_ptr().add(16).cast()),
            ],
        )
    };
    let mut vrows = [std::ptr::null::<u8>(); V_CHUNK];
    let mut next = [std::ptr::null::<u8>(); V_CHUNK];
    let chunk = value_chunk(value.stride);
    for c0 in (0..n).step_by(chunk) {
        let live = chunk.min(n - c0);
        // SAFETY: the caller's contract on values, weights and sums.
        unsafe {
            // A step's second token past `n` reads the last row again, at weight 0.
            let steps = live.next_multiple_of(E::STEP);
            for (t, row) in vrows.iter_mut().enumerate().take(steps) {
                *row = value.at(c0 + t.min(live - 1));
            }
            let next_live = chunk.min(reach.saturating_sub(c0 + chunk));
            for (t, row) in next.iter_mut().enumerate().take(next_live) {
                *row = value.at(c0 + chunk + t);
            }
            let vrows = &vrows[..steps];
            let mut r0 = 0;
            while r0 < rows {
                let nr = ROWS.min(rows - r0);
                let (pr, ar) = (p.add(r0 * ld + c0 / E::STEP), acc.add(r0 * d));
                // The first row group requests the next chunk's rows.
                let next = if r0 == 0 { &next[..next_live] } else { &[] };
                for x0 in (0..dv).step_by(32) {
                    let xl = 32.min(dv - x0);
                    let at = x0 * E::VALUE_BYTES;
                    let perm = (&to_lanes, &from_lanes);
                    let vs = (vrows, next);
                    by_rows!(nr, pv_rows::<E>(pr, ld, vs, at, xl, ar.add(x0), d, perm));
                }
                r0 += nr;
            }
        }
    }
}

/// `R` rows' sums over `xl <= 32` head-dim values, `at` bytes into each value row, for the
/// chunk's tokens; `acc` points at the first of them in row 0 of the sums. The sums are
/// permuted into the step vectors' lane order while they stay in registers. The same bytes
/// of the `next` rows are prefetched, spread over the steps.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_rows<E: TileElem, const R: usize>(
    p: *const u32,
    ld: usize,
    (vrows, next): (&[*const u8], &[*const u8]),
    at: usize,
    xl: usize,
    acc: *mut f32,
    d: usize,
    (to_lanes, from_lanes): (&[__m512i; 2], &[__m512i; 2]),
) {
    let bytes = xl * E::VALUE_BYTES;
    let (m0, m1) = (lanes16(xl), lanes16(xl.saturating_sub(16)));
    // SAFETY: `accumulate`'s contract, narrowed to R rows and xl values.
    unsafe {
        let mut sums = [[_mm512_setzero_ps(); 2]; R];
        for (j, s) in sums.iter_mut().enumerate() {
            let a0 = _mm512_maskz_loadu_ps(m0, acc.add(j * d));
            let a1 = _mm512_maskz_loadu_ps(m1, acc.add(j * d + 16));
            s[0] = _mm512_permutex2var_ps(a0, to_lanes[0], a1);
            s[1] = _mm512_permutex2var_ps(a0, to_lanes[1], a1);
        }
        for (i, step) in vrows.chunks_exact(E::STEP).enumerate() {
            for row in next.iter().skip(i * E::STEP).take(E::STEP) {
                prefetch::<_, true>(row.add(at), bytes);
            }
            let [lo, hi] = E::values(step, at, xl);
            for (j, s) in sums.iter_mut().enumerate() {
                let w = _mm512_set1_epi32(p.add(j * ld + i).read() as i32);
                s[0] = E::madd(s[0], w, lo);
                s[1] = E::madd(s[1], w, hi);
            }
        }
        for (j, s) in sums.iter().enumerate() {
            let a0 = _mm512_permutex2var_ps(s[0], from_lanes[0], s[1]);
            let a1 = _mm512_permutex2var_ps(s[0], from_lanes[1], s[1]);
            _mm512_mask_storeu_ps(acc.add(j * d), m0, a0);
            _mm512_mask_storeu_ps(acc.add(j * d + 16), m1, a1);
        }
    }
}

/// The public entry points, one per element type, each compiled for the target features that
/// element's instructions need (everything above is inlined into them): one task's scores into
/// `t.scores` and, after `softmax` (handed the same pointer) turned them into weights, `P·V`
/// into `t.acc`; `t.scratch` holds [`q_words`] words.
macro_rules! entry {
    ($(#[$doc:meta])* $name:ident, $elem:ty, $features:literal) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub unsafe fn $name(t: Task, softmax: impl FnOnce(*mut f32)) {
            let Task { q, rows, d, dv, n, key, value, scale, scores: s, ld, scratch, acc, q_ready, ahead } = t;
            let reach = n + ahead;
            // SAFETY: the caller's contract.
            unsafe {
                scores::<$elem>(q, rows, d, (n, reach), key, scale, s, ld, scratch, q_ready);
                softmax(s);
                <$elem>::pack_weights(s, rows, ld, n);
                accumulate::<$elem>(s.cast(), ld, rows, (d, dv), (n, reach), value, acc);
            }
        }
    };
}

entry!(
    /// One paged-attention task on f32 caches.
    ///
    /// # Safety
    /// As [`scores`] and [`accumulate`]; the CPU has AVX-512F/BW.
    task_f32,
    F32Words,
    "avx512f,avx512bw"
);

entry!(
    /// One paged-attention task on f16 caches.
    ///
    /// # Safety
    /// As [`scores`] and [`accumulate`]; the CPU has AVX-512F/BW/VL (the 256-bit masked
    /// loads of f16 rows are VL instructions).
    task_f16,
    Widened<F16Bits>,
    "avx512f,avx512bw,avx512vl"
);

entry!(
    /// One paged-attention task on bf16 caches widened to f32 (hosts without AVX-512-BF16,
    /// an odd head dimension, or a config that widens).
    ///
    /// # Safety
    /// As [`scores`] and [`accumulate`]; the CPU has AVX-512F/BW/VL.
    task_bf16_widened,
    Widened<Bf16Bits>,
    "avx512f,avx512bw,avx512vl"
);

entry!(
    /// One paged-attention task on bf16 caches.
    ///
    /// # Safety
    /// As [`scores`] and [`accumulate`]; `d` is even; the CPU has AVX-512F/BW and AVX-512-BF16.
    task_bf16,
    Bf16Pairs,
    "avx512f,avx512bw,avx512bf16"
);

entry!(
    /// One paged-attention task on E4M3 caches (either format) under f16 queries.
    ///
    /// # Safety
    /// As [`scores`] and [`accumulate`]; the CPU has AVX-512F/BW/VL.
    task_f16_e4m3,
    Widened<Fp8Bytes<F16Bits, false>>,
    "avx512f,avx512bw,avx512vl,avx2,f16c"
);

entry!(
    /// One paged-attention task on E5M2 caches under f16 queries.
    ///
    /// # Safety
    /// As [`scores`] and [`accumulate`]; the CPU has AVX-512F/BW/VL.
    task_f16_e5m2,
    Widened<Fp8Bytes<F16Bits, true>>,
    "avx512f,avx512bw,avx512vl,avx2,f16c"
);

entry!(
    /// One paged-attention task on E4M3 caches (either format) under bf16 queries.
    ///
    /// # Safety
    /// As [`scores`] and [`accumulate`]; the CPU has AVX-512F/BW/VL.
    task_bf16_e4m3,
    Widened<Fp8Bytes<Bf16Bits, false>>,
    "avx512f,avx512bw,avx512vl,avx2,f16c"
);

entry!(
    /// One paged-attention task on E5M2 caches under bf16 queries.
    ///
    /// # Safety
    /// As [`scores`] and [`accumulate`]; the CPU has AVX-512F/BW/VL.
    task_bf16_e5m2,
    Widened<Fp8Bytes<Bf16Bits, true>>,
    "avx512f,avx512bw,avx512vl,avx2,f16c"
);
