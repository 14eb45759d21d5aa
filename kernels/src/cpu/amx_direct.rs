//! bf16 GEMM on AMX tiles with a Linear layer's weights `[N, K]` read in place: the weight
//! rows are the tiles' A operand, loaded where they lie, and the tokens, packed in pairs of k
//! values, the B operand. The product is `Cᵀ`, as in [`super::direct`].
//!
//! Tile loads are what this kernel waits on: on the Xeon it was measured on, one 1 KiB tile
//! load took about as long as two or three `tdpbf16ps` (20 ns against 7-8 ns, loads from L1),
//! and a 2 × 2 block needs one load per multiply. So each operand should come from as close as
//! possible, and the blocking is built for that:
//!
//! - tokens in panels of `nc`, packed once per panel for all of K, slice by slice;
//! - weights in blocks of `mc` rows; the accumulators of a block × panel (`mc × nc` f32, in
//!   tile layout) stay in L2 across the `kc` slices, a tile load and store per slice, and the
//!   last slice transposes each tile into C once;
//! - within a slice each `mr`-row weight sliver meets every token sliver of the panel, whose
//!   slice streams from L2 (`kc` ≤ 512 keeps a 32-row sliver in L1, but each weight row is
//!   then read in runs too short for the hardware prefetcher: the heuristic takes all of K up
//!   to 64 tokens and slices of 2048 past them, measured faster).
//!
//! The weights are then read from memory `M / nc` times, not `M / (tokens that fit in L2 with
//! all of K)`: at M = 2048 (Llama-70B gate_up) the earlier whole-K blocking read them 32 times.
//!
//! fp8 weights (W8A8) are read as bytes, half of bf16's: each sliver's `mr` rows of a slice are
//! widened to the bf16 of their f16 readings (exact, [`super::fp8_bf16`]) into the sliver
//! buffer that edge slivers use, and loaded from there, while the next sliver's rows are
//! requested into L2 (slices of up to 2 KiB); the tokens' bytes are widened once.
//! C holds the sums of the readings, which the caller scales.
//!
//! Block-scaled fp8 takes slices of whole groups of k (`kc` a multiple of the block): each
//! group's tile product starts from zero, and is added to the accumulators times its tokens'
//! and weight rows' scales of that group ([`Groups`]), the products of a group exact before
//! they are scaled, as the reference sums them.

use half::bf16;

use super::amx::{depth, ukr_rows_for};
use super::amx_tiles::{Configured, TileConfig, Tiles, ROWS};
use super::direct::{for_each_share, tile_into_c, weight_sliver};
use super::parallel::SharedMut;
use crate::config::GemmConfig;
use crate::problem::GemmProblem;
use crate::Fp8;

/// The weights as the kernel reads them: bf16 in place, or fp8 bytes widened sliver by sliver.
#[derive(Clone, Copy)]
enum Weights<'a> {
    Bf16(&'a [bf16]),
    Fp8(Fp8, &'a [u8]),
}

/// A block-scaled problem's scales ([`crate::kernel::GemmScales`]' block layout): A's `count`
/// per token, B's `count` per `block` weight rows, one per group of k.
#[derive(Clone, Copy)]
struct Groups<'a> {
    block: usize,
    count: usize,
    a: &'a [f32],
    b: &'a [f32],
}

impl Groups<'_> {
    /// Adds `fresh`, one group's `mr × nr` tile of `Cᵀ` (weight rows from `n0`, tokens from
    /// `i0`), to `tile` (or stores it, for the first group) times each row's and token's
    /// scale of group `g`; rows and tokens past the problem's scale to zero.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &self,
        p: &GemmProblem,
        g: usize,
        (n0, i0): (usize, usize),
        (mr, nr): (usize, usize),
        fresh: &[f32],
        tile: &mut [f32],
        first: bool,
    ) {
        let mut sa = [0f32; 32];
        for (c, s) in sa[..nr].iter_mut().enumerate() {
            let i = i0 + c;
            *s = if i < p.m {
                self.a[i * self.count + g]
            } else {
                0.0
            };
        }
        let mut sb = [0f32; 32];
        for (r, s) in sb[..mr].iter_mut().enumerate() {
            let n = n0 + r;
            *s = if n < p.n {
                self.b[n / self.block * self.count + g]
            } else {
                0.0
            };
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") && nr.is_multiple_of(16) {
            // SAFETY: the host has AVX-512F; `fresh` and `tile` hold `mr × nr` values, `sa`
            // and `sb` at least `nr` and `mr`.
            return unsafe { scale_add_avx512(&sa, &sb[..mr], nr, fresh, tile, first) };
        }
        for (r, &sb) in sb[..mr].iter().enumerate() {
            let (dst, src) = (&mut tile[r * nr..][..nr], &fresh[r * nr..][..nr]);
            for ((d, &v), &s) in dst.iter_mut().zip(src).zip(&sa) {
                *d = if first { 0.0 } else { *d } + v * s * sb;
            }
        }
    }
}

/// [`Groups::add`]'s loop in AVX-512 (every AMX host has it): this pass runs once a slice of
/// 128 values of k per tile, a quarter of the tile products' time in SSE2's four lanes
/// (DeepSeek-V3 gate_up, N 4608, K 7168, at 64 tokens).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scale_add_avx512(
    sa: &[f32],
    sb: &[f32],
    nr: usize,
    fresh: &[f32],
    tile: &mut [f32],
    first: bool,
) {
    use std::arch::x86_64::*;
    assert!(fresh.len() >= sb.len() * nr && tile.len() >= sb.len() * nr && sa.len() >= nr);
    // SAFETY: every access is within the lengths asserted above, 16 values at a time.
    unsafe {
        for (r, &sb) in sb.iter().enumerate() {
            let s = _mm512_set1_ps(sb);
            for c in (0..nr).step_by(16) {
                let at = r * nr + c;
                let v = _mm512_mul_ps(
                    _mm512_loadu_ps(fresh.as_ptr().add(at)),
                    _mm512_loadu_ps(sa.as_ptr().add(c)),
                );
                let acc = if first {
                    _mm512_setzero_ps()
                } else {
                    _mm512_loadu_ps(tile.as_ptr().add(at))
                };
                _mm512_storeu_ps(tile.as_mut_ptr().add(at), _mm512_fmadd_ps(v, s, acc));
            }
        }
    }
}

/// The scratch parts of one thread, in 32-bit words: the token panel (all of K), the
/// accumulators of a block × panel, and one edge sliver of weight rows.
fn parts(p: &GemmProblem, c: &GemmConfig) -> (usize, usize, usize) {
    let nc = c.nc.min(p.m.next_multiple_of(c.nr));
    let mc = c.mc.min(p.n.next_multiple_of(c.mr));
    let kc = c.kc.min(p.k);
    (nc * panel_depth(p.k, kc), mc * nc, c.mr * depth(kc))
}

/// Pair rows per token of a panel: every `kc` slice padded to whole 32-value blocks.
fn panel_depth(k: usize, kc: usize) -> usize {
    k / kc * depth(kc) + depth(k % kc)
}

/// Scratch (32-bit words) a call needs: each thread's parts, and for fp8 the tokens widened
/// to bf16 (two a word, on whole lines), which every thread reads.
pub fn scratch_len(p: &GemmProblem, c: &GemmConfig) -> usize {
    let (panel, acc, edge) = parts(p, c);
    super::parallel::shares_len(c.threads, panel + acc + edge) + widened_tokens_len(p)
}

/// Words of the fp8 tokens widened to bf16, rounded up to whole cache lines; 0 for bf16.
fn widened_tokens_len(p: &GemmProblem) -> usize {
    match p.fp8() {
        Some(_) => (p.m * p.k).div_ceil(2).next_multiple_of(16),
        None => 0,
    }
}

/// Runs a config validated against the detected host (bf16, b = nk, even K and kc, an AMX
/// shape, `mc` a multiple of `mr`, a host whose level is `avx512-amx`).
pub fn run(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[bf16],
    b: &[bf16],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    debug_assert_eq!(crate::CpuInfo::detect().isa, crate::Isa::Avx512Amx);
    run_on::<super::amx_tiles::Hardware>(p, c, a, Weights::Bf16(b), None, out, scratch);
}

/// [`run`] on fp8 bytes of `format` (validated as for bf16): C gets the sums of the bytes'
/// f16 readings, for the caller to scale ([`super::gemm::scale`]).
pub fn run_fp8(
    p: &GemmProblem,
    c: &GemmConfig,
    format: Fp8,
    a: &[u8],
    b: &[u8],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    debug_assert_eq!(crate::CpuInfo::detect().isa, crate::Isa::Avx512Amx);
    run_fp8_on::<super::amx_tiles::Hardware>(p, c, format, a, b, None, out, scratch);
}

/// [`run_fp8`] for a block-scaled problem (validated: `kc` a multiple of its block): C gets
/// the sums with both scales in, for the caller to apply the format's factor.
#[allow(clippy::too_many_arguments)]
pub fn run_fp8_blocks(
    p: &GemmProblem,
    c: &GemmConfig,
    format: Fp8,
    a: &[u8],
    b: &[u8],
    scales: crate::kernel::GemmScales<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    debug_assert_eq!(crate::CpuInfo::detect().isa, crate::Isa::Avx512Amx);
    let groups = groups_of(p, scales);
    run_fp8_on::<super::amx_tiles::Hardware>(p, c, format, a, b, groups, out, scratch);
}

fn groups_of<'a>(p: &GemmProblem, scales: crate::kernel::GemmScales<'a>) -> Option<Groups<'a>> {
    Some(Groups {
        block: p.block?,
        count: p.k_groups(),
        a: scales.a,
        b: scales.b,
    })
}

/// [`run_fp8`] on a given implementation of the tile operations.
#[allow(clippy::too_many_arguments)]
fn run_fp8_on<T: Tiles + Default>(
    p: &GemmProblem,
    c: &GemmConfig,
    format: Fp8,
    a: &[u8],
    b: &[u8],
    groups: Option<Groups<'_>>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let (wide, rest) = scratch.split_at_mut(widened_tokens_len(p));
    // SAFETY: f32 words hold two u16s each, bf16 is a u16; every bit pattern is valid.
    let wide: &mut [bf16] =
        unsafe { std::slice::from_raw_parts_mut(wide.as_mut_ptr().cast(), 2 * wide.len()) };
    let wide = &mut wide[..p.m * p.k];
    super::fp8_bf16::widen(format, a, wide);
    run_on::<T>(p, c, wide, Weights::Fp8(format, b), groups, out, rest);
}

/// Rows `n0 .. n0 + rows` of fp8 weights `b` (rows `k` bytes apart), bytes `pc .. pc + live
/// · 2`, widened into `edge` as `mr` rows of `d` pair words (rows past `rows` and words past
/// `live` zero): the sliver and its row stride, as [`weight_sliver`] returns them. With
/// `ahead`, the first row and k offset of the sliver widened next, each row's bytes there are
/// requested into L2 as this sliver's are read: short slices of many rows are runs too short
/// for the hardware prefetcher to find.
#[allow(clippy::too_many_arguments)]
fn widen_sliver(
    format: Fp8,
    b: &[u8],
    k: usize,
    (n0, rows, mr): (usize, usize, usize),
    pc: usize,
    d: usize,
    live: usize,
    ahead: Option<(usize, usize)>,
    edge: &mut [u32],
) -> (*const u32, usize) {
    for (r, dst) in edge[..mr * d].chunks_exact_mut(d).enumerate() {
        if r >= rows {
            dst.fill(0);
            continue;
        }
        let (values, padding) = dst.split_at_mut(live);
        padding.fill(0);
        // SAFETY: u32 words hold two u16s each, bf16 is a u16; every bit pattern is valid.
        let values: &mut [bf16] =
            unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), 2 * values.len()) };
        let at = (n0 + r) * k + pc;
        super::fp8_bf16::widen(format, &b[at..at + 2 * live], values);
        if let Some((row, pc)) = ahead {
            // The next sliver's row r, as far as it exists.
            if let Some(next) = b.get((row + r) * k + pc..) {
                super::leaf::prefetch::<_, true>(next.as_ptr(), next.len().min(2 * live));
            }
        }
    }
    (edge.as_ptr(), d)
}

/// The longest slice (bytes of a weight row) whose next sliver [`widen_sliver`] prefetches.
/// Longer runs the hardware prefetcher finds by itself, and asking for them too crowds L2:
/// fp8 gate_up (N 7168, K 8192) on two threads of an AMX Xeon, cold, `tune bench`, mr 32 × nr
/// 32, ms without / with: kc 1024 M = 32 8.9 / 7.1, 64 10.4-10.6 / 8.6-9.0, 128 14.1-14.4 /
/// 12.5-12.8, 256 23.9-24.1 / 22.3-23.2; kc 2048 M = 64 9.3-9.6 / 8.6-8.9, 256 23.1-23.5 /
/// 23.1-23.2; kc 4096 M = 128 12.8-13.8 / 13.2-13.9, 256 24.9-25.1 / 26.9-27.5; kc 8192 M =
/// 32 6.0-6.2 / 6.4-6.7, 128 14.1-15.1 / 17.5-18.1.
const PREFETCHED_SLICE: usize = 2048;

/// [`run`] on a given implementation of the tile operations.
fn run_on<T: Tiles + Default>(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[bf16],
    source: Weights<'_>,
    groups: Option<Groups<'_>>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let ukr = ukr_rows_for::<T>(c.mr, c.nr).expect("validated configs have an AMX shape");
    let (mr, nr) = (c.mr, c.nr);
    let kc = c.kc.min(p.k);
    let (panel_len, acc_len, _) = parts(p, c);
    let per_thread = super::parallel::share_len(scratch.len(), c.threads);
    let scratch = SharedMut(super::dpbf16::pair_words(scratch).as_mut_ptr());
    let out = SharedMut(out.as_mut_ptr());
    // Rows of B are K values apart: K / 2 pair words.
    let ldw = p.k / 2;
    for_each_share(p, c, |worker, weights, tokens| {
        // SAFETY: workers of one pool run one task at a time, so `worker` slices are disjoint.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(scratch.get().add(worker * per_thread), per_thread)
        };
        let (panel, rest) = buf.split_at_mut(panel_len);
        let (acc, edge) = rest.split_at_mut(acc_len);
        // The accumulators are f32 in words the tiles load and store.
        // SAFETY: u32 and f32 share size and alignment, and any bits are a valid f32.
        let acc =
            unsafe { std::slice::from_raw_parts_mut(acc.as_mut_ptr().cast::<f32>(), acc_len) };
        // A transposed tile: nr rows of mr, both at most 32 for the AMX shapes.
        let mut transposed = [0f32; 32 * 32];
        // A block-scaled slice's product, before its scales.
        let mut fresh = [0f32; 32 * 32];
        // SAFETY: validation checked the host runs AMX, or T is the software model.
        let mut tiles =
            unsafe { Configured::new(T::default(), &TileConfig::full(mr / ROWS, nr / ROWS)) };
        for jc in tokens.clone().step_by(c.nc) {
            let ncur = c.nc.min(tokens.end - jc);
            let slivers = ncur.div_ceil(nr);
            // Slice s of the panel starts at s · depth(kc) pair rows of every sliver.
            let slice_at = |pc: usize| slivers * nr * (pc / kc) * depth(kc);
            for pc in (0..p.k).step_by(kc) {
                let kcur = kc.min(p.k - pc);
                let d = depth(kcur);
                let at = slice_at(pc);
                super::dpbf16::pack_b(p, a, pc, kcur, jc, ncur, nr, d, &mut panel[at..]);
            }
            for nb in weights.clone().step_by(c.mc) {
                let block = nb..(nb + c.mc).min(weights.end);
                for pc in (0..p.k).step_by(kc) {
                    let kcur = kc.min(p.k - pc);
                    let (d, live) = (depth(kcur), kcur / 2);
                    let x = &panel[slice_at(pc)..];
                    let last = pc + kcur == p.k;
                    for n0 in block.clone().step_by(mr) {
                        let rows = mr.min(block.end - n0);
                        let (w, rsa) = match source {
                            Weights::Bf16(b) => {
                                // SAFETY (for the closure): rows n0 + r < N of B hold K values.
                                let row = |r: usize| unsafe {
                                    b.as_ptr().add((n0 + r) * p.k + pc).cast()
                                };
                                weight_sliver(row, rows, mr, ldw, d, live, edge)
                            }
                            Weights::Fp8(format, b) => {
                                let ahead = (kcur <= PREFETCHED_SLICE).then(|| {
                                    if n0 + mr < block.end {
                                        (n0 + mr, pc)
                                    } else if pc + kc < p.k {
                                        (nb, pc + kc)
                                    } else {
                                        (block.end, 0)
                                    }
                                });
                                let sliver = (n0, rows, mr);
                                widen_sliver(format, b, p.k, sliver, pc, d, live, ahead, edge)
                            }
                        };
                        for (s, jr) in (0..ncur).step_by(nr).enumerate() {
                            let t = ((n0 - nb) / mr * slivers + s) * mr * nr;
                            let tile = &mut acc[t..t + mr * nr];
                            let x = &x[s * d * nr..];
                            match groups {
                                // SAFETY: `w` has `mr` rows of `live` words `rsa` apart, `x` a
                                // sliver of `d` pair rows per token; `tiles` are configured
                                // for this shape.
                                None => unsafe {
                                    ukr(
                                        &mut *tiles,
                                        d,
                                        live,
                                        w,
                                        rsa,
                                        x.as_ptr(),
                                        tile.as_mut_ptr(),
                                        pc > 0,
                                    )
                                },
                                // A group at a time, each from zero into `fresh`, then scaled
                                // into the tile.
                                Some(groups) => {
                                    for k0 in (0..kcur).step_by(groups.block) {
                                        let len = groups.block.min(kcur - k0);
                                        // SAFETY: as above, from pair word k0 / 2 of each row
                                        // and pair row k0 / 2 of the sliver (a multiple of 32
                                        // values: whole k blocks), `len / 2` words live.
                                        unsafe {
                                            ukr(
                                                &mut *tiles,
                                                depth(len),
                                                len / 2,
                                                w.add(k0 / 2),
                                                rsa,
                                                x[k0 / 2 * nr..].as_ptr(),
                                                fresh.as_mut_ptr(),
                                                false,
                                            )
                                        };
                                        let (g, first) = ((pc + k0) / groups.block, pc + k0 == 0);
                                        let at = (n0, jc + jr);
                                        groups.add(p, g, at, (mr, nr), &fresh, tile, first);
                                    }
                                }
                            }
                            if last {
                                // SAFETY: C rows jc + jr.., columns n0.., belong to this task
                                // (its weights or its tokens).
                                unsafe {
                                    tile_into_c(
                                        tile,
                                        (mr, nr),
                                        (rows, nr.min(ncur - jr)),
                                        c.isa,
                                        out.get().add((jc + jr) * p.n + n0),
                                        p.n,
                                        false,
                                        &mut transposed,
                                    )
                                };
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
    use crate::config::{GemmVariant, Inner, Split};
    use crate::cpu::amx::tests::{assert_scaled_matches, case, fp8_case};
    use crate::cpu::amx::AMX_SHAPES;
    use crate::cpu::amx_tiles::Model;
    use crate::Isa;

    /// The kernel on the software model of the tiles, against the f64 reference: every shape,
    /// weight rows that end mid-tile and mid-block, tokens that end mid-sliver and mid-panel,
    /// slices that end mid-block (the copied tail), several slices accumulated, both splits.
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
            for c in blockings(&p) {
                let mut scratch = vec![0f32; scratch_len(&p, &c)];
                data.out.fill(f32::NAN);
                let out = &mut data.out;
                run_on::<Model>(&p, &c, &a, Weights::Bf16(b), None, out, &mut scratch);
                let err = crate::reference::relative_error(&data.out, &reference);
                assert!(
                    err <= problem.tolerance(),
                    "{spec} with {c:?}: relative error {err:e}"
                );
                ran += 1;
            }
        }
        assert_eq!(ran, 6 * AMX_SHAPES.len() * 9);
    }

    /// Every AMX shape with a slice shorter than a block, one past a block and all of K;
    /// panels of one and two slivers; weight blocks of one and two slivers; both splits.
    fn blockings(p: &GemmProblem) -> Vec<GemmConfig> {
        let mut out = Vec::new();
        for &(mr, nr) in AMX_SHAPES {
            for (kc, nc, mc) in [(6, nr, mr), (34, 2 * nr, 2 * mr), (p.k, nr, 2 * mr)] {
                for (split, threads) in [(Split::N, 1), (Split::M, 2), (Split::N, 2)] {
                    out.push(GemmConfig {
                        variant: GemmVariant::AmxDirect,
                        isa: Isa::Avx512Amx,
                        mr,
                        nr,
                        mc,
                        kc,
                        nc,
                        split,
                        threads,
                        prefetch: true,
                        inner: Inner::M,
                    });
                }
            }
        }
        out
    }

    /// fp8 weights of every format, widened a sliver at a time (full slivers and edge ones,
    /// slices that end mid-block, several slices, the next sliver's rows prefetched past the
    /// last row), then scaled, against the f64 reference.
    #[test]
    fn fp8_matches_the_reference_on_the_tile_model() {
        let mut ran = 0;
        for spec in [
            "gemm:m=1,n=1,k=2,dtype=fp8_e4m3,b=nk",
            "gemm:m=29,n=67,k=46,dtype=fp8_e4m3,b=nk",
            "gemm:m=40,n=33,k=100,dtype=fp8_e4m3fnuz,b=nk",
            "gemm:m=3,n=64,k=130,dtype=fp8_e5m2,b=nk",
        ] {
            let (problem, p, mut data, reference, format, a, b) = fp8_case(spec, 5);
            for c in blockings(&p) {
                let mut scratch = vec![0f32; scratch_len(&p, &c)];
                data.out.fill(f32::NAN);
                let out = &mut data.out;
                run_fp8_on::<Model>(&p, &c, format, &a, &b, None, out, &mut scratch);
                assert_scaled_matches(&problem, &c, &mut data, &reference);
                ran += 1;
            }
        }
        assert_eq!(ran, 4 * AMX_SHAPES.len() * 9);
    }

    /// Block-scaled fp8 of every format in slices of one and three blocks: weight rows and tokens that
    /// end mid-sliver (their scales past the problem), blocks of weight rows that two slivers
    /// share (blocks of 64), a last group shorter than a block, one group only (K below the
    /// block), both splits, against the f64 reference.
    #[test]
    fn block_scaled_fp8_matches_the_reference_on_the_tile_model() {
        let mut ran = 0;
        for spec in [
            "gemm:m=1,n=1,k=2,dtype=fp8_e4m3,b=nk,block=32",
            "gemm:m=29,n=67,k=130,dtype=fp8_e4m3,b=nk,block=32",
            "gemm:m=40,n=130,k=200,dtype=fp8_e4m3fnuz,b=nk,block=64",
            "gemm:m=3,n=64,k=100,dtype=fp8_e5m2,b=nk,block=128",
        ] {
            let (problem, p, mut data, reference, format, a, b) = fp8_case(spec, 5);
            let scales = crate::kernel::GemmScales {
                a: &data.a_scales.clone(),
                b: &data.b_scales.clone(),
                zeros: &[],
            };
            // Slices of one group and of three (the last group of a slice, or of K, short).
            for (mut c, groups) in blockings(&p).into_iter().flat_map(|c| [(c, 1), (c, 3)]) {
                c.kc = groups * p.block.unwrap();
                let mut scratch = vec![0f32; scratch_len(&p, &c)];
                data.out.fill(f32::NAN);
                let (groups, out) = (groups_of(&p, scales), &mut data.out);
                run_fp8_on::<Model>(&p, &c, format, &a, &b, groups, out, &mut scratch);
                assert_scaled_matches(&problem, &c, &mut data, &reference);
                ran += 1;
            }
        }
        assert_eq!(ran, 4 * AMX_SHAPES.len() * 9 * 2);
    }
}
