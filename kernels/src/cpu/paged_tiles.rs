//! The two halves of a paged-attention task with transposed key tiles (`key_tiles` configs,
//! AVX-512; f32 caches, or bf16 caches on AVX-512-BF16): scores `Q·Kᵀ` without horizontal sums,
//! and `P·V` with query-row sums held in registers. [`super::paged`] owns the tasks, the
//! softmax and the partitions.
//!
//! Scores: sixteen key rows (tokens) are loaded through the block table and transposed in
//! registers 16 32-bit words at a time, so one vector holds one word of every token: an f32
//! head-dim value, or a pair of bf16 values. Each query row's word is broadcast against it
//! (an FMA, or `vdpbf16ps` for pairs): a row's 16 scores build up in one register, and each
//! key row is read once for all query rows of the KV head. The query is used as given (bf16
//! stays bf16) and the scale is applied to the f32 sums.
//!
//! `P·V`: for 32 head-dim values at a time, up to 8 query rows keep their sums in 16
//! registers while the value rows of a 64-token chunk (16 KiB of bf16 at d = 128, in L1)
//! stream past; each value vector is loaded (and widened) once for all rows.

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

/// A cache element type the tiles handle: its values packed in 32-bit words.
pub trait TileElem {
    /// Head-dim values per 32-bit word.
    const PER_WORD: usize;
    /// `acc + q · k` over each lane's word: `q` one word of a query row, `k` 16 tokens' words.
    ///
    /// # Safety
    /// The CPU has AVX-512F (and AVX-512-BF16 for bf16 pairs).
    unsafe fn madd(acc: __m512, q: u32, k: __m512i) -> __m512;
    /// `n <= 32` values from `row` as f32, the first 16 and the rest.
    ///
    /// # Safety
    /// As [`Self::madd`]; `row` readable for `n` values.
    unsafe fn load32(row: *const u8, n: usize) -> [__m512; 2];
}

/// f32 caches: one value per word, multiplied with FMAs.
pub struct F32Words;

impl TileElem for F32Words {
    const PER_WORD: usize = 1;
    #[inline(always)]
    unsafe fn madd(acc: __m512, q: u32, k: __m512i) -> __m512 {
        // SAFETY: the caller's contract on the CPU.
        unsafe {
            _mm512_fmadd_ps(
                _mm512_set1_ps(f32::from_bits(q)),
                _mm512_castsi512_ps(k),
                acc,
            )
        }
    }
    #[inline(always)]
    unsafe fn load32(row: *const u8, n: usize) -> [__m512; 2] {
        let row = row.cast::<f32>();
        // SAFETY: masked loads read only the `n` values the caller vouches for.
        unsafe {
            [
                _mm512_maskz_loadu_ps(lanes16(n), row),
                _mm512_maskz_loadu_ps(lanes16(n.saturating_sub(16)), row.wrapping_add(16)),
            ]
        }
    }
}

/// bf16 caches: pairs of values per word, multiplied with `vdpbf16ps`.
pub struct Bf16Pairs;

impl TileElem for Bf16Pairs {
    const PER_WORD: usize = 2;
    #[inline(always)]
    unsafe fn madd(acc: __m512, q: u32, k: __m512i) -> __m512 {
        // SAFETY: the caller's contract on the CPU.
        unsafe { _mm512_dpbf16_ps(acc, bh(_mm512_set1_epi32(q as i32)), bh(k)) }
    }
    #[inline(always)]
    unsafe fn load32(row: *const u8, n: usize) -> [__m512; 2] {
        // SAFETY: the masked load reads only the `n` values the caller vouches for.
        unsafe {
            let v = _mm512_maskz_loadu_epi16(lanes32(n), row.cast());
            // bf16 is the top half of an f32: zero-extend each value to 32 bits and shift.
            [
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                    _mm512_castsi512_si256(v),
                ))),
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                    _mm512_extracti64x4_epi64::<1>(v),
                ))),
            ]
        }
    }
}

/// Scratch words for the transposed key tile of head dimension `d`.
pub fn tile_words<E: TileElem>(d: usize) -> usize {
    d / E::PER_WORD * TILE
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
/// The CPU has AVX-512F/BW (and AVX-512-BF16 for bf16 pairs); `d` is a multiple of
/// `E::PER_WORD`; `q` holds `rows` rows of `d / E::PER_WORD` words (read unaligned: a bf16
/// buffer need only be 2-byte aligned); `key(i)` points at `d` readable values for `i < n`;
/// `scores` is writable for `rows` rows of `n` at `ld` apart; `tile` holds
/// [`tile_words`]`(d)` words.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores<E: TileElem>(
    q: *const u32,
    rows: usize,
    d: usize,
    n: usize,
    key: impl Fn(usize) -> *const u8,
    scale: f32,
    scores: *mut f32,
    ld: usize,
    tile: *mut u32,
) {
    let words = d / E::PER_WORD;
    let row_bytes = 4 * words;
    for i0 in (0..n).step_by(TILE) {
        let live = TILE.min(n - i0);
        // SAFETY: the caller's contract on keys, the tile and the scores.
        unsafe {
            let rows_at: [*const u8; TILE] =
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
                        _mm512_maskz_loadu_epi32(mask, rows_at[t].add(4 * w0).cast())
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
                by_rows!(nr, score_rows::<E>(qr, words, tile, scale, sr, ld, store));
                r0 += nr;
            }
        }
    }
}

/// One tile's scores for `R` query rows.
#[inline(always)]
unsafe fn score_rows<E: TileElem, const R: usize>(
    q: *const u32,
    words: usize,
    tile: *const u32,
    scale: f32,
    scores: *mut f32,
    ld: usize,
    store: __mmask16,
) {
    // SAFETY: `scores`' contract, narrowed to R rows of one tile.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        for w in 0..words {
            let k = _mm512_loadu_si512(tile.add(w * TILE).cast());
            for (j, s) in acc.iter_mut().enumerate() {
                *s = E::madd(*s, q.add(j * words + w).read_unaligned(), k);
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
/// As [`scores`]; `value(i)` points at `d` readable values for `i < n`; `p` holds `rows` rows
/// of `n` weights at `ld` apart; `acc` holds `rows × d`.
#[inline(always)]
unsafe fn accumulate<E: TileElem>(
    p: *const f32,
    ld: usize,
    rows: usize,
    d: usize,
    n: usize,
    value: impl Fn(usize) -> *const u8,
    acc: *mut f32,
) {
    let row_bytes = 4 * d / E::PER_WORD;
    for c0 in (0..n).step_by(V_CHUNK) {
        let live = V_CHUNK.min(n - c0);
        // SAFETY: the caller's contract on values, weights and sums.
        unsafe {
            let vrows: [*const u8; V_CHUNK] =
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
                    let at = x0 * 4 / E::PER_WORD;
                    by_rows!(nr, pv_rows::<E>(pr, ld, vrows, at, xl, ar.add(x0), d));
                }
                r0 += nr;
            }
        }
    }
}

/// `R` rows' sums over `xl <= 32` head-dim values, `at` bytes into each value row, for the
/// chunk's tokens; `acc` points at the first of them in row 0 of the sums.
#[inline(always)]
unsafe fn pv_rows<E: TileElem, const R: usize>(
    p: *const f32,
    ld: usize,
    vrows: &[*const u8],
    at: usize,
    xl: usize,
    acc: *mut f32,
    d: usize,
) {
    let (m0, m1) = (lanes16(xl), lanes16(xl.saturating_sub(16)));
    // SAFETY: `accumulate`'s contract, narrowed to R rows and xl values.
    unsafe {
        let mut sums: [[__m512; 2]; R] = std::array::from_fn(|j| {
            [
                _mm512_maskz_loadu_ps(m0, acc.add(j * d)),
                _mm512_maskz_loadu_ps(m1, acc.add(j * d + 16)),
            ]
        });
        for (t, &row) in vrows.iter().enumerate() {
            let [lo, hi] = E::load32(row.add(at), xl);
            for (j, s) in sums.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*p.add(j * ld + t));
                s[0] = _mm512_fmadd_ps(w, lo, s[0]);
                s[1] = _mm512_fmadd_ps(w, hi, s[1]);
            }
        }
        for (j, s) in sums.iter().enumerate() {
            _mm512_mask_storeu_ps(acc.add(j * d), m0, s[0]);
            _mm512_mask_storeu_ps(acc.add(j * d + 16), m1, s[1]);
        }
    }
}

/// The public entry points, one per element type, each compiled for the target features that
/// element's instructions need (everything above is inlined into them): one task's scores into
/// `scores_buf` and, after `softmax` (handed the same pointer) turned them into weights, `P·V`
/// into `acc` (zeroed by the caller).
macro_rules! entry {
    ($(#[$doc:meta])* $name:ident, $elem:ty, $features:literal) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name(
            q: *const u32,
            rows: usize,
            d: usize,
            n: usize,
            key: impl Fn(usize) -> *const u8,
            value: impl Fn(usize) -> *const u8,
            scale: f32,
            scores_buf: *mut f32,
            ld: usize,
            tile: *mut u32,
            softmax: impl FnOnce(*mut f32),
            acc: *mut f32,
        ) {
            // SAFETY: the caller's contract.
            unsafe {
                scores::<$elem>(q, rows, d, n, key, scale, scores_buf, ld, tile);
                softmax(scores_buf);
                accumulate::<$elem>(scores_buf, ld, rows, d, n, value, acc);
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
    /// One paged-attention task on bf16 caches.
    ///
    /// # Safety
    /// As [`scores`] and [`accumulate`]; `d` is even; the CPU has AVX-512F/BW and AVX-512-BF16.
    task_bf16,
    Bf16Pairs,
    "avx512f,avx512bw,avx512bf16"
);
