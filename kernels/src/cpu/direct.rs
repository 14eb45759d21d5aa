//! GEMM with a Linear layer's weights read in place: for B stored `[N, K]` and few rows of A
//! (batched decode, short prefill chunks), where packing B is a whole extra pass over the
//! weights for little work per value (16% of the `dpbf16` kernel's time at M = 128).
//!
//! The product is computed transposed, `Cᵀ = B · Aᵀ`: the weights' rows are the microkernel's
//! broadcast operand, read where they lie (each row k-contiguous, `K` apart), and A's rows, the
//! small operand, are packed into `nr`-token slivers once per `kc` slice. Each `mr × nr` tile
//! of `Cᵀ` is stored to the stack, transposed in registers and added to C's rows.
//!
//! Threads own disjoint weight rows (`split = n`, each weight read by one thread) or tokens
//! (`split = m`). Each `mr`-row weight sliver meets every token sliver of the panel while its
//! rows stay in L1, so `mc` plays no part (the space fixes it to `mr`); a deep `kc` (all of
//! K) amortises the transposed stores: Llama-70B gate_up at M = 128, bf16, two Zen 4 threads,
//! 8×32 tiles: 42.2 ms with kc = 512, 35.8 ms with 2048, 34.0 ms with 8192.
//!
//! [`super::amx_direct`], the same scheme on AMX tiles, shares the thread split, the edge
//! sliver and the transposed store into C.

use half::bf16;

use std::ops::Range;

use super::parallel::{for_each_task, SharedMut};
use super::table::table;
use crate::config::{GemmConfig, Split};
use crate::problem::GemmProblem;

/// The largest microkernel tile (`mr · nr`) of the f32 and pair shapes; a transposed tile is
/// `nr` rows of `mr` rounded up to 16, at most twice that.
const MAX_TILE: usize = 1024;

/// Words of a `kcur`-deep slice: f32 values, or pairs of bf16 values (K and kc are even).
fn words(p: &GemmProblem, kcur: usize) -> usize {
    match p.dtype {
        crate::DType::Bf16 => kcur / 2,
        _ => kcur,
    }
}

/// Scratch (32-bit words) a call needs per thread: A's packed panel and one edge sliver of
/// weight rows.
pub fn scratch_len(p: &GemmProblem, c: &GemmConfig) -> usize {
    let d = words(p, c.kc.min(p.k));
    let nc = c.nc.min(p.m.next_multiple_of(c.nr));
    super::parallel::shares_len(c.threads, d * nc + d * c.mr)
}

/// f32: the host table's microkernel with A at any strides.
pub fn run_f32(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let ukr = table(c.isa)
        .ukr(c.mr, c.nr)
        .expect("validated configs have a microkernel");
    let (mr, nr) = (c.mr, c.nr);
    drive(
        p,
        c,
        out,
        scratch,
        |pc, kcur, jc, ncur, dst| super::gemm::pack_a(p, a, jc, ncur, pc, kcur, nr, c.isa, dst),
        // SAFETY (for the closure's contract): rows n0.. of B hold kcur values from pc.
        |n0, pc| unsafe { b.as_ptr().add(n0 * p.k + pc) },
        p.k,
        // SAFETY: drive's contract: MR readable rows `rsa` apart, a packed sliver, a full tile.
        |d, w, rsa, x, tile| unsafe { ukr(d, w, rsa, 1, x, nr, tile, nr, mr, nr, false) },
    );
}

/// bf16 on AVX-512-BF16: pairs of k values, [`super::dpbf16`]'s microkernels with A's rows in
/// place. `K` and `kc` are even (validated), so every row starts on a pair.
pub fn run_bf16(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[bf16],
    b: &[bf16],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let ukr =
        super::dpbf16::microkernel_rows(c.mr, c.nr).expect("validated configs have a microkernel");
    let (mr, nr) = (c.mr, c.nr);
    drive(
        p,
        c,
        out,
        super::dpbf16::pair_words(scratch),
        |pc, kcur, jc, ncur, dst| {
            super::dpbf16::pack_b(p, a, pc, kcur, jc, ncur, nr, kcur / 2, dst)
        },
        // SAFETY (for the closure's contract): rows n0.. of B hold kcur values from pc.
        |n0, pc| unsafe { b.as_ptr().add(n0 * p.k + pc).cast::<u32>() },
        p.k / 2,
        // SAFETY: drive's contract; the validated host has AVX-512-BF16.
        |d, w, rsa, x, tile| unsafe { ukr(d, w, rsa, x, tile, nr, mr, nr, false) },
    );
}

/// The loop nest, over words `W` (f32 values or bf16 pairs).
///
/// `pack_a(pc, kcur, t0, count, dst)` packs `count` rows of A from `t0` into `nr`-token
/// slivers of `kcur` values per token; `row(n0, pc)` points at weight row `n0`, value `pc`,
/// with rows `ldw` words apart; `ukr(d, w, rsa, x, tile)` writes the full `mr × nr` tile of
/// `Cᵀ` for `mr` weight rows `rsa` words apart and one packed sliver, both `d` words deep.
#[allow(clippy::too_many_arguments)]
fn drive<W: Copy + Default>(
    p: &GemmProblem,
    c: &GemmConfig,
    out: &mut [f32],
    scratch: &mut [W],
    pack_a: impl Fn(usize, usize, usize, usize, &mut [W]) + Sync,
    row: impl Fn(usize, usize) -> *const W + Sync,
    ldw: usize,
    ukr: impl Fn(usize, *const W, usize, *const W, *mut f32) + Sync,
) {
    let (mr, nr) = (c.mr, c.nr);
    debug_assert!(mr * nr <= MAX_TILE);
    let per_thread = super::parallel::share_len(scratch.len(), c.threads);
    let d_max = words(p, c.kc.min(p.k));
    let scratch = SharedMut(scratch.as_mut_ptr());
    let out = SharedMut(out.as_mut_ptr());
    for_each_share(p, c, |worker, weights, tokens| {
        // SAFETY: workers of one pool run one task at a time, so `worker` slices are disjoint.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(scratch.get().add(worker * per_thread), per_thread)
        };
        let (panel, edge) = buf.split_at_mut(per_thread - d_max * mr);
        let mut tile = [0f32; MAX_TILE];
        let mut transposed = [0f32; 2 * MAX_TILE];
        for jc in tokens.clone().step_by(c.nc) {
            let ncur = c.nc.min(tokens.end - jc);
            for pc in (0..p.k).step_by(c.kc) {
                let kcur = c.kc.min(p.k - pc);
                let d = words(p, kcur);
                pack_a(pc, kcur, jc, ncur, panel);
                // One weight sliver against every token sliver: its rows stay in L1 while the
                // packed panel streams from L2 (the other order re-read them from L2 and ran
                // 5% slower at M = 128).
                for n0 in weights.clone().step_by(mr) {
                    let rows = mr.min(weights.end - n0);
                    let (w, rsa) = weight_sliver(|r| row(n0 + r, pc), rows, mr, ldw, d, d, edge);
                    for jr in (0..ncur).step_by(nr) {
                        ukr(
                            d,
                            w,
                            rsa,
                            panel[jr / nr * d * nr..].as_ptr(),
                            tile.as_mut_ptr(),
                        );
                        // SAFETY: C rows jc + jr.., columns n0.., belong to this task (its
                        // weights or its tokens).
                        unsafe {
                            tile_into_c(
                                &tile[..mr * nr],
                                (mr, nr),
                                (rows, nr.min(ncur - jr)),
                                c.isa,
                                out.get().add((jc + jr) * p.n + n0),
                                p.n,
                                pc > 0,
                                &mut transposed,
                            )
                        };
                    }
                }
            }
        }
    });
}

/// Runs `task(worker, weights, tokens)` on the config's threads, each on its share of weight
/// rows (`split = n`, in whole `mr` slivers) or tokens (`split = m`, whole `nr` slivers).
pub(super) fn for_each_share(
    p: &GemmProblem,
    c: &GemmConfig,
    task: impl Fn(usize, Range<usize>, Range<usize>) + Sync,
) {
    let (units, unit) = match c.split {
        Split::N => (p.n.div_ceil(c.mr), c.mr),
        Split::M => (p.m.div_ceil(c.nr), c.nr),
    };
    let chunks = c.threads.min(units).max(1);
    for_each_task(c.threads, chunks, |i, worker| {
        let lo = units * i / chunks * unit;
        let hi = units * (i + 1) / chunks * unit;
        match c.split {
            Split::N => task(worker, lo..hi.min(p.n), 0..p.m),
            Split::M => task(worker, 0..p.n, lo..hi.min(p.m)),
        }
    });
}

/// `mr` weight rows as a microkernel reads them, `(pointer, row stride)`: where they lie when
/// `rows == mr`, else the `rows` that exist (`row(r)`, `live` words each) copied into `edge` at
/// a stride of `d`, zero below and past them, so the microkernel reads `mr` rows that exist.
pub(super) fn weight_sliver<W: Copy + Default>(
    row: impl Fn(usize) -> *const W,
    rows: usize,
    mr: usize,
    ldw: usize,
    d: usize,
    live: usize,
    edge: &mut [W],
) -> (*const W, usize) {
    if rows == mr {
        return (row(0), ldw);
    }
    for (r, dst) in edge[..mr * d].chunks_exact_mut(d).enumerate() {
        if r >= rows {
            dst.fill(W::default());
            continue;
        }
        let (values, padding) = dst.split_at_mut(live);
        padding.fill(W::default());
        // SAFETY: the caller's row r < rows holds `live` words; copied as bytes, since a
        // bf16 row's words need not be aligned.
        unsafe {
            std::ptr::copy_nonoverlapping(
                row(r).cast::<u8>(),
                values.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(values),
            )
        };
    }
    (edge.as_ptr(), d)
}

/// Writes (or adds, when `accumulate`) the live `rows × cols` corner of an `mr × nr` tile of
/// `Cᵀ` into C at `c`, `ldc` apart: `cols` rows of C, `rows` columns each. `transposed` holds
/// `nr` rows of `mr` rounded up to 16.
///
/// # Safety
/// C is writable for `cols` rows of `rows` values at `c`, `ldc` apart.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_into_c(
    tile: &[f32],
    (mr, nr): (usize, usize),
    (rows, cols): (usize, usize),
    isa: crate::Isa,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    transposed: &mut [f32],
) {
    let width = mr.next_multiple_of(16);
    super::gemm::pack_rows(tile, nr, nr, rows, isa, &mut transposed[..nr * width]);
    for (j, t) in transposed.chunks_exact(width).take(cols).enumerate() {
        // SAFETY: the caller's contract.
        let dst = unsafe { std::slice::from_raw_parts_mut(c.add(j * ldc), rows) };
        if accumulate {
            for (o, v) in dst.iter_mut().zip(t) {
                *o += v;
            }
        } else {
            dst.copy_from_slice(&t[..rows]);
        }
    }
}
