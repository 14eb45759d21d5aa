//! The two halves of a paged-attention task on bf16 caches with AVX-512-BF16 (`pairs`
//! configs): scores `Q·Kᵀ` with `vdpbf16ps`, and `P·V` with query-row accumulators held in
//! registers. [`super::paged`] owns the tasks, the softmax and the partitions.
//!
//! Scores: sixteen key rows (tokens) are loaded through the block table and transposed in
//! registers, 16 bf16 pairs at a time, so one vector holds one pair of head-dim values for 16
//! tokens. Each query row's pair is broadcast against it: a row's 16 scores build up in one
//! register with no horizontal sums, and each key row is read once for all query rows of the
//! KV head. The query stays bf16 as given and the scale is applied to the f32 sums.
//!
//! `P·V`: for 32 head-dim values at a time, up to 8 query rows keep their sums in 16
//! registers while the value rows of a 64-token chunk (16 KiB at d = 128, in L1) stream past;
//! each value vector is widened once for all rows instead of once per row.

use std::arch::x86_64::*;

use super::leaf::prefetch;

/// Tokens ahead whose rows are prefetched into L2: four blocks of 16. Measured on two Zen 4
/// cores (32 sequences × 4096 tokens, 8 query heads per KV head): 6.2 ms at 32 to 128 tokens
/// ahead into L2, 9.9 ms at 32 into L1 (its miss buffers fill), 7.6 ms at 256.
const AHEAD: usize = 64;
/// Tokens per score tile: one vector of scores per query row.
pub const TILE: usize = 16;
/// Query rows whose sums stay in registers together.
const ROWS: usize = 8;
/// Tokens whose value rows are reused from L1 across the passes over the head dimension.
const V_CHUNK: usize = 64;

/// Calls `f::<R>(args)` for `R = rows` (1 to [`ROWS`]): the row count is a const generic so
/// each row group's sums are an array LLVM keeps in registers.
macro_rules! by_rows {
    ($rows:expr, $f:ident($($arg:expr),*)) => {
        match $rows {
            8 => $f::<8>($($arg),*),
            7 => $f::<7>($($arg),*),
            6 => $f::<6>($($arg),*),
            5 => $f::<5>($($arg),*),
            4 => $f::<4>($($arg),*),
            3 => $f::<3>($($arg),*),
            2 => $f::<2>($($arg),*),
            _ => $f::<1>($($arg),*),
        }
    };
}

/// Scratch words for the transposed key tile of head dimension `d`.
pub fn tile_words(d: usize) -> usize {
    d / 2 * TILE
}

fn lanes16(n: usize) -> __mmask16 {
    if n >= 16 {
        !0
    } else {
        (1u16 << n) - 1
    }
}

fn lanes32(n: usize) -> __mmask32 {
    if n >= 32 {
        !0
    } else {
        (1u32 << n) - 1
    }
}

#[inline(always)]
unsafe fn bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// `scores[r · ld + i] = scale · q_r · k_i` for `rows` query rows and `n` tokens.
///
/// # Safety
/// The CPU has AVX-512F/BW and AVX-512-BF16; `d` is even; `q` holds `rows` rows of `d / 2` pair
/// words (read unaligned: a bf16 buffer need only be 2-byte aligned); `key(i)` points at `d` readable values for `i < n`; `scores` is writable for `rows`
/// rows of `n` at `ld` apart; `tile` holds [`tile_words`]`(d)` words.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn scores(
    q: *const u32,
    rows: usize,
    d: usize,
    n: usize,
    key: impl Fn(usize) -> *const u16,
    scale: f32,
    scores: *mut f32,
    ld: usize,
    tile: *mut u32,
) {
    let words = d / 2;
    let row_bytes = 2 * d;
    for i0 in (0..n).step_by(TILE) {
        let live = TILE.min(n - i0);
        // SAFETY: the caller's contract on keys, the tile and the scores.
        unsafe {
            let rows_at: [*const u16; TILE] =
                std::array::from_fn(|t| if t < live { key(i0 + t) } else { key(i0) });
            for t in 0..TILE {
                if i0 + t + AHEAD < n {
                    prefetch::<_, true>(key(i0 + t + AHEAD), row_bytes);
                }
            }
            for w0 in (0..words).step_by(16) {
                let mask = lanes16(words - w0);
                let mut r: [__m512i; TILE] = std::array::from_fn(|t| {
                    if t < live {
                        _mm512_maskz_loadu_epi32(mask, rows_at[t].add(2 * w0).cast())
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                super::transpose::transpose16(&mut r);
                for (c, v) in r.iter().enumerate().take(words - w0) {
                    _mm512_storeu_si512(tile.add((w0 + c) * TILE).cast(), *v);
                }
            }
            let store = lanes16(live);
            let mut r0 = 0;
            while r0 < rows {
                let nr = ROWS.min(rows - r0);
                let (qr, sr) = (q.add(r0 * words), scores.add(r0 * ld + i0));
                by_rows!(nr, score_rows(qr, words, tile, scale, sr, ld, store));
                r0 += nr;
            }
        }
    }
}

/// One tile's scores for `R` query rows.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn score_rows<const R: usize>(
    q: *const u32,
    words: usize,
    tile: *const u32,
    scale: f32,
    scores: *mut f32,
    ld: usize,
    store: __mmask16,
) {
    let mut acc = [_mm512_setzero_ps(); R];
    // SAFETY: `scores`' contract, narrowed to R rows of one tile.
    unsafe {
        for w in 0..words {
            let k = bh(_mm512_loadu_si512(tile.add(w * TILE).cast()));
            for (j, s) in acc.iter_mut().enumerate() {
                let qv = bh(_mm512_set1_epi32(
                    q.add(j * words + w).read_unaligned() as i32
                ));
                *s = _mm512_dpbf16_ps(*s, qv, k);
            }
        }
        let sv = _mm512_set1_ps(scale);
        for (j, s) in acc.iter().enumerate() {
            _mm512_mask_storeu_ps(scores.add(j * ld), store, _mm512_mul_ps(*s, sv));
        }
    }
}

/// `acc[r · d + x] += Σ_i p[r · ld + i] · v_i[x]` for `rows` rows and `n` tokens.
///
/// # Safety
/// The CPU has AVX-512F/BW and AVX-512-BF16; `value(i)` points at `d` readable values for
/// `i < n`; `p` holds `rows` rows of `n` weights at `ld` apart; `acc` holds `rows × d`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn accumulate(
    p: *const f32,
    ld: usize,
    rows: usize,
    d: usize,
    n: usize,
    value: impl Fn(usize) -> *const u16,
    acc: *mut f32,
) {
    let row_bytes = 2 * d;
    for c0 in (0..n).step_by(V_CHUNK) {
        let live = V_CHUNK.min(n - c0);
        // SAFETY: the caller's contract on values, weights and sums.
        unsafe {
            let vrows: [*const u16; V_CHUNK] =
                std::array::from_fn(|t| if t < live { value(c0 + t) } else { value(c0) });
            for t in 0..live {
                if c0 + t + AHEAD < n {
                    prefetch::<_, true>(value(c0 + t + AHEAD), row_bytes);
                }
            }
            let vrows = &vrows[..live];
            let mut r0 = 0;
            while r0 < rows {
                let nr = ROWS.min(rows - r0);
                let (pr, ar) = (p.add(r0 * ld + c0), acc.add(r0 * d));
                for x0 in (0..d).step_by(32) {
                    let xl = 32.min(d - x0);
                    by_rows!(nr, pv_rows(pr, ld, vrows, x0, xl, ar, d));
                }
                r0 += nr;
            }
        }
    }
}

/// `R` rows' sums over head-dim values `x0..x0 + xl` (`xl <= 32`) for the chunk's tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pv_rows<const R: usize>(
    p: *const f32,
    ld: usize,
    vrows: &[*const u16],
    x0: usize,
    xl: usize,
    acc: *mut f32,
    d: usize,
) {
    let (m0, m1) = (lanes16(xl), lanes16(xl.saturating_sub(16)));
    let load = lanes32(xl);
    // SAFETY: `accumulate`'s contract, narrowed to R rows and xl values.
    unsafe {
        let mut sums: [[__m512; 2]; R] = std::array::from_fn(|j| {
            [
                _mm512_maskz_loadu_ps(m0, acc.add(j * d + x0)),
                _mm512_maskz_loadu_ps(m1, acc.add(j * d + x0 + 16)),
            ]
        });
        for (t, &row) in vrows.iter().enumerate() {
            let v = _mm512_maskz_loadu_epi16(load, row.add(x0).cast());
            // bf16 is the top half of an f32: zero-extend each value to 32 bits and shift.
            let lo = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm512_castsi512_si256(v),
            )));
            let hi = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm512_extracti64x4_epi64::<1>(v),
            )));
            for (j, s) in sums.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*p.add(j * ld + t));
                s[0] = _mm512_fmadd_ps(w, lo, s[0]);
                s[1] = _mm512_fmadd_ps(w, hi, s[1]);
            }
        }
        for (j, s) in sums.iter().enumerate() {
            _mm512_mask_storeu_ps(acc.add(j * d + x0), m0, s[0]);
            _mm512_mask_storeu_ps(acc.add(j * d + x0 + 16), m1, s[1]);
        }
    }
}
