//! Flash attention forward with both products on bf16 pairs: on AMX tiles (`tdpbf16ps` on
//! 32 × 32 blocks of four f32 accumulator tiles) or by AVX-512-BF16's `vdpbf16ps` (the same
//! blocks as 8-row strips of register accumulators), the online softmax in f32 between them.
//! Both take their operands alike (A rows of pair words, B rows of pairs interleaved per
//! column), so one driver serves both through [`Products`].
//!
//! A task owns the query tiles of [`super::flash::Span`] (with `group_heads`, the positions ×
//! query heads sharing a KV head) and walks the key tiles in order, as [`super::flash`] does:
//!
//! - `S = Q·Kᵀ`: the tile's Q rows, copied once per query tile, are the A operand; each key
//!   tile is packed as B, the pair words of each key's row transposed into `[d pair][key]`
//!   rows (16 × 16 word transposes in registers);
//! - the softmax runs along each row of S: scale by `scale·log2(e)`, causal and window masks,
//!   running max and sum, `exp2`, and the weights rounded to bf16 into P, whose rows are the A
//!   operand of the second product (PyTorch's CPU flash attention rounds them the same way);
//! - `O += P·V`: V packed as B, each pair of consecutive keys interleaved per column; the
//!   accumulators O live in the scratch as f32, loaded and stored per key tile.
//!
//! Every buffer is padded to whole 32 × 32 blocks (query rows, keys, head dimension), zero
//! past the live part, so the products have no edges: padded keys get weight 0, padded head
//! columns produce zeros that are never written out.
//!
//! `vdpbf16ps` does two multiply-adds a lane, so where a core issues it as fast as an f32 FMA
//! (Zen 4) the products take half the instructions of [`super::flash`]'s f32 microkernels,
//! which widen bf16 inputs to f32.

use half::bf16;

use super::amx::block;
use super::amx_tiles::{c_tile, TileConfig, Tiles, ROWS};
use super::flash::{causal_offset, kv_end, task_count, Span};
use super::parallel::{for_each_task, share_len, shares_len, SharedMut};
use crate::config::FlashConfig;
use crate::kernel::HeadValues;
use crate::problem::FlashProblem;

/// Rows and columns of a block of 2 × 2 accumulator tiles, and the padding of every dimension.
const BLOCK: usize = 2 * ROWS;

/// One worker's buffers, in 32-bit words (bf16 parts hold two values a word).
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Query rows of a tile, padded to a block.
    rows_pad: usize,
    /// Head dimension, padded to a block.
    dp: usize,
    /// Keys of a key tile, padded to a block.
    bcp: usize,
}

impl Layout {
    fn new(p: &FlashProblem, c: &FlashConfig) -> Self {
        let rows = c.br * if c.group_heads { p.group() } else { 1 };
        Layout {
            rows_pad: rows.next_multiple_of(BLOCK),
            dp: p.head_dim.next_multiple_of(BLOCK),
            bcp: c.bc.next_multiple_of(BLOCK),
        }
    }

    /// Q `[rows][dp]` bf16, Kᵀ `[dp/2][bcp]` pairs, V `[bcp/2][dp]` pairs, S `[rows][bcp]`
    /// f32, P `[rows][bcp]` bf16, O `[rows][dp]` f32, row max and sum. Every part is a whole
    /// number of cache lines (all dimensions are multiples of 32).
    fn parts(&self) -> [usize; 8] {
        let (r, d, b) = (self.rows_pad, self.dp, self.bcp);
        [
            r * d / 2,
            d / 2 * b,
            b / 2 * d,
            r * b,
            r * b / 2,
            r * d,
            r,
            r,
        ]
    }
}

pub fn scratch_len(p: &FlashProblem, c: &FlashConfig) -> usize {
    shares_len(c.threads, Layout::new(p, c).parts().iter().sum())
}

/// Runs a config validated against the detected host (bf16, an even head dimension, and
/// `amx` on a host whose level is `avx512-amx` or `dpbf16` on one with AVX-512-BF16).
#[allow(clippy::too_many_arguments)]
pub fn run(
    p: &FlashProblem,
    c: &FlashConfig,
    q: &[bf16],
    k: &[bf16],
    v: &[bf16],
    heads: HeadValues<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    // Every AMX host, and every host with AVX-512-BF16, has AVX-512.
    let passes = passes(Level::best());
    if c.amx {
        debug_assert_eq!(crate::CpuInfo::detect().isa, crate::Isa::Avx512Amx);
        run_on::<super::amx_tiles::Hardware>(p, c, q, k, v, heads, out, scratch, passes);
        return;
    }
    debug_assert!(c.dpbf16 && crate::CpuInfo::detect().avx512_bf16);
    #[cfg(target_arch = "x86_64")]
    run_on::<Dpbf16>(p, c, q, k, v, heads, out, scratch, passes);
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("validation refuses dpbf16 configs off x86-64");
}

/// The two products of a key tile on some hardware: `C[32 × 32] (+)= A · B` over whole
/// blocks of 16 pairs, between `start` and `finish` (one query tile's work).
trait Products {
    /// # Safety
    /// The host runs this engine.
    unsafe fn start(&mut self);
    /// `C[32 × 32] (+)= A · B` over `blocks` k blocks: A rows at `a`, `lda` words apart, B
    /// pair rows at `b`, `ldb` words apart; C at `c`, `ldc` f32 apart, loaded first when
    /// accumulating.
    ///
    /// # Safety
    /// Between `start` and `finish`; A holds 32 rows of `blocks · 16` words, B `blocks · 16`
    /// pair rows of 32 words, C 32 rows of 32 values.
    #[allow(clippy::too_many_arguments)]
    unsafe fn product(
        &mut self,
        blocks: usize,
        a: *const u32,
        lda: usize,
        b: *const u32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    );
    /// # Safety
    /// After `start`.
    unsafe fn finish(&mut self);
}

/// AMX tiles, or their software model: configured for blocks of 2 × 2 tiles while a query
/// tile lasts.
impl<T: Tiles> Products for T {
    unsafe fn start(&mut self) {
        // SAFETY: the caller's contract.
        unsafe { self.configure(&TileConfig::full(2, 2)) }
    }

    unsafe fn product(
        &mut self,
        blocks: usize,
        a: *const u32,
        lda: usize,
        b: *const u32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            let corner = |i: usize, j: usize| c.add(i * ROWS * ldc + j * ROWS);
            for i in 0..2 {
                for j in 0..2 {
                    if accumulate {
                        self.load(c_tile(i, j), corner(i, j).cast(), 4 * ldc);
                    } else {
                        self.zero(c_tile(i, j));
                    }
                }
            }
            for kb in 0..blocks {
                block::<T, 2, 2>(self, a.add(kb * ROWS), lda, b.add(kb * ROWS * ldb), ldb);
            }
            for i in 0..2 {
                for j in 0..2 {
                    self.store(c_tile(i, j), corner(i, j).cast(), 4 * ldc);
                }
            }
        }
    }

    unsafe fn finish(&mut self) {
        // SAFETY: the caller's contract.
        unsafe { self.release() }
    }
}

/// `vdpbf16ps` (AVX-512-BF16): a block as four strips of 8 rows × 32 columns, each strip's 16
/// accumulators in registers over all of k (two B vectors and eight A broadcasts for its 16
/// instructions a pair).
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Default)]
struct Dpbf16;

#[cfg(target_arch = "x86_64")]
impl Products for Dpbf16 {
    unsafe fn start(&mut self) {}

    unsafe fn product(
        &mut self,
        blocks: usize,
        a: *const u32,
        lda: usize,
        b: *const u32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        const STRIP: usize = 8;
        for r in (0..BLOCK).step_by(STRIP) {
            // SAFETY: the caller's contract; this engine runs where AVX-512-BF16 is.
            unsafe {
                super::dpbf16::x86::ukr_tiles::<STRIP, 2>(
                    blocks * ROWS,
                    a.add(r * lda),
                    lda,
                    b,
                    ldb,
                    c.add(r * ldc),
                    ldc,
                    accumulate,
                )
            };
        }
    }

    unsafe fn finish(&mut self) {}
}

/// [`pack_v`]'s arguments: values, first row, row stride, live keys, columns, row width,
/// destination.
type PackV = fn(&[u16], usize, usize, usize, usize, usize, &mut [u32]);

/// The passes between the tile products: packing the key tiles, the softmax, packing the value
/// tiles. Written once in plain Rust and compiled twice: for AVX-512 (every AMX host has it),
/// where LLVM vectorises them, and portably for the software model of the tiles on hosts
/// without it.
#[derive(Clone, Copy)]
struct Passes {
    pack_kt: unsafe fn(*const u8, usize, usize, usize, usize, *mut u32),
    softmax: fn(&mut Rows<'_>),
    pack_v: PackV,
}

/// Which build of the [`Passes`] to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Level {
    Portable,
    /// AVX-512F, BW, VL and DQ, weights rounded to bf16 in integer steps.
    Avx512,
    /// The same with AVX-512-BF16's rounding instruction.
    Avx512Bf16,
}

impl Level {
    /// The best level this host runs. The instructions themselves decide, whatever
    /// `KERNTUNE_AVX512_BF16` hides from config choice.
    fn best() -> Level {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq") {
                return if has!("avx512bf16") {
                    Level::Avx512Bf16
                } else {
                    Level::Avx512
                };
            }
        }
        Level::Portable
    }

    /// Every level this host runs, for the tests.
    #[cfg(test)]
    fn supported() -> Vec<Level> {
        let all = [Level::Portable, Level::Avx512, Level::Avx512Bf16];
        let best = all.iter().position(|&l| l == Level::best()).unwrap_or(0);
        all[..=best].to_vec()
    }
}

fn passes(level: Level) -> Passes {
    #[cfg(target_arch = "x86_64")]
    if level != Level::Portable {
        return Passes {
            pack_kt: pack_kt_avx512,
            softmax: if level == Level::Avx512Bf16 {
                |rows| {
                    // SAFETY: chosen only where the host has AVX-512 with BF16.
                    unsafe { softmax_avx512_bf16(rows) }
                }
            } else {
                |rows| {
                    // SAFETY: chosen only where the host has AVX-512F, BW, VL and DQ.
                    unsafe { softmax_avx512_int(rows) }
                }
            },
            pack_v: |v, at, stride, w, d, dp, dst| {
                // SAFETY: chosen only where the host has AVX-512F.
                unsafe { pack_v_avx512(v, at, stride, w, d, dp, dst) }
            },
        };
    }
    let _ = level;
    Passes {
        pack_kt: pack_kt_portable,
        softmax: softmax_portable,
        pack_v,
    }
}

/// The kernel on a given implementation of the products.
#[allow(clippy::too_many_arguments)]
fn run_on<T: Products + Default>(
    p: &FlashProblem,
    c: &FlashConfig,
    q: &[bf16],
    k: &[bf16],
    v: &[bf16],
    heads: HeadValues<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
    passes: Passes,
) {
    let lay = Layout::new(p, c);
    let per_worker = share_len(scratch.len(), c.threads);
    let scratch = SharedMut(super::dpbf16::pair_words(scratch).as_mut_ptr());
    let out = SharedMut(out.as_mut_ptr());
    // bf16 values as their bits, which is what the tiles and the packing passes move.
    fn bits(x: &[bf16]) -> &[u16] {
        // SAFETY: bf16 is a 16-bit value with the alignment of u16.
        unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u16>(), x.len()) }
    }
    let (q, k, v) = (bits(q), bits(k), bits(v));
    for_each_task(c.threads, task_count(p, c), |task, worker| {
        // SAFETY: one task per worker at a time, so worker slices are disjoint.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(scratch.get().add(worker * per_worker), per_worker)
        };
        let span = Span::of(p, c, task);
        let mut tiles = T::default();
        for blk in span.blocks.clone() {
            // SAFETY: query blocks of distinct tasks write disjoint rows of `out`; validation
            // checked the host runs T (AMX, AVX-512-BF16), or T is the software model.
            unsafe {
                query_tile(
                    &mut tiles,
                    p,
                    c,
                    &lay,
                    &span,
                    passes,
                    q,
                    k,
                    v,
                    heads,
                    out.get(),
                    blk,
                    buf,
                )
            };
        }
    });
}

/// The softmax's view of one key tile: scores in, weights out, the running statistics.
struct Rows<'a> {
    /// Scores `[rows][bcp]`, as the first product stored them (the row step may overwrite
    /// them).
    s: &'a mut [f32],
    /// Weights `[rows][bcp]` as bf16 bits.
    pm: &'a mut [u16],
    /// Accumulators `[rows][dp]`, rescaled when a row's max moves.
    o: &'a mut [f32],
    mx: &'a mut [f32],
    sum: &'a mut [f32],
    rows: usize,
    bcp: usize,
    dp: usize,
    /// Keys live in this tile, and the same rounded up to a block.
    w: usize,
    wp: usize,
    /// `scale·log2(e)`.
    qscale: f32,
    /// With the mask, the keys of this tile the tile's first position sees (negative when
    /// the tile starts past them): row r sees `first_pos_keys + r / rows_per_pos` of them.
    first_pos_keys: isize,
    /// With a sliding window, the keys of this tile the window of the tile's first position
    /// has passed (negative when none): row r's window has passed `first_pos_passed +
    /// r / rows_per_pos` of them.
    first_pos_passed: Option<isize>,
    rows_per_pos: usize,
    causal: bool,
}

impl Rows<'_> {
    /// The keys of this tile row `r` sees: a range, empty for a row the tile is hidden from.
    fn visible(&self, r: usize) -> std::ops::Range<usize> {
        let pos = (r / self.rows_per_pos) as isize;
        let clamp = |keys: isize| keys.clamp(0, self.w as isize) as usize;
        let end = match self.causal {
            true => clamp(self.first_pos_keys + pos),
            false => self.w,
        };
        let start = self.first_pos_passed.map_or(0, |k| clamp(k + pos));
        start..end.max(start)
    }
}

/// One online-softmax step for every row of the tile. `exp_row(row, qscale, m_old, weights)`
/// turns a row's visible scores into weights: it returns the new running max `m_new` (the
/// larger of `m_old` and the scaled scores' max) and the sum of `2^(x·qscale − m_new)`, each
/// of which it stores rounded to bf16.
#[inline(always)]
fn softmax_rows(
    t: &mut Rows<'_>,
    exp_row: impl Fn(&mut [f32], f32, f32, &mut [u16]) -> (f32, f32),
) {
    for r in 0..t.rows {
        let vis = t.visible(r);
        let pm = &mut t.pm[r * t.bcp..r * t.bcp + t.wp];
        if vis.is_empty() {
            // Hidden from every key of this tile: nothing to add, nothing to rescale.
            pm.fill(0);
            continue;
        }
        let m_old = t.mx[r];
        let row = &mut t.s[r * t.bcp + vis.start..r * t.bcp + vis.end];
        let (m_new, total) = exp_row(row, t.qscale, m_old, &mut pm[vis.start..]);
        pm[..vis.start].fill(0);
        pm[vis.end..].fill(0);
        // 0 on the first visible tile, where m_old is −∞.
        let alpha = super::leaf::exp2_approx(m_old - m_new);
        t.sum[r] = t.sum[r] * alpha + total;
        t.mx[r] = m_new;
        if alpha != 1.0 {
            for x in &mut t.o[r * t.dp..(r + 1) * t.dp] {
                *x *= alpha;
            }
        }
    }
}

/// [`softmax_rows`]' row step in plain Rust, for the software model of the tiles: the
/// leaf loops' max, `exp2` and sum, on the scores scaled in place.
fn softmax_portable(t: &mut Rows<'_>) {
    softmax_rows(t, |row, qscale, m_old, pm| {
        for x in row.iter_mut() {
            *x *= qscale;
        }
        let m_new = m_old.max(super::leaf::row_max::<super::simd::Portable>(row));
        let total = super::leaf::exp2_sum(row, m_new);
        for (o, &e) in pm.iter_mut().zip(row.iter()) {
            *o = to_bf16_bits(e);
        }
        (m_new, total)
    });
}

/// bf16 bits of a finite f32, rounded to nearest even (what `half` does, in integer steps LLVM
/// vectorises).
#[inline(always)]
fn to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// `dst[pair][x]` (rows of `dp`) = keys `2·pair` and `2·pair + 1` of a tile (`w` live, rows
/// `stride` values apart from `at`) interleaved for column `x < d`; pairs past the live keys
/// are zero, the missing second key of an odd tile too. Columns `d..` are left as they are
/// (zero).
#[inline(always)]
fn pack_v(v: &[u16], at: usize, stride: usize, w: usize, d: usize, dp: usize, dst: &mut [u32]) {
    for (pair, row) in dst.chunks_exact_mut(dp).enumerate() {
        let j = 2 * pair;
        let row = &mut row[..d];
        if j + 1 < w {
            let a = &v[at + j * stride..][..d];
            let b = &v[at + (j + 1) * stride..][..d];
            for ((o, &lo), &hi) in row.iter_mut().zip(a).zip(b) {
                *o = u32::from(lo) | u32::from(hi) << 16;
            }
        } else if j < w {
            let a = &v[at + j * stride..][..d];
            for (o, &lo) in row.iter_mut().zip(a) {
                *o = u32::from(lo);
            }
        } else {
            row.fill(0);
        }
    }
}

/// [`softmax_rows`]' row step in AVX-512: the max, then one pass that computes
/// `2^(x·qscale − m)`, sums it and rounds it to bf16, 16 scores an instruction. LLVM's
/// vectorisation of the portable step kept the leaf kernels' degree-6 polynomial in separate
/// multiplies and adds, and the softmax took 60% of the kernel's time; here the fraction's
/// power of two is a degree-4 polynomial in FMAs (relative error 2.6e-6, against the 2^-9 of
/// the bf16 rounding that follows), scaled by `vscalefps`. `NATIVE_BF16` rounds with
/// `vcvtneps2bf16` (AVX-512-BF16), one instruction for the five of the integer rounding.
///
/// Inlined into the `#[target_feature]` functions below, which compile it for their features
/// (closures here would not inherit them, and every intrinsic would become a call).
///
/// # Safety
/// The host has AVX-512F, BW, VL and DQ, and AVX-512-BF16 when `NATIVE_BF16`; `pm` holds at
/// least `row.len()` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn row_step_avx512<const NATIVE_BF16: bool>(
    row: &[f32],
    qscale: f32,
    m_old: f32,
    pm: &mut [u16],
) -> (f32, f32) {
    use std::arch::x86_64::*;
    let n = row.len();
    let tail = (n % 16) as u32;
    let full = n - tail as usize;
    let tail_mask: __mmask16 = ((1u32 << tail) - 1) as u16;
    let (src, dst) = (row.as_ptr(), pm.as_mut_ptr());
    // SAFETY: every load and store stays within `row` (n values) and `pm` (at least n):
    // whole vectors below `full`, the masked tail after it; the caller's contract on the
    // host's features.
    unsafe {
        let mut mv = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in (0..full).step_by(16) {
            mv = _mm512_max_ps(mv, _mm512_loadu_ps(src.add(i)));
        }
        mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(mv, tail_mask, src.add(full)));
        // The scale is positive, so the scaled max is the max of the scaled scores.
        let m_new = m_old.max(_mm512_reduce_max_ps(mv) * qscale);
        let (scale, sub) = (_mm512_set1_ps(qscale), _mm512_set1_ps(m_new));
        let mut acc = _mm512_setzero_ps();
        for i in (0..full).step_by(16) {
            let e = exp2_bf16::<NATIVE_BF16>(
                _mm512_loadu_ps(src.add(i)),
                scale,
                sub,
                0xffff,
                dst.add(i),
            );
            acc = _mm512_add_ps(acc, e);
        }
        if tail > 0 {
            let x = _mm512_maskz_loadu_ps(tail_mask, src.add(full));
            let e = exp2_bf16::<NATIVE_BF16>(x, scale, sub, tail_mask, dst.add(full));
            acc = _mm512_add_ps(acc, e);
        }
        (m_new, _mm512_reduce_add_ps(acc))
    }
}

/// `2^(x·scale − sub)` for the lanes in `mask` (zero elsewhere), stored at `dst` rounded to
/// bf16 (nearest even, as `to_bf16_bits`), and returned in f32. Below 2^−126 the result is
/// 2^−126 · p, which no sum of weights of at most 1 notices.
///
/// # Safety
/// As [`row_step_avx512`]; `dst` holds the lanes in `mask`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn exp2_bf16<const NATIVE_BF16: bool>(
    x: std::arch::x86_64::__m512,
    scale: std::arch::x86_64::__m512,
    sub: std::arch::x86_64::__m512,
    mask: std::arch::x86_64::__mmask16,
    dst: *mut u16,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // Minimax (relative error) coefficients of 2^f on [0, 1), highest power first.
    const C: [f32; 5] = [
        1.353_398e-2,
        5.201_128_5e-2,
        2.414_433e-1,
        6.930_036e-1,
        1.000_002_6,
    ];
    // SAFETY: the caller's contract.
    unsafe {
        // 2^x = 2^floor(x) · 2^f, f in [0, 1).
        let x = _mm512_max_ps(_mm512_fmsub_ps(x, scale, sub), _mm512_set1_ps(-126.0));
        let xi = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(x);
        let f = _mm512_sub_ps(x, xi);
        let mut p = _mm512_set1_ps(C[0]);
        for &k in &C[1..] {
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(k));
        }
        let e = _mm512_maskz_scalef_ps(mask, p, xi);
        let h: __m256i = if NATIVE_BF16 {
            std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(e))
        } else {
            let b = _mm512_castps_si512(e);
            let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
            let r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), odd);
            _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(r))
        };
        _mm256_mask_storeu_epi16(dst.cast(), mask, h);
        e
    }
}

/// # Safety
/// The host has AVX-512F, BW, VL and DQ.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn softmax_avx512_int(t: &mut Rows<'_>) {
    softmax_rows(t, |row, qscale, m_old, pm| {
        // SAFETY: the caller's contract; the row step's weights are the row's length.
        unsafe { row_step_avx512::<false>(row, qscale, m_old, pm) }
    })
}

/// # Safety
/// The host has AVX-512F, BW, VL, DQ and AVX-512-BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
unsafe fn softmax_avx512_bf16(t: &mut Rows<'_>) {
    softmax_rows(t, |row, qscale, m_old, pm| {
        // SAFETY: the caller's contract; the row step's weights are the row's length.
        unsafe { row_step_avx512::<true>(row, qscale, m_old, pm) }
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn pack_v_avx512(
    v: &[u16],
    at: usize,
    stride: usize,
    w: usize,
    d: usize,
    dp: usize,
    dst: &mut [u32],
) {
    pack_v(v, at, stride, w, d, dp, dst)
}

/// `dst[q][j]` = pair word `q < count` of key row `j` (`row_bytes` apart from `src`) for
/// `j < live`, zero for `live <= j < width`.
///
/// # Safety
/// Rows `0..live` hold `count` words; `dst` holds `count · width` words; AVX-512F.
#[cfg(target_arch = "x86_64")]
unsafe fn pack_kt_avx512(
    src: *const u8,
    row_bytes: usize,
    count: usize,
    live: usize,
    width: usize,
    dst: *mut u32,
) {
    // SAFETY: the caller's contract.
    unsafe { super::transpose::gather_words(src, row_bytes, 4, count, live, width, dst) }
}

/// [`pack_kt_avx512`] a word at a time.
///
/// # Safety
/// As [`pack_kt_avx512`], without the AVX-512 requirement.
unsafe fn pack_kt_portable(
    src: *const u8,
    row_bytes: usize,
    count: usize,
    live: usize,
    width: usize,
    dst: *mut u32,
) {
    for q in 0..count {
        for j in 0..width {
            // SAFETY: the caller's contract; unaligned reads of whole words.
            unsafe {
                let word = if j < live {
                    src.add(j * row_bytes + 4 * q)
                        .cast::<u32>()
                        .read_unaligned()
                } else {
                    0
                };
                *dst.add(q * width + j) = word;
            }
        }
    }
}

/// Query tile `blk` of a task: every key tile it sees, then its rows of the output.
///
/// # Safety
/// `out` is the whole output; no other task writes these rows; `T` runs on this host.
#[allow(clippy::too_many_arguments)]
unsafe fn query_tile<T: Products>(
    tiles: &mut T,
    p: &FlashProblem,
    c: &FlashConfig,
    lay: &Layout,
    span: &Span,
    passes: Passes,
    q: &[u16],
    k: &[u16],
    v: &[u16],
    heads: HeadValues<'_>,
    out: *mut f32,
    blk: usize,
    buf: &mut [u32],
) {
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let Layout { rows_pad, dp, bcp } = *lay;
    let [lq, lk, lv, ls, lp, lo, lm, _] = lay.parts();
    let (qp, rest) = buf.split_at_mut(lq);
    let (kt, rest) = rest.split_at_mut(lk);
    let (vv, rest) = rest.split_at_mut(lv);
    let (s, rest) = rest.split_at_mut(ls);
    let (pm, rest) = rest.split_at_mut(lp);
    let (o, rest) = rest.split_at_mut(lo);
    let (mx, rest) = rest.split_at_mut(lm);
    let sum = &mut rest[..lm];
    // SAFETY: u32 and f32 share size and alignment and any bits are a valid f32; two u16 fit
    // a u32 at its alignment.
    let (s, o, mx, sum, qh, pm) = unsafe {
        let f =
            |x: &mut [u32]| std::slice::from_raw_parts_mut(x.as_mut_ptr().cast::<f32>(), x.len());
        let h = |x: &mut [u32]| {
            std::slice::from_raw_parts_mut(x.as_mut_ptr().cast::<u16>(), 2 * x.len())
        };
        (f(s), f(o), f(mx), f(sum), h(qp), h(pm))
    };

    let i0 = blk * c.br;
    let i1 = (i0 + c.br).min(p.q_len);
    let rows = (i1 - i0) * span.rows_per_pos;
    let live_rows = rows.next_multiple_of(BLOCK);
    // Q rows as they are, zero past the head dimension and the live rows.
    for r in 0..rows_pad {
        let dst = &mut qh[r * dp..(r + 1) * dp];
        if r < rows {
            let at = span.q_at(p, i0, r);
            dst[..d].copy_from_slice(&q[at..at + d]);
            dst[d..].fill(0);
        } else {
            dst.fill(0);
        }
    }
    // Padding that the packing passes never write: Kᵀ rows past the head dimension, V columns
    // past the value heads', P rows past the live rows.
    kt[d / 2 * bcp..].fill(0);
    for row in vv.chunks_exact_mut(dp) {
        row[dv..].fill(0);
    }
    pm[rows * bcp..].fill(0);
    o.fill(0.0);
    mx.fill(f32::NEG_INFINITY);
    sum.fill(0.0);

    let (kv_stride, v_stride) = (p.kv_heads * d, p.kv_heads * dv);
    let (kv_base, v_base) = (span.kv_base(p), span.v_base(p));
    let off = causal_offset(p);
    let kv_end = kv_end(p, i1);
    let qscale = p.scale.get() * std::f32::consts::LOG2_E;
    // The host's best vector build of the cap (the portable one where it lacks AVX-512).
    let softcap = super::table::table(c.isa).softcap;
    let alibi = super::table::table(c.isa).alibi_row;
    // SAFETY (whole block): the tiles' operands are the padded buffers above, every product
    // within their blocks; the caller's contract on T.
    unsafe {
        tiles.start();
        for j0 in (p.first_key(i0)..kv_end).step_by(c.bc) {
            let w = c.bc.min(kv_end - j0);
            let wp = w.next_multiple_of(BLOCK);
            (passes.pack_kt)(
                k.as_ptr().add(kv_base + j0 * kv_stride).cast(),
                2 * kv_stride,
                d / 2,
                w,
                bcp,
                kt.as_mut_ptr(),
            );
            // S = Q·Kᵀ, [live rows][wp].
            for r0 in (0..live_rows).step_by(BLOCK) {
                for j in (0..wp).step_by(BLOCK) {
                    tiles.product(
                        dp / BLOCK,
                        qp.as_ptr().add(r0 * dp / 2),
                        dp / 2,
                        kt.as_ptr().add(j),
                        bcp,
                        s.as_mut_ptr().add(r0 * bcp + j),
                        bcp,
                        false,
                    );
                }
            }
            // Soft-capped scores, in their units here (unscaled): C / scale.
            if let Some(cap) = p.softcap {
                let unit = cap.get() / p.scale.get();
                for r in 0..rows {
                    softcap(&mut s[r * bcp..r * bcp + w], unit);
                }
            }
            // ALiBi's bias, in the same units (`slope / scale` a key).
            if p.alibi {
                for r in 0..rows {
                    let (slope, pos) = span
                        .alibi(p, heads.slopes, i0, r)
                        .expect("validated: a slope per query head");
                    let row = &mut s[r * bcp..r * bcp + w];
                    alibi(row, slope / qscale, j0 as f32 - pos);
                }
            }
            (passes.softmax)(&mut Rows {
                s,
                pm,
                o,
                mx,
                sum,
                rows,
                bcp,
                dp,
                w,
                wp,
                qscale,
                // Position i0 + t sees keys up to i0 + t + off.
                first_pos_keys: (i0 + off + 1) as isize - j0 as isize,
                // Position i0 + t's window starts at key i0 + t + off + 1 − window.
                first_pos_passed: p
                    .window
                    .map(|w| (i0 + off + 1) as isize - w as isize - j0 as isize),
                rows_per_pos: span.rows_per_pos,
                causal: p.causal,
            });
            (passes.pack_v)(
                v,
                v_base + j0 * v_stride,
                v_stride,
                w,
                dv,
                dp,
                &mut vv[..wp / 2 * dp],
            );
            // O += P·V, [live rows][dp], over the blocks of columns holding values (narrow
            // value heads leave the rest zero).
            for r0 in (0..live_rows).step_by(BLOCK) {
                for x in (0..dv.next_multiple_of(BLOCK)).step_by(BLOCK) {
                    tiles.product(
                        wp / BLOCK,
                        pm.as_ptr().cast::<u32>().add(r0 * bcp / 2),
                        bcp / 2,
                        vv.as_ptr().add(x),
                        dp,
                        o.as_mut_ptr().add(r0 * dp + x),
                        dp,
                        true,
                    );
                }
            }
        }
        tiles.finish();
    }

    for r in 0..rows {
        let dst = span.out_at(p, i0, r);
        let inv = 1.0 / (sum[r] + span.sink_weight(heads.sinks, r, mx[r]));
        for (x, &acc) in o[r * dp..r * dp + dv].iter().enumerate() {
            // SAFETY: the caller's contract: this row of out belongs to this task.
            unsafe { *out.add(dst + x) = acc * inv };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FlashSplit;
    use crate::cpu::amx_tiles::Model;
    use crate::data::ProblemData;
    use crate::{Isa, Problem, TensorBuf};

    /// The kernel on the software model of the tiles and, where the host has AVX-512-BF16, on
    /// `vdpbf16ps`, against the f64 reference: head
    /// dimensions below, at and past a block, GQA 1, 8 and 64, one query, more queries than
    /// keys, causal with fewer queries than keys, key tiles shorter than query tiles (rows
    /// that start seeing keys mid-tile), tiles shorter than a block, both splits, one and two
    /// threads, every build of the passes the host runs (`vdpbf16ps` with its best); sliding
    /// windows of 1, 5 and 40 keys
    /// (rows whose window has passed keys mid-tile, tiles some rows see nothing of); sinks,
    /// on grouped heads and within a window; a soft-cap; value heads narrower than the keys
    /// (latent attention's 192 and 128, and 80 and 47: an odd width, short of a block);
    /// ALiBi, grouped, chunked (queries after cached keys) and capped within a window.
    #[test]
    fn flash_matches_the_reference_on_the_tile_model_and_dpbf16() {
        let builds = Level::supported();
        // Where the host lacks AVX-512-BF16 the second engine is not run, and the count at
        // the end says so.
        let dpbf16 = cfg!(target_arch = "x86_64") && Level::best() == Level::Avx512Bf16;
        let mut ran = 0;
        for spec in [
            "flash:batch=2,q_len=37,kv_len=37,q_heads=2,kv_heads=2,head_dim=64,causal=true",
            "flash:batch=1,q_len=19,kv_len=70,q_heads=8,kv_heads=2,head_dim=64,causal=true,alibi=true",
            "flash:batch=2,q_len=37,kv_len=37,q_heads=4,kv_heads=2,head_dim=64,causal=true,window=9,softcap=0.5,alibi=true",
            "flash:batch=1,q_len=19,kv_len=70,q_heads=8,kv_heads=1,head_dim=128,causal=true,sinks=true",
            "flash:batch=1,q_len=1,kv_len=29,q_heads=64,kv_heads=1,head_dim=64,causal=true",
            "flash:batch=1,q_len=23,kv_len=23,q_heads=8,kv_heads=8,head_dim=80,causal=false",
            "flash:batch=1,q_len=70,kv_len=9,q_heads=4,kv_heads=2,head_dim=64,causal=false",
            "flash:batch=1,q_len=9,kv_len=40,q_heads=2,kv_heads=1,head_dim=2,causal=true",
            "flash:batch=2,q_len=37,kv_len=37,q_heads=2,kv_heads=2,head_dim=64,causal=true,window=5,softcap=0.5",
            "flash:batch=1,q_len=19,kv_len=70,q_heads=8,kv_heads=1,head_dim=128,causal=true,window=40,sinks=true",
            "flash:batch=1,q_len=70,kv_len=100,q_heads=4,kv_heads=2,head_dim=64,causal=true,window=1",
            "flash:batch=1,q_len=40,kv_len=70,q_heads=4,kv_heads=4,head_dim=192,v_head_dim=128,causal=true,scale=0.1352",
            "flash:batch=2,q_len=23,kv_len=23,q_heads=4,kv_heads=2,head_dim=80,v_head_dim=47,causal=true,window=9,sinks=true",
        ] {
            let problem: Problem = format!("{spec},dtype=bf16").parse().unwrap();
            let Problem::Flash(p) = problem else {
                unreachable!("{spec} is flash attention")
            };
            let mut data = ProblemData::random(&problem, 3);
            let reference = data.reference();
            let [TensorBuf::Bf16(q), TensorBuf::Bf16(k), TensorBuf::Bf16(v)] = &data.inputs[..]
            else {
                unreachable!("bf16 problems have bf16 inputs")
            };
            let (q, k, v) = (q.to_vec(), k.to_vec(), v.to_vec());
            for (br, bc) in [(1, 16), (7, 32), (32, 64), (64, 32)] {
                for group_heads in [false, true] {
                    for (split, threads) in [(FlashSplit::Heads, 1), (FlashSplit::Blocks, 2)] {
                        let c = FlashConfig {
                            isa: Isa::Avx512Amx,
                            br,
                            bc,
                            group_heads,
                            split,
                            threads,
                            amx: true,
                            dpbf16: false,
                        };
                        let engines = builds
                            .iter()
                            .map(|&level| (level, false))
                            .chain(dpbf16.then_some((Level::best(), true)));
                        for (level, on_dpbf16) in engines {
                            let mut scratch = vec![0f32; scratch_len(&p, &c) + 16];
                            let mut out = std::mem::take(&mut data.out);
                            out.fill(f32::NAN);
                            let heads = data.heads();
                            let passes = passes(level);
                            if on_dpbf16 {
                                #[cfg(target_arch = "x86_64")]
                                run_on::<Dpbf16>(
                                    &p, &c, &q, &k, &v, heads, &mut out, &mut scratch, passes,
                                );
                            } else {
                                run_on::<Model>(
                                    &p, &c, &q, &k, &v, heads, &mut out, &mut scratch, passes,
                                );
                            }
                            data.out = out;
                            let err = crate::reference::relative_error(&data.out, &reference);
                            let engine = if on_dpbf16 { "vdpbf16ps" } else { "tile model" };
                            assert!(
                                err <= problem.tolerance(),
                                "{problem} with {c:?} ({engine}, {level:?} passes): relative \
                                 error {err:e}"
                            );
                            ran += 1;
                        }
                    }
                }
            }
        }
        let engines = builds.len() + usize::from(dpbf16);
        assert_eq!(ran, 13 * 4 * 2 * 2 * engines);
        if !dpbf16 {
            eprintln!(
                "the vdpbf16ps engine did not run: this host lacks AVX-512-BF16 (the tile \
                 model ran every case)"
            );
        }
    }
}
