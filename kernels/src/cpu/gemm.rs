//! GEMM on the CPU: the packed BLIS loop nest for compute-bound shapes and a streaming path for
//! decode shapes.
//!
//! Packed: for each `nc`-wide panel of B and `kc`-deep slice, B is packed into `nr`-wide slivers
//! (converted to f32 as it is packed), then each `mc`-tall block of A into `mr`-tall slivers, and
//! the microkernel sweeps the block. Threads own disjoint ranges of M or N (the `split`
//! parameter) and each packs what it reads, so threads never wait on each other.
//!
//! Stream: with 1 to 16 rows of A the work is reading B once at memory bandwidth; B is read in
//! place (no packing pass, which would read it twice) and widened in registers.
//!
//! Both run f32, f16, bf16 and fp8 inputs (fp8 bytes widened as the f16 of their bits, see
//! [`crate::Fp8::half_bits`]); an fp8 GEMM's factors and scales are applied to C after
//! ([`scale`]). Block-scaled fp8 ([`stream_blocks`]) streams too, its scales folded into the
//! widened tokens.

use super::parallel::{for_each_task, SharedMut};
use super::table::{table, TableElem, STREAM_KN_VECTORS, STREAM_ROWS};
use crate::config::{GemmConfig, GemmVariant, Inner, Split};
use crate::kernel::GemmScales;
use crate::problem::{BLayout, GemmProblem};

/// Scratch (f32 values) a GEMM call needs.
pub fn scratch_len(p: &GemmProblem, c: &GemmConfig) -> usize {
    match c.variant {
        GemmVariant::Packed => {
            let mc = c.mc.min(p.m.next_multiple_of(c.mr));
            let kc = c.kc.min(p.k);
            let nc = c.nc.min(p.n.next_multiple_of(c.nr));
            super::parallel::shares_len(c.threads, mc * kc + kc * nc)
        }
        // Block-scaled: each thread's rows of tokens times their scales too.
        GemmVariant::Stream if p.block.is_some() => {
            p.m * p.k + super::parallel::shares_len(c.threads, STREAM_ROWS[2] * p.k)
        }
        GemmVariant::Stream => p.m * p.k,
        GemmVariant::Dpbf16 => super::dpbf16::scratch_len(p, c),
        GemmVariant::StreamDpbf16 if p.fp8().is_some() => super::dpbf16_stream::fp8_scratch_len(p),
        GemmVariant::StreamDpbf16 => 0,
        GemmVariant::Amx => super::amx::scratch_len(p, c),
        GemmVariant::Direct => super::direct::scratch_len(p, c),
        GemmVariant::AmxDirect => super::amx_direct::scratch_len(p, c),
    }
}

/// Runs a validated config; buffers and scratch sizes were checked by the caller.
pub fn run<T: TableElem>(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[T],
    b: &[T],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    match c.variant {
        GemmVariant::Packed => packed(p, c, a, b, out, scratch),
        GemmVariant::Stream => stream(p, c, a, b, out, scratch),
        // Validation admits them for bf16 inputs only, which the backend sends to their modules.
        GemmVariant::Dpbf16 | GemmVariant::StreamDpbf16 | GemmVariant::Amx => {
            unreachable!("bf16-only configs run through cpu::dpbf16, dpbf16_stream and amx")
        }
        // Validation admits f32 and bf16 only, which the backend sends to cpu::direct and
        // amx_direct.
        GemmVariant::Direct | GemmVariant::AmxDirect => {
            unreachable!("direct configs run through cpu::direct and amx_direct")
        }
    }
}

fn packed<T: TableElem>(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[T],
    b: &[T],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let ukr = table(c.isa)
        .ukr_packed(c.mr, c.nr)
        .expect("validated configs have a microkernel");
    let (mr, nr) = (c.mr, c.nr);
    loop_nest(
        p,
        c,
        out,
        scratch,
        |kcur| kcur,
        |pc, kcur, jc, ncur, dst| pack_b(p, b, pc, kcur, jc, ncur, nr, c.isa, dst),
        |ic, mcur, pc, kcur, dst| pack_a(p, a, ic, mcur, pc, kcur, mr, c.isa, dst),
        // SAFETY: loop_nest's contract: zero-padded slivers `depth` deep, C inside the
        // thread's rows and columns.
        || (),
        |_, depth, ap, bp, cp, rows, cols, accumulate| unsafe {
            ukr(depth, ap, 1, mr, bp, nr, cp, p.n, rows, cols, accumulate)
        },
    );
}

/// The packed loop nest (BLIS order: nc panels of B, kc slices, mc blocks of A, then the
/// microkernel tiles in the config's `inner` order), shared by the f32, bf16-pair and AMX
/// kernels, which differ in what a packed word is (`W`), how deep a kc slice packs
/// (`depth`), and how they pack and multiply. Threads own disjoint rows or columns of C
/// (`split`) and pack what they read, so they never wait on each other.
///
/// `ukr(state, depth, a, b, c, rows, cols, accumulate)` gets slivers zero-padded to full `mr` /
/// `nr` and `depth` deep, and a C corner with `rows × cols` live values inside the thread's
/// share; `state` is what `task()` made for the task it runs in (the AMX kernel's configured
/// tiles), dropped when the task ends.
#[allow(clippy::too_many_arguments)]
pub(super) fn loop_nest<W: Copy, S>(
    p: &GemmProblem,
    c: &GemmConfig,
    out: &mut [f32],
    scratch: &mut [W],
    depth: impl Fn(usize) -> usize + Sync,
    pack_b: impl Fn(usize, usize, usize, usize, &mut [W]) + Sync,
    pack_a: impl Fn(usize, usize, usize, usize, &mut [W]) + Sync,
    task: impl Fn() -> S + Sync,
    ukr: impl Fn(&mut S, usize, *const W, *const W, *mut f32, usize, usize, bool) + Sync,
) {
    let (mr, nr) = (c.mr, c.nr);
    let (units, unit) = match c.split {
        Split::N => (p.n.div_ceil(nr), nr),
        Split::M => (p.m.div_ceil(mr), mr),
    };
    let chunks = c.threads.min(units).max(1);
    let per_thread = super::parallel::share_len(scratch.len(), c.threads);
    let scratch = SharedMut(scratch.as_mut_ptr());
    let out = SharedMut(out.as_mut_ptr());
    for_each_task(c.threads, chunks, |i, worker| {
        let lo = units * i / chunks * unit;
        let hi = (units * (i + 1) / chunks * unit).min(match c.split {
            Split::N => p.n,
            Split::M => p.m,
        });
        let (rows, cols) = match c.split {
            Split::N => (0..p.m, lo..hi),
            Split::M => (lo..hi, 0..p.n),
        };
        // SAFETY: workers of one pool run one task at a time, so `worker` slices are disjoint;
        // chunks cover disjoint rows or columns of C.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(scratch.get().add(worker * per_thread), per_thread)
        };
        let mc_max = c.mc.min(p.m.next_multiple_of(mr));
        // B's panel starts on a cache line too.
        let (ap_buf, bp_buf) = buf.split_at_mut(
            (mc_max * depth(c.kc.min(p.k))).next_multiple_of(super::parallel::LINE_WORDS),
        );
        let mut state = task();
        for jc in cols.clone().step_by(c.nc) {
            let ncur = c.nc.min(cols.end - jc);
            for pc in (0..p.k).step_by(c.kc) {
                let kcur = c.kc.min(p.k - pc);
                let d = depth(kcur);
                pack_b(pc, kcur, jc, ncur, bp_buf);
                for ic in rows.clone().step_by(c.mc) {
                    let mcur = c.mc.min(rows.end - ic);
                    pack_a(ic, mcur, pc, kcur, ap_buf);
                    let mut tile = |ir: usize, jr: usize| {
                        let ap = ap_buf[ir / mr * d * mr..].as_ptr();
                        let bp = bp_buf[jr / nr * d * nr..].as_ptr();
                        // SAFETY (for `ukr`'s contract): the C corner lies inside this
                        // thread's rows and columns.
                        let cp = unsafe { out.get().add((ic + ir) * p.n + jc + jr) };
                        let (rows, cols) = (mr.min(mcur - ir), nr.min(ncur - jr));
                        ukr(&mut state, d, ap, bp, cp, rows, cols, pc > 0);
                    };
                    match c.inner {
                        Inner::M => {
                            for jr in (0..ncur).step_by(nr) {
                                for ir in (0..mcur).step_by(mr) {
                                    tile(ir, jr);
                                }
                            }
                        }
                        Inner::N => {
                            for ir in (0..mcur).step_by(mr) {
                                for jr in (0..ncur).step_by(nr) {
                                    tile(ir, jr);
                                }
                            }
                        }
                    }
                }
            }
        }
    });
}

/// Packs `mcur` rows × `kcur` columns of A into `mr`-row slivers, `[kcur][mr]` each.
#[allow(clippy::too_many_arguments)]
pub(super) fn pack_a<T: TableElem + 'static>(
    p: &GemmProblem,
    a: &[T],
    ic: usize,
    mcur: usize,
    pc: usize,
    kcur: usize,
    mr: usize,
    isa: crate::Isa,
    dst: &mut [f32],
) {
    for (s, sliver) in dst[..mcur.next_multiple_of(mr) * kcur]
        .chunks_exact_mut(mr * kcur)
        .enumerate()
    {
        let r0 = ic + s * mr;
        let live = mr.min(ic + mcur - r0);
        pack_rows(&a[r0 * p.k + pc..], p.k, kcur, live, isa, sliver);
    }
}

/// Packs `kcur` rows × `ncur` columns of B into `nr`-column slivers, `[kcur][nr]` each.
#[allow(clippy::too_many_arguments)]
fn pack_b<T: TableElem + 'static>(
    p: &GemmProblem,
    b: &[T],
    pc: usize,
    kcur: usize,
    jc: usize,
    ncur: usize,
    nr: usize,
    isa: crate::Isa,
    dst: &mut [f32],
) {
    for (s, sliver) in dst[..ncur.next_multiple_of(nr) * kcur]
        .chunks_exact_mut(nr * kcur)
        .enumerate()
    {
        let j0 = jc + s * nr;
        let live = nr.min(jc + ncur - j0);
        match p.b_layout {
            BLayout::Kn => {
                let widen = T::fns(table(isa)).widen;
                for (q, dst_row) in sliver.chunks_exact_mut(nr).enumerate() {
                    let src = &b[(pc + q) * p.n + j0..(pc + q) * p.n + j0 + live];
                    // SAFETY: both hold `live` values; the table runs on this host.
                    unsafe { widen(src.as_ptr(), dst_row.as_mut_ptr(), live, 1.0) };
                    dst_row[live..].fill(0.0);
                }
            }
            // A Linear layer's rows are k-contiguous, like A's.
            BLayout::Nk => pack_rows(&b[j0 * p.k + pc..], p.k, kcur, live, isa, sliver),
        }
    }
}

/// Rows and values a chunk of [`pack_rows`]'s widening block holds: slivers are at most 64
/// wide (the widest AVX-512 microkernel), and 64 × 64 floats are 16 KiB of stack.
#[cfg(target_arch = "x86_64")]
const WIDEN_ROWS: usize = 64;
#[cfg(target_arch = "x86_64")]
const WIDEN_CHUNK: usize = 64;

/// Packs `live` k-contiguous rows `stride` apart, `count` values each, into one sliver
/// `[count][width]` (`width = sliver.len() / count`), zero past `live`.
///
/// For f32 this is a transpose of 32-bit words, done in registers where the config runs AVX2
/// or AVX-512 (validation checked the host has it): the scalar loop stores one word per sliver
/// row, which cost 7% of a 2048-row GEMM in A's packing alone. Other types are widened a
/// chunk of each row at a time by the table's vector widening into a block on the stack,
/// which that transpose then packs: one value at a time, f16 and fp8 (converted in software
/// there) took 37% of a 512-row GEMM more than f32 (gate_up, AVX-512 12×32, 280 and 276 ms
/// against 203).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(super) fn pack_rows<T: TableElem + 'static>(
    src: &[T],
    stride: usize,
    count: usize,
    live: usize,
    isa: crate::Isa,
    sliver: &mut [f32],
) {
    let width = sliver.len() / count;
    debug_assert!(live == 0 || src.len() >= (live - 1) * stride + count);
    #[cfg(target_arch = "x86_64")]
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && isa >= crate::Isa::Avx2Fma {
        let (from, to) = (src.as_ptr().cast::<u8>(), sliver.as_mut_ptr().cast::<u32>());
        // SAFETY: T is f32; rows 0..live hold `count` values (the slice reaches past the last
        // one's); the sliver holds count · width words; the ISA level runs on this host.
        unsafe {
            if isa >= crate::Isa::Avx512 {
                super::transpose::gather_words(from, 4 * stride, 4, count, live, width, to)
            } else {
                super::transpose::words_avx2(from, 4 * stride, count, live, width, to)
            }
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= crate::Isa::Avx2Fma && width <= WIDEN_ROWS {
        let widen = T::fns(table(isa)).widen;
        let mut block = [0f32; WIDEN_ROWS * WIDEN_CHUNK];
        for q0 in (0..count).step_by(WIDEN_CHUNK) {
            let n = WIDEN_CHUNK.min(count - q0);
            for (j, row) in block.chunks_exact_mut(WIDEN_CHUNK).take(live).enumerate() {
                // SAFETY: row j holds `count` values from `j · stride` (the caller's
                // contract), the block row WIDEN_CHUNK; the table runs on this host.
                unsafe { widen(src.as_ptr().add(j * stride + q0), row.as_mut_ptr(), n, 1.0) };
            }
            let (from, to) = (
                block.as_ptr().cast::<u8>(),
                sliver[q0 * width..].as_mut_ptr().cast::<u32>(),
            );
            // SAFETY: rows 0..live of the block hold n words, WIDEN_CHUNK words apart; the
            // sliver holds `(count - q0) · width` words from row q0; the ISA runs here.
            unsafe {
                if isa >= crate::Isa::Avx512 {
                    super::transpose::gather_words(from, 4 * WIDEN_CHUNK, 4, n, live, width, to)
                } else {
                    super::transpose::words_avx2(from, 4 * WIDEN_CHUNK, n, live, width, to)
                }
            };
        }
        return;
    }
    for j in 0..width {
        if j < live {
            for (q, v) in src[j * stride..j * stride + count].iter().enumerate() {
                sliver[q * width + j] = v.to_f32();
            }
        } else {
            for q in 0..count {
                sliver[q * width + j] = 0.0;
            }
        }
    }
}

fn stream<T: TableElem>(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[T],
    b: &[T],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let t = table(c.isa);
    let fns = T::fns(t);
    let widen = T::fns(t).widen;
    // A is tiny next to B: widen it once so the inner loops read f32.
    let a32: &[f32] = {
        let dst = &mut scratch[..p.m * p.k];
        // SAFETY: both hold m·k values.
        unsafe { widen(a.as_ptr(), dst.as_mut_ptr(), p.m * p.k, 1.0) };
        dst
    };
    let chunk = match p.b_layout {
        BLayout::Nk => c.nc,
        BLayout::Kn => c.nc.next_multiple_of(STREAM_KN_VECTORS * t.lanes),
    };
    let tasks = p.n.div_ceil(chunk);
    let out = SharedMut(out.as_mut_ptr());
    let (m, n, k) = (p.m, p.n, p.k);
    for_each_task(c.threads, tasks, |task, _| {
        let (c0, c1) = (task * chunk, ((task + 1) * chunk).min(n));
        // Row groups: as many rows per pass as the config allows, then the remainder.
        match p.b_layout {
            BLayout::Nk => {
                for j0 in (c0..c1).step_by(4) {
                    let cols = 4.min(c1 - j0);
                    for (i0, r) in row_groups(m, c.mr) {
                        let f = fns.stream_nk[STREAM_ROWS.iter().position(|&x| x == r).unwrap()];
                        // SAFETY: rows i0..i0+r of A and C, columns j0..j0+cols of B and C
                        // exist; tasks write disjoint columns.
                        unsafe {
                            f(
                                k,
                                a32.as_ptr().add(i0 * k),
                                k,
                                b.as_ptr().add(j0 * k),
                                k,
                                cols,
                                out.get().add(i0 * n + j0),
                                n,
                                c.prefetch,
                            )
                        };
                    }
                }
            }
            BLayout::Kn => {
                let w = STREAM_KN_VECTORS * t.lanes;
                for (i0, r) in row_groups(m, c.mr) {
                    let f = fns.stream_kn[STREAM_ROWS.iter().position(|&x| x == r).unwrap()];
                    for j0 in (c0..c1).step_by(w) {
                        let width = w.min(c1 - j0);
                        // SAFETY: as above; the kernel reads `width` columns of each B row.
                        unsafe {
                            f(
                                k,
                                a32.as_ptr().add(i0 * k),
                                k,
                                b.as_ptr().add(j0),
                                n,
                                width,
                                out.get().add(i0 * n + j0),
                                n,
                            )
                        };
                    }
                }
            }
        }
    });
}

/// [`stream`] for a block-scaled fp8 problem (weights `[N, K]`, validated): C gets the
/// bytes' f16 readings summed with both scales inside, for [`scale`] to apply the formats'
/// factors.
///
/// A group's two scales multiply every product in it, so they are folded into the tokens:
/// for each block of `block` weight rows, the streamed rows of A are the widened tokens times
/// their own group's scale and that block's, and the stream kernel runs unchanged on them.
/// Folding into the tokens costs `rows × K` products a block of `block × K` weight bytes
/// read (at 4 rows, one product per 32 bytes), where scaling partial sums would stop the
/// kernel every `block` values of k. A row group is rescaled once per weight block and reads
/// that block's rows in 4-row passes, which a 128-row block of K = 8192 keeps in L2 (1 MiB).
pub fn stream_blocks<T: TableElem>(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[T],
    b: &[T],
    scales: GemmScales<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let block = p.block.expect("a block-scaled problem");
    let groups = p.k_groups();
    let t = table(c.isa);
    let fns = T::fns(t);
    let (a32, rest) = scratch.split_at_mut(p.m * p.k);
    // SAFETY: both hold m·k values.
    unsafe { (fns.widen)(a.as_ptr(), a32.as_mut_ptr(), p.m * p.k, 1.0) };
    let a32: &[f32] = a32;
    let per_thread = super::parallel::share_len(rest.len(), c.threads);
    let rest = SharedMut(rest.as_mut_ptr());
    // Chunks of whole 4-column passes, so that no pass straddles two blocks (blocks are
    // multiples of 32 columns).
    let chunk = c.nc.next_multiple_of(4);
    let tasks = p.n.div_ceil(chunk);
    let out = SharedMut(out.as_mut_ptr());
    let (m, n, k) = (p.m, p.n, p.k);
    for_each_task(c.threads, tasks, |task, worker| {
        // SAFETY: workers run one task at a time, so `worker` shares are disjoint.
        let rows =
            unsafe { std::slice::from_raw_parts_mut(rest.get().add(worker * per_thread), 4 * k) };
        let (c0, c1) = (task * chunk, ((task + 1) * chunk).min(n));
        let mut j = c0;
        while j < c1 {
            let jb = j / block;
            let end = ((jb + 1) * block).min(c1);
            let sb = &scales.b[jb * groups..][..groups];
            for (i0, r) in row_groups(m, c.mr) {
                for (i, row) in (i0..i0 + r).zip(rows.chunks_exact_mut(k)) {
                    let sa = &scales.a[i * groups..][..groups];
                    let src = a32[i * k..(i + 1) * k].chunks(block);
                    for (((dst, src), &sa), &sb) in row.chunks_mut(block).zip(src).zip(sa).zip(sb) {
                        let s = sa * sb;
                        for (d, &v) in dst.iter_mut().zip(src) {
                            *d = v * s;
                        }
                    }
                }
                let f = fns.stream_nk[STREAM_ROWS.iter().position(|&x| x == r).unwrap()];
                for j0 in (j..end).step_by(4) {
                    // SAFETY: `rows` holds r rows of k; columns j0..j0 + cols of B and C
                    // exist; tasks write disjoint columns.
                    unsafe {
                        f(
                            k,
                            rows.as_ptr(),
                            k,
                            b.as_ptr().add(j0 * k),
                            k,
                            4.min(end - j0),
                            out.get().add(i0 * n + j0),
                            n,
                            c.prefetch,
                        )
                    };
                }
            }
            j = end;
        }
    });
}

/// Splits `m` rows into passes of at most `max_rows`, each a size some kernel has.
pub(super) fn row_groups(m: usize, max_rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let rows_at = move |i: usize| {
        STREAM_ROWS
            .iter()
            .rev()
            .copied()
            .find(|&r| r <= max_rows && r <= m - i)
            .unwrap_or(1)
    };
    std::iter::successors((m > 0).then(|| (0, rows_at(0))), move |&(i, r)| {
        (i + r < m).then(|| (i + r, rows_at(i + r)))
    })
}

/// Turns an fp8 GEMM's C, the sums of its bytes' f16 readings, into values: each times the
/// format's factor squared, its row's scale and its column's (a block-scaled GEMM's kernels
/// scale inside each group of k: the factor only). A pass over C after the
/// product, not in the kernels: C has `K` times fewer values than the product reads, and every
/// variant (and the ones to come) shares it.
pub fn scale(p: &GemmProblem, c: &GemmConfig, scales: GemmScales<'_>, out: &mut [f32]) {
    let Some(format) = p.fp8() else { return };
    let factor = format.half_factor() * format.half_factor();
    // Rows of at least 16 KiB a task.
    let rows = (4096 / p.n.max(1)).max(1);
    let tasks = p.m.div_ceil(rows);
    let c_at = SharedMut(out.as_mut_ptr());
    for_each_task(c.threads, tasks, |task, _| {
        let (r0, r1) = (task * rows, ((task + 1) * rows).min(p.m));
        // SAFETY: tasks own disjoint rows of C, which holds m·n values.
        let block =
            unsafe { std::slice::from_raw_parts_mut(c_at.get().add(r0 * p.n), (r1 - r0) * p.n) };
        for (i, row) in (r0..r1).zip(block.chunks_exact_mut(p.n)) {
            if p.block.is_some() {
                // The scales are in the sums already (`stream_blocks`, amx-direct's groups).
                row.iter_mut().for_each(|v| *v *= factor);
                continue;
            }
            let a = factor * scales.a_at(i);
            match scales.b {
                [b] => row.iter_mut().for_each(|v| *v *= a * b),
                b => {
                    for (v, &b) in row.iter_mut().zip(b) {
                        *v *= a * b;
                    }
                }
            }
        }
    });
}
