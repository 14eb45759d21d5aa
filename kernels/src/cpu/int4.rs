//! Int4 weights (W4A16: GPTQ's, AWQ's and compressed-tensors' 4-bit checkpoints) on the CPU:
//! the stream variant's scheme, B read once in place, each word's eight values widened in
//! registers as they are multiplied.
//!
//! A is widened to f32 once (it is small beside B at decode, and read once a row group at
//! prompts), with each row's sum over each group of k, which the zero points multiply. Tasks
//! own chunks of `nc` columns; in a chunk, each group of `mr` rows streams every strip of
//! [`INT4_VECTORS`] vectors of columns down all of k ([`super::leaf::stream_int4`]).
//!
//! Prompts amortize a pass that dequantizes the weights to the dtype instead
//! ([`dequantize`]), after which the dense problem's kernels run: widening each word once a
//! row group costs the stream kernel more than the pass costs from a few tokens. The kernels
//! that read B in place as a Linear layer stores it (`direct`, `amx-direct`) take the weights
//! as `[N, K]` ([`dequantize_nk`]), the others as the words hold them, `[K, N]`.

use super::leaf::Int4Strip;
use super::parallel::{for_each_task, SharedMut};
use super::table::{table, Int4Cols, Table, TableElem, INT4_COLS, INT4_VECTORS, STREAM_ROWS};
use crate::config::GemmConfig;
use crate::kernel::GemmScales;
use crate::problem::GemmProblem;
use half::{bf16, f16, slice::HalfFloatSliceExt};

/// Scratch (f32 values): A widened, and its sums per row and group.
pub fn scratch_len(p: &GemmProblem) -> usize {
    let group = p.int4.unwrap_or(p.k).max(1);
    p.m * p.k + p.m * (p.k / group)
}

/// Each row of `a` (rows of `k`) summed over each group of k, `k / group` sums a row: what
/// the zero points multiply.
pub(super) fn group_sums<T: Copy>(
    a: &[T],
    k: usize,
    group: usize,
    sums: &mut [f32],
    value: impl Fn(T) -> f32,
) {
    for (row, sums) in a.chunks_exact(k).zip(sums.chunks_exact_mut(k / group)) {
        for (g, s) in row.chunks_exact(group).zip(sums) {
            *s = g.iter().map(|&v| value(v)).sum();
        }
    }
}

/// Runs a validated config of an int4 problem; buffers and scratch were checked by the caller.
pub fn run<T: TableElem>(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[T],
    words: &[u32],
    scales: GemmScales<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let group = p.int4.expect("an int4 problem");
    let (m, n, k) = (p.m, p.n, p.k);
    let groups = k / group;
    let t = table(c.isa);
    let (a32, rest) = scratch.split_at_mut(m * k);
    // SAFETY: both hold m·k values.
    unsafe { (T::fns(t).widen)(a.as_ptr(), a32.as_mut_ptr(), m * k, 1.0) };
    let asum = &mut rest[..m * groups];
    group_sums(a32, k, group, asum, |v| v);
    let (a32, asum): (&[f32], &[f32]) = (a32, asum);
    let strip = INT4_VECTORS * t.lanes;
    let chunk = c.nc.next_multiple_of(strip);
    let tasks = n.div_ceil(chunk);
    let out = SharedMut(out.as_mut_ptr());
    for_each_task(c.threads, tasks, |task, _| {
        let (c0, c1) = (task * chunk, ((task + 1) * chunk).min(n));
        for (i0, r) in super::gemm::row_groups(m, c.mr) {
            let f = t.stream_int4[STREAM_ROWS.iter().position(|&x| x == r).unwrap()];
            for j0 in (c0..c1).step_by(strip) {
                // SAFETY: rows i0..i0 + r of A, its sums and C, and columns j0..j0 + width
                // of the words, scales, zero points and C exist; tasks write disjoint columns.
                unsafe {
                    f(Int4Strip {
                        k,
                        group,
                        a: a32.as_ptr().add(i0 * k),
                        lda: k,
                        asum: asum.as_ptr().add(i0 * groups),
                        lds: groups,
                        words: words.as_ptr().add(j0),
                        n,
                        scales: scales.b.as_ptr().add(j0),
                        zeros: match scales.zeros {
                            [] => std::ptr::null(),
                            zeros => zeros.as_ptr().add(j0),
                        },
                        width: strip.min(c1 - j0),
                        c: out.get().add(i0 * n + j0),
                        ldc: n,
                    })
                };
            }
        }
    });
}

/// Element types the weights are dequantized to.
pub trait Dequant: TableElem + bytemuck::Pod {
    /// `src` rounded to nearest into `dst`.
    fn from_row(t: &Table, src: &[f32], dst: &mut [Self]);
}

impl Dequant for f32 {
    fn from_row(_: &Table, src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl Dequant for bf16 {
    fn from_row(t: &Table, src: &[f32], dst: &mut [bf16]) {
        (t.round_bf16)(src, dst);
    }
}

impl Dequant for f16 {
    /// By F16C where the host has it (the `half` crate detects it).
    fn from_row(_: &Table, src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
}

/// Weights the `[N, K]` pass writes: the element types of the kernels that read B in place.
pub trait DequantCols: bytemuck::Pod {
    fn cols(t: &Table) -> fn(&Int4Cols<'_>, &mut [Self]);
}

impl DequantCols for f32 {
    fn cols(t: &Table) -> fn(&Int4Cols<'_>, &mut [f32]) {
        t.dequant_cols_f32
    }
}

impl DequantCols for bf16 {
    fn cols(t: &Table) -> fn(&Int4Cols<'_>, &mut [bf16]) {
        t.dequant_cols_bf16
    }
}

/// Scratch (f32 values) of the dequantizing pass, before the dense kernel's: the weights as
/// `T`, `[K, N]`, and a row of `N` f32 values for each thread, each part on whole cache lines.
pub fn dequantize_scratch_len(p: &GemmProblem, threads: usize) -> usize {
    let line = super::parallel::LINE_WORDS;
    let weights = (p.k * p.n * p.dtype.size())
        .div_ceil(4)
        .next_multiple_of(line);
    weights + (threads * p.n).next_multiple_of(line)
}

/// The pass's scratch as [`dequantize_scratch_len`] lays it out: the weights as `T` (`k · n`),
/// a row of `n` f32 values for each of `threads` threads, then the rest, for the dense kernel.
fn pass_scratch<'s, T: bytemuck::Pod>(
    p: &GemmProblem,
    threads: usize,
    scratch: &'s mut [f32],
) -> (&'s mut [T], &'s mut [f32], &'s mut [f32]) {
    let (n, k) = (p.n, p.k);
    let line = super::parallel::LINE_WORDS;
    let (weights, rest) = scratch.split_at_mut(
        (k * n * std::mem::size_of::<T>())
            .div_ceil(4)
            .next_multiple_of(line),
    );
    let (rows, rest) = rest.split_at_mut((threads * n).next_multiple_of(line));
    (&mut bytemuck::cast_slice_mut(weights)[..k * n], rows, rest)
}

/// Writes an int4 problem's weights as `T` (`[K, N]`: `(q − z) · s` rounded once) into the
/// front of `scratch` and returns them, on `threads` threads; the rest of `scratch` after
/// [`dequantize_scratch_len`] is left for the dense kernel. `c` is the dense kernel's config,
/// whose ISA level and threads the pass takes.
pub fn dequantize<'s, T: Dequant>(
    p: &GemmProblem,
    c: &GemmConfig,
    words: &[u32],
    scales: GemmScales<'_>,
    scratch: &'s mut [f32],
) -> (&'s [T], &'s mut [f32]) {
    let (t, threads) = (table(c.isa), c.threads);
    let group = p.int4.expect("an int4 problem");
    let (n, k) = (p.n, p.k);
    let (weights, rows, rest) = pass_scratch::<T>(p, threads, scratch);
    let (dst, rows) = (
        SharedMut(weights.as_mut_ptr()),
        SharedMut(rows.as_mut_ptr()),
    );
    for_each_task(threads, k / 8, |r, worker| {
        // SAFETY: workers run one task at a time, so their rows are disjoint; task `r` writes
        // rows 8r..8r + 8 of the weights alone.
        let (row, out) = unsafe {
            (
                std::slice::from_raw_parts_mut(rows.get().add(worker * n), n),
                std::slice::from_raw_parts_mut(dst.get().add(8 * r * n), 8 * n),
            )
        };
        let g = 8 * r / group;
        let words = &words[r * n..][..n];
        let s = &scales.b[g * n..][..n];
        let z = match scales.zeros {
            [] => &[][..],
            zeros => &zeros[g * n..][..n],
        };
        for (i, out) in out.chunks_exact_mut(n).enumerate() {
            (t.dequant_row)(words, 4 * i as u32, s, z, row);
            T::from_row(t, row, out);
        }
    });
    (weights, rest)
}

/// [`dequantize`], the weights written `[N, K]` (a row of k a column), for the kernels that
/// read B in place: same scratch, same rounding.
pub fn dequantize_nk<'s, T: DequantCols>(
    p: &GemmProblem,
    c: &GemmConfig,
    words: &[u32],
    scales: GemmScales<'_>,
    scratch: &'s mut [f32],
) -> (&'s [T], &'s mut [f32]) {
    let (t, threads) = (table(c.isa), c.threads);
    let group = p.int4.expect("an int4 problem");
    let (n, k) = (p.n, p.k);
    // The rows [`dequantize`] widens into go unused: the dense kernel's scratch follows where
    // [`dequantize_scratch_len`] puts it.
    let (weights, _, rest) = pass_scratch::<T>(p, threads, scratch);
    let dst = SharedMut(weights.as_mut_ptr());
    let block = Int4Cols {
        words,
        scales: scales.b,
        zeros: scales.zeros,
        n,
        k,
        group,
        first: 0,
    };
    for_each_task(threads, n.div_ceil(INT4_COLS), |b, _| {
        let first = b * INT4_COLS;
        let cols = INT4_COLS.min(n - first);
        // SAFETY: task `b` writes the rows of its own columns alone.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.get().add(first * k), cols * k) };
        (T::cols(t))(&Int4Cols { first, ..block }, out);
    });
    (weights, rest)
}
