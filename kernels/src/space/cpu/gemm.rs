//! GEMM's CPU space: the stream kernels for decode shapes, the packed loop nest and its
//! AVX-512-BF16 twin, the weights read in place, and on AMX hosts both on tiles; microkernel
//! shapes, cache blocks, thread splits and tile orders.

use crate::config::{GemmConfig, GemmVariant, Inner, Split};
use crate::cpu::dpbf16::BF16_SHAPES;
use crate::cpu::table::{table, STREAM_ROWS};
use crate::cpu::AMX_SHAPES;
use crate::device::{CpuInfo, Isa};
use crate::problem::{BLayout, GemmProblem};
use crate::{DType, Family, KernelError};

use super::{
    check_common, invalid, isa_levels, kernel_isa, thread_counts, MAX_BLOCK,
    MAX_SCRATCH_PER_THREAD, STREAM_MAX_M,
};

/// amx-direct's slices for a block-scaled problem: one group of k, whole groups of about
/// 512, 1024 and 2048 values (what the weights are read in runs of), and all of K, each once.
fn block_depths(k: usize, block: usize) -> Vec<usize> {
    let whole = k.next_multiple_of(block);
    let mut out = vec![block];
    for d in [512, 1024, 2048, whole] {
        let d = (d / block).max(1) * block;
        if d <= whole && !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// Slice depths swept by the direct variants: the given ones within K, and all of K.
fn in_place_depths(k: usize, depths: &[usize]) -> Vec<usize> {
    let mut out: Vec<usize> = depths.iter().map(|&kc| kc.min(k)).chain([k]).collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The `vdpbf16ps` variants: bf16 inputs on a host with AVX-512-BF16 (the stream one's fp8
/// inputs: [`fp8_pairs`]).
fn bf16_pairs(c: &GemmConfig, p: &GemmProblem, host: &CpuInfo) -> Result<(), KernelError> {
    let f = Family::Gemm;
    let name = c.variant.name();
    if p.dtype != DType::Bf16 {
        let or_fp8 = match c.variant {
            GemmVariant::StreamDpbf16 => " (or fp8 weights stored [N, K], or int4 weights)",
            _ => "",
        };
        return Err(invalid(
            f,
            format!(
                "the {name} variant takes bf16 inputs{or_fp8}, not {}",
                p.dtype
            ),
        ));
    }
    if !host.avx512_bf16 {
        return Err(invalid(
            f,
            format!(
                "the {name} variant needs AVX-512-BF16, which {} lacks",
                host.model
            ),
        ));
    }
    Ok(())
}

/// The stream-dpbf16 variant on fp8 bytes: weights `[N, K]` (each row streamed and widened
/// to bf16 pairs 32 bytes at a time), on a host with AVX-512-BF16.
fn fp8_pairs(c: &GemmConfig, p: &GemmProblem, host: &CpuInfo) -> Result<(), KernelError> {
    let f = Family::Gemm;
    if p.b_layout != BLayout::Nk {
        return Err(invalid(
            f,
            format!(
                "the {} variant takes fp8 weights stored [N, K] (b=nk), as a Linear layer \
                 stores them; b=kn takes the stream variant",
                c.variant.name()
            ),
        ));
    }
    if !host.avx512_bf16 {
        return Err(invalid(
            f,
            format!(
                "the {} variant needs AVX-512-BF16, which {} lacks",
                c.variant.name(),
                host.model
            ),
        ));
    }
    Ok(())
}

/// The cache blocks of a packed loop nest: tiles that divide, within bounds and scratch.
fn check_blocks(f: Family, c: &GemmConfig) -> Result<(), KernelError> {
    if c.mc == 0 || !c.mc.is_multiple_of(c.mr) || c.mc > MAX_BLOCK {
        return Err(invalid(
            f,
            format!(
                "mc = {} must be a positive multiple of mr = {} up to {MAX_BLOCK}",
                c.mc, c.mr
            ),
        ));
    }
    if c.nc == 0 || !c.nc.is_multiple_of(c.nr) || c.nc > MAX_BLOCK {
        return Err(invalid(
            f,
            format!(
                "nc = {} must be a positive multiple of nr = {} up to {MAX_BLOCK}",
                c.nc, c.nr
            ),
        ));
    }
    if c.kc == 0 || c.kc > MAX_BLOCK {
        return Err(invalid(
            f,
            format!("kc = {} must be between 1 and {MAX_BLOCK}", c.kc),
        ));
    }
    if c.mc * c.kc + c.kc * c.nc > MAX_SCRATCH_PER_THREAD {
        return Err(invalid(
            f,
            format!(
                "packing buffers of mc·kc + kc·nc = {} values exceed {MAX_SCRATCH_PER_THREAD}",
                c.mc * c.kc + c.kc * c.nc
            ),
        ));
    }
    Ok(())
}

/// Whether a variant runs the packed loop nest, whose tile order `inner` sets.
fn in_loop_nest(variant: GemmVariant) -> bool {
    matches!(
        variant,
        GemmVariant::Packed | GemmVariant::Dpbf16 | GemmVariant::Amx
    )
}

/// The cache blockings swept for one microkernel: `mc` and `nc` in tiles of `mr` and `nr`,
/// both thread splits (one on a single thread), and for the packed loop nest both tile
/// orders where the other one's B panel fits the host's L2.
struct Blocking<'a> {
    mc_tiles: &'a [usize],
    kc: &'a [usize],
    nc_tiles: &'a [usize],
}

impl Blocking<'_> {
    fn push(
        &self,
        variant: GemmVariant,
        isa: Isa,
        (mr, nr): (usize, usize),
        threads: usize,
        host: &CpuInfo,
        out: &mut Vec<GemmConfig>,
    ) {
        // Bytes a packed B value takes: f32 in the packed kernel, bf16 in the pair and AMX
        // kernels.
        let word = if variant == GemmVariant::Packed { 4 } else { 2 };
        for &mc_tiles in self.mc_tiles {
            for &kc in self.kc {
                for &nc_tiles in self.nc_tiles {
                    let nc = nr * nc_tiles;
                    // With `inner = n` the B panel is what each A sliver sweeps: past L2 it
                    // streams from L3 once per sliver, which no blocking repays.
                    let n_inner = in_loop_nest(variant) && kc * nc * word <= host.l2_bytes;
                    let orders: &[Inner] = if n_inner {
                        &[Inner::M, Inner::N]
                    } else {
                        &[Inner::M]
                    };
                    for split in [Split::M, Split::N] {
                        if threads == 1 && split == Split::M {
                            continue;
                        }
                        for &inner in orders {
                            out.push(GemmConfig {
                                variant,
                                isa,
                                mr,
                                nr,
                                mc: mr * mc_tiles,
                                kc,
                                nc,
                                split,
                                threads,
                                prefetch: true,
                                inner,
                            });
                        }
                    }
                }
            }
        }
    }
}

/// Widest B panel the AMX kernel packs: 4096 columns, 16 MiB of scratch a thread at kc = 2048.
const AMX_SHARE_MAX: usize = 4096;

/// A thread's whole share of N as one B panel for the packed AMX kernel (split over N), in
/// equal panels of at most [`AMX_SHARE_MAX`] columns, `nr` wide each: A is packed once per
/// panel, and a panel of 1024 columns left a tail of 256 (qkv, N = 1280) or packed A four
/// times a thread (gate_up, N = 7168, two threads), for B slivers that stream from L3 either
/// way.
fn amx_share(n: usize, nr: usize, threads: usize) -> usize {
    let share = n.div_ceil(nr).div_ceil(threads.max(1)) * nr;
    let panels = share.div_ceil(AMX_SHARE_MAX);
    share.div_ceil(panels).next_multiple_of(nr)
}

/// A microkernel shape of a variant, or why there is none.
fn check_shape(
    f: Family,
    name: &str,
    shapes: &[(usize, usize)],
    c: &GemmConfig,
) -> Result<(), KernelError> {
    if shapes.contains(&(c.mr, c.nr)) {
        return Ok(());
    }
    Err(invalid(
        f,
        format!(
            "no {}x{} {name} microkernel; shapes: {shapes:?}",
            c.mr, c.nr
        ),
    ))
}

/// What the direct variants need of a problem and config: B stored `[N, K]`, rows and slices
/// of bf16 that start on a pair of k values, and no `mc` blocking.
fn check_direct(f: Family, c: &GemmConfig, p: &GemmProblem) -> Result<(), KernelError> {
    let name = c.variant.name();
    if p.b_layout != BLayout::Nk {
        return Err(invalid(
            f,
            format!(
                "the {name} variant reads B stored [N, K] as a Linear layer's weights (b=nk), \
                 not [K, N]"
            ),
        ));
    }
    let pairs =
        p.dtype == DType::Bf16 || (p.fp8().is_some() && c.variant == GemmVariant::AmxDirect);
    if pairs && (!p.k.is_multiple_of(2) || !c.kc.is_multiple_of(2)) {
        return Err(invalid(
            f,
            format!(
                "the {name} variant on {} needs an even K and kc (pairs of k values); K = {}, \
                 kc = {}",
                p.dtype, p.k, c.kc
            ),
        ));
    }
    // The AMX kernel blocks the weights by mc rows; the others have no use for mc.
    if c.variant != GemmVariant::AmxDirect && c.mc != c.mr {
        return Err(invalid(
            f,
            format!(
                "the {name} variant has no mc blocking: mc must equal mr = {}, not {}",
                c.mr, c.mc
            ),
        ));
    }
    Ok(())
}

/// A microkernel shape of the f32 tables at the config's ISA level, or why there is none.
fn check_table_shape(f: Family, c: &GemmConfig) -> Result<(), KernelError> {
    let t = table(kernel_isa(c.isa));
    if t.ukr(c.mr, c.nr).is_some() {
        return Ok(());
    }
    Err(invalid(
        f,
        format!(
            "no {}x{} microkernel for {}; shapes: {:?}",
            c.mr, c.nr, c.isa, t.shapes
        ),
    ))
}

pub(super) fn candidates(p: &GemmProblem, host: &CpuInfo) -> Vec<GemmConfig> {
    let mut out = Vec::new();
    for isa in isa_levels(host.isa) {
        let t = table(kernel_isa(isa));
        for &threads in &thread_counts(host) {
            let dpbf16 = p.dtype == DType::Bf16 && host.avx512_bf16 && isa >= Isa::Avx512;
            // bf16 pairs as loaded; fp8 weights ([N, K]) widened to them as loaded.
            let fp8_pairs = p.fp8().is_some()
                && p.b_layout == BLayout::Nk
                && host.avx512_bf16
                && isa >= Isa::Avx512;
            let streams = [(GemmVariant::Stream, t.lanes)]
                .into_iter()
                .chain((dpbf16 || fp8_pairs).then_some((GemmVariant::StreamDpbf16, 32)));
            // Fixed chunk widths, and widths that deal the columns out evenly: one or four
            // chunks per thread.
            let mut widths = vec![64, 256, 1024];
            for per_thread in [1, 4] {
                let nc = p.n.div_ceil(threads * per_thread).next_multiple_of(4);
                if nc <= MAX_BLOCK && !widths.contains(&nc) {
                    widths.push(nc);
                }
            }
            // Weights stored `[K, N]` stream without the row prefetch either way.
            let prefetches: &[bool] = match p.b_layout {
                BLayout::Nk => &[true, false],
                BLayout::Kn => &[true],
            };
            let every_m = p.block.is_some() || p.int4.is_some();
            for (variant, nr) in streams.filter(|_| p.m <= STREAM_MAX_M || every_m) {
                for &rows in &STREAM_ROWS {
                    for &nc in &widths {
                        for &prefetch in prefetches {
                            out.push(GemmConfig {
                                variant,
                                isa,
                                mr: rows,
                                nr,
                                mc: rows,
                                kc: p.k,
                                nc,
                                split: Split::N,
                                threads,
                                prefetch,
                                inner: Inner::M,
                            });
                        }
                    }
                }
            }
            let shapes = t.shapes.iter().map(|&s| (GemmVariant::Packed, s)).chain(
                BF16_SHAPES
                    .iter()
                    .filter(|_| dpbf16)
                    .map(|&s| (GemmVariant::Dpbf16, s)),
            );
            let grid = Blocking {
                mc_tiles: &[8, 16],
                kc: &[256, 512, 768, 1024],
                nc_tiles: &[32, 128],
            };
            for (variant, shape) in shapes {
                grid.push(variant, isa, shape, threads, host, &mut out);
            }
            // Weights read in place: depths up to all of K, token panels of 4 to 16
            // slivers; no mc blocking.
            if p.b_layout == BLayout::Nk {
                let shapes: &[(usize, usize)] = match p.dtype {
                    DType::F32 => t.shapes,
                    DType::Bf16 if dpbf16 && p.k.is_multiple_of(2) => BF16_SHAPES,
                    _ => &[],
                };
                let depths = in_place_depths(p.k, &[1024, 4096]);
                let grid = Blocking {
                    mc_tiles: &[1],
                    kc: &depths,
                    nc_tiles: &[4, 8, 16],
                };
                for &shape in shapes {
                    grid.push(GemmVariant::Direct, isa, shape, threads, host, &mut out);
                }
            }
        }
    }
    // AMX tiles, at their own level: blocks of 4 or 8 tiles of rows, a B panel of 8 or 32
    // tiles of columns, depths of 8 to 64 k blocks.
    // fp8 on AMX tiles too, widened to bf16 as the packed kernel packs it.
    if (p.dtype == DType::Bf16 || p.fp8().is_some()) && host.isa == Isa::Avx512Amx {
        let grid = Blocking {
            mc_tiles: &[4, 8],
            kc: &[256, 512, 1024, 2048],
            nc_tiles: &[8, 32],
        };
        // The weights in place: blocks of one and eight weight slivers, depths of 8 k
        // blocks to all of K (2048: the bf16 guess past 64 tokens), token panels of 4 to 16
        // slivers.
        // Block-scaled fp8: slices of whole groups of k, whose products are scaled apart.
        let depths = match p.block {
            Some(block) => block_depths(p.k, block),
            None => in_place_depths(p.k, &[256, 512, 1024, 2048]),
        };
        let direct = Blocking {
            mc_tiles: &[1, 8],
            kc: &depths,
            nc_tiles: &[4, 8, 16],
        };
        // fp8 weights widened a sliver at a time as the tiles take them.
        let in_place = (p.dtype == DType::Bf16 || p.fp8().is_some())
            && p.b_layout == BLayout::Nk
            && p.k.is_multiple_of(2);
        for &threads in &thread_counts(host) {
            for &shape in AMX_SHAPES {
                // And a thread's share of N in one panel (or a few equal ones), where it is
                // wider than the grid's: what the heuristic takes for prompts.
                let share_tiles = [amx_share(p.n, shape.1, threads) / shape.1];
                let share = Blocking {
                    mc_tiles: &[8],
                    kc: &[1024, 2048],
                    nc_tiles: &share_tiles,
                };
                let wide = share_tiles[0] > 32;
                for blocking in std::iter::once(&grid).chain(wide.then_some(&share)) {
                    blocking.push(
                        GemmVariant::Amx,
                        Isa::Avx512Amx,
                        shape,
                        threads,
                        host,
                        &mut out,
                    );
                }
                if in_place {
                    direct.push(
                        GemmVariant::AmxDirect,
                        Isa::Avx512Amx,
                        shape,
                        threads,
                        host,
                        &mut out,
                    );
                }
            }
        }
    }
    // Block-scaled fp8: the stream kernel at every M, and amx-direct (see `validate`).
    if p.block.is_some() {
        out.retain(|c| matches!(c.variant, GemmVariant::Stream | GemmVariant::AmxDirect));
    }
    // Int4 weights: the stream kernels (which widen each word as they multiply it: to f32,
    // or to bf16 pairs for `vdpbf16ps`) at every M, and from two tokens the dense problem's
    // kernels, run after a pass that dequantizes the weights to the dtype: `[N, K]` for those
    // that read B in place, `[K, N]` for the others (see `validate`).
    if let (Some(kn), Some(nk)) = (p.dequantized(), p.dequantized_as(BLayout::Nk)) {
        out.retain(|c| matches!(c.variant, GemmVariant::Stream | GemmVariant::StreamDpbf16));
        if p.m > 1 {
            let streams = |c: &GemmConfig| {
                matches!(c.variant, GemmVariant::Stream | GemmVariant::StreamDpbf16)
            };
            let in_place = candidates(&nk, host)
                .into_iter()
                .filter(|c| c.variant.reads_b_in_place());
            let packing = candidates(&kn, host)
                .into_iter()
                .filter(|c| !streams(c) && !c.variant.reads_b_in_place());
            out.extend(in_place.chain(packing));
        }
    }
    out
}

pub(super) fn validate(c: &GemmConfig, p: &GemmProblem, host: &CpuInfo) -> Result<(), KernelError> {
    let f = Family::Gemm;
    let streams = matches!(c.variant, GemmVariant::Stream | GemmVariant::StreamDpbf16);
    if let (Some(dense), false) = (p.dequantized_as(c.variant.int4_pass_layout()), streams) {
        // The other variants run after the weights are dequantized, on the dense problem.
        return validate(c, &dense, host);
    }
    if let Some(block) = p.block {
        match c.variant {
            GemmVariant::Stream => {}
            GemmVariant::AmxDirect if c.kc.is_multiple_of(block) => {}
            GemmVariant::AmxDirect => {
                return Err(invalid(
                    f,
                    format!(
                        "amx-direct runs block-scaled fp8 in slices of whole groups of k: kc \
                         = {} is not a multiple of the problem's block, {block}",
                        c.kc
                    ),
                ))
            }
            _ => {
                return Err(invalid(
                    f,
                    format!(
                        "block-scaled fp8 runs on the stream variant (each group's scales \
                         folded into the tokens it streams) and on amx-direct (each group's \
                         tile products scaled apart); the {} variant takes scales per \
                         tensor, token or channel only",
                        c.variant.name()
                    ),
                ))
            }
        }
    }
    let amx = matches!(c.variant, GemmVariant::Amx | GemmVariant::AmxDirect);
    if amx && host.isa != Isa::Avx512Amx {
        return Err(invalid(
            f,
            format!(
                "the {} variant needs AMX tiles (AMX-TILE and AMX-BF16, Sapphire Rapids or \
                 later, with the kernel's permission for tile data), which {} ({}) lacks",
                c.variant.name(),
                host.model,
                host.isa
            ),
        ));
    }
    check_common(f, c.isa, c.threads, host)?;
    if !c.prefetch {
        let streaming = matches!(c.variant, GemmVariant::Stream | GemmVariant::StreamDpbf16);
        if !streaming || p.b_layout != BLayout::Nk {
            return Err(invalid(
                f,
                format!(
                    "prefetch = false applies to the stream variants with B stored [N, K] \
                     (b=nk), which prefetch their weight rows; the {} variant with b={} \
                     has no prefetch to turn off: drop the field",
                    c.variant.name(),
                    p.b_layout
                ),
            ));
        }
    }
    if c.inner == Inner::N && !in_loop_nest(c.variant) {
        return Err(invalid(
            f,
            format!(
                "inner = n orders the tiles of the packed loop nest (the packed, dpbf16 and \
                 amx variants); the {} variant has no such loop: drop the field",
                c.variant.name()
            ),
        ));
    }
    match c.variant {
        GemmVariant::Stream | GemmVariant::StreamDpbf16 => {
            if c.variant == GemmVariant::StreamDpbf16 && p.fp8().is_some() {
                fp8_pairs(c, p, host)?;
            } else if c.variant == GemmVariant::StreamDpbf16 {
                bf16_pairs(c, p, host)?;
            }
            if p.m > STREAM_MAX_M && p.block.is_none() && p.int4.is_none() {
                return Err(invalid(
                    f,
                    format!(
                        "the stream variant is for decode shapes, M <= {STREAM_MAX_M}; M = {}",
                        p.m
                    ),
                ));
            }
            if !STREAM_ROWS.contains(&c.mr) {
                return Err(invalid(
                    f,
                    format!("stream rows mr = {} must be one of {STREAM_ROWS:?}", c.mr),
                ));
            }
            if c.nc == 0 || c.nc > MAX_BLOCK || !c.nc.is_multiple_of(4) {
                return Err(invalid(
                    f,
                    format!(
                        "stream nc = {} must be a multiple of 4 in 4..={MAX_BLOCK}",
                        c.nc
                    ),
                ));
            }
        }
        GemmVariant::Dpbf16 => {
            bf16_pairs(c, p, host)?;
            check_shape(f, "dpbf16", BF16_SHAPES, c)?;
            check_blocks(f, c)?;
        }
        GemmVariant::Direct => {
            match p.dtype {
                DType::F32 => check_table_shape(f, c)?,
                DType::Bf16 => {
                    bf16_pairs(c, p, host)?;
                    check_shape(f, "direct bf16", BF16_SHAPES, c)?;
                }
                DType::F16 | DType::Fp8(_) => {
                    return Err(invalid(
                        f,
                        "the direct variant takes f32, or bf16 on hosts with AVX-512-BF16, \
                         not f16",
                    ))
                }
            }
            check_direct(f, c, p)?;
            check_blocks(f, c)?;
        }
        GemmVariant::Amx | GemmVariant::AmxDirect => {
            let name = c.variant.name();
            // The packed kernel widens fp8 bytes to bf16 as it packs them; amx-direct reads
            // bf16 weights in place, as tiles load them, and widens fp8 ones a sliver at a
            // time.
            if p.dtype != DType::Bf16 && p.fp8().is_none() {
                return Err(invalid(
                    f,
                    format!(
                        "the {name} variant takes bf16 inputs (or fp8, widened to bf16), not {}",
                        p.dtype
                    ),
                ));
            }
            if c.isa != Isa::Avx512Amx {
                return Err(invalid(
                    f,
                    format!("the {name} variant runs at isa avx512-amx, not {}", c.isa),
                ));
            }
            check_shape(f, name, AMX_SHAPES, c)?;
            check_blocks(f, c)?;
            if c.variant == GemmVariant::AmxDirect {
                check_direct(f, c, p)?;
                let words = crate::cpu::amx_direct_scratch_len(p, c) / c.threads;
                if words > MAX_SCRATCH_PER_THREAD {
                    return Err(invalid(
                        f,
                        format!(
                            "the amx-direct token panel (nc = {} tokens × K = {}) and \
                             accumulators (mc × nc) need {words} values per thread, more \
                             than {MAX_SCRATCH_PER_THREAD}: lower nc",
                            c.nc, p.k
                        ),
                    ));
                }
            }
        }
        GemmVariant::Packed => {
            check_table_shape(f, c)?;
            check_blocks(f, c)?;
        }
    }
    Ok(())
}

/// The most tokens the int4 guess streams, widening the words to f32 and to bf16 pairs
/// (measured in [`heuristic`]).
const INT4_STREAM_MAX_M: usize = 32;
const INT4_PAIRS_MAX_M: usize = 128;

/// The default config of a block-scaled fp8 or int4 problem: the stream variant, which runs
/// it on every host, four rows a pass, about four 256-column chunks a thread; also its guess
/// (a block-scaled one's except from 5 tokens on AMX hosts, [`heuristic`]).
pub(super) fn block_stream(p: &GemmProblem, host: &CpuInfo) -> GemmConfig {
    let threads = host.threads.max(1);
    let chunks = p.n.div_ceil(256 * threads).max(1) * threads;
    GemmConfig {
        variant: GemmVariant::Stream,
        isa: host.isa,
        mr: if p.m >= 4 { 4 } else { p.m.min(2) },
        nr: table(kernel_isa(host.isa)).lanes,
        mc: 4,
        kc: p.k,
        nc: p.n.div_ceil(chunks).next_multiple_of(4).min(256),
        split: Split::N,
        threads,
        prefetch: true,
        inner: Inner::M,
    }
}

pub(super) fn default(host: &CpuInfo) -> GemmConfig {
    let t = table(kernel_isa(host.isa));
    let (mr, nr) = t.shapes[t.shapes.len().min(2) - 1];
    GemmConfig {
        variant: GemmVariant::Packed,
        isa: host.isa,
        mr,
        nr,
        mc: mr * 16,
        kc: 256,
        nc: nr * 32,
        split: Split::N,
        threads: host.threads.max(1),
        prefetch: true,
        inner: Inner::M,
    }
}

/// The packed AMX kernel with large blocks, as prompts take it (measured in [`heuristic`]):
/// B panels of a thread's share of N from 128 tokens, of 1024 columns below.
fn amx_prompt(p: &GemmProblem, host: &CpuInfo, threads: usize) -> GemmConfig {
    GemmConfig {
        variant: GemmVariant::Amx,
        isa: host.isa,
        mr: 32,
        nr: 32,
        mc: 256,
        kc: 2048,
        nc: if p.m >= 128 {
            amx_share(p.n, 32, threads)
        } else {
            1024
        },
        split: Split::N,
        threads,
        prefetch: true,
        inner: Inner::M,
    }
}

/// The amx-direct kernel as decode and short prompts take it (measured in [`heuristic`]):
/// 32-row weight slivers in blocks of 256, token slivers of 16 up to 16 tokens and of 32
/// past them, all the tokens (up to 256) in one panel, slices of `kc`.
fn amx_direct(p: &GemmProblem, host: &CpuInfo, threads: usize, kc: usize) -> GemmConfig {
    let nr = if p.m <= 16 { 16 } else { 32 };
    GemmConfig {
        variant: GemmVariant::AmxDirect,
        isa: host.isa,
        mr: 32,
        nr,
        mc: 256,
        kc,
        nc: p.m.next_multiple_of(nr).min(256),
        split: Split::N,
        threads,
        prefetch: true,
        inner: Inner::M,
    }
}

pub(super) fn heuristic(p: &GemmProblem, host: &CpuInfo) -> GemmConfig {
    let threads = host.threads.max(1);
    // Int4 weights: streamed (on bf16 pairs to 128 tokens where the host has AVX-512-BF16
    // and the activations are bf16, else widened to f32 to 32 tokens); past that the dense
    // problem's guess, after the dequantizing pass, which prompts amortize. Two Zen 4
    // threads (session 62), cold, medians, `tune bench`, Llama-70B TP8 gate_up (N 7168, K
    // 8192) / qkv (1280, 8192), ms, widened / pairs / the pass and the dense guess: M = 16
    // 11.4-12.3 / 6.3-6.5 / - and 2.5-2.7 / 1.4-2.2 / -, M = 32 23.2 / 11.8 / 34.2 and 5.2 /
    // 2.3-2.4 / 6.0, M = 64 45.0-45.3 / 22.8-22.9 / 41.0 and 9.8-10.4 / 5.1-5.5 / 6.0-6.5,
    // M = 128 88.7 / 44.5-44.7 / 59.5-60.3 and 18.4 / 10.7 / 10.5-10.7, M = 256 - / 89.0-89.3
    // / 96.6-98.4 and - / 21.1-21.2 / 17.4-17.6. Session 63, the `[N, K]` pass and `direct`
    // (in place): M = 128 50.4-50.8 and 8.4-8.5 against pairs' 44.1-45.9 and 9.7, M = 256
    // 83.0-84.2 and 14.8-15.5 against the `[K, N]` pass's 93.8-105 and 15.7-17.7.
    if let (Some(kn), Some(nk)) = (p.dequantized(), p.dequantized_as(BLayout::Nk)) {
        // After the pass, the guess for weights stored as a Linear layer stores them where
        // it reads them in place, else the guess for `[K, N]`.
        let in_place = heuristic(&nk, host);
        let after_pass = match in_place.variant.reads_b_in_place() {
            true => in_place,
            false => heuristic(&kn, host),
        };
        let streams = matches!(
            after_pass.variant,
            GemmVariant::Stream | GemmVariant::StreamDpbf16
        );
        let pairs = p.dtype == DType::Bf16 && host.avx512_bf16 && host.isa >= Isa::Avx512;
        return match (pairs, p.m) {
            (true, m) if m <= INT4_PAIRS_MAX_M || streams => GemmConfig {
                variant: GemmVariant::StreamDpbf16,
                nr: 32,
                ..block_stream(p, host)
            },
            (false, m) if m <= INT4_STREAM_MAX_M || streams => block_stream(p, host),
            _ => after_pass,
        };
    }
    if let Some(block) = p.block {
        // Block-scaled fp8 from 5 tokens on AMX tiles, in slices of whole groups of about
        // 512 values; the stream kernel below them. Two threads of an AMX Xeon (session 60),
        // cold, DeepSeek-V3 TP8 gate_up (N 4608, K 7168) / down (7168, 2304), blocks of 128,
        // `tune bench`, ms, amx-direct (mr 32) in slices of 128 / 512 / 1024 / 2048 / all of
        // K: M = 9 4.3 / 3.1 / 2.9-3.2 / 3.3-3.4 / 2.8-3.1 and 2.1 / 1.6 / 1.6 / 1.6 / 1.5,
        // M = 64 7.9-8.0 / 5.7-5.8 / 5.7-5.9 / 6.2-6.3 / 5.5-5.7 and 4.7-5.0 / 3.7-3.8 /
        // 3.3-3.6 / 3.4-3.6 / 3.5, M = 256 19.2-20.7 / 16.0-16.2 / 16.0-16.5 / 16.8-17.3 /
        // 20.6-20.9 and 12.2-12.5 / 11.6-11.7 / 11.1-14.2 / 11.4-11.5 / 10.4; slices of one
        // group read each weight row in 128-byte runs. Against the stream kernel, slices of
        // 512: M = 4 2.9-3.0 / 1.5-1.6 against 2.2-2.3 / 1.5, M = 5 3.0 / 1.6-1.7 against 3.3
        // / 2.0-2.1, M = 8 3.0-3.1 / 1.6-2.2 against 3.8-3.9 / 2.4, M = 64 against 28.0-28.3 /
        // 14.5. The same shapes scaled per channel: 2.5-2.7 / 1.3-1.4 at M = 5 to 16, 4.4-4.6
        // / 2.4 at 64, 12.5-12.8 / 8.2 at 256.
        if host.isa == Isa::Avx512Amx && p.k.is_multiple_of(2) && p.m >= 5 {
            return amx_direct(p, host, threads, (512 / block).max(1) * block);
        }
        return block_stream(p, host);
    }
    let t = table(kernel_isa(host.isa));
    // Long prompts on Intel cores without AMX tiles: bf16 widened to f32 while packing, the
    // f32 microkernels doing the multiply-adds, because `vdpbf16ps` issues there at half the
    // f32 FMA rate and so buys no arithmetic, only a costlier repacking. Two threads of a
    // Xeon whose KVM guest reports AVX-512-BF16 but no AMX (family 6 model 207, session 18),
    // cold, Llama-70B at M = 2048: gate_up 1319-1347 ms widened (8×32, kc = 1024) against
    // 1680-1752 for the direct pair kernel this took before and 1686-1723 packed on pairs;
    // qkv 241-242 against 291-428 and 303-381; o 170-207 against 274-290; this heuristic
    // against the one before, alternating: qkv 227-232 against 349-376, down 604-645 against
    // 837-859 (PyTorch's oneDNN, warm, in the same session: 282 and 818). At M = 128 the
    // pair kernels led (gate_up 111-113 against 134-136 widened); M = 512 was within this
    // host's noise then, and from 512 rows up on session 52's (the same kind), in turn, the
    // widened packed kernel against the direct pair kernel, ms: qkv 48.3-48.5 against
    // 63.9-64.0, o 37.8-38.9 against 57.3-63.4, down 134.8-149.7 against 182.5-186.2,
    // gate_up 277-294 against 355-357. From 256 rows (session 53, three rounds in turn):
    // qkv 29.1-29.5 against 32.1-32.2, o 22.5 against 27.6-28.0, down 80.5-81.9 against
    // 90.1-92.5, gate_up 160.6-166.2 against 176.6-176.8; at M = 192 even (qkv 24.8 against
    // 24.2-24.4, o 19.4-19.5 against 21.6-21.8, down 67.8-69.7 against 68.7-68.9); at M =
    // 128 the pairs ahead (qkv 20.3-20.7 against 16.0-18.9, o 16.5-18.6 against 14.5-14.7,
    // down 55.8 against 45.7-46.3), and at M = 32 (qkv 13.4-13.5 against 4.1: the packed
    // kernel copies every weight).
    // Decode of 3 to 16 tokens on such cores widens too: the widening stream kernel against
    // the pair kernels (stream, direct from 9 rows), the same host kind, cold, two threads,
    // in turn (session 52, ms): gate_up at M = 3 5.41-5.59 against
    // 7.68-8.01, M = 4 4.70-5.01 against 5.70-6.50, M = 8 6.87-7.73 against 10.43-10.48,
    // M = 16 10.74-11.21 against 11.91-11.95; qkv at M = 4 0.82-0.84 against 1.12-1.14,
    // M = 8 1.60-1.64 against 1.86-1.87; down and o at M = 8 3.67-3.75 and 1.34-1.45
    // against 4.91-5.15 and 1.55-1.72. At one and two tokens, bound by the weights' reads,
    // the pairs read them faster (gate_up 4.14-4.58 against 4.91-4.93 ms at M = 1, 4.44-4.55
    // against 5.48-5.55 at M = 2).
    let pairs = p.dtype == DType::Bf16
        && host.avx512_bf16
        && !(host.intel() && host.isa != Isa::Avx512Amx && (p.m >= 256 || (3..=16).contains(&p.m)));
    // bf16 pairs at 9 to 16 rows: the direct kernel's 8×16 tile (below). Two Zen 4
    // threads, Llama-70B TP8 qkv / o / gate_up / down: M = 16 1.18 / 1.29 / 6.37 / 3.80 ms
    // against 1.79 / 1.57 / 9.34 / 5.27 streaming four rows at a time, M = 12 1.14 / 1.24
    // / 6.28 / 3.40 against 1.49 / 1.31 / 6.61 / 3.53; at M = 8 streaming is faster (5.13
    // against 6.41 ms for gate_up).
    let in_place = p.b_layout == BLayout::Nk && p.k.is_multiple_of(2);
    // bf16 on AMX tiles, the weights in place, from 3 rows up: two threads of a Xeon with
    // AMX (KVM guest, family 6 model 207), Llama-70B gate_up (N = 7168, K = 8192), cold,
    // against the AVX-512-BF16 kernels below: M = 4 / 8 / 16 / 128 / 2048 4.34 / 5.56 /
    // 4.56 / 19.2 / 300 ms against 5.06 / 8.76 / 16.6 / 97.7 / 1593 (M = 1: 4.52 against
    // 4.19 streaming); 32 × 32 tiles beat 32 × 16 and 16 × 32 (25.8, 28.1 ms at M = 128).
    // Blocks of 256 weight rows whose accumulators stay in L2 across slices of 1024
    // (amx_direct's blocking) against all of K in one slice with 64 tokens, 64-byte
    // aligned operands, repeated calls, gate_up M = 2048: one thread 400-414 ms against
    // 625-830 over two rounds, two threads 226 against 426; qkv (N = 1280) two threads
    // 38 against 118 ms. Cold, two threads, the two were within this host's noise at
    // M = 16 and 128.
    // B stored [K, N] (or an odd K): the packed AMX kernel, M = 16 / 128 15.2 / 25.3 ms
    // against 55.6 / 106 for the AVX-512-BF16 ones.
    // fp8 past 16 tokens on AMX tiles, widened as the packed kernel packs it: two threads of
    // this Xeon (AMX, family 6 model 167), cold, Llama-70B gate_up (N = 7168, K = 8192), the
    // config below against the widening stream and packed f32 kernels (`tune bench`, ms): M =
    // 16 16.5 / 13.2, 64 17.9 / 89.8, 512 49.6 / 297.5, 2048 149.4 / 1020.0; bf16 on its
    // heuristic 5.0, 10.2, 42.4, 140.6 (packing widens every weight each call, the fixed 15
    // ms of the small M). Up to 16 tokens the stream kernel reads the bytes in place (M = 4:
    // 4.0 ms against bf16's 4.8).
    // From 5 to 256 tokens, fp8 weights [N, K] widened a sliver at a time into amx-direct's
    // tiles (session 58, same host, cold, medians, `tune bench`, ms, amx-direct with kc 1024
    // against the heuristic before, gate_up / down / qkv): M = 10 7.8 / 3.7 / 1.4 against 8.9
    // / 4.8 / 1.7, M = 16 7.6-7.9 / 3.9-4.1 / 1.4 against 12.6 / 6.5 / 2.7 (the stream
    // kernel), M = 64 11.3-11.4 / 5.5-5.6 / 2.2-2.6 against 17-19 / 10.6-11.0 / 3.4, M = 128
    // 14.7 / 9.4 / 3.2 against 19.7 / 10.3 / 3.6, M = 256 23.3 / 13.7 / 5.1 against 30.3 / 14.2
    // / 5.1 (the packed tiles). Then (session 59) each slice's next sliver prefetched and the
    // bytes widened by table lookups (VBMI): M = 5 5.1-5.3 / 2.4 / 1.0 against the stream
    // kernel's 5.6-5.7 / 3.6-3.8 / 1.1 (at M = 4 it wins, 3.9-4.1 / 2.3 / 0.7), M = 8
    // 5.1-5.2 / 2.3-2.6 / 0.9 against 6.5-6.6 / 3.6-3.7 / 1.2-1.25, M = 16 5.5-5.6 / 2.6-2.8 /
    // 1.0, M = 64 8.1 / 4.1-4.5 / 1.7, M = 128 12.2-12.5 / 6.9-7.1 / 2.6-2.7 against the
    // session-58 build's 15.0-15.4 / 10.2-10.3 / 3.2-3.4, M = 256 21.8 / 12.7-12.9 / 4.8-4.9
    // against 23.5-23.9 / 13.8-14.4 / 5.0-5.2. All of K in one slice was as fast up to 16
    // tokens and 2-10% faster on gate_up from 32 to 64 (5.8-6.1 against 6.5-6.6 at M = 32),
    // slower on down; at K = 28672 (Llama-70B TP1 down) it lost, 25.6 against 21.1 ms at M = 16.
    if p.fp8().is_some() && host.isa == Isa::Avx512Amx && in_place && (5..=256).contains(&p.m) {
        return amx_direct(p, host, threads, p.k.min(1024));
    }
    if p.fp8().is_some() && host.isa == Isa::Avx512Amx && p.m > 16 {
        return amx_prompt(p, host, threads);
    }
    if p.dtype == DType::Bf16 && host.isa == Isa::Avx512Amx && p.m >= 3 {
        // Prompts: the packed kernel with large blocks. Packing the weights is one pass,
        // repaid over 1024 tokens and more; 64-byte aligned operands, repeated calls, two
        // threads, M = 2048: qkv / o / gate_up / down 46 / 59 / 149 / 196 ms against
        // amx-direct's 65 / 65 / 203 / 206, one thread gate_up 319-357 against 383-418.
        // Since the tiles are configured once a task (session 19), over 512 tokens too, and
        // over 64 where K is at most 1024 (the direct kernel's transposition of each Cᵀ tile
        // into C is then a large share of its work). Cold, two threads, the packed config
        // below against amx-direct's below it, Llama-70B TP8 (ms): M = 512 qkv 7.2 / 8.1, o
        // 6.7 / 11.2, gate_up 37.6-38.9 / 36.8-39.6, down 20.3-21.3 / 22.8-23.8; o (K = 1024)
        // at M = 64 / 128 / 256 1.5 / 2.2 / 4.2 against 1.9 / 3.1 / 5.4, at M = 16 and 32
        // behind (1.2-1.3 against 0.7-0.9); at M = 256 with K = 3584 and 8192 behind (12.2-12.3
        // against 11.4-11.5, 22.5-23.8 against 19.1-19.9). B panels of a thread's whole share
        // of N ([`amx_share`]) against 1024 columns, cold, two threads (session 20): M = 2048
        // gate_up 106.9 against 114.2 ms, o 18.5 against 20.1, down 57.1 against 69.9; M =
        // 512 gate_up 32.2 / 34.8, o 5.3 / 6.4, down 16.7 / 18.2; o at M = 256 3.3 / 3.9;
        // one thread, M = 2048, gate_up 218.6 (3584 columns) / 227.4 (7168: 208.7, at 32 MiB
        // of scratch), qkv 39.5 / 43.6. Below 128 tokens A is cheap to pack again: o at M = 64
        // 1.51 against 1.47 ms, so 1024 columns there.
        if in_place && (p.m >= 512 || (p.k <= 1024 && p.m >= 64)) {
            return amx_prompt(p, host, threads);
        }
        // Up to 64 tokens each weight row in one slice: the tiles then load whole rows,
        // runs the hardware prefetcher follows, where slices of 1024 are 2 KiB runs of 32
        // rows at a time. Cold, two threads, gate_up / down / qkv, ms, all of K against 1024
        // (session 59): M = 3 4.4-4.5 / 2.3-2.4 / 0.8 against 4.9-5.2 / 2.5-2.7 / 0.9, M = 8
        // 4.6 / 2.4 / 0.8 against 5.1 / 2.5 / 0.9, M = 16 4.4-4.8 / 2.2-2.4 against 4.7-4.9 /
        // 2.5-2.6, M = 32 5.3 / 2.9 / 1.1 against 6.4 / 3.2 / 1.2, M = 64 8.2-8.5 / 3.5-3.6 / 1.6
        // against 10.0-10.2 / 5.2-5.4 / 1.9; M = 128 16.2 / 7.1 / 3.2 against 14.7 / 8.3 / 2.9
        // and M = 256 26.2 / 12.9 / 4.8 against 21.0 / 11.5 / 4.5 (the token panel's slice
        // then outgrows L2). K = 14336 at M = 16: 4.7 against 5.2; K = 28672: 10.4 against 10.2.
        // Past 64 tokens slices of 2048 (4 KiB runs), against 1024 and 4096: M = 128
        // 11.2-12.1 / 7.1-7.2 / 2.5-2.6 against 13.9-14.2 / 7.7-7.9 / 2.7-2.8 and 12.3 / 6.8-7.0
        // / 2.3, M = 256 19.8-19.9 / 10.7-10.8 / 4.1 against 20.2-21.2 / 11.1-11.5 / 4.3-4.4 and
        // 23.1-23.7 / 12.3-12.4 / 4.3-4.5, M = 384 30.7-31.3 / 16.5-16.9 / 6.4-6.6 against
        // 33.7-33.8 / 18.6-18.8 / 6.5-6.6 and 35.3-35.8 / 18.8-19.2 / 6.5-6.6; at M = 96 all of
        // K and 2048 split (gate_up 11.3-11.4 against 10.9-11.2, down 4.8-4.9 against 6.0).
        if in_place {
            let whole_rows = p.m <= 64 && p.k <= 16384;
            let kc = if whole_rows { p.k } else { p.k.min(2048) };
            return amx_direct(p, host, threads, kc);
        }
        let mr = if p.m <= 16 { 16 } else { 32 };
        return GemmConfig {
            variant: GemmVariant::Amx,
            isa: host.isa,
            mr,
            nr: 32,
            mc: p.m.next_multiple_of(mr).min(128),
            kc: 512,
            nc: 512,
            split: Split::N,
            threads,
            prefetch: true,
            inner: Inner::M,
        };
    }
    let direct_few = pairs && p.m > 8 && in_place;
    if p.m <= 16 && !direct_few {
        // bf16 pairs multiplied as loaded: measured on two Zen 4 cores at M = 1, cold,
        // 29.8 GB/s against 18.1 GB/s for widening (qkv, 8192 → 1280).
        let (variant, nr) = if pairs {
            (GemmVariant::StreamDpbf16, 32)
        } else {
            (GemmVariant::Stream, t.lanes)
        };
        // Column chunks of about 256, as many per thread: with 1280 columns in five
        // chunks of 256, one of two threads read three fifths of the weights (qkv, two
        // threads, repeated calls: 1.15 ms against 0.77 ms with ten chunks of 128).
        let chunks = p.n.div_ceil(256 * threads).max(1) * threads;
        // The weight-row prefetch, measured cold at M = 1 (`tune bench`, alternating, two
        // threads): on an AMX Xeon the widening kernel did better without it for rows of
        // up to 16 KiB (f32 o, 4 KiB rows: 1.04–1.07 ms against 1.07–1.10; down, 14 KiB:
        // 3.71–3.75 against 3.82–3.84) and with it beyond (qkv, 32 KiB: 1.24–1.27 against
        // 1.28–1.30; gate_up even), while the bf16 pair kernel gained 4–21% from it
        // everywhere; on a Zen 4 it paid for both (f32 down 7%).
        let row_bytes = p.k * p.dtype.size();
        let prefetch = !(variant == GemmVariant::Stream
            && host.isa == Isa::Avx512Amx
            && p.m == 1
            && p.b_layout == BLayout::Nk
            && row_bytes <= 16 << 10);
        return GemmConfig {
            variant,
            isa: host.isa,
            mr: if p.m >= 4 { 4 } else { p.m.min(2) },
            nr,
            mc: 4,
            kc: p.k,
            nc: p.n.div_ceil(chunks).next_multiple_of(4).min(256),
            split: Split::N,
            threads,
            prefetch,
            inner: Inner::M,
        };
    }
    // A Linear layer's weights read in place, all of K deep (up to 8192 per slice), token
    // panels of up to 256. Measured on two Zen 4 threads against the packed heuristic below
    // (`tune bench`, medians, Llama-70B gate_up N = 7168, K = 8192): bf16 8×32 at M = 32 /
    // 128 / 256 / 2048: 8.9 / 34.0 / 67.6 / 555 ms against 15.2 / 40.7 / 76.4 / 588 (qkv,
    // o and down at M = 2048 5–9% faster too); f32 12×32 at M = 32 / 128: 18.9 / 75.7 ms
    // against 29.7 / 80.4, but 162 against 150 at M = 256. At M = 16 the stream kernels
    // above are as fast or faster. f32 takes it where the 12×32 microkernel exists
    // (AVX-512); other levels were not measured.
    let direct_max_m = if pairs { usize::MAX } else { 128 };
    let (mr, nr) = match (pairs, p.m <= 16) {
        (true, true) => (8, 16),
        (true, false) => (8, 32),
        (false, _) => (12, 32),
    };
    let kernel = if pairs {
        p.k.is_multiple_of(2)
    } else {
        p.dtype == DType::F32 && t.ukr(mr, nr).is_some()
    };
    if p.b_layout == BLayout::Nk && p.m <= direct_max_m && kernel {
        let slices = p.k.div_ceil(8192);
        return GemmConfig {
            variant: GemmVariant::Direct,
            isa: host.isa,
            mr,
            nr,
            mc: mr,
            kc: p.k.div_ceil(slices).next_multiple_of(2),
            nc: p.m.next_multiple_of(nr).min(256),
            split: Split::N,
            threads,
            prefetch: true,
            inner: Inner::M,
        };
    }
    // bf16 on AVX-512-BF16: the pair kernel does twice the multiply-adds per instruction.
    // Measured on one Zen 4 core: 12×32 with nc = 2048 is fastest on 2048³ (202 GFLOP/s);
    // with few rows a narrower B panel that stays in L2 wins (M = 128: nc = 512).
    if pairs {
        let kc = p.k.min(768);
        return GemmConfig {
            variant: GemmVariant::Dpbf16,
            isa: host.isa,
            mr: 12,
            nr: 32,
            mc: 96.min(p.m.next_multiple_of(12)),
            kc,
            nc: (if p.m <= 256 { 512 } else { 2048 }).min(p.n.next_multiple_of(32)),
            split: if p.n >= p.m { Split::N } else { Split::M },
            threads,
            prefetch: true,
            inner: Inner::M,
        };
    }
    // Two vectors wide and 8 rows (or the tallest below): 16 accumulators leave registers for
    // the B loads and broadcasts on every ISA with 32 vector registers. On the Xeons with
    // AMX, 12 rows (24 accumulators, 12 broadcasts and 2 loads per 24 FMAs): one thread,
    // f32, repeated calls, 2048³ 91.2 ms against 95.7 and Llama-70B qkv / o / down at
    // M = 2048 5%, 3%, 4% faster, two threads 5-7% (session 11); other hosts unmeasured.
    let tallest = if host.isa == Isa::Avx512Amx { 12 } else { 8 };
    let (mr, nr) = t
        .shapes
        .iter()
        .copied()
        .filter(|&(mr, nr)| nr == 2 * t.lanes && mr <= tallest)
        .max_by_key(|&(mr, _)| mr)
        .unwrap_or(t.shapes[0]);
    // A deep kc amortises C updates; an A sliver of mr·kc stays in L1 while a B sliver of
    // kc·nr streams from L2, and a B panel of kc·nc (4 MiB) is reused from L3 by every row
    // block. Measured on a 2-core Zen 4 (1 MiB L2, 32 MiB L3), f32, cold cache: 2048³ on
    // one thread 165 ms with kc = 1024, nc = 1024 against 171 ms with kc = 768 and 176 ms
    // with the L2-sized panel (nc = 160) this used before; Llama-70B gate_up at M = 2048 on
    // two threads 1272 ms against 1661 ms.
    // A thread's columns up to 1280 wide take one panel: a second, narrow one re-packs all
    // of A for little work (Llama-70B qkv, N = 1280, M = 2048, one thread: 395 ms against
    // 417 ms with nc = 1024).
    // On the Xeons with AMX the other tile order with a shallow kc: each A sliver (12 ×
    // 256, 12 KiB) stays in L1 while it sweeps a B panel of at most 1280 × 256 (1.25 MiB)
    // in L2. Two threads, f32, repeated calls, the configs interleaved round by round
    // (session 13): 2048³ 47.4 ms against 49.1, Llama-70B at M = 2048 o 95.0 against 97.0,
    // qkv 118.6 against 122.7, gate_up 692 against 702; one thread 2048³ 93.5 against
    // 95.7. At M = 256 to 1024 mixed, within 4% either way (o at M = 1024 43.9 against
    // 45.4, gate_up 320 against 315). Other hosts unmeasured.
    let (inner, kc) = if host.isa == Isa::Avx512Amx {
        (Inner::N, p.k.min(256))
    } else {
        (Inner::M, p.k.min(1024))
    };
    let mc = (mr * 8).min(p.m.next_multiple_of(mr));
    let split = if p.n >= p.m { Split::N } else { Split::M };
    let share = match split {
        Split::N => p.n.div_ceil(threads),
        Split::M => p.n,
    };
    let nc = if share <= 1280 {
        share.next_multiple_of(nr)
    } else {
        1024
    };
    GemmConfig {
        variant: GemmVariant::Packed,
        isa: host.isa,
        mr,
        nr,
        mc,
        kc,
        nc,
        split,
        threads,
        prefetch: true,
        inner,
    }
}
