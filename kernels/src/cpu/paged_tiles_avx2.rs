//! Paged-attention key tiles on AVX2 + FMA hosts (`key_tiles` configs at ISA `avx2-fma`):
//! the scheme of [`super::paged_tiles`] at 8 lanes. Every cache type is widened to f32 as
//! it is read (AVX2 has no bf16 products); key rows go through a staging tile padded to whole
//! vectors, so the score steps need no tail handling.
//!
//! Scores: query rows share the 8 lanes of a vector (`U = 8 / R` words of each of `R` rows,
//! `R` the group padded to a power of two), each key row's matching words are broadcast
//! against it, and one 8 × 8 transpose per 8 tokens turns lanes into tokens. `P·V`: 8
//! head-dim values of up to 8 query rows in registers while a 64-token chunk of value rows
//! streams past.

use std::arch::x86_64::*;

use super::leaf::prefetch;
use super::paged_tiles::{by_rows, Rows, Task};
use super::transpose::transpose8;

/// Tokens per score tile: one vector of scores per query row (16 registers in all).
const TILE: usize = 8;
/// Tokens ahead whose key rows are prefetched into L2, as in [`super::paged_tiles`].
const AHEAD: usize = 64;
/// Query rows whose `P·V` sums stay in registers together.
const ROWS: usize = 8;
/// Tokens whose value rows are reused from L1 across the passes over the head dimension, at
/// most (fewer on rows far apart, [`super::paged_tiles::value_chunk`]).
const V_CHUNK: usize = 64;

/// A cache element type, read as f32.
pub trait Elem8 {
    /// Bytes of one value.
    const BYTES: usize;
    /// The query's element type: the cache's, or a 16-bit one over an fp8 cache.
    type Query: Elem8;
    /// Value `i` at `row`.
    ///
    /// # Safety
    /// `row` is readable for value `i`.
    unsafe fn scalar(row: *const u8, i: usize) -> f32;
    /// Eight values at `p`.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `p` is readable for 8 values.
    unsafe fn load8(p: *const u8) -> __m256;
}

/// f32 caches.
pub struct F32;
/// f16 caches, widened by `vcvtph2ps`.
pub struct F16;
/// bf16 caches, widened by a shift.
pub struct Bf16;

impl Elem8 for F32 {
    const BYTES: usize = 4;
    type Query = Self;
    #[inline(always)]
    unsafe fn scalar(row: *const u8, i: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { row.add(4 * i).cast::<f32>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(p.cast()) }
    }
}

impl Elem8 for F16 {
    const BYTES: usize = 2;
    type Query = Self;
    #[inline(always)]
    unsafe fn scalar(row: *const u8, i: usize) -> f32 {
        // SAFETY: the caller's contract.
        half::f16::from_bits(unsafe { row.add(2 * i).cast::<u16>().read_unaligned() }).to_f32()
    }
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

impl Elem8 for Bf16 {
    const BYTES: usize = 2;
    type Query = Self;
    #[inline(always)]
    unsafe fn scalar(row: *const u8, i: usize) -> f32 {
        // SAFETY: the caller's contract.
        f32::from_bits(u32::from(unsafe { row.add(2 * i).cast::<u16>().read_unaligned() }) << 16)
    }
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(p.cast()),
            )))
        }
    }
}

/// Fp8 caches (bytes read as f16 bits, E5M2's where `E5M2`, else E4M3's) under queries of
/// `Q`.
pub struct Fp8<Q, const E5M2: bool>(std::marker::PhantomData<Q>);

impl<Q: Elem8, const E5M2: bool> Elem8 for Fp8<Q, E5M2> {
    const BYTES: usize = 1;
    type Query = Q;
    #[inline(always)]
    unsafe fn scalar(row: *const u8, i: usize) -> f32 {
        use super::simd::Elem;
        // SAFETY: the caller's contract.
        super::simd::Fp8Bits::<E5M2>(unsafe { row.add(i).read() }).to_f32()
    }
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller's contract (F16C with AVX2).
        unsafe {
            let w = _mm_cvtepu8_epi16(_mm_loadl_epi64(p.cast()));
            _mm256_cvtph_ps(super::simd::fp8_half_bits_128::<E5M2>(w))
        }
    }
}

/// `n` values at `p` (all 8 when `n >= 8`), the rest 0: AVX2 has no masked 16-bit loads, so
/// a short tail goes through a buffer.
#[inline(always)]
unsafe fn load_part<E: Elem8>(p: *const u8, n: usize) -> __m256 {
    // SAFETY: the caller vouches for `min(n, 8)` values at `p`.
    unsafe {
        if n >= 8 {
            return E::load8(p);
        }
        let mut buf = [0f32; 8];
        for (i, b) in buf.iter_mut().enumerate().take(n) {
            *b = E::scalar(p, i);
        }
        _mm256_loadu_ps(buf.as_ptr())
    }
}

/// Lanes below `n` set, for `vmaskmovps`.
#[inline(always)]
unsafe fn lanes8(n: usize) -> __m256i {
    // SAFETY: plain integer vector arithmetic.
    unsafe {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n.min(8) as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }
}

/// Head-dim values padded to whole vectors: the stride of staged key rows and query steps.
fn padded(d: usize) -> usize {
    d.next_multiple_of(8)
}

/// Scratch words for `rows` query rows of head dimension `d`: per group of up to 8 rows, at
/// most `padded(d)` steps of 8 words, then the staging tile of 8 key rows.
pub fn q_words(d: usize, rows: usize) -> usize {
    (rows.div_ceil(8) + 1) * padded(d) * 8
}

/// `U` consecutive f32 at `p` in every group of `U` lanes.
#[inline(always)]
unsafe fn broadcast<const U: usize>(p: *const f32) -> __m256 {
    // SAFETY: the caller vouches for `U` values at `p`.
    unsafe {
        match U {
            1 => _mm256_set1_ps(p.read()),
            // Unaligned reads: the staging rows are only 4-byte aligned.
            2 => _mm256_castpd_ps(_mm256_set1_pd(p.cast::<f64>().read_unaligned())),
            4 => {
                let x = _mm_loadu_ps(p);
                _mm256_set_m128(x, x)
            }
            _ => _mm256_loadu_ps(p),
        }
    }
}

/// `scores[r · ld + i] = scale · q_r · k_i` for `rows` query rows and `n` tokens.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `q` holds `rows` rows of `d` values; `key.at(i)` points at
/// `d` readable values for `i < n` and names a row of the cache for `i < reach` (`reach >=
/// n`: those rows are prefetched); `scores` is writable for `rows` rows of `n` at `ld`
/// apart; `qs` holds [`q_words`]`(d, rows)` words.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores<E: Elem8>(
    q: *const u8,
    rows: usize,
    d: usize,
    (n, reach): (usize, usize),
    key: Rows,
    scale: f32,
    scores: *mut f32,
    ld: usize,
    qs: *mut f32,
    q_ready: bool,
) {
    let dp = padded(d);
    let groups = rows.div_ceil(8);
    // SAFETY: the caller's contract on the query and `qs`.
    unsafe {
        for g in (0..groups).filter(|_| !q_ready) {
            let g_rows = 8.min(rows - 8 * g);
            let u = 8 / g_rows.next_power_of_two();
            let dst = qs.add(g * dp * 8);
            for (s, w0) in (0..dp).step_by(u).enumerate() {
                for lane in 0..8 {
                    let (r, w) = (lane / u, w0 + lane % u);
                    let v = if r < g_rows && w < d {
                        E::Query::scalar(q.add((8 * g + r) * d * E::Query::BYTES), w)
                    } else {
                        0.0
                    };
                    dst.add(8 * s + lane).write(v);
                }
            }
        }
    }
    let staging = qs.wrapping_add(groups * dp * 8);
    for i0 in (0..n).step_by(TILE) {
        let live = TILE.min(n - i0);
        // SAFETY: the caller's contract on keys, `qs` (with its staging rows) and the scores.
        unsafe {
            // Tokens past `n` score row 0 again; their scores are not stored.
            for t in 0..live {
                let row = key.at(i0 + t);
                let dst = staging.add(t * dp);
                for x in (0..dp).step_by(8) {
                    let v = load_part::<E>(row.add(x * E::BYTES), d.saturating_sub(x));
                    _mm256_storeu_ps(dst.add(x), v);
                }
                if i0 + AHEAD + t < reach {
                    prefetch::<_, true>(key.at(i0 + AHEAD + t), d * E::BYTES);
                }
            }
            for t in live..TILE {
                std::ptr::copy_nonoverlapping(staging, staging.add(t * dp), dp);
            }
            for g in 0..groups {
                let g_rows = 8.min(rows - 8 * g);
                let args = (
                    qs.add(g * dp * 8).cast_const(),
                    dp,
                    staging.cast_const(),
                    g_rows,
                    scale,
                    scores.add(8 * g * ld + i0),
                    ld,
                    live,
                );
                match 8 / g_rows.next_power_of_two() {
                    1 => score_tile::<1>(args),
                    2 => score_tile::<2>(args),
                    4 => score_tile::<4>(args),
                    _ => score_tile::<8>(args),
                }
            }
        }
    }
}

/// One tile's scores for a group of `g_rows <= 8 / U` query rows against the staged rows.
#[inline(always)]
#[allow(clippy::type_complexity)]
unsafe fn score_tile<const U: usize>(
    (qs, dp, staging, g_rows, scale, scores, ld, live): (
        *const f32,
        usize,
        *const f32,
        usize,
        f32,
        *mut f32,
        usize,
        usize,
    ),
) {
    // SAFETY: `scores`' contract, narrowed to one group and tile.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); TILE];
        for (s, w0) in (0..dp).step_by(U).enumerate() {
            let qv = _mm256_loadu_ps(qs.add(8 * s));
            for (t, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qv, broadcast::<U>(staging.add(t * dp + w0)), *a);
            }
        }
        transpose8(&mut acc);
        let (sv, store) = (_mm256_set1_ps(scale), lanes8(live));
        for r in 0..g_rows {
            let mut sum = acc[r * U];
            for x in &acc[r * U + 1..(r + 1) * U] {
                sum = _mm256_add_ps(sum, *x);
            }
            _mm256_maskstore_ps(scores.add(r * ld), store, _mm256_mul_ps(sum, sv));
        }
    }
}

/// `acc[r · d + x] += Σ_i p[r · ld + i] · v_i[x]` for `rows` rows, `x < dv` and `n` tokens.
///
/// # Safety
/// As [`scores`]; `value.at(i)` points at `dv` readable values for `i < n`, at a row of the
/// cache for `i < reach`; `p` holds `rows` rows of `n` weights at `ld` apart; `acc` holds
/// `rows × d`, `dv <= d`.
#[inline(always)]
unsafe fn accumulate<E: Elem8>(
    p: *const f32,
    ld: usize,
    rows: usize,
    (d, dv): (usize, usize),
    (n, reach): (usize, usize),
    value: Rows,
    acc: *mut f32,
) {
    let mut vrows = [std::ptr::null::<u8>(); V_CHUNK];
    let mut next = [std::ptr::null::<u8>(); V_CHUNK];
    let chunk = super::paged_tiles::value_chunk(value.stride);
    for c0 in (0..n).step_by(chunk) {
        let live = chunk.min(n - c0);
        // SAFETY: the caller's contract on values, weights and sums.
        unsafe {
            for (t, row) in vrows.iter_mut().enumerate().take(live) {
                *row = value.at(c0 + t);
            }
            let next_live = chunk.min(reach.saturating_sub(c0 + chunk));
            for (t, row) in next.iter_mut().enumerate().take(next_live) {
                *row = value.at(c0 + chunk + t);
            }
            let mut r0 = 0;
            while r0 < rows {
                let nr = ROWS.min(rows - r0);
                let (pr, ar) = (p.add(r0 * ld + c0), acc.add(r0 * d));
                let next = if r0 == 0 { &next[..next_live] } else { &[] };
                for x0 in (0..dv).step_by(8) {
                    let vs = (&vrows[..live], next);
                    by_rows!(nr, pv_rows::<E>(pr, ld, vs, x0, (d, dv), ar.add(x0)));
                }
                r0 += nr;
            }
        }
    }
}

/// `R` rows' sums over the 8 head-dim values from `x0` (fewer at the end of `dv`) for the
/// chunk's tokens, rows `d` apart in `acc`; the same bytes of the `next` rows are prefetched
/// where a line starts.
#[inline(always)]
unsafe fn pv_rows<E: Elem8, const R: usize>(
    p: *const f32,
    ld: usize,
    (vrows, next): (&[*const u8], &[*const u8]),
    x0: usize,
    (d, dv): (usize, usize),
    acc: *mut f32,
) {
    let xl = dv - x0;
    let at = x0 * E::BYTES;
    // SAFETY: `accumulate`'s contract, narrowed to R rows and 8 values.
    unsafe {
        let m = lanes8(xl);
        let mut sums = [_mm256_setzero_ps(); R];
        for (j, s) in sums.iter_mut().enumerate() {
            *s = _mm256_maskload_ps(acc.add(j * d), m);
        }
        if at.is_multiple_of(64) {
            for row in next {
                prefetch::<_, true>(row.add(at), 64);
            }
        }
        // Two loops, the full one without the tail's branch: with the branch inside, LLVM
        // kept a sum in memory across tokens, one store-to-load round trip per token.
        if xl >= 8 {
            for (t, row) in vrows.iter().enumerate() {
                let v = E::load8(row.add(at));
                for (j, s) in sums.iter_mut().enumerate() {
                    *s = _mm256_fmadd_ps(_mm256_set1_ps(p.add(j * ld + t).read()), v, *s);
                }
            }
        } else {
            for (t, row) in vrows.iter().enumerate() {
                let v = load_part::<E>(row.add(at), xl);
                for (j, s) in sums.iter_mut().enumerate() {
                    *s = _mm256_fmadd_ps(_mm256_set1_ps(p.add(j * ld + t).read()), v, *s);
                }
            }
        }
        for (j, s) in sums.iter().enumerate() {
            _mm256_maskstore_ps(acc.add(j * d), m, *s);
        }
    }
}

/// One paged-attention task: scores into `t.scores`, `softmax` (handed the same pointer)
/// turning them into weights, then `P·V` into `t.acc`; `t.scratch` holds [`q_words`] words.
///
/// # Safety
/// As [`scores`] and [`accumulate`]; the CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn task<E: Elem8>(t: Task, softmax: impl FnOnce(*mut f32)) {
    let Task {
        q,
        rows,
        d,
        dv,
        n,
        key,
        value,
        scale,
        scores: s,
        ld,
        scratch,
        acc,
        q_ready,
        ahead,
    } = t;
    let reach = n + ahead;
    // SAFETY: the caller's contract.
    unsafe {
        scores::<E>(
            q,
            rows,
            d,
            (n, reach),
            key,
            scale,
            s,
            ld,
            scratch.cast(),
            q_ready,
        );
        softmax(s);
        accumulate::<E>(s, ld, rows, (d, dv), (n, reach), value, acc);
    }
}
