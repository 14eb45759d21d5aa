//! Int4 weights under bf16 activations with AVX-512-BF16 (`vdpbf16ps`): the stream-dpbf16
//! variant of an int4 problem.
//!
//! A word holds values `i` and `i + 4` in bits `4i..4i + 4` and `4i + 16..4i + 20`: shifted
//! right by `4i` and passed through one `vpternlogd` (`(w & 0x000F000F) | 0x43004300`), each
//! 32-bit lane becomes the bf16 pair `(128 + q_i, 128 + q_{i+4})`, exact (bf16's unit at 128
//! is 1). So a vector of words becomes four vectors of pairs at two instructions each, and
//! each multiplies 32 weights in one `vdpbf16ps`, where the widening kernel spends a shift, a
//! look-up and a multiply-add on 16. The pairs meet A's `(a[8r + i], a[8r + i + 4])`, laid out
//! so once a call; a group's sum is then `Σ a·q + 128 Σ a`, and its zero point's correction
//! takes `(z + 128)` times the group's sum of A. x86-64 only (the module is gated): AVX-512-BF16
//! hosts are.

use half::bf16;

use super::parallel::{for_each_task, SharedMut};
use crate::config::GemmConfig;
use crate::kernel::GemmScales;
use crate::problem::GemmProblem;

/// Columns of a strip: two vectors of 16.
const STRIP: usize = 32;

/// Scratch (f32 words): A's pairs (`k / 2` a row) and its sums per row and group.
pub fn scratch_len(p: &GemmProblem) -> usize {
    let group = p.int4.unwrap_or(p.k).max(1);
    p.m * (p.k / 2) + p.m * (p.k / group)
}

/// Runs a config validated against the detected host (dtype bf16, `mr` of 1, 2 or 4,
/// AVX-512-BF16 present); buffers and scratch were checked by the caller.
pub fn run(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[bf16],
    words: &[u32],
    scales: GemmScales<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let group = p.int4.expect("an int4 problem");
    let (m, n, k) = (p.m, p.n, p.k);
    let groups = k / group;
    let (pairs, rest) = scratch.split_at_mut(m * k / 2);
    let asum = &mut rest[..m * groups];
    super::int4::group_sums(a, k, group, asum, bf16::to_f32);
    for (row, dst) in a.chunks_exact(k).zip(pairs.chunks_exact_mut(k / 2)) {
        for (eight, four) in row.chunks_exact(8).zip(dst.chunks_exact_mut(4)) {
            for (i, d) in four.iter_mut().enumerate() {
                let pair = eight[i].to_bits() as u32 | (eight[i + 4].to_bits() as u32) << 16;
                *d = f32::from_bits(pair);
            }
        }
    }
    let (pairs, asum): (&[f32], &[f32]) = (pairs, asum);
    let chunk = c.nc.next_multiple_of(STRIP);
    let out = SharedMut(out.as_mut_ptr());
    for_each_task(c.threads, n.div_ceil(chunk), |task, _| {
        let (c0, c1) = (task * chunk, ((task + 1) * chunk).min(n));
        for (i0, r) in super::gemm::row_groups(m, c.mr) {
            for j0 in (c0..c1).step_by(STRIP) {
                let strip = Strip {
                    k,
                    group,
                    pairs: pairs[i0 * k / 2..].as_ptr().cast(),
                    asum: asum[i0 * groups..].as_ptr(),
                    words: words[j0..].as_ptr(),
                    n,
                    scales: scales.b[j0..].as_ptr(),
                    zeros: match scales.zeros {
                        [] => std::ptr::null(),
                        zeros => zeros[j0..].as_ptr(),
                    },
                    width: STRIP.min(c1 - j0),
                    // SAFETY: row i0, column j0 of C exist.
                    c: unsafe { out.get().add(i0 * n + j0) },
                };
                // SAFETY: rows i0..i0 + r of the pairs, sums and C, columns j0..j0 + width of
                // the words, scales, zero points and C exist; tasks write disjoint columns;
                // validation checked the host has AVX-512-BF16.
                unsafe {
                    match r {
                        4 => x86::strip::<4>(strip),
                        2 => x86::strip::<2>(strip),
                        _ => x86::strip::<1>(strip),
                    }
                }
            }
        }
    });
}

/// One strip: rows of A's pairs (`k / 2` words apart) and sums (`k / group` apart), and the
/// strip's first column of the words, scales, zero points (null for 8) and C (`n` apart).
#[derive(Debug, Clone, Copy)]
struct Strip {
    k: usize,
    group: usize,
    pairs: *const u32,
    asum: *const f32,
    words: *const u32,
    n: usize,
    scales: *const f32,
    zeros: *const f32,
    width: usize,
    c: *mut f32,
}

mod x86 {
    use super::Strip;
    use std::arch::x86_64::*;

    /// `v`'s 512 bits as 32 bf16 values.
    #[inline(always)]
    unsafe fn bh(v: __m512i) -> __m512bh {
        // SAFETY: both are 512 bits of plain data.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// `R` rows of C over a strip of up to 32 columns (masked loads and stores past
    /// `width`, whose lanes are computed and dropped).
    ///
    /// # Safety
    /// AVX-512F/BW and AVX-512-BF16 present; every pointer valid for its rows as [`Strip`]
    /// lays them out, for `width` columns.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn strip<const R: usize>(s: Strip) {
        let groups = s.k / s.group;
        let ldp = s.k / 2;
        let mask = |v: usize| -> __mmask16 {
            let cols = s.width.saturating_sub(16 * v).min(16);
            ((1u32 << cols) - 1) as __mmask16
        };
        let masks = [mask(0), mask(1)];
        // SAFETY (whole body): the caller's contract on every pointer; masked lanes are
        // neither read nor written.
        unsafe {
            let low_nibbles = _mm512_set1_epi32(0x000F_000F);
            let one_two_eight = _mm512_set1_epi32(0x4300_4300);
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for g in 0..groups {
                let mut part = [[_mm512_setzero_ps(); 2]; R];
                for r in g * s.group / 8..(g + 1) * s.group / 8 {
                    let w = [0, 1].map(|v| {
                        _mm512_maskz_loadu_epi32(masks[v], s.words.add(r * s.n + 16 * v).cast())
                    });
                    // Values i and i + 4 of each word as a bf16 pair, times A's pair.
                    macro_rules! pair {
                        ($i:literal, $shift:literal) => {
                            let b = w.map(|wv| {
                                let shifted = _mm512_srli_epi32::<$shift>(wv);
                                bh(_mm512_ternarylogic_epi32::<0xEA>(
                                    shifted,
                                    low_nibbles,
                                    one_two_eight,
                                ))
                            });
                            for (x, part_row) in part.iter_mut().enumerate() {
                                let ap = *s.pairs.add(x * ldp + 4 * r + $i);
                                let av = bh(_mm512_set1_epi32(ap as i32));
                                for (pv, bv) in part_row.iter_mut().zip(b) {
                                    *pv = _mm512_dpbf16_ps(*pv, av, bv);
                                }
                            }
                        };
                    }
                    pair!(0, 0);
                    pair!(1, 4);
                    pair!(2, 8);
                    pair!(3, 12);
                }
                for (v, &m) in masks.iter().enumerate() {
                    let at = g * s.n + 16 * v;
                    let scale = _mm512_maskz_loadu_ps(m, s.scales.add(at));
                    let zero = if s.zeros.is_null() {
                        _mm512_set1_ps(8.0)
                    } else {
                        _mm512_maskz_loadu_ps(m, s.zeros.add(at))
                    };
                    let zero = _mm512_add_ps(zero, _mm512_set1_ps(128.0));
                    for (x, acc_row) in acc.iter_mut().enumerate() {
                        let sum = _mm512_set1_ps(*s.asum.add(x * groups + g));
                        let t = _mm512_fnmadd_ps(zero, sum, part[x][v]);
                        acc_row[v] = _mm512_fmadd_ps(scale, t, acc_row[v]);
                    }
                }
            }
            for (x, acc_row) in acc.iter().enumerate() {
                for (v, &m) in masks.iter().enumerate() {
                    _mm512_mask_storeu_ps(s.c.add(x * s.n + 16 * v), m, acc_row[v]);
                }
            }
        }
    }
}
