//! Per-ISA dispatch tables: the leaf kernels of [`super::leaf`] compiled for each SIMD level,
//! chosen once per call from the config's ISA (the pattern rav1e uses for its assembly).

use half::{bf16, f16};

use super::leaf;
use super::simd::{E4m3Bits, E5m2Bits, Elem, Portable, Simd};
use crate::device::Isa;

/// A register-blocked microkernel, see [`leaf::ukr`].
pub type UkrFn = unsafe fn(
    usize,
    *const f32,
    usize,
    usize,
    *const f32,
    usize,
    *mut f32,
    usize,
    usize,
    usize,
    bool,
);

pub type StreamFn<T> = unsafe fn(usize, *const f32, usize, *const T, usize, usize, *mut f32, usize);
/// [`StreamFn`] with the config's `prefetch` last.
pub type StreamNkFn<T> =
    unsafe fn(usize, *const f32, usize, *const T, usize, usize, *mut f32, usize, bool);
pub type DotFn<T> = unsafe fn(*const f32, *const T, usize) -> f32;
pub type AxpyFn<T> = unsafe fn(*mut f32, f32, *const T, usize);
pub type WidenFn<T> = unsafe fn(*const T, *mut f32, usize, f32);
/// See [`leaf::softmax_cols`].
pub type SoftmaxColsFn = fn(
    &mut [f32],
    usize,
    usize,
    usize,
    &mut [f32],
    &mut [f32],
    &mut [f32],
    &mut [f32],
    usize,
    usize,
);

/// Row counts the decode-shaped GEMM kernels come in.
pub const STREAM_ROWS: [usize; 3] = [1, 2, 4];
/// Vectors per strip of the `[K, N]` decode kernel.
pub const STREAM_KN_VECTORS: usize = 4;
/// Vectors per strip of the int4 kernel: its rows hold a group's sums beside the running
/// ones, two registers a vector, so four rows of four vectors would not fit in 32.
pub const INT4_VECTORS: usize = 2;

/// See [`leaf::stream_int4`].
pub type Int4Fn = unsafe fn(leaf::Int4Strip);
/// See [`Table::dequant_row`]: words, shift, scales, zero points (or none), the row.
pub type DequantRowFn = fn(&[u32], u32, &[f32], &[f32], &mut [f32]);

/// Columns of a block [`Table::dequant_cols_f32`] and [`Table::dequant_cols_bf16`] take at
/// most: each row of words read is a few cache lines of theirs, and each of their rows of k
/// is written in order.
pub const INT4_COLS: usize = 64;

/// Words down k a column of a block takes in turn: two cache lines of its bf16 row.
const INT4_ROWS: usize = 16;

/// A block of an int4 problem's columns, whose weights [`Table::dequant_cols_f32`] and
/// [`Table::dequant_cols_bf16`] write as rows of `k` (the `[N, K]` a Linear layer stores).
#[derive(Debug, Clone, Copy)]
pub struct Int4Cols<'a> {
    /// The problem's words, `[k / 8, n]`, its scales and zero points (or none: 8), `[k /
    /// group, n]`.
    pub words: &'a [u32],
    pub scales: &'a [f32],
    pub zeros: &'a [f32],
    pub n: usize,
    pub k: usize,
    pub group: usize,
    /// The block: columns `first..first + out.len() / k`.
    pub first: usize,
}

/// The leaf kernels of one input element type.
#[derive(Debug)]
pub struct ElemFns<T: 'static> {
    /// Indexed like [`STREAM_ROWS`].
    pub stream_nk: [StreamNkFn<T>; 3],
    pub stream_kn: [StreamFn<T>; 3],
    pub dot: DotFn<T>,
    pub axpy: AxpyFn<T>,
    pub widen: WidenFn<T>,
}

/// Everything one ISA level offers.
#[derive(Debug)]
pub struct Table {
    pub lanes: usize,
    /// Microkernel shapes as (MR, NR) in elements.
    pub shapes: &'static [(usize, usize)],
    ukr: fn(usize, usize, bool) -> Option<UkrFn>,
    pub row_max: fn(&[f32]) -> f32,
    pub exp2_sum: fn(&mut [f32], f32) -> f32,
    /// Soft-caps scores held in units where the cap is the second argument.
    pub softcap: fn(&mut [f32], f32),
    /// ALiBi along a row of one head's scores: score `i` gains `slope · (first + i)`.
    pub alibi_row: fn(&mut [f32], f32, f32),
    /// ALiBi down a column of one key's scores, a row each: score `r` gains
    /// `slopes[r] · (key − positions[r])`.
    pub alibi_col: fn(&mut [f32], &[f32], &[f32], f32),
    pub softmax_cols: SoftmaxColsFn,
    pub f32: ElemFns<f32>,
    pub bf16: ElemFns<bf16>,
    pub f16: ElemFns<f16>,
    /// fp8 bytes, read as f16 bits: a KV cache's and an fp8 GEMM's.
    pub e4m3: ElemFns<E4m3Bits>,
    pub e5m2: ElemFns<E5m2Bits>,
    /// Int4 weights, indexed like [`STREAM_ROWS`].
    pub stream_int4: [Int4Fn; 3],
    /// One row of int4 weights dequantized: value `shift / 4` of each word, less its zero
    /// point (8 where none are given), times its scale.
    pub dequant_row: DequantRowFn,
    /// f32 values rounded to bf16, to nearest (ties to even); the values are finite.
    pub round_bf16: fn(&[f32], &mut [bf16]),
    /// A block of int4 columns dequantized as rows of k: f32, and rounded to bf16.
    pub dequant_cols_f32: fn(&Int4Cols<'_>, &mut [f32]),
    pub dequant_cols_bf16: fn(&Int4Cols<'_>, &mut [bf16]),
}

impl Table {
    /// The microkernel for an (MR, NR) shape with A at any strides, if this level has one.
    pub fn ukr(&self, mr: usize, nr: usize) -> Option<UkrFn> {
        nr.is_multiple_of(self.lanes)
            .then(|| (self.ukr)(mr, nr / self.lanes, false))?
    }

    /// The same microkernel specialised for A packed in `[k][MR]` slivers.
    pub fn ukr_packed(&self, mr: usize, nr: usize) -> Option<UkrFn> {
        nr.is_multiple_of(self.lanes)
            .then(|| (self.ukr)(mr, nr / self.lanes, true))?
    }
}

/// Picks the [`ElemFns`] of an element type out of a table.
pub trait TableElem: Elem {
    fn fns(t: &Table) -> &ElemFns<Self>;
}
impl TableElem for f32 {
    fn fns(t: &Table) -> &ElemFns<f32> {
        &t.f32
    }
}
impl TableElem for bf16 {
    fn fns(t: &Table) -> &ElemFns<bf16> {
        &t.bf16
    }
}
impl TableElem for f16 {
    fn fns(t: &Table) -> &ElemFns<f16> {
        &t.f16
    }
}
impl TableElem for E4m3Bits {
    fn fns(t: &Table) -> &ElemFns<E4m3Bits> {
        &t.e4m3
    }
}
impl TableElem for E5m2Bits {
    fn fns(t: &Table) -> &ElemFns<E5m2Bits> {
        &t.e5m2
    }
}

/// Picks the products with cached rows of a KV-cache element type out of a table.
pub trait CacheElem: Elem {
    fn dot(t: &Table) -> DotFn<Self>;
    fn axpy(t: &Table) -> AxpyFn<Self>;
}
impl<T: TableElem> CacheElem for T {
    fn dot(t: &Table) -> DotFn<T> {
        T::fns(t).dot
    }
    fn axpy(t: &Table) -> AxpyFn<T> {
        T::fns(t).axpy
    }
}

/// Instantiates every leaf kernel for one SIMD type inside functions carrying its target
/// features, and gathers them into a `static TABLE`.
macro_rules! isa_table {
    ($module:ident, $simd:ty, [$(($mr:literal, $nv:literal)),*] $(, $feature:literal)?) => {
        mod $module {
            use super::*;
            type S = $simd;

            $(#[target_feature(enable = $feature)])?
            #[allow(clippy::too_many_arguments)]
            unsafe fn ukr<const MR: usize, const NV: usize>(
                k: usize, a: *const f32, rsa: usize, csa: usize, b: *const f32, ldb: usize,
                c: *mut f32, ldc: usize, mr: usize, nr: usize, acc: bool,
            ) {
                // SAFETY: forwarded caller contract; the table is only reachable when the host
                // supports this ISA.
                unsafe { leaf::ukr::<S, MR, NV>(k, a, rsa, csa, b, ldb, c, ldc, mr, nr, acc) }
            }

            /// Packed A (`rsa = 1`, `csa = MR`) as constants, so each row's broadcast is a fixed
            /// offset instead of a chain of pointer additions.
            $(#[target_feature(enable = $feature)])?
            #[allow(clippy::too_many_arguments)]
            unsafe fn ukr_packed<const MR: usize, const NV: usize>(
                k: usize, a: *const f32, _rsa: usize, _csa: usize, b: *const f32, ldb: usize,
                c: *mut f32, ldc: usize, mr: usize, nr: usize, acc: bool,
            ) {
                // SAFETY: as `ukr`.
                unsafe { leaf::ukr::<S, MR, NV>(k, a, 1, MR, b, ldb, c, ldc, mr, nr, acc) }
            }

            fn pick(mr: usize, nv: usize, packed: bool) -> Option<UkrFn> {
                match (mr, nv, packed) {
                    $(($mr, $nv, false) => Some(ukr::<$mr, $nv> as UkrFn),)*
                    $(($mr, $nv, true) => Some(ukr_packed::<$mr, $nv> as UkrFn),)*
                    _ => None,
                }
            }

            $(#[target_feature(enable = $feature)])?
            #[allow(clippy::too_many_arguments)]
            unsafe fn stream_nk<T: Elem, const R: usize>(
                k: usize, a: *const f32, lda: usize, b: *const T, ldb: usize, cols: usize,
                c: *mut f32, ldc: usize, prefetch: bool,
            ) {
                // SAFETY: forwarded caller contract.
                unsafe { leaf::stream_nk::<S, T, R>(k, a, lda, b, ldb, cols, c, ldc, prefetch) }
            }

            $(#[target_feature(enable = $feature)])?
            #[allow(clippy::too_many_arguments)]
            unsafe fn stream_kn<T: Elem, const R: usize>(
                k: usize, a: *const f32, lda: usize, b: *const T, ldb: usize, width: usize,
                c: *mut f32, ldc: usize,
            ) {
                // SAFETY: forwarded caller contract.
                unsafe {
                    leaf::stream_kn::<S, T, R, STREAM_KN_VECTORS>(k, a, lda, b, ldb, width, c, ldc)
                }
            }

            $(#[target_feature(enable = $feature)])?
            unsafe fn stream_int4<const R: usize>(strip: leaf::Int4Strip) {
                // SAFETY: forwarded caller contract.
                unsafe { leaf::stream_int4::<S, R, INT4_VECTORS>(strip) }
            }

            $(#[target_feature(enable = $feature)])?
            unsafe fn dot<T: Elem>(x: *const f32, y: *const T, n: usize) -> f32 {
                // SAFETY: forwarded caller contract.
                unsafe { leaf::dot::<S, T>(x, y, n) }
            }

            $(#[target_feature(enable = $feature)])?
            unsafe fn axpy<T: Elem>(out: *mut f32, alpha: f32, x: *const T, n: usize) {
                // SAFETY: forwarded caller contract.
                unsafe { leaf::axpy::<S, T>(out, alpha, x, n) }
            }

            $(#[target_feature(enable = $feature)])?
            unsafe fn widen<T: Elem>(src: *const T, dst: *mut f32, n: usize, scale: f32) {
                // SAFETY: forwarded caller contract.
                unsafe { leaf::widen::<S, T>(src, dst, n, scale) }
            }

            $(#[target_feature(enable = $feature)])?
            unsafe fn row_max_tf(row: &[f32]) -> f32 {
                leaf::row_max::<S>(row)
            }

            $(#[target_feature(enable = $feature)])?
            unsafe fn exp2_sum_tf(row: &mut [f32], sub: f32) -> f32 {
                leaf::exp2_sum(row, sub)
            }

            // Built at this level's vector width: the tanh is most of a capped kernel's work
            // beside its products, and at the baseline's four lanes, half its time.
            $(#[target_feature(enable = $feature)])?
            unsafe fn softcap_tf(scores: &mut [f32], unit: f32) {
                for s in scores {
                    *s = crate::SoftCap::apply(unit, *s);
                }
            }

            fn softcap(scores: &mut [f32], unit: f32) {
                // SAFETY: the table is only reachable when the host supports this ISA.
                unsafe { softcap_tf(scores, unit) }
            }

            // ALiBi's bias, likewise at this level's width: at the baseline's four lanes (and
            // a 64-bit index turned into a float a score) it took as long as AMX's products
            // of a flash tile. Distances are whole numbers below 2^24, exact in f32.
            $(#[target_feature(enable = $feature)])?
            unsafe fn alibi_row_tf(scores: &mut [f32], slope: f32, first: f32) {
                for (i, s) in scores.iter_mut().enumerate() {
                    *s += slope * (first + i as i32 as f32);
                }
            }

            fn alibi_row(scores: &mut [f32], slope: f32, first: f32) {
                // SAFETY: the table is only reachable when the host supports this ISA.
                unsafe { alibi_row_tf(scores, slope, first) }
            }

            $(#[target_feature(enable = $feature)])?
            unsafe fn alibi_col_tf(scores: &mut [f32], slopes: &[f32], positions: &[f32], key: f32) {
                for ((s, &m), &at) in scores.iter_mut().zip(slopes).zip(positions) {
                    *s += m * (key - at);
                }
            }

            fn alibi_col(scores: &mut [f32], slopes: &[f32], positions: &[f32], key: f32) {
                // SAFETY: the table is only reachable when the host supports this ISA.
                unsafe { alibi_col_tf(scores, slopes, positions, key) }
            }

            $(#[target_feature(enable = $feature)])?
            #[allow(clippy::too_many_arguments)]
            unsafe fn softmax_cols_tf(
                s: &mut [f32], w: usize, rows: usize, ld: usize, mx: &mut [f32],
                sum: &mut [f32], tmp: &mut [f32], o: &mut [f32], ldo: usize, d: usize,
            ) {
                leaf::softmax_cols(s, w, rows, ld, mx, sum, tmp, o, ldo, d)
            }

            #[allow(clippy::too_many_arguments)]
            fn softmax_cols(
                s: &mut [f32], w: usize, rows: usize, ld: usize, mx: &mut [f32],
                sum: &mut [f32], tmp: &mut [f32], o: &mut [f32], ldo: usize, d: usize,
            ) {
                // SAFETY: the table is only reachable when the host supports this ISA.
                unsafe { softmax_cols_tf(s, w, rows, ld, mx, sum, tmp, o, ldo, d) }
            }

            // Plain loops the compiler vectorizes at this level's width: int4 weights
            // dequantized for the prompt kernels (at the baseline's four lanes, the pass took
            // 4.5 ms of Llama-70B TP8 qkv's 10.7 at 128 tokens on two Zen 4 threads).
            $(#[target_feature(enable = $feature)])?
            unsafe fn dequant_row_tf(
                words: &[u32], shift: u32, scales: &[f32], zeros: &[f32], row: &mut [f32],
            ) {
                match zeros {
                    [] => {
                        for ((v, &w), &s) in row.iter_mut().zip(words).zip(scales) {
                            *v = (((w >> shift) & 15) as f32 - 8.0) * s;
                        }
                    }
                    zeros => {
                        let values = row.iter_mut().zip(words).zip(scales).zip(zeros);
                        for (((v, &w), &s), &z) in values {
                            *v = (((w >> shift) & 15) as f32 - z) * s;
                        }
                    }
                }
            }

            fn dequant_row(
                words: &[u32], shift: u32, scales: &[f32], zeros: &[f32], row: &mut [f32],
            ) {
                // SAFETY: the table is only reachable when the host supports this ISA.
                unsafe { dequant_row_tf(words, shift, scales, zeros, row) }
            }

            $(#[target_feature(enable = $feature)])?
            unsafe fn round_bf16_tf(src: &[f32], dst: &mut [bf16]) {
                for (d, &v) in dst.iter_mut().zip(src) {
                    let u = v.to_bits();
                    let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16;
                    *d = bf16::from_bits(rounded as u16);
                }
            }

            fn round_bf16(src: &[f32], dst: &mut [bf16]) {
                // SAFETY: the table is only reachable when the host supports this ISA.
                unsafe { round_bf16_tf(src, dst) }
            }

            // A word's eight values at a time, as eight lanes the compiler vectorizes (a
            // variable shift each), each column's values of k stored together. Rows of k of
            // a block's columns lie `k` values apart, a multiple of 4 KiB in the LLMs' shapes,
            // which puts the lines being written of every column in one L1 set: each column
            // takes `INT4_ROWS` words down k (whole lines of its row) before the next.
            $(#[target_feature(enable = $feature)])?
            unsafe fn dequant_cols_tf<T: Copy>(
                b: &Int4Cols<'_>, out: &mut [T], store: impl Fn([f32; 8], &mut [T]),
            ) {
                let words_down = b.k / 8;
                for r0 in (0..words_down).step_by(INT4_ROWS) {
                    let r1 = (r0 + INT4_ROWS).min(words_down);
                    for (j, row) in out.chunks_exact_mut(b.k).enumerate() {
                        let col = b.first + j;
                        for r in r0..r1 {
                            let w = b.words[r * b.n + col];
                            let at = 8 * r / b.group * b.n + col;
                            let (s, z) = (b.scales[at], b.zeros.get(at).copied().unwrap_or(8.0));
                            let v: [f32; 8] =
                                std::array::from_fn(|i| (((w >> (4 * i)) & 15) as f32 - z) * s);
                            store(v, &mut row[8 * r..8 * r + 8]);
                        }
                    }
                }
            }

            fn dequant_cols_f32(b: &Int4Cols<'_>, out: &mut [f32]) {
                // SAFETY: the table is only reachable when the host supports this ISA.
                unsafe { dequant_cols_tf(b, out, |v, o| o.copy_from_slice(&v)) }
            }

            fn dequant_cols_bf16(b: &Int4Cols<'_>, out: &mut [bf16]) {
                let round = |v: [f32; 8], o: &mut [bf16]| {
                    for (d, x) in o.iter_mut().zip(v) {
                        let u = x.to_bits();
                        *d = bf16::from_bits((u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16);
                    }
                };
                // SAFETY: the table is only reachable when the host supports this ISA.
                unsafe { dequant_cols_tf(b, out, round) }
            }

            fn row_max(row: &[f32]) -> f32 {
                // SAFETY: the table is only reachable when the host supports this ISA.
                unsafe { row_max_tf(row) }
            }

            fn exp2_sum(row: &mut [f32], sub: f32) -> f32 {
                // SAFETY: the table is only reachable when the host supports this ISA.
                unsafe { exp2_sum_tf(row, sub) }
            }

            const fn elem_fns<T: Elem>() -> ElemFns<T> {
                ElemFns {
                    stream_nk: [stream_nk::<T, 1>, stream_nk::<T, 2>, stream_nk::<T, 4>],
                    stream_kn: [stream_kn::<T, 1>, stream_kn::<T, 2>, stream_kn::<T, 4>],
                    dot: dot::<T>,
                    axpy: axpy::<T>,
                    widen: widen::<T>,
                }
            }

            pub static TABLE: Table = Table {
                lanes: <S as Simd>::LANES,
                shapes: &[$(($mr, $nv * <S as Simd>::LANES)),*],
                ukr: pick,
                row_max,
                exp2_sum,
                softcap,
                alibi_row,
                alibi_col,
                softmax_cols,
                f32: elem_fns::<f32>(),
                bf16: elem_fns::<bf16>(),
                f16: elem_fns::<f16>(),
                e4m3: elem_fns::<E4m3Bits>(),
                e5m2: elem_fns::<E5m2Bits>(),
                stream_int4: [stream_int4::<1>, stream_int4::<2>, stream_int4::<4>],
                dequant_row,
                round_bf16,
                dequant_cols_f32,
                dequant_cols_bf16,
            };
        }
    };
}

isa_table!(portable, Portable, [(4, 1), (4, 2), (8, 1)]);

#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
isa_table!(
    avx2,
    Avx2,
    [(4, 2), (6, 2), (4, 3), (8, 1)],
    "avx2,fma,f16c"
);

#[cfg(target_arch = "x86_64")]
isa_table!(
    avx512,
    Avx512,
    [
        (4, 2),
        (6, 2),
        (8, 2),
        (12, 2),
        (14, 2),
        (4, 4),
        (6, 4),
        (8, 3)
    ],
    "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
);

#[cfg(target_arch = "aarch64")]
use super::simd::Neon;

// 32 vector registers of 4 lanes: up to 24 accumulators beside the B loads and a broadcast.
// The shapes include the portable table's (4 × 8, 4 × 16, 8 × 8), so configs stored on NEON
// hosts before this table keep their meaning.
#[cfg(target_arch = "aarch64")]
isa_table!(
    neon,
    Neon,
    [(4, 2), (4, 4), (6, 4), (8, 2), (8, 3), (12, 2)],
    "neon"
);

/// The table for an ISA level. Levels without kernels of their own use the nearest lower one:
/// AMX machines run the AVX-512 ones.
///
/// A level the host cannot run falls back to the portable table, so no path can execute an
/// instruction the CPU lacks; the space validation rejects such configs before they get here.
pub fn table(isa: Isa) -> &'static Table {
    if !isa.runs_on(crate::device::CpuInfo::detect().isa) {
        return &portable::TABLE;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Amx => &avx512::TABLE,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => &avx2::TABLE,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => &neon::TABLE,
        _ => &portable::TABLE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An AArch64 host runs its own NEON table, whose shapes keep the meaning of configs that
    /// NEON hosts stored when they ran the portable one.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_has_its_own_table_with_the_portable_shapes() {
        let neon = table(Isa::Neon);
        assert_eq!(crate::device::CpuInfo::detect().isa, Isa::Neon);
        assert!(!std::ptr::eq(neon, &portable::TABLE));
        assert_eq!(neon.lanes, Isa::Neon.f32_lanes());
        for shape in portable::TABLE.shapes {
            assert!(
                neon.shapes.contains(shape),
                "{shape:?} of {:?}",
                neon.shapes
            );
        }
    }

    /// Every level a host cannot run gets the portable table, whatever it asks for.
    #[test]
    fn levels_the_host_lacks_fall_back_to_portable() {
        let host = crate::device::CpuInfo::detect().isa;
        for isa in [Isa::Neon, Isa::Avx2Fma, Isa::Avx512, Isa::Avx512Amx] {
            if !isa.runs_on(host) {
                assert!(
                    std::ptr::eq(table(isa), &portable::TABLE),
                    "{isa} on {host}"
                );
            }
        }
    }
}
