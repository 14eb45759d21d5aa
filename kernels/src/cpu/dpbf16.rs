//! bf16 GEMM with AVX-512-BF16 (`vdpbf16ps`): the packed loop nest of [`super::gemm`], but A and
//! B stay bf16 and are packed as pairs of consecutive k values in one 32-bit word, so each
//! instruction does two multiply-adds per lane, twice the f32 FMA rate, with f32 accumulation.
//!
//! A sliver holds `[ceil(kc / 2)][mr]` pair words (row i's `(a[i][2q], a[i][2q + 1])`), a B
//! sliver `[ceil(kc / 2)][nr]` (column j's `(b[2q][j], b[2q + 1][j])`); an odd k pads its last
//! pair with zero. The microkernel broadcasts one A pair per row and multiplies it with `nr / 16`
//! vectors of B pairs.

use half::bf16;

use crate::config::GemmConfig;
use crate::problem::{BLayout, GemmProblem};

/// Microkernel shapes (mr, nr): accumulators `mr · nr / 16` plus `nr / 16` B vectors and one
/// broadcast stay within the 32 vector registers. The 16-column tiles are for the direct
/// variant at 9 to 16 rows. Two Zen 4 threads, M = 16, Llama-70B TP8: 8×16 qkv 1.18 ms, gate_up
/// 6.37 ms against 1.79 and 9.34 ms streaming (12×16 and 24×16 were slower than 8×16 on both);
/// 16×16 is a little faster than 8×16 with a short K (o, K = 1024: 1.19 against 1.29 ms) and
/// much slower with K = 8192 (gate_up 10.5 ms).
pub const BF16_SHAPES: &[(usize, usize)] = &[
    (4, 64),
    (6, 64),
    (8, 32),
    (12, 32),
    (14, 32),
    (16, 16),
    (8, 16),
];

/// Scratch (32-bit words) a call needs: one packed A block and one B panel per thread.
pub fn scratch_len(p: &GemmProblem, c: &GemmConfig) -> usize {
    let mc = c.mc.min(p.m.next_multiple_of(c.mr));
    let kp = c.kc.min(p.k).div_ceil(2);
    let nc = c.nc.min(p.n.next_multiple_of(c.nr));
    super::parallel::shares_len(c.threads, mc * kp + kp * nc)
}

fn pair(lo: bf16, hi: bf16) -> u32 {
    u32::from(lo.to_bits()) | (u32::from(hi.to_bits()) << 16)
}

/// The f32 scratch as 32-bit words, where the pair kernels keep packed bf16 pairs as raw bits.
pub(super) fn pair_words(scratch: &mut [f32]) -> &mut [u32] {
    // SAFETY: u32 and f32 have the same size and alignment, and every bit pattern is valid.
    unsafe { std::slice::from_raw_parts_mut(scratch.as_mut_ptr().cast::<u32>(), scratch.len()) }
}

/// Runs a config validated against the detected host (dtype bf16, a shape of
/// [`BF16_SHAPES`], AVX-512-BF16 present).
pub fn run(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[bf16],
    b: &[bf16],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let (mr, nr) = (c.mr, c.nr);
    let ukr = microkernel(mr, nr).expect("validated configs have a microkernel");
    let words = pair_words(scratch);
    super::gemm::loop_nest(
        p,
        c,
        out,
        words,
        |kcur| kcur.div_ceil(2),
        |pc, kcur, jc, ncur, dst| pack_b(p, b, pc, kcur, jc, ncur, nr, kcur.div_ceil(2), dst),
        |ic, mcur, pc, kcur, dst| pack_a(p, a, ic, mcur, pc, kcur, mr, dst),
        || (),
        // SAFETY: loop_nest's contract on slivers and C; the backend validated the config
        // against the detected host, which has AVX-512-BF16.
        |_, depth, ap, bp, cp, rows, cols, accumulate| unsafe {
            ukr(depth, ap, bp, cp, p.n, rows, cols, accumulate)
        },
    );
}

#[allow(clippy::too_many_arguments)]
fn pack_a(
    p: &GemmProblem,
    a: &[bf16],
    ic: usize,
    mcur: usize,
    pc: usize,
    kcur: usize,
    mr: usize,
    dst: &mut [u32],
) {
    let kp = kcur.div_ceil(2);
    let zero = bf16::ZERO;
    for (s, sliver) in dst[..mcur.next_multiple_of(mr) * kp]
        .chunks_exact_mut(mr * kp)
        .enumerate()
    {
        let r0 = ic + s * mr;
        let live = mr.min(ic + mcur - r0);
        // A's rows are k-contiguous like a Linear layer's B: the same pair transpose.
        #[cfg(target_arch = "x86_64")]
        {
            let full = kcur / 2;
            // SAFETY: rows r0..r0 + live of A hold kcur values from pc; the detected host has
            // AVX-512 (validated).
            unsafe {
                super::transpose::gather_words(
                    a.as_ptr().add(r0 * p.k + pc).cast(),
                    2 * p.k,
                    4,
                    full,
                    live,
                    mr,
                    sliver.as_mut_ptr(),
                )
            };
            if full < kp {
                for (i, d) in sliver[full * mr..(full + 1) * mr].iter_mut().enumerate() {
                    *d = if i < live {
                        pair(a[(r0 + i) * p.k + pc + 2 * full], zero)
                    } else {
                        0
                    };
                }
            }
            continue;
        }
        #[allow(unreachable_code)]
        for i in 0..mr {
            if i >= live {
                for q in 0..kp {
                    sliver[q * mr + i] = 0;
                }
                continue;
            }
            let row = &a[(r0 + i) * p.k + pc..(r0 + i) * p.k + pc + kcur];
            let mut pairs = row.chunks_exact(2);
            for (q, two) in pairs.by_ref().enumerate() {
                sliver[q * mr + i] = pair(two[0], two[1]);
            }
            if let [last] = pairs.remainder() {
                sliver[(kp - 1) * mr + i] = pair(*last, zero);
            }
        }
    }
}

/// Packs `kcur` rows × `ncur` columns of B into `nr`-column slivers of `depth` pair rows
/// (`ceil(kcur / 2)` of them live, zero after: the AMX kernel pads to whole k blocks).
#[allow(clippy::too_many_arguments)]
pub(super) fn pack_b(
    p: &GemmProblem,
    b: &[bf16],
    pc: usize,
    kcur: usize,
    jc: usize,
    ncur: usize,
    nr: usize,
    depth: usize,
    dst: &mut [u32],
) {
    let kp = kcur.div_ceil(2);
    debug_assert!(depth >= kp);
    let zero = bf16::ZERO;
    // Every host that runs these kernels has AVX-512; the AMX kernel's tests also pack on
    // hosts without it.
    #[cfg(target_arch = "x86_64")]
    let avx512 = crate::CpuInfo::detect().isa >= crate::Isa::Avx512;
    for (s, full_sliver) in dst[..ncur.next_multiple_of(nr) * depth]
        .chunks_exact_mut(nr * depth)
        .enumerate()
    {
        let (sliver, padding) = full_sliver.split_at_mut(nr * kp);
        padding.fill(0);
        let j0 = jc + s * nr;
        let live = nr.min(jc + ncur - j0);
        match p.b_layout {
            BLayout::Kn => {
                for (q, dst_row) in sliver.chunks_exact_mut(nr).enumerate() {
                    let k0 = pc + 2 * q;
                    let even = &b[k0 * p.n + j0..k0 * p.n + j0 + live];
                    if k0 + 1 < pc + kcur {
                        let odd = &b[(k0 + 1) * p.n + j0..(k0 + 1) * p.n + j0 + live];
                        for ((d, &lo), &hi) in dst_row.iter_mut().zip(even).zip(odd) {
                            *d = pair(lo, hi);
                        }
                    } else {
                        for (d, &lo) in dst_row.iter_mut().zip(even) {
                            *d = pair(lo, zero);
                        }
                    }
                    dst_row[live..].fill(0);
                }
            }
            BLayout::Nk => {
                // A Linear layer's rows are k-contiguous, so each pair is already one 32-bit
                // word in memory (little endian: the even k in the low half): a full sliver is
                // a transpose of 32-bit words, done with gathers of 16 columns.
                #[cfg(target_arch = "x86_64")]
                if avx512 {
                    let full = kcur / 2;
                    // SAFETY: the sliver's `live` rows of B hold kcur values from pc; the
                    // gather reads pairs 0..full of each; the detected host has AVX-512.
                    unsafe {
                        super::transpose::gather_words(
                            b.as_ptr().add(j0 * p.k + pc).cast(),
                            2 * p.k,
                            4,
                            full,
                            live,
                            nr,
                            sliver.as_mut_ptr(),
                        )
                    };
                    if full < kp {
                        let dst_row = &mut sliver[full * nr..(full + 1) * nr];
                        for (j, d) in dst_row.iter_mut().enumerate() {
                            *d = if j < live {
                                pair(b[(j0 + j) * p.k + pc + 2 * full], zero)
                            } else {
                                0
                            };
                        }
                    }
                    continue;
                }
                for j in 0..nr {
                    if j >= live {
                        for q in 0..kp {
                            sliver[q * nr + j] = 0;
                        }
                        continue;
                    }
                    let src = &b[(j0 + j) * p.k + pc..(j0 + j) * p.k + pc + kcur];
                    let mut pairs = src.chunks_exact(2);
                    for (q, two) in pairs.by_ref().enumerate() {
                        sliver[q * nr + j] = pair(two[0], two[1]);
                    }
                    if let [last] = pairs.remainder() {
                        sliver[(kp - 1) * nr + j] = pair(*last, zero);
                    }
                }
            }
        }
    }
}

/// `(kp, a, b, c, ldc, mr, nr, accumulate)`: C[mr × nr] (+)= A pairs · B pairs.
type Ukr = unsafe fn(usize, *const u32, *const u32, *mut f32, usize, usize, usize, bool);

/// [`Ukr`] with A's rows in place, `rsa` words apart (`(kp, a, rsa, b, c, ldc, mr, nr,
/// accumulate)`): the direct GEMM broadcasts a Linear layer's weights as they lie.
pub type UkrRows =
    unsafe fn(usize, *const u32, usize, *const u32, *mut f32, usize, usize, usize, bool);

/// The `x86` kernel `$kernel` instantiated for `(mr, nr)`, if it is a shape of
/// [`BF16_SHAPES`].
macro_rules! for_shape {
    ($kernel:ident, $mr:expr, $nr:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            Some(match ($mr, $nr) {
                (4, 64) => x86::$kernel::<4, 4>,
                (6, 64) => x86::$kernel::<6, 4>,
                (8, 32) => x86::$kernel::<8, 2>,
                (12, 32) => x86::$kernel::<12, 2>,
                (14, 32) => x86::$kernel::<14, 2>,
                (16, 16) => x86::$kernel::<16, 1>,
                (8, 16) => x86::$kernel::<8, 1>,
                _ => return None,
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = ($mr, $nr);
            None
        }
    }};
}

/// The in-place-rows microkernel for a shape of [`BF16_SHAPES`].
pub fn microkernel_rows(mr: usize, nr: usize) -> Option<UkrRows> {
    for_shape!(ukr_rows, mr, nr)
}

/// The microkernel for a shape of [`BF16_SHAPES`].
pub fn microkernel(mr: usize, nr: usize) -> Option<Ukr> {
    for_shape!(ukr, mr, nr)
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    /// `MR` rows × `NV` vectors of 16 columns, A packed.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX-512-BF16; `a` holds `kp · MR` and `b` `kp · NV · 16` pair
    /// words; C is writable for `mr` rows of `nr` columns at `ldc` apart.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ukr<const MR: usize, const NV: usize>(
        kp: usize,
        a: *const u32,
        b: *const u32,
        c: *mut f32,
        ldc: usize,
        mr: usize,
        nr: usize,
        accumulate: bool,
    ) {
        // SAFETY: the caller's contract; packed A is `[kp][MR]`, packed B `[kp][NV · 16]`.
        unsafe { body::<MR, NV>(kp, a, 1, MR, b, NV * 16, c, ldc, mr, nr, accumulate) }
    }

    /// [`ukr`] with A's `MR` rows in place, `rsa` words apart.
    ///
    /// # Safety
    /// As [`ukr`], with each of A's `MR` rows holding `kp` words (any alignment).
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ukr_rows<const MR: usize, const NV: usize>(
        kp: usize,
        a: *const u32,
        rsa: usize,
        b: *const u32,
        c: *mut f32,
        ldc: usize,
        mr: usize,
        nr: usize,
        accumulate: bool,
    ) {
        // SAFETY: the caller's contract.
        unsafe { body::<MR, NV>(kp, a, rsa, 1, b, NV * 16, c, ldc, mr, nr, accumulate) }
    }

    /// [`ukr_rows`] on whole tiles with B's pair rows `ldb` words apart: C[MR × NV · 16]
    /// (+)= A · B, as flash attention's pair products take their operands.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX-512-BF16; A's `MR` rows (`rsa` words apart) hold `kp`
    /// words, B's `kp` rows (`ldb` apart) `NV · 16`; C is writable for `MR` rows of
    /// `NV · 16` values, `ldc` apart.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ukr_tiles<const MR: usize, const NV: usize>(
        kp: usize,
        a: *const u32,
        rsa: usize,
        b: *const u32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY: the caller's contract.
        unsafe { body::<MR, NV>(kp, a, rsa, 1, b, ldb, c, ldc, MR, NV * 16, accumulate) }
    }

    /// A's pair `q` of row `i` at `a + i · rsa + q · csa` words, B's pair row `q` at `b + q ·
    /// ldb`.
    ///
    /// Requesting each in-place row's line 1 KiB ahead (once per line read) measured no
    /// faster: Llama-70B gate_up M = 16 and 128, 8×32 and 16×16.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn body<const MR: usize, const NV: usize>(
        kp: usize,
        a: *const u32,
        rsa: usize,
        csa: usize,
        b: *const u32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        mr: usize,
        nr: usize,
        accumulate: bool,
    ) {
        // SAFETY: inlined into callers that enable AVX-512F.
        let mut acc = [[unsafe { _mm512_setzero_ps() }; NV]; MR];
        for q in 0..kp {
            // SAFETY: caller contract on the packed slivers.
            unsafe {
                let bv: [__m512bh; NV] = std::array::from_fn(|v| {
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        b.add(q * ldb + v * 16).cast(),
                    ))
                });
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                        a.add(i * rsa + q * csa).read_unaligned() as i32,
                    ));
                    for (accv, bvv) in row.iter_mut().zip(bv.iter()) {
                        *accv = _mm512_dpbf16_ps(*accv, av, *bvv);
                    }
                }
            }
        }
        // SAFETY: caller contract on C; edge tiles store through masks.
        unsafe {
            for (i, row) in acc.iter().enumerate().take(mr) {
                let cp = c.add(i * ldc);
                for (v, accv) in row.iter().enumerate() {
                    let lo = v * 16;
                    if lo >= nr {
                        break;
                    }
                    let live = (nr - lo).min(16);
                    let mask: __mmask16 = if live == 16 {
                        0xffff
                    } else {
                        (1u16 << live) - 1
                    };
                    let out = if accumulate {
                        _mm512_add_ps(_mm512_maskz_loadu_ps(mask, cp.add(lo)), *accv)
                    } else {
                        *accv
                    };
                    _mm512_mask_storeu_ps(cp.add(lo), mask, out);
                }
            }
        }
    }
}
