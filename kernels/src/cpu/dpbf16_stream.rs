//! Decode-shaped bf16 GEMM with AVX-512-BF16 (`vdpbf16ps`): the streaming path of
//! [`super::gemm`] without widening.
//!
//! With 1 to 16 rows of A the work is reading the bf16 weights once; widening them to f32 costs
//! two instructions per 16 values plus an FMA each, which on this kind of core caps the f32
//! stream below memory bandwidth. `vdpbf16ps` multiplies 32 bf16 pairs into 16 f32 sums in one
//! instruction, straight from the loaded bytes.
//!
//! B `[N, K]` (a Linear layer's weights): a row of A and a row of B are both k-contiguous, so
//! 32 consecutive values of each are 16 pairs already; `R` rows of A against 4 rows of B per
//! pass, the last partial vector of k through masked loads (zeros add nothing).
//! B `[K, N]`: two consecutive rows of B are interleaved in registers (`vpunpck[lh]wd`) into
//! pairs of k for 32 columns, multiplied with a broadcast pair of A; the interleave permutes
//! columns within each 128-bit lane, which is undone once on the sums.
//!
//! fp8 (W8A8, B `[N, K]`): the weights stream as bytes, half of bf16's, and are widened 32 at a
//! time in registers to their f16 readings as bf16 (exact: a reading has at most four
//! significant bits; integer operations, [`super::fp8_bf16`]), then multiplied as the bf16
//! pairs are; A's few rows are widened once.
//! The widening kernel of [`super::gemm`] multiplies the readings as f32, one FMA a value and
//! row: from a few rows on that, not the bytes, is the limit.

use half::bf16;

use super::parallel::{for_each_task, SharedMut};
use crate::config::GemmConfig;
use crate::problem::{BLayout, GemmProblem};
use crate::Fp8;

/// Columns of a `[K, N]` strip per pass: two interleaved 32-column vectors.
const KN_STRIP: usize = 64;

/// Runs a config validated against the detected host (dtype bf16, `mr` of 1, 2 or 4,
/// AVX-512-BF16 present).
pub fn run(p: &GemmProblem, c: &GemmConfig, a: &[bf16], b: &[bf16], out: &mut [f32]) {
    let chunk = match p.b_layout {
        BLayout::Nk => c.nc,
        BLayout::Kn => c.nc.next_multiple_of(KN_STRIP),
    };
    let out = SharedMut(out.as_mut_ptr());
    let (n, k) = (p.n, p.k);
    for_each_pass(p, c, chunk, |i0, rows, c0, c1| {
        // SAFETY: rows i0..i0 + rows of A and C and columns c0..c1 of B and C exist; tasks
        // write disjoint columns; validation checked the CPU has AVX-512-BF16.
        unsafe {
            let ap = a.as_ptr().add(i0 * k).cast::<u16>();
            let (bp, cp) = (b.as_ptr().cast::<u16>(), out.get().add(i0 * n));
            columns(p.b_layout, rows, k, ap, bp, c0, c1, cp, n, c.prefetch);
        }
    });
}

/// C in tasks of `chunk` columns, each task's rows in passes of 4, 2 or 1 (at most `mr`):
/// `pass(i0, rows, c0, c1)` for rows `i0 .. i0 + rows` and columns `c0 .. c1`.
fn for_each_pass(
    p: &GemmProblem,
    c: &GemmConfig,
    chunk: usize,
    pass: impl Fn(usize, usize, usize, usize) + Sync + Send,
) {
    let (m, n) = (p.m, p.n);
    for_each_task(c.threads, n.div_ceil(chunk), |task, _| {
        let (c0, c1) = (task * chunk, ((task + 1) * chunk).min(n));
        let mut i0 = 0;
        while i0 < m {
            let rows = [4, 2, 1]
                .into_iter()
                .find(|&r| r <= c.mr && r <= m - i0)
                .unwrap_or(1);
            pass(i0, rows, c0, c1);
            i0 += rows;
        }
    });
}

/// Scratch (f32 words) an fp8 call needs: A's rows widened to bf16, two values a word.
pub fn fp8_scratch_len(p: &GemmProblem) -> usize {
    (p.m * p.k).div_ceil(2)
}

/// Runs an fp8 config validated against the detected host (B `[N, K]`, `mr` of 1, 2 or 4,
/// AVX-512-BF16 present): C gets the sums of the bytes' f16 readings, for the caller to scale
/// ([`super::gemm::scale`]). `scratch` holds [`fp8_scratch_len`] words.
pub fn run_fp8(
    p: &GemmProblem,
    c: &GemmConfig,
    format: Fp8,
    a: &[u8],
    b: &[u8],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    debug_assert_eq!(p.b_layout, BLayout::Nk);
    let words = &mut super::dpbf16::pair_words(scratch)[..fp8_scratch_len(p)];
    // SAFETY: u32 words hold two u16s each, bf16 is a u16; every bit pattern is valid.
    let wide: &mut [bf16] =
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), 2 * words.len()) };
    let wide = &mut wide[..p.m * p.k];
    super::fp8_bf16::widen(format, a, wide);
    let out = SharedMut(out.as_mut_ptr());
    let wide: &[bf16] = wide;
    let (n, k) = (p.n, p.k);
    for_each_pass(p, c, c.nc, |i0, rows, c0, c1| {
        // SAFETY: as in `run`: rows i0..i0 + rows of A and C and columns c0..c1 of B and C
        // exist, tasks write disjoint columns, validation checked AVX-512-BF16.
        unsafe {
            let ap = wide.as_ptr().add(i0 * k).cast::<u16>();
            let cp = out.get().add(i0 * n);
            fp8_columns(format, rows, k, ap, b.as_ptr(), c0, c1, cp, n, c.prefetch);
        }
    });
}

/// [`columns`] of B `[N, K]` in fp8 bytes of `format`, A's rows widened.
///
/// # Safety
/// As [`columns`], B holding bytes.
#[allow(clippy::too_many_arguments)]
unsafe fn fp8_columns(
    format: Fp8,
    rows: usize,
    k: usize,
    a: *const u16,
    b: *const u8,
    c0: usize,
    c1: usize,
    c: *mut f32,
    ldc: usize,
    prefetch: bool,
) {
    #[cfg(target_arch = "x86_64")]
    for j0 in (c0..c1).step_by(4) {
        let w = 4.min(c1 - j0);
        let (bp, cp) = (b.wrapping_add(j0 * k), c.wrapping_add(j0));
        // SAFETY: the caller's contract, narrowed to one pass.
        unsafe {
            match (format == Fp8::E5m2, rows) {
                (true, 4) => x86::nk_fp8::<4, true>(k, a, bp, w, cp, ldc, prefetch),
                (true, 2) => x86::nk_fp8::<2, true>(k, a, bp, w, cp, ldc, prefetch),
                (true, _) => x86::nk_fp8::<1, true>(k, a, bp, w, cp, ldc, prefetch),
                (false, 4) => x86::nk_fp8::<4, false>(k, a, bp, w, cp, ldc, prefetch),
                (false, 2) => x86::nk_fp8::<2, false>(k, a, bp, w, cp, ldc, prefetch),
                (false, _) => x86::nk_fp8::<1, false>(k, a, bp, w, cp, ldc, prefetch),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (format, rows, k, a, b, c0, c1, c, ldc, prefetch);
}

/// Columns `c0..c1` of `rows` rows of C: passes of 4 columns (B `[N, K]`, its rows prefetched
/// with `prefetch`) or strips of [`KN_STRIP`] columns (B `[K, N]`, `ldc` columns wide).
///
/// # Safety
/// As [`run`]'s task: A holds `rows × k`, B its `n × k` values, C `rows × ldc` from its pointer.
#[allow(clippy::too_many_arguments)]
unsafe fn columns(
    layout: BLayout,
    rows: usize,
    k: usize,
    a: *const u16,
    b: *const u16,
    c0: usize,
    c1: usize,
    c: *mut f32,
    ldc: usize,
    prefetch: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let step = match layout {
            BLayout::Nk => 4,
            BLayout::Kn => KN_STRIP,
        };
        for j0 in (c0..c1).step_by(step) {
            let w = step.min(c1 - j0);
            let cp = c.wrapping_add(j0);
            // SAFETY: the caller's contract, narrowed to one pass.
            unsafe {
                match (layout, rows) {
                    (BLayout::Nk, 4) => x86::nk::<4>(k, a, b.add(j0 * k), w, cp, ldc, prefetch),
                    (BLayout::Nk, 2) => x86::nk::<2>(k, a, b.add(j0 * k), w, cp, ldc, prefetch),
                    (BLayout::Nk, _) => x86::nk::<1>(k, a, b.add(j0 * k), w, cp, ldc, prefetch),
                    (BLayout::Kn, 4) => x86::kn::<4>(k, a, b.add(j0), ldc, w, cp, ldc),
                    (BLayout::Kn, 2) => x86::kn::<2>(k, a, b.add(j0), ldc, w, cp, ldc),
                    (BLayout::Kn, _) => x86::kn::<1>(k, a, b.add(j0), ldc, w, cp, ldc),
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (layout, rows, k, a, b, c0, c1, c, ldc, prefetch);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::cpu::fp8_bf16::x86::bf16_bits;

    #[inline(always)]
    unsafe fn bh(v: __m512i) -> __m512bh {
        // SAFETY: both are 512 bits of plain data.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// Values ahead of the loads whose line is requested into L2 in each of the four rows:
    /// four rows stream at once, more than the hardware prefetcher keeps ahead of. Measured
    /// on two Zen 4 cores, bf16 M = 1 (alternating runs): qkv 0.59–0.61 ms against 0.66–0.67
    /// cold, 0.26 against 0.31 ms warm in L3; down 1.64–1.78 ms against 1.84–1.92 ms cold.
    /// Into L1 instead (T0) it was slower cold, and 2048 values ahead no better.
    const PREFETCH: usize = 1024;

    /// Mask of the first `n` of 32 words.
    #[inline(always)]
    fn words(n: usize) -> __mmask32 {
        if n >= 32 {
            !0
        } else {
            (1u32 << n) - 1
        }
    }

    /// How [`rows_of_b`] reads 32 values of a B row as bf16 pairs: in place, or widened from
    /// fp8 bytes as loaded.
    trait RowLoad {
        type Elem;

        /// 32 values at `p`.
        ///
        /// # Safety
        /// The caller's kernel features; 32 values readable at `p`.
        unsafe fn full(p: *const Self::Elem) -> __m512bh;

        /// The first `n < 32` values at `p`, the rest zero.
        ///
        /// # Safety
        /// As [`RowLoad::full`], `n` values readable.
        unsafe fn part(p: *const Self::Elem, n: usize) -> __m512bh;
    }

    /// bf16 values, loaded as they lie.
    struct Bf16Row;

    impl RowLoad for Bf16Row {
        type Elem = u16;

        #[inline(always)]
        unsafe fn full(p: *const u16) -> __m512bh {
            // SAFETY: the caller's contract.
            unsafe { bh(_mm512_loadu_si512(p.cast())) }
        }

        #[inline(always)]
        unsafe fn part(p: *const u16, n: usize) -> __m512bh {
            // SAFETY: the caller's contract; the mask keeps the load to `n` values.
            unsafe { bh(_mm512_maskz_loadu_epi16(words(n), p.cast())) }
        }
    }

    /// fp8 bytes (E5M2, or E4M3 either format) as the bf16 bits of their f16 readings,
    /// exactly ([`crate::cpu::fp8_bf16::x86::bf16_bits`]).
    struct Fp8Row<const E5M2: bool>;

    impl<const E5M2: bool> RowLoad for Fp8Row<E5M2> {
        type Elem = u8;

        #[inline(always)]
        unsafe fn full(p: *const u8) -> __m512bh {
            // SAFETY: the caller's contract (AVX-512F/BW, 32 bytes).
            unsafe { bh(bf16_bits::<E5M2>(_mm256_loadu_si256(p.cast()))) }
        }

        #[inline(always)]
        unsafe fn part(p: *const u8, n: usize) -> __m512bh {
            // SAFETY: the caller's contract; the mask keeps the load to `n` bytes.
            unsafe {
                bh(bf16_bits::<E5M2>(_mm256_maskz_loadu_epi8(
                    words(n),
                    p.cast(),
                )))
            }
        }
    }

    /// `R` rows of A (bf16, row stride `k`) against `cols <= 4` rows of B (row stride `k`
    /// values), each row read through `L`.
    ///
    /// # Safety
    /// AVX-512F/BW/VL and AVX-512-BF16 present; A readable for `R × k`, B for `cols × k`, C
    /// writable for `R` rows of `cols` at `ldc` apart.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_of_b<const R: usize, L: RowLoad>(
        k: usize,
        a: *const u16,
        b: *const L::Elem,
        cols: usize,
        c: *mut f32,
        ldc: usize,
        prefetch: bool,
    ) {
        // Unused columns read row 0 again; their sums are never stored.
        let rows: [*const L::Elem; 4] =
            std::array::from_fn(|j| if j < cols { unsafe { b.add(j * k) } } else { b });
        let full = k / 32 * 32;
        let mut p = 0;
        // SAFETY: the caller's features; p + 32 <= k in the loop, masked loads stay within k
        // after it; prefetch hints never fault, wherever they point.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 4]; R];
            while p < full {
                if prefetch {
                    // As many values ahead whatever their width (fp8 rows: the same lines of
                    // time as bf16's).
                    for r in rows {
                        _mm_prefetch::<_MM_HINT_T1>(r.wrapping_add(p + PREFETCH).cast());
                    }
                }
                let bv: [__m512bh; 4] = std::array::from_fn(|j| L::full(rows[j].add(p)));
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = bh(_mm512_loadu_si512(a.add(i * k + p).cast()));
                    for (s, bvv) in row.iter_mut().zip(bv) {
                        *s = _mm512_dpbf16_ps(*s, av, bvv);
                    }
                }
                p += 32;
            }
            if p < k {
                let n = k - p;
                let bv: [__m512bh; 4] = std::array::from_fn(|j| L::part(rows[j].add(p), n));
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = bh(_mm512_maskz_loadu_epi16(words(n), a.add(i * k + p).cast()));
                    for (s, bvv) in row.iter_mut().zip(bv) {
                        *s = _mm512_dpbf16_ps(*s, av, bvv);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                for (j, s) in row.iter().enumerate().take(cols) {
                    *c.add(i * ldc + j) = _mm512_reduce_add_ps(*s);
                }
            }
        }
    }

    /// [`rows_of_b`] on bf16 rows of B.
    ///
    /// # Safety
    /// As [`rows_of_b`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn nk<const R: usize>(
        k: usize,
        a: *const u16,
        b: *const u16,
        cols: usize,
        c: *mut f32,
        ldc: usize,
        prefetch: bool,
    ) {
        // SAFETY: the caller's contract.
        unsafe { rows_of_b::<R, Bf16Row>(k, a, b, cols, c, ldc, prefetch) }
    }

    /// [`rows_of_b`] on fp8 rows of B, bytes widened as loaded.
    ///
    /// # Safety
    /// As [`rows_of_b`], B readable for `cols × k` bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn nk_fp8<const R: usize, const E5M2: bool>(
        k: usize,
        a: *const u16,
        b: *const u8,
        cols: usize,
        c: *mut f32,
        ldc: usize,
        prefetch: bool,
    ) {
        // SAFETY: the caller's contract.
        unsafe { rows_of_b::<R, Fp8Row<E5M2>>(k, a, b, cols, c, ldc, prefetch) }
    }

    /// `R` rows of C over a strip of `width <= 64` columns, B stored `[K, N]` (row stride
    /// `ldb`), A's rows `k` apart.
    ///
    /// # Safety
    /// As [`nk`]: B readable for `k` rows of `width` columns.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn kn<const R: usize>(
        k: usize,
        a: *const u16,
        b: *const u16,
        ldb: usize,
        width: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        let masks = [words(width), words(width.saturating_sub(32))];
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        let pairs = k / 2;
        // SAFETY: rows 2q and 2q + 1 < k of B are read through masks of the strip's columns;
        // A's pair word 2q, 2q + 1 lies within its row.
        unsafe {
            let load = |row: usize, v: usize| {
                _mm512_maskz_loadu_epi16(masks[v], b.add(row * ldb + v * 32).cast())
            };
            let mut step = |even: [__m512i; 2], odd: [__m512i; 2], ap: [i32; R]| {
                // Within each 128-bit lane: lo holds columns 0..4, hi columns 4..8 (per lane).
                let bv = [
                    bh(_mm512_unpacklo_epi16(even[0], odd[0])),
                    bh(_mm512_unpackhi_epi16(even[0], odd[0])),
                    bh(_mm512_unpacklo_epi16(even[1], odd[1])),
                    bh(_mm512_unpackhi_epi16(even[1], odd[1])),
                ];
                for (row, &w) in acc.iter_mut().zip(&ap) {
                    let av = bh(_mm512_set1_epi32(w));
                    for (s, bvv) in row.iter_mut().zip(bv) {
                        *s = _mm512_dpbf16_ps(*s, av, bvv);
                    }
                }
            };
            for q in 0..pairs {
                let even = [load(2 * q, 0), load(2 * q, 1)];
                let odd = [load(2 * q + 1, 0), load(2 * q + 1, 1)];
                let ap: [i32; R] =
                    std::array::from_fn(|i| a.add(i * k + 2 * q).cast::<i32>().read_unaligned());
                step(even, odd, ap);
            }
            if k % 2 == 1 {
                let last = k - 1;
                let even = [load(last, 0), load(last, 1)];
                let ap: [i32; R] = std::array::from_fn(|i| i32::from(*a.add(i * k + last)));
                step(even, [_mm512_setzero_si512(); 2], ap);
            }
            // Undo the interleave: sums lo/hi hold, per 128-bit lane l, columns 8l..8l+4 and
            // 8l+4..8l+8; two-source permutes put 16 consecutive columns in each vector.
            let first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
            let second =
                _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
            for (i, row) in acc.iter().enumerate() {
                let cp = c.add(i * ldc);
                for v in 0..2 {
                    let (lo, hi) = (row[2 * v], row[2 * v + 1]);
                    let sums = [
                        _mm512_permutex2var_ps(lo, first, hi),
                        _mm512_permutex2var_ps(lo, second, hi),
                    ];
                    for (h, s) in sums.into_iter().enumerate() {
                        let col = v * 32 + h * 16;
                        if col >= width {
                            break;
                        }
                        let live = (width - col).min(16);
                        let mask: __mmask16 = if live == 16 {
                            0xffff
                        } else {
                            (1u16 << live) - 1
                        };
                        _mm512_mask_storeu_ps(cp.add(col), mask, s);
                    }
                }
            }
        }
    }
}
