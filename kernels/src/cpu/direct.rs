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

use half::bf16;

use super::parallel::{for_each_task, SharedMut};
use super::table::table;
use crate::config::{GemmConfig, Split};
use crate::problem::GemmProblem;

/// The largest microkernel tile (`mr · nr`) of any shape the variants accept (AMX 32 × 32).
const MAX_TILE: usize = 1024;

/// How a kernel's values sit in 32-bit words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Words {
    /// f32, one value per word.
    F32,
    /// bf16 pairs of k values (`vdpbf16ps`).
    Pairs,
    /// bf16 pairs padded to whole 32-value k blocks, as AMX tiles load them.
    AmxBlocks,
}

impl Words {
    /// Words of a `kcur`-deep slice that hold values.
    fn live(self, kcur: usize) -> usize {
        match self {
            Words::F32 => kcur,
            Words::Pairs | Words::AmxBlocks => kcur / 2,
        }
    }

    /// Words per token of a packed sliver `kcur` deep.
    fn depth(self, kcur: usize) -> usize {
        match self {
            Words::AmxBlocks => super::amx::depth(kcur),
            _ => self.live(kcur),
        }
    }

    /// The layout a config's variant and dtype use.
    pub fn of(c: &GemmConfig, p: &GemmProblem) -> Words {
        match (c.variant, p.dtype) {
            (crate::config::GemmVariant::AmxDirect, _) => Words::AmxBlocks,
            (_, crate::DType::Bf16) => Words::Pairs,
            _ => Words::F32,
        }
    }
}

/// Scratch (32-bit words) a call needs per thread: A's packed panel and one edge sliver of
/// weight rows.
pub fn scratch_len(p: &GemmProblem, c: &GemmConfig) -> usize {
    let d = Words::of(c, p).depth(c.kc.min(p.k));
    let nc = c.nc.min(p.m.next_multiple_of(c.nr));
    c.threads * (d * nc + d * c.mr)
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
        Words::F32,
        out,
        scratch,
        |pc, kcur, jc, ncur, dst| super::gemm::pack_a(p, a, jc, ncur, pc, kcur, nr, c.isa, dst),
        // SAFETY (for the closure's contract): rows n0.. of B hold kcur values from pc.
        |n0, pc| unsafe { b.as_ptr().add(n0 * p.k + pc) },
        p.k,
        // SAFETY: drive's contract: MR readable rows `rsa` apart, a packed sliver, a full tile.
        |d, _, w, rsa, x, tile| unsafe { ukr(d, w, rsa, 1, x, nr, tile, nr, mr, nr, false) },
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
        Words::Pairs,
        out,
        super::dpbf16::pair_words(scratch),
        |pc, kcur, jc, ncur, dst| {
            super::dpbf16::pack_b(p, a, pc, kcur, jc, ncur, nr, kcur / 2, dst)
        },
        // SAFETY (for the closure's contract): rows n0.. of B hold kcur values from pc.
        |n0, pc| unsafe { b.as_ptr().add(n0 * p.k + pc).cast::<u32>() },
        p.k / 2,
        // SAFETY: drive's contract; the validated host has AVX-512-BF16.
        |d, _, w, rsa, x, tile| unsafe { ukr(d, w, rsa, x, tile, nr, mr, nr, false) },
    );
}

/// bf16 on AMX tiles: the weight rows are the tiles' A operand, loaded where they lie, and the
/// packed tokens the B operand (pairs of k values for 16 tokens per tile row), in whole
/// 32-value k blocks. `K` and `kc` are even (validated), so every row starts on a pair.
pub fn run_amx(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[bf16],
    b: &[bf16],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    debug_assert_eq!(crate::CpuInfo::detect().isa, crate::Isa::Avx512Amx);
    run_amx_on::<super::amx_tiles::Hardware>(p, c, a, b, out, scratch);
}

/// [`run_amx`] on a given implementation of the tile operations.
fn run_amx_on<T: super::amx_tiles::Tiles + Default>(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[bf16],
    b: &[bf16],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let ukr =
        super::amx::ukr_rows_for::<T>(c.mr, c.nr).expect("validated configs have an AMX shape");
    let nr = c.nr;
    drive(
        p,
        c,
        Words::AmxBlocks,
        out,
        super::dpbf16::pair_words(scratch),
        |pc, kcur, jc, ncur, dst| {
            let d = super::amx::depth(kcur);
            super::dpbf16::pack_b(p, a, pc, kcur, jc, ncur, nr, d, dst)
        },
        // SAFETY (for the closure's contract): rows n0.. of B hold kcur values from pc.
        |n0, pc| unsafe { b.as_ptr().add(n0 * p.k + pc).cast::<u32>() },
        p.k / 2,
        // SAFETY: drive's contract; validation checked the host runs AMX, or T is the model.
        |d, live, w, rsa, x, tile| unsafe { ukr(&mut T::default(), d, live, w, rsa, x, tile) },
    );
}

/// The loop nest, over words `W` (f32 values or bf16 pairs).
///
/// `pack_a(pc, kcur, t0, count, dst)` packs `count` rows of A from `t0` into `nr`-token
/// slivers of `layout.depth(kcur)` words per token; `row(n0, pc)` points at weight row `n0`,
/// value `pc`, with rows `ldw` words apart; `ukr(d, live, w, rsa, x, tile)` writes the full
/// `mr × nr` tile of `Cᵀ` for `mr` weight rows `rsa` words apart (`live` words of each hold
/// the slice's values) and one packed sliver `d` words deep.
#[allow(clippy::too_many_arguments)]
fn drive<W: Copy + Default>(
    p: &GemmProblem,
    c: &GemmConfig,
    layout: Words,
    out: &mut [f32],
    scratch: &mut [W],
    pack_a: impl Fn(usize, usize, usize, usize, &mut [W]) + Sync,
    row: impl Fn(usize, usize) -> *const W + Sync,
    ldw: usize,
    ukr: impl Fn(usize, usize, *const W, usize, *const W, *mut f32) + Sync,
) {
    let (mr, nr) = (c.mr, c.nr);
    debug_assert!(mr * nr <= MAX_TILE);
    let (units, unit) = match c.split {
        Split::N => (p.n.div_ceil(mr), mr),
        Split::M => (p.m.div_ceil(nr), nr),
    };
    let chunks = c.threads.min(units).max(1);
    let per_thread = scratch.len() / c.threads;
    let d_max = layout.depth(c.kc.min(p.k));
    let scratch = SharedMut(scratch.as_mut_ptr());
    let out = SharedMut(out.as_mut_ptr());
    let isa = c.isa;
    for_each_task(c.threads, chunks, |i, worker| {
        let lo = units * i / chunks * unit;
        let hi = units * (i + 1) / chunks * unit;
        let (weights, tokens) = match c.split {
            Split::N => (lo..hi.min(p.n), 0..p.m),
            Split::M => (0..p.n, lo..hi.min(p.m)),
        };
        // SAFETY: workers of one pool run one task at a time, so `worker` slices are disjoint.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(scratch.get().add(worker * per_thread), per_thread)
        };
        let (panel, edge) = buf.split_at_mut(per_thread - d_max * mr);
        let mut tile = [0f32; MAX_TILE];
        let mut tile_t = [0f32; MAX_TILE * 2];
        let width = mr.next_multiple_of(16);
        for jc in tokens.clone().step_by(c.nc) {
            let ncur = c.nc.min(tokens.end - jc);
            for pc in (0..p.k).step_by(c.kc) {
                let kcur = c.kc.min(p.k - pc);
                let (d, live) = (layout.depth(kcur), layout.live(kcur));
                pack_a(pc, kcur, jc, ncur, panel);
                // One weight sliver against every token sliver: its rows stay in L1 while the
                // packed panel streams from L2 (the other order re-read them from L2 and ran
                // 5% slower at M = 128).
                for n0 in weights.clone().step_by(mr) {
                    let rows = mr.min(weights.end - n0);
                    let (w, rsa) = if rows == mr {
                        (row(n0, pc), ldw)
                    } else {
                        // The last rows of B: copied, zero below and past the live words, so
                        // the microkernel reads MR rows that exist.
                        for (r, dst) in edge[..mr * d].chunks_exact_mut(d).enumerate() {
                            if r >= rows {
                                dst.fill(W::default());
                                continue;
                            }
                            let (values, padding) = dst.split_at_mut(live);
                            padding.fill(W::default());
                            // SAFETY: row n0 + r < N holds kcur values (`live` words) from pc;
                            // copied as bytes, since a bf16 row's words need not be aligned.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    row(n0 + r, pc).cast::<u8>(),
                                    values.as_mut_ptr().cast::<u8>(),
                                    std::mem::size_of_val(values),
                                )
                            };
                        }
                        (edge.as_ptr(), d)
                    };
                    for jr in (0..ncur).step_by(nr) {
                        let cols = nr.min(ncur - jr);
                        ukr(
                            d,
                            live,
                            w,
                            rsa,
                            panel[jr / nr * d * nr..].as_ptr(),
                            tile.as_mut_ptr(),
                        );
                        // Cᵀ's tile, rows × cols live, into C's rows jc + jr.., columns n0..
                        super::gemm::pack_rows(
                            &tile[..mr * nr],
                            nr,
                            nr,
                            rows,
                            isa,
                            &mut tile_t[..nr * width],
                        );
                        for (j, t) in tile_t.chunks_exact(width).take(cols).enumerate() {
                            // SAFETY: C row jc + jr + j, columns n0..n0 + rows, belong to this
                            // task (its weights or its tokens).
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(
                                    out.get().add((jc + jr + j) * p.n + n0),
                                    rows,
                                )
                            };
                            if pc == 0 {
                                dst.copy_from_slice(&t[..rows]);
                            } else {
                                for (o, v) in dst.iter_mut().zip(t) {
                                    *o += v;
                                }
                            }
                        }
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GemmVariant, Split};
    use crate::cpu::amx::{tests::case, AMX_SHAPES};
    use crate::cpu::amx_tiles::Model;
    use crate::Isa;

    /// The AMX direct kernel on the software model of the tiles, against the f64 reference:
    /// every shape, weight rows that end mid-tile, tokens that end mid-sliver and mid-panel,
    /// slices that end mid-block (the copied tail), several slices summed, both splits.
    #[test]
    fn amx_matches_the_reference_on_the_tile_model() {
        let mut ran = 0;
        for spec in [
            "gemm:m=1,n=1,k=2,dtype=bf16,b=nk",
            "gemm:m=29,n=67,k=46,dtype=bf16,b=nk",
            "gemm:m=40,n=33,k=100,dtype=bf16,b=nk",
            "gemm:m=3,n=64,k=64,dtype=bf16,b=nk",
            "gemm:m=17,n=64,k=46,dtype=bf16,b=nk",
            "gemm:m=70,n=31,k=130,dtype=bf16,b=nk",
        ] {
            let (problem, p, mut data, reference, a, mut b) = case(spec, 5);
            // NaN past the weights: a load that reads past the last row's slice spoils C.
            let len = b.len();
            b.extend([half::bf16::NAN; 64]);
            let b = &b[..len];
            for &(mr, nr) in AMX_SHAPES {
                // A slice shorter than a block, one past a block, all of K; panels of one and
                // two slivers.
                for (kc, nc) in [(6, nr), (34, 2 * nr), (p.k, nr)] {
                    for (split, threads) in [(Split::N, 1), (Split::M, 2), (Split::N, 2)] {
                        let c = GemmConfig {
                            variant: GemmVariant::AmxDirect,
                            isa: Isa::Avx512Amx,
                            mr,
                            nr,
                            mc: mr,
                            kc,
                            nc,
                            split,
                            threads,
                        };
                        let mut scratch = vec![0f32; scratch_len(&p, &c)];
                        data.out.fill(f32::NAN);
                        run_amx_on::<Model>(&p, &c, &a, b, &mut data.out, &mut scratch);
                        let err = crate::reference::relative_error(&data.out, &reference);
                        assert!(
                            err <= problem.tolerance(),
                            "{spec} with {c:?}: relative error {err:e}"
                        );
                        ran += 1;
                    }
                }
            }
        }
        assert_eq!(ran, 6 * AMX_SHAPES.len() * 9);
    }
}
