//! The GEMM's GPU space: the tiled, MFMA, mma, wgmma and skinny variants' rules, split-K for
//! decode shapes, the candidates in the order a budgeted search should meet them, and the
//! untuned configs.

use std::cmp::Reverse;

use crate::config::{GpuGemmConfig, GpuGemmVariant};
use crate::device::GpuModel;
use crate::problem::GemmProblem;
use crate::{BLayout, DType, Family, KernelError};

use super::{
    check_threads, has_fp8_mfma, has_fp8_mma, has_mfma, has_mma, has_wgmma, invalid, vec_of,
};

/// Blocks that may share the k range of one GEMM tile (split-K).
pub const GPU_MAX_SPLIT_K: usize = 16;

/// The most device memory a split-K GEMM's partial products may take; splits needing more
/// are invalid (they belong to prefill shapes, which have tiles enough without them).
pub const GPU_SPLIT_K_WORKSPACE_BYTES: usize = 64 << 20;

/// C tiles a block of the specialized wgmma variant may take in turn.
const GPU_MAX_BLOCK_TILES: usize = 64;

/// Accumulators a thread of the wgmma variant holds: `tm` tiles of 64 rows by `tn`, `tn / 2`
/// floats each over a warpgroup's 128 threads.
const WGMMA_MAX_ACCUMULATORS: usize = 128;

/// Accumulators a lane of the skinny variant holds: `bm` rows of A by `tn` weight rows.
const SKINNY_MAX_ACCUMULATORS: usize = 32;

/// A matrix-core GEMM variant's first two rules: the model has its `instructions`, and the
/// inputs are 16-bit, or fp8 staged as f16 (one-stage MFMA and mma; `validate`).
fn matrix_cores(
    g: &GpuModel,
    p: &GemmProblem,
    present: bool,
    variant: &str,
    instructions: &str,
) -> Result<(), KernelError> {
    if !present {
        return Err(invalid(
            Family::Gemm,
            format!("{} ({}) has no {instructions}", g.name, g.arch),
        ));
    }
    if p.dtype == DType::F32 {
        return Err(invalid(
            Family::Gemm,
            format!("the {variant} variant takes f16, bf16 or fp8 inputs"),
        ));
    }
    Ok(())
}

/// The block tile of a matrix-core variant is whole instruction tiles: `tm` by `tn` of
/// `rows` × `cols` a wave or warp, and `bk` whole `k` steps.
fn instruction_tiles(
    c: &GpuGemmConfig,
    variant: &str,
    (rows, cols, k): (usize, usize, usize),
) -> Result<(), KernelError> {
    if !c.bm.is_multiple_of(rows * c.tm)
        || !c.bn.is_multiple_of(cols * c.tn)
        || !c.bk.is_multiple_of(k)
    {
        return Err(invalid(
            Family::Gemm,
            format!(
                "{variant} tiles: {}x{} must be multiples of {rows}·{}x{cols}·{} and bk = {} of {k}",
                c.bm, c.bn, c.tm, c.tn, c.bk
            ),
        ));
    }
    Ok(())
}

/// Whether config `c` computes `p`: block-scaled fp8's scales enter every group of k
/// (gemm.hip's `KT_BLOCK`). The tiled and skinny variants apply them as they read k; the mma,
/// MFMA and wgmma tiles add each group's products to the sums times its scales after the
/// group's last k tile, so a k tile must not straddle two groups (`bk` divides the block);
/// the warp-specialized wgmma tiles, whose multiplying warpgroups keep products in flight
/// across k tiles and C tiles, take none.
pub fn gemm_kernel_for(c: &GpuGemmConfig, p: &GemmProblem) -> Result<(), KernelError> {
    if let Some(group) = p.int4 {
        return int4_kernel_for(c, group);
    }
    let Some(block) = p.block else {
        return Ok(());
    };
    let promoted = matches!(
        c.variant,
        GpuGemmVariant::Mma | GpuGemmVariant::Mfma | GpuGemmVariant::Wgmma
    );
    if c.specialized {
        return Err(invalid(
            Family::Gemm,
            format!(
                "block-scaled fp8 (block = {block}) does not run on the warp-specialized wgmma \
                 tiles, whose products stay in flight across k tiles where each group's must \
                 be scaled apart: take specialized = false"
            ),
        ));
    }
    if promoted && !block.is_multiple_of(c.bk) {
        return Err(invalid(
            Family::Gemm,
            format!(
                "block-scaled fp8 (block = {block}): the {} tiles scale each group of k after \
                 its last k tile, so bk = {} must divide the block",
                c.variant, c.bk
            ),
        ));
    }
    Ok(())
}

/// Int4 weights (GPTQ's words, gemm.hip's `KT_INT4`) are unpacked as a k tile is staged (the
/// tiled variant, and the one-stage mma and MFMA tiles, whose copies of whole 16-byte pieces
/// would carry the words, not the values) or read in place by the skinny variant; the wgmma
/// tiles read B as `[N, K]` 16-bit values straight from shared memory and take none. A word
/// holds 8 values of k: the staged variants' k tiles are whole words, the skinny variant's
/// steps 32 lanes of a word row each.
fn int4_kernel_for(c: &GpuGemmConfig, group: usize) -> Result<(), KernelError> {
    let why = if c.variant == GpuGemmVariant::Wgmma || c.stages > 1 {
        Some(format!(
            "the {} variant at {} stages copies B's rows as they lie in memory, where int4 words must be unpacked as staged: take the tiled, skinny, or one-stage mma or MFMA variant",
            c.variant, c.stages
        ))
    } else if c.variant == GpuGemmVariant::Skinny {
        let rules = c.tm == 1
            && c.bn.is_multiple_of(c.tn)
            && c.bm * c.tn <= SKINNY_MAX_ACCUMULATORS
            && c.bk.is_multiple_of(256);
        (!rules).then(|| {
            format!(
                "int4 skinny tiles: tm = {} must be 1, tn = {} must divide bn = {}, bm·tn = {} at most {SKINNY_MAX_ACCUMULATORS} accumulators, bk = {} a multiple of 256 (32 lanes · a word's 8 values)",
                c.tm,
                c.tn,
                c.bn,
                c.bm * c.tn,
                c.bk
            )
        })
    } else {
        (!c.bk.is_multiple_of(8)).then(|| {
            format!(
                "bk = {}: int4 weights are staged a word (8 values of k) at a time, so bk must be a multiple of 8",
                c.bk
            )
        })
    };
    match why {
        Some(why) => Err(invalid(
            Family::Gemm,
            format!("int4 weights (int4 = {group}): {why}"),
        )),
        None => Ok(()),
    }
}

pub(super) fn validate(
    c: &GpuGemmConfig,
    p: &GemmProblem,
    g: &GpuModel,
) -> Result<(), KernelError> {
    let f = Family::Gemm;
    gemm_kernel_for(c, p)?;
    if p.fp8().is_some() {
        validate_fp8(c, p, g)?;
    }
    let pow2 = |v: usize| v.is_power_of_two() && v <= 512;
    // wgmma's N need not be a power of two: its columns follow their own rule
    // (validate_wgmma), so that one of its tiles can divide the problem's N evenly.
    let columns = |v: usize| pow2(v) || (c.variant == GpuGemmVariant::Wgmma && v <= 512);
    // The skinny variant's k tile is 16-byte steps of 32 lanes: two of them are 1024 fp8 values.
    let depth = |v: usize| {
        pow2(v) || (c.variant == GpuGemmVariant::Skinny && v.is_power_of_two() && v <= 1024)
    };
    if !(pow2(c.bm) && columns(c.bn) && depth(c.bk) && pow2(c.tm) && columns(c.tn)) {
        return Err(invalid(
            f,
            format!(
                "tile {}x{}x{} / {}x{}: every size must be a power of two up to 512 (wgmma: bn and tn as its tiles allow; skinny: bk up to 1024)",
                c.bm, c.bn, c.bk, c.tm, c.tn
            ),
        ));
    }
    match c.variant {
        GpuGemmVariant::Tiled => {
            if !c.bm.is_multiple_of(c.tm) || !c.bn.is_multiple_of(c.tn) || c.tm * c.tn > 64 {
                return Err(invalid(
                    f,
                    format!(
                        "register tile {}x{} must divide the block tile {}x{} and hold at most 64 values",
                        c.tm, c.tn, c.bm, c.bn
                    ),
                ));
            }
        }
        GpuGemmVariant::Mfma => {
            matrix_cores(g, p, has_mfma(g), "MFMA", "MFMA instructions")?;
            instruction_tiles(c, "MFMA", (32, 32, 8))?;
        }
        GpuGemmVariant::Mma => {
            matrix_cores(
                g,
                p,
                has_mma(g),
                "mma",
                "mma.sync.m16n8k16 tensor-core instructions",
            )?;
            instruction_tiles(c, "mma", (16, 8, 16))?;
        }
        GpuGemmVariant::Wgmma => validate_wgmma(c, p, g)?,
        // Int4's skinny tiles follow their own rules (`int4_kernel_for`).
        GpuGemmVariant::Skinny if p.int4.is_some() => {}
        GpuGemmVariant::Skinny => validate_skinny(c, p)?,
    }
    if !(1..=4).contains(&c.stages) {
        return Err(invalid(f, format!("stages = {}: must be 1 to 4", c.stages)));
    }
    if c.stages > 1 {
        if !matches!(
            c.variant,
            GpuGemmVariant::Mma | GpuGemmVariant::Wgmma | GpuGemmVariant::Mfma
        ) {
            return Err(invalid(
                f,
                format!(
                    "stages = {}: only the mma, wgmma and MFMA variants pipeline their k tiles",
                    c.stages
                ),
            ));
        }
        if c.variant == GpuGemmVariant::Mfma && (c.stages != 2 || p.b_layout != BLayout::Nk) {
            return Err(invalid(
                f,
                format!(
                    "stages = {}: the MFMA variant pipelines 2 stages with B as [N, K] (b = {}); take stages = 1 otherwise",
                    c.stages, p.b_layout
                ),
            ));
        }
        if c.variant == GpuGemmVariant::Mma && !c.tn.is_multiple_of(2) {
            return Err(invalid(
                f,
                format!(
                    "the pipelined mma variant reads B fragments of two n tiles at once: tn = {} must be even",
                    c.tn
                ),
            ));
        }
        // 16-byte copies of 8 elements: rows of A and B must start 16-byte aligned (fp8's
        // rules are its own, above).
        if !pipelines(p) && p.fp8().is_none() {
            let (dim, v) = if p.k.is_multiple_of(8) {
                ("n", p.n)
            } else {
                ("k", p.k)
            };
            return Err(invalid(
                f,
                format!(
                    "stages = {}: 16-byte copies need {dim} = {v} a multiple of 8 (stages = 1 takes any size)",
                    c.stages
                ),
            ));
        }
    }
    if c.specialized && c.variant != GpuGemmVariant::Wgmma {
        return Err(invalid(
            f,
            "specialized: only the wgmma variant has a producer warpgroup; take specialized = false",
        ));
    }
    // TMA boxes: 64 of k (one 128-byte swizzled row) and a producer to issue them. Split-K
    // ranges are whole k tiles, so no box crosses into the next split's.
    if !(1..=GPU_MAX_BLOCK_TILES).contains(&c.block_tiles) || (c.block_tiles > 1 && !c.specialized)
    {
        return Err(invalid(
            f,
            format!(
                "block_tiles = {}: 1, or up to {GPU_MAX_BLOCK_TILES} C tiles a block of the specialized wgmma variant",
                c.block_tiles
            ),
        ));
    }
    // A pair of blocks shares B's tile, each copying half by a multicast box: rows bn / 2,
    // a whole number of 8-row swizzle patterns (1024 bytes) so the second half lines up.
    if !(1..=2).contains(&c.cluster) || (c.cluster == 2 && !(c.tma && c.bn.is_multiple_of(16))) {
        return Err(invalid(
            f,
            format!(
                "cluster = {}: 1, or 2 blocks of the TMA wgmma variant sharing B's tile (bn = {} a multiple of 16)",
                c.cluster, c.bn
            ),
        ));
    }
    // A box row is 128 bytes: 64 of a 16-bit k, 128 of an fp8 one.
    let box_k = 64 * per_word(p);
    if c.tma && !(c.specialized && c.swizzle == 128 && c.bk == box_k) {
        return Err(invalid(
            f,
            format!(
                "tma: the copy engine feeds the specialized wgmma variant with swizzle = 128 and bk = {box_k} for {} (not specialized = {}, swizzle = {}, bk = {})",
                p.dtype, c.specialized, c.swizzle, c.bk
            ),
        ));
    }
    if c.swizzle != 0 && c.variant != GpuGemmVariant::Wgmma {
        return Err(invalid(
            f,
            format!(
                "swizzle = {}: only the wgmma variant swizzles its shared memory; leave it out (0)",
                c.swizzle
            ),
        ));
    }
    if !c.split_k.is_power_of_two() || c.split_k > GPU_MAX_SPLIT_K {
        return Err(invalid(
            f,
            format!(
                "split_k = {}: must be a power of two up to {GPU_MAX_SPLIT_K}",
                c.split_k
            ),
        ));
    }
    if c.split_k > 1 {
        let bytes = 4 * c.split_k * p.m * p.n;
        if bytes > GPU_SPLIT_K_WORKSPACE_BYTES {
            return Err(invalid(
                f,
                format!(
                    "split_k = {} needs {} MiB of partial products for {}x{}; at most {} MiB",
                    c.split_k,
                    bytes >> 20,
                    p.m,
                    p.n,
                    GPU_SPLIT_K_WORKSPACE_BYTES >> 20
                ),
            ));
        }
    }
    check_threads(f, c.threads(), g)
}

/// What fp8 GEMMs take: bytes widened to their f16 readings as one-stage tiles stage them;
/// on sm_89 and later the pipelined mma tiles, whose copies move the bytes as they lie into
/// `mma.sync.m16n8k32` on the bytes themselves (OCP E4M3 or E5M2), on sm_90 the wgmma
/// tiles into `wgmma.mma_async.m64nNk32` the same way, and on CDNA3 the pipelined MFMA tiles
/// into `v_mfma_f32_32x32x16_fp8_fp8` (E4M3 FNUZ); both operands k-major, rows of whole
/// 16-byte pieces, k tiles of whole instruction steps.
fn validate_fp8(c: &GpuGemmConfig, p: &GemmProblem, g: &GpuModel) -> Result<(), KernelError> {
    let f = Family::Gemm;
    let wgmma = c.variant == GpuGemmVariant::Wgmma;
    if c.stages == 1 && !wgmma {
        return Ok(());
    }
    if c.variant == GpuGemmVariant::Mfma {
        return validate_fp8_mfma(c, p, g);
    }
    // (The wgmma variant's own rules say where the model has no wgmma.)
    let tiles = if wgmma {
        "the fp8 wgmma tiles"
    } else {
        "the pipelined fp8 mma tiles"
    };
    let why = if !wgmma && !has_fp8_mma(g) {
        Some(format!(
            "{} ({}) has no mma.sync on fp8 (sm_89 and later): the mma variant widens {} at stages = 1",
            g.name, g.arch, p.dtype
        ))
    } else if p.fp8() == Some(crate::Fp8::E4m3Fnuz) {
        Some(
            "E4M3 FNUZ (MI300X's) is no format of NVIDIA's fp8 instructions: the mma variant widens it at stages = 1"
                .to_string(),
        )
    } else if p.b_layout != BLayout::Nk {
        Some(format!("{tiles} read B as [N, K] (a Linear layer's weights); a [K, N] B takes the mma variant at stages = 1"))
    } else if !p.k.is_multiple_of(16) {
        Some(format!(
            "{tiles} copy rows in 16-byte pieces: k = {} must be a multiple of 16 (the mma variant at stages = 1 takes any size)",
            p.k
        ))
    } else if !c.bk.is_multiple_of(32) {
        Some(format!(
            "{tiles} multiply 32 bytes of k a step: bk = {} must be a multiple of 32",
            c.bk
        ))
    } else {
        None
    };
    match why {
        Some(reason) => Err(invalid(f, reason)),
        None => Ok(()),
    }
}

/// The pipelined MFMA tiles on fp8 bytes: CDNA3's fp8 MFMA, whose fp8 is E4M3 FNUZ; B as
/// [N, K], 16-byte pieces of k, k tiles of whole 16-byte steps.
fn validate_fp8_mfma(c: &GpuGemmConfig, p: &GemmProblem, g: &GpuModel) -> Result<(), KernelError> {
    let why = if !has_fp8_mfma(g) {
        Some(format!(
            "{} ({}) has no fp8 MFMA (CDNA3 has): the MFMA variant widens {} at stages = 1",
            g.name, g.arch, p.dtype
        ))
    } else if p.fp8() != Some(crate::Fp8::E4m3Fnuz) {
        Some(format!(
            "{}'s fp8 MFMA reads E4M3 FNUZ; {} takes the MFMA variant at stages = 1, widened",
            g.arch, p.dtype
        ))
    } else if p.b_layout != BLayout::Nk || !p.k.is_multiple_of(16) {
        Some(format!(
            "the pipelined fp8 MFMA tiles load rows of B as [N, K] in 16-byte pieces: k = {} must be a multiple of 16 (b = {}; stages = 1 takes any)",
            p.k, p.b_layout
        ))
    } else if !c.bk.is_multiple_of(16) {
        Some(format!(
            "the pipelined fp8 MFMA tiles multiply 16 bytes of k a step: bk = {} must be a multiple of 16",
            c.bk
        ))
    } else {
        None
    };
    match why {
        Some(reason) => Err(invalid(Family::Gemm, reason)),
        None => Ok(()),
    }
}

/// The wgmma variant's own rules: sm_90, 16-bit or fp8 inputs, B as `[N, K]` (both operands
/// k-major in shared memory), rows of whole 16-byte pieces for the copies, 64-row
/// warpgroup tiles of an N the instruction has, and 3 or 4 stages. Depths count 16-bit
/// words, as the kernel lays fp8 bytes out: two to a word.
fn validate_wgmma(c: &GpuGemmConfig, p: &GemmProblem, g: &GpuModel) -> Result<(), KernelError> {
    let f = Family::Gemm;
    let vec = vec_of(p.dtype);
    let bkw = c.bk / per_word(p);
    matrix_cores(
        g,
        p,
        has_wgmma(g),
        "wgmma",
        "wgmma instructions (sm_90 only)",
    )?;
    if p.b_layout != BLayout::Nk {
        return Err(invalid(
            f,
            "the wgmma variant reads B as [N, K] (a Linear layer's weights); a [K, N] B takes the mma variant",
        ));
    }
    if !p.k.is_multiple_of(vec) {
        return Err(invalid(
            f,
            format!(
                "the wgmma variant copies rows in 16-byte pieces: k = {} must be a multiple of {vec} for {}",
                p.k, p.dtype
            ),
        ));
    }
    if !(1..=2).contains(&c.tm)
        || !(64..=256).contains(&c.tn)
        || !c.tn.is_multiple_of(32)
        || c.tm * c.tn / 2 > WGMMA_MAX_ACCUMULATORS
        || !c.bm.is_multiple_of(64 * c.tm)
        || !c.bn.is_multiple_of(c.tn)
        || !(16..=128).contains(&bkw)
    {
        return Err(invalid(
            f,
            format!(
                "wgmma tiles: tm = {} (1 or 2) tiles of 64 rows by tn = {} (a multiple of 32 from 64 to 256), at most {WGMMA_MAX_ACCUMULATORS} accumulators a thread, dividing {}x{}; bk = {} from 16 to 128 ({} for {})",
                c.tm,
                c.tn,
                c.bm,
                c.bn,
                c.bk,
                if per_word(p) == 2 { "32 to 256" } else { "16 to 128" },
                p.dtype
            ),
        ));
    }
    if c.stages < 3 {
        return Err(invalid(
            f,
            format!(
                "stages = {}: the wgmma variant takes 3 or 4 (a tile multiplied, the one before it finishing, the rest copied)",
                c.stages
            ),
        ));
    }
    // A swizzled row holds `swizzle` bytes of k; a k tile is a whole number of them.
    if !matches!(c.swizzle, 0 | 32 | 64 | 128)
        || (c.swizzle != 0 && !(2 * bkw).is_multiple_of(c.swizzle))
    {
        return Err(invalid(
            f,
            format!(
                "swizzle = {}: 0 (core matrices), or 32, 64 or 128 bytes dividing a k tile's rows ({} bytes for bk = {})",
                c.swizzle,
                2 * bkw,
                c.bk
            ),
        ));
    }
    Ok(())
}

/// The skinny variant's rules: B as `[N, K]` (each weight row read along k), rows that
/// start 16-byte aligned, a whole number of 16-byte steps per tile, and accumulators
/// that stay in registers.
fn validate_skinny(c: &GpuGemmConfig, p: &GemmProblem) -> Result<(), KernelError> {
    let f = Family::Gemm;
    if p.b_layout != BLayout::Nk {
        return Err(invalid(
            f,
            "the skinny variant reads B as [N, K] (a Linear layer's weights); a [K, N] B takes the other variants",
        ));
    }
    let vec = vec_of(p.dtype);
    if !p.k.is_multiple_of(vec) {
        return Err(invalid(
            f,
            format!(
                "the skinny variant loads rows in 16-byte pieces: k = {} must be a multiple of {vec} for {}",
                p.k, p.dtype
            ),
        ));
    }
    if c.tm != 1
        || !c.bn.is_multiple_of(c.tn)
        || c.bm * c.tn > SKINNY_MAX_ACCUMULATORS
        || !c.bk.is_multiple_of(32 * vec)
    {
        return Err(invalid(
            f,
            format!(
                "skinny tiles: tm = {} must be 1, tn = {} must divide bn = {}, bm·tn = {} at most {SKINNY_MAX_ACCUMULATORS} accumulators, bk = {} a multiple of 32 lanes · {vec} values",
                c.tm,
                c.tn,
                c.bn,
                c.bm * c.tn,
                c.bk
            ),
        ));
    }
    Ok(())
}

/// The wgmma variant's prefill tiles `(bm, bn, tm, tn)`, largest first: one or two
/// warpgroups of 64×256 or 64×128 (128×256 also as two warpgroups of two 64×128 tiles), then
/// one warpgroup.
const WGMMA_TILES: [(usize, usize, usize, usize); 6] = [
    (128, 256, 1, 256),
    (128, 128, 1, 128),
    (256, 128, 1, 128),
    (128, 256, 2, 128),
    (64, 256, 1, 256),
    (64, 128, 1, 128),
];

/// The warp-specialized wgmma form's tiles `(bm, bn, tm, tn)`: two warpgroups of 64 rows by
/// each N the instruction takes from 256 down to 128 in steps of 32, so that one of them
/// divides the problem's N into blocks that fill the last wave (N = 1280 in 8 of 160, 7168 in
/// 32 of 224); then four warpgroups of 64×128 and two of 128×128.
const SPECIALIZED_TILES: [(usize, usize, usize, usize); 7] = [
    (128, 256, 1, 256),
    (128, 224, 1, 224),
    (128, 192, 1, 192),
    (128, 160, 1, 160),
    (128, 128, 1, 128),
    (256, 128, 1, 128),
    (128, 256, 2, 128),
];

/// How much of the device a `bm`×`bn` tiling with its k range split `split` ways keeps busy,
/// one block an SM at a time (the specialized tiles' registers allow no second): the
/// matrix's share of the tiles' area, times the blocks' share of the waves they take.
/// 2048×7168 in 128×256 tiles: 448 blocks, 4 waves of 132 of which the last 52 full, 0.85;
/// in 128×224 tiles 512 blocks, 0.97.
fn wave_fill(p: &GemmProblem, g: &GpuModel, (bm, bn): (usize, usize), split: usize) -> f64 {
    let sms = (g.compute_units as usize).max(1);
    let tiles = p.m.div_ceil(bm) * p.n.div_ceil(bn);
    let covered = (p.m * p.n) as f64 / (tiles * bm * bn) as f64;
    let blocks = tiles * split;
    covered * blocks as f64 / (blocks.div_ceil(sms) * sms) as f64
}

/// The specialized tiles for `p` with their splits of k, best first: by wave fill in steps
/// of 5%, then the larger tile (fewer bytes copied per product), then the fewer splits.
/// Unsplit, the first five; where even the best of those fills under half the SMs, first the
/// two tiles whose best split (2, 4 or 8, each at least 512 of k) fills more.
fn specialized_tiles(p: &GemmProblem, g: &GpuModel) -> Vec<((usize, usize, usize, usize), usize)> {
    let ranked = |mut tiles: Vec<((usize, usize, usize, usize), usize)>| {
        // A stable sort: equal tiles keep the order of SPECIALIZED_TILES.
        tiles.sort_by_key(|&((bm, bn, ..), split)| {
            let step = (wave_fill(p, g, (bm, bn), split) * 20.0).floor() as usize;
            (Reverse(step), Reverse(bm * bn), split)
        });
        tiles
    };
    let mut whole = ranked(SPECIALIZED_TILES.iter().map(|&t| (t, 1)).collect());
    whole.truncate(5);
    let best = wave_fill(p, g, (whole[0].0 .0, whole[0].0 .1), 1);
    let mut out = Vec::new();
    if best < 0.5 {
        let splits = SPECIALIZED_TILES
            .iter()
            .flat_map(|&t| [2, 4, 8].map(|split| (t, split)))
            .filter(|&((bm, bn, ..), split)| {
                p.k / split >= 512 && wave_fill(p, g, (bm, bn), split) > best
            })
            .collect();
        // Each tile at its best split only: two tiles to choose from.
        let mut ranked = ranked(splits);
        ranked.dedup_by_key(|(t, _)| *t);
        out.extend(ranked.into_iter().take(2));
    }
    out.extend(whole);
    out
}

/// C tiles a block takes so that the blocks fit on the SMs at once (a persistent kernel's
/// grid), where there are at least two a SM; else 1.
fn persistent_tiles(p: &GemmProblem, g: &GpuModel, (bm, bn): (usize, usize)) -> usize {
    let sms = (g.compute_units as usize).max(1);
    let tiles = p.m.div_ceil(bm) * p.n.div_ceil(bn);
    if tiles >= 2 * sms {
        tiles.div_ceil(sms).min(GPU_MAX_BLOCK_TILES)
    } else {
        1
    }
}

/// The GEMM candidates, the likeliest winners first (a budgeted search takes the first):
/// matrix-core variants before the skinny and tiled ones on models that have them, and
/// for decode shapes the one-warp-high split-K tiles first, after the skinny ones where A
/// has at most 8 rows.
pub(super) fn candidates(p: &GemmProblem, g: &GpuModel) -> Vec<GpuGemmConfig> {
    let mut out = Vec::new();
    let mut push = |c: GpuGemmConfig| out.push(c);
    // Decode: a few rows give few tiles; split-K fills the device.
    let decode = p.m <= 64;
    let splits: &[usize] = if decode { &[1, 2, 4, 8, 16] } else { &[1] };
    if has_mma(g) && p.dtype != DType::F32 {
        let mma = GpuGemmVariant::Mma;
        // fp8's tiles are as deep in bytes as 16-bit ones are in words: twice the values.
        let pack = per_word(p);
        if pipelines(p) || fp8_pipelines(p, g) {
            if decode {
                let bm = decode_rows(p.m);
                for &split in splits.iter().rev() {
                    for (bn, tn) in [(64, 2), (128, 4)] {
                        for (bk, stages) in [(32, 4), (64, 3)] {
                            push(GpuGemmConfig::tile(
                                mma,
                                (bm, bn, bk * pack),
                                (bm / 16, tn),
                                stages,
                                split,
                            ));
                        }
                    }
                }
            }
            // Hopper: a warpgroup's MMA reads both tiles from shared memory, as cuBLAS's
            // sm_90 kernels do; one or two warpgroups of 64×256 or 64×128, 128 to 192 of
            // k in flight. Decode shapes fill 64 rows of which most are padding, with
            // split-K, after the one-warp-high mma tiles.
            let wgmma = GpuGemmVariant::Wgmma;
            if has_wgmma(g) && p.b_layout == BLayout::Nk {
                for &split in splits.iter().rev().filter(|_| decode) {
                    for bn in [64, 128] {
                        push(GpuGemmConfig::tile(
                            wgmma,
                            (64, bn, 64 * pack),
                            (1, bn),
                            3,
                            split,
                        ));
                    }
                }
                // Warp-specialized first, swizzled, the tiles that fill the waves best: a
                // producer warpgroup copies while the others multiply, by the copy engine
                // (TMA) and then by cp.async; the split ones by TMA at 4 stages only. After
                // each unsplit TMA tile of 4 stages, the same with every block taking
                // several C tiles in turn, where there are two a SM or more, and both in
                // clusters of two blocks sharing B's tile.
                let specialized = specialized_tiles(p, g);
                for tma in [true, false] {
                    for &((bm, bn, tm, tn), split) in &specialized {
                        for stages in [4, 3] {
                            let c = GpuGemmConfig {
                                swizzle: 128,
                                specialized: true,
                                tma,
                                ..GpuGemmConfig::tile(
                                    wgmma,
                                    (bm, bn, 64 * pack),
                                    (tm, tn),
                                    stages,
                                    split,
                                )
                            };
                            if split == 1 || (tma && stages == 4) {
                                push(c);
                            }
                            let block_tiles = persistent_tiles(p, g, (bm, bn));
                            if tma && stages == 4 && split == 1 && block_tiles > 1 {
                                push(GpuGemmConfig { block_tiles, ..c });
                            }
                            // The same in pairs sharing B's tile (multicast: half of B's
                            // traffic from L2), where there are two m tiles to pair.
                            if tma && stages == 4 && split == 1 && p.m > bm {
                                push(GpuGemmConfig { cluster: 2, ..c });
                                if block_tiles > 1 {
                                    push(GpuGemmConfig {
                                        block_tiles,
                                        cluster: 2,
                                        ..c
                                    });
                                }
                            }
                        }
                    }
                }
                // Swizzled rows next: with core matrices each 32-byte sector is fetched
                // twice (a quarter-warp's copies fill one core matrix, 16 bytes of 8 rows),
                // which Nsight Compute showed on the H200 (half the L2 sectors excess);
                // swizzled rows are copied a whole 128-byte line per quarter-warp.
                for swizzle in [128, 0] {
                    for &(bm, bn, tm, tn) in &WGMMA_TILES {
                        for (bk, stages) in [(64, 3), (64, 4), (32, 4)] {
                            let swizzle = swizzle.min(2 * bk);
                            push(GpuGemmConfig {
                                swizzle,
                                ..GpuGemmConfig::tile(
                                    wgmma,
                                    (bm, bn, bk * pack),
                                    (tm, tn),
                                    stages,
                                    1,
                                )
                            });
                        }
                    }
                }
            }
            // Eight warps of 64×64 on the largest tiles (as CUTLASS's sm_80 GEMMs), then
            // 64 to 192 of k in flight on the others; shared memory is dynamic, up to the
            // model's per-block limit (validation).
            for (bm, bn) in [(128, 256), (256, 128)] {
                for (bk, stages) in [(32, 3), (32, 4), (64, 3)] {
                    push(GpuGemmConfig::tile(
                        mma,
                        (bm, bn, bk * pack),
                        (4, 8),
                        stages,
                        1,
                    ));
                }
            }
            for (bm, bn) in [(128, 128), (128, 64), (64, 128), (64, 64)] {
                for (bk, stages) in [(32, 3), (32, 4), (64, 3), (32, 2)] {
                    for t in [(4, 4), (4, 2), (2, 4), (2, 2)] {
                        push(GpuGemmConfig::tile(mma, (bm, bn, bk * pack), t, stages, 1));
                    }
                }
            }
        } else {
            if decode {
                let bm = decode_rows(p.m);
                for &split in splits.iter().rev() {
                    push(GpuGemmConfig::tile(
                        mma,
                        (bm, 64, 32),
                        (bm / 16, 2),
                        1,
                        split,
                    ));
                }
            }
            for (bm, bn) in [(128, 128), (128, 64), (64, 128), (64, 64)] {
                for bk in [32, 16, 64] {
                    for t in [(4, 4), (4, 2), (2, 4), (2, 2), (1, 2)] {
                        push(GpuGemmConfig::tile(mma, (bm, bn, bk), t, 1, 1));
                    }
                }
            }
        }
    }
    if has_mfma(g) && p.dtype != DType::F32 {
        // Pipelined where the 16-byte loads apply (every LLM shape; fp8 on CDNA3's fp8 MFMA,
        // twice the values a tile): first, as the guess.
        let pack = per_word(p);
        if (pipelines(p) && p.b_layout == BLayout::Nk) || fp8_mfma_pipelines(p, g) {
            for (bm, bn) in [(128, 128), (256, 128), (128, 64), (64, 128), (64, 64)] {
                for bk in [32, 64] {
                    for t in [(2, 2), (1, 2), (2, 1)] {
                        push(GpuGemmConfig::tile(
                            GpuGemmVariant::Mfma,
                            (bm, bn, bk * pack),
                            t,
                            2,
                            1,
                        ));
                    }
                }
            }
        }
        if decode {
            for &split in splits.iter().rev() {
                push(GpuGemmConfig::tile(
                    GpuGemmVariant::Mfma,
                    (32, 64, 64),
                    (1, 1),
                    1,
                    split,
                ));
                push(GpuGemmConfig::tile(
                    GpuGemmVariant::Mfma,
                    (32, 128, 64),
                    (1, 2),
                    1,
                    split,
                ));
            }
        }
        for (bm, bn) in [(128, 128), (256, 128), (128, 64), (64, 128), (64, 64)] {
            for bk in [32, 16, 64] {
                for t in [(2, 2), (1, 2), (2, 1), (1, 1)] {
                    push(GpuGemmConfig::tile(
                        GpuGemmVariant::Mfma,
                        (bm, bn, bk),
                        t,
                        1,
                        1,
                    ));
                }
            }
        }
    }
    // GEMV-style decode (few rows, weights `[N, K]`): no matrix cores, so on every model;
    // before the tiled variant, and first of all for the fewest rows (below).
    let skinny = GpuGemmVariant::Skinny;
    let vec = vec_of(p.dtype);
    if p.m <= SKINNY_MAX_ROWS && p.int4.is_some() {
        // Int4 words in place: 8 consecutive columns a group of lanes (one 32-byte sector of
        // each word row a lane), then 16, 4 and 2 (as many rows of A as the sums allow).
        let bm = p.m.next_power_of_two();
        for &split in splits.iter().rev() {
            for (groups, tn) in [(4, 8), (8, 8), (4, 16), (8, 4), (16, 2)] {
                for steps in [2, 1] {
                    push(GpuGemmConfig::tile(
                        skinny,
                        (bm, groups * tn, 256 * steps),
                        (1, tn),
                        1,
                        split,
                    ));
                }
            }
        }
    } else if p.m <= SKINNY_MAX_ROWS && p.b_layout == BLayout::Nk && p.k.is_multiple_of(vec) {
        let bm = p.m.next_power_of_two();
        for &split in splits.iter().rev() {
            for (groups, tn) in [(8, 2), (4, 4), (8, 1)] {
                for steps in [2, 1] {
                    push(GpuGemmConfig::tile(
                        skinny,
                        (bm, groups * tn, 32 * vec * steps),
                        (1, tn),
                        1,
                        split,
                    ));
                }
            }
        }
    }
    for &split in splits[1..].iter().rev() {
        push(GpuGemmConfig::tile(
            GpuGemmVariant::Tiled,
            (32, 32, 32),
            (2, 2),
            1,
            split,
        ));
    }
    for (bm, bn) in [(32, 32), (64, 64), (64, 128), (128, 64), (128, 128)] {
        for bk in [8, 16, 32] {
            for t in [(2, 2), (4, 4), (8, 4), (4, 8), (8, 8)] {
                push(GpuGemmConfig::tile(
                    GpuGemmVariant::Tiled,
                    (bm, bn, bk),
                    t,
                    1,
                    1,
                ));
            }
        }
    }
    // The skinny tiles go first where A has so few rows that the matrix cores' tiles are
    // mostly padding (a stable sort keeps each variant's order).
    if p.m <= SKINNY_FIRST_ROWS {
        out.sort_by_key(|c| c.variant != skinny);
    }
    // Block-scaled fp8: the configs that scale each group of k apart, with room for it.
    if p.block.is_some() {
        out.retain(|c| gemm_kernel_for(c, p).is_ok() && group_sums_fit(c));
    }
    // Int4: the configs that unpack its words.
    if p.int4.is_some() {
        out.retain(|c| gemm_kernel_for(c, p).is_ok());
    }
    out
}

/// What runs untuned: a 64×64 tile of 4×4 per thread, on every model and input type.
pub(super) fn default() -> GpuGemmConfig {
    GpuGemmConfig::tile(GpuGemmVariant::Tiled, (64, 64, 16), (4, 4), 1, 1)
}

/// The guess for shapes never tuned (`gpu` is `None` when asked about a CPU): matrix cores
/// where the model has them for 16-bit inputs, split-K for decode shapes, and on NVIDIA the
/// skinny kernel for decode of up to 8 rows.
pub(super) fn heuristic(p: &GemmProblem, gpu: Option<&GpuModel>) -> GpuGemmConfig {
    if p.block.is_some() {
        return block_scaled_heuristic(p, gpu);
    }
    if p.int4.is_some() && p.m <= SKINNY_FIRST_ROWS {
        // Int4 decode on every vendor: the words read once, in place, where the staged tiles
        // would be mostly padding; split-K until every SM has two blocks.
        let guess = int4_skinny_guess(p);
        let split = gpu.map_or(1, |g| decode_split(p, guess.bm, guess.bn, g));
        return GpuGemmConfig {
            split_k: split,
            ..guess
        };
    }
    // fp8 included: the matrix cores multiply its readings as f16.
    let sixteen_bit = p.dtype != DType::F32;
    let mma = gpu.is_some_and(|g| has_mma(g) && sixteen_bit);
    let mfma = gpu.is_some_and(|g| has_mfma(g) && sixteen_bit);
    // The pipelined tiles, on fp8 bytes where the model multiplies them (as deep in bytes as
    // 16-bit tiles are in values).
    let pipelined = pipelines(p) || gpu.is_some_and(|g| fp8_pipelines(p, g));
    let pack = per_word(p);
    if mma && p.m > 64 && pipelined {
        // Tensor cores for prefill-sized GEMMs where rows allow 16-byte copies: the largest
        // tile of 8 warps that still gives every SM a block (128×256, 3 stages of 32; then
        // 128×128, 4 stages), else 64×128.
        let sms = gpu.map_or(1, |g| g.compute_units as usize);
        let tiles = |bm: usize, bn: usize| p.m.div_ceil(bm) * p.n.div_ceil(bn);
        let (bm, bn, tm, tn, stages) = [(128, 256, 4, 8, 3), (128, 128, 4, 4, 4)]
            .into_iter()
            .find(|&(bm, bn, ..)| tiles(bm, bn) >= sms)
            .unwrap_or((64, 128, 2, 4, 4));
        GpuGemmConfig::tile(
            GpuGemmVariant::Mma,
            (bm, bn, 32 * pack),
            (tm, tn),
            stages,
            1,
        )
    } else if mma && p.m > 64 {
        // Rows not of 8 elements: a 128×128 tile over 8 warps, plain loads.
        GpuGemmConfig::tile(GpuGemmVariant::Mma, (128, 128, 32), (4, 4), 1, 1)
    } else if mma && p.m <= SKINNY_FIRST_ROWS && validate_skinny(&skinny_guess(p), p).is_ok() {
        // Decode of a few rows, weights [N, K]: the skinny kernel, 4 groups of 4 weight rows
        // a block with two steps in flight, split-K until every SM has two blocks. Measured on
        // an H200 (Llama-70B TP8, M = 1) it was within 2% of the best of 24 candidates and
        // 1.2–1.5x faster than the mma decode tile below, which stays the guess from 9 rows.
        let guess = skinny_guess(p);
        let split = gpu.map_or(1, |g| decode_split(p, guess.bm, guess.bn, g));
        GpuGemmConfig {
            split_k: split,
            ..guess
        }
    } else if mma && (pipelined || p.fp8().is_some()) {
        // Tensor cores for decode: one warp high, four stages of 32 streaming the weights
        // (fp8 without its mma: one, widened as staged), split-K until every SM has two
        // blocks.
        let bm = decode_rows(p.m);
        let split = gpu.map_or(1, |g| decode_split(p, bm, 64, g));
        let (bk, stages) = if pipelined { (32 * pack, 4) } else { (32, 1) };
        GpuGemmConfig::tile(
            GpuGemmVariant::Mma,
            (bm, 64, bk),
            (bm / 16, 2),
            stages,
            split,
        )
    } else if mfma && p.m >= 64 {
        // 16-byte loads of the next k tile in flight over this one's products where the
        // shape allows them (fp8 on CDNA3's fp8 MFMA, twice the values); element loads, one
        // tile at a time, elsewhere.
        let (bk, stages) = if pipelines(p) && p.b_layout == BLayout::Nk {
            (32, 2)
        } else if gpu.is_some_and(|g| fp8_mfma_pipelines(p, g)) {
            (32 * pack, 2)
        } else {
            (32, 1)
        };
        GpuGemmConfig::tile(GpuGemmVariant::Mfma, (128, 128, bk), (2, 2), stages, 1)
    } else if p.m <= 64 {
        // Decode elsewhere: few rows, many columns; a narrow tile, split-K as above.
        let split = gpu.map_or(1, |g| decode_split(p, 32, 32, g));
        GpuGemmConfig::tile(GpuGemmVariant::Tiled, (32, 32, 32), (2, 2), 1, split)
    } else {
        default()
    }
}

/// Whether a thread of `c` has room for a group's products beside its sums: the mma, MFMA and
/// wgmma tiles keep both, so at most 64 sums a thread (mma `tm·tn` ≤ 16, MFMA ≤ 4, wgmma
/// `tm·tn` ≤ 128) in blocks of at most 256 threads, whose threads have the most registers.
/// For DeepSeek-V3's gate and up at 2048 tokens NVRTC 13.5 built the mma 128×256 tile of 4×8
/// (128 sums) spilling 240 registers for sm_90 and the tiles of 512 and 1024 threads spilling
/// 2 to 30; of those kept, only 128×128 of 4×4 at 4 stages of 64 bytes spilled (1 register).
/// The HIP compiler built the MFMA 256×128 tile of 2×2 (512 threads) spilling 4 for gfx942,
/// every kept one none.
fn group_sums_fit(c: &GpuGemmConfig) -> bool {
    let room = c.threads() <= 256;
    match c.variant {
        GpuGemmVariant::Mma => room && c.tm * c.tn <= 16,
        GpuGemmVariant::Mfma => room && c.tm * c.tn <= 4,
        GpuGemmVariant::Wgmma => room && c.tm * c.tn <= 128,
        _ => true,
    }
}

/// The guess for block-scaled fp8: the per-channel guess of the same shape where it computes
/// blocks (its k tiles inside a group: the checkpoints' blocks of 128 take every guess) with
/// room for a group's products; in place of the mma 128×256 tile, 128×128 at 3 stages of
/// twice the depth (at 4 stages of 64 bytes it spilled a register); else the narrow split
/// tile for decode, the default otherwise.
fn block_scaled_heuristic(p: &GemmProblem, gpu: Option<&GpuModel>) -> GpuGemmConfig {
    let plain = heuristic(&GemmProblem { block: None, ..*p }, gpu);
    let smaller = GpuGemmConfig::tile(GpuGemmVariant::Mma, (128, 128, 2 * plain.bk), (4, 4), 3, 1);
    if gemm_kernel_for(&plain, p).is_ok() && group_sums_fit(&plain) {
        plain
    } else if plain.variant == GpuGemmVariant::Mma
        && plain.stages > 1
        && gemm_kernel_for(&smaller, p).is_ok()
    {
        smaller
    } else if p.m <= 64 {
        let split = gpu.map_or(1, |g| decode_split(p, 32, 32, g));
        GpuGemmConfig::tile(GpuGemmVariant::Tiled, (32, 32, 32), (2, 2), 1, split)
    } else {
        default()
    }
}

/// The skinny heuristic's tile before its split: A's rows rounded up to a power of two, 4
/// groups of 4 weight rows, two 16-byte steps a lane in flight.
fn skinny_guess(p: &GemmProblem) -> GpuGemmConfig {
    let vec = vec_of(p.dtype);
    GpuGemmConfig::tile(
        GpuGemmVariant::Skinny,
        (p.m.next_power_of_two(), 16, 2 * 32 * vec),
        (1, 4),
        1,
        1,
    )
}

/// The int4 skinny guess before its split: A's rows rounded up to a power of two, 32 columns a
/// block in 4 groups of 8 (a lane's word row one 32-byte sector; 8 groups of 4 where the rows'
/// sums need the room), two word rows a lane in flight.
fn int4_skinny_guess(p: &GemmProblem) -> GpuGemmConfig {
    let bm = p.m.next_power_of_two();
    let tn = (SKINNY_MAX_ACCUMULATORS / bm).min(8);
    GpuGemmConfig::tile(GpuGemmVariant::Skinny, (bm, 32, 512), (1, tn), 1, 1)
}

/// Rows of A up to which the skinny variant is a candidate: beyond them a weight byte feeds
/// more multiply-adds than the vector units keep up with at full memory bandwidth.
const SKINNY_MAX_ROWS: usize = 16;

/// Rows of A up to which the skinny candidates come first.
const SKINNY_FIRST_ROWS: usize = 8;

/// Whether the pipelined mma variant's 16-byte copies apply: 16-bit inputs (fp8 bytes are
/// widened as they are staged, int4 words unpacked), rows of A and B (k, and n for a K×N B) multiples of 8
/// elements.
fn pipelines(p: &GemmProblem) -> bool {
    p.fp8().is_none()
        && p.int4.is_none()
        && p.k.is_multiple_of(8)
        && (p.b_layout == BLayout::Nk || p.n.is_multiple_of(8))
}

/// Whether the pipelined mma tiles take `p`'s fp8 bytes on `g` (validate_fp8's rules).
fn fp8_pipelines(p: &GemmProblem, g: &GpuModel) -> bool {
    has_fp8_mma(g)
        && matches!(p.fp8(), Some(crate::Fp8::E4m3 | crate::Fp8::E5m2))
        && p.b_layout == BLayout::Nk
        && p.k.is_multiple_of(16)
}

/// Whether the pipelined MFMA tiles take `p`'s fp8 bytes on `g` (validate_fp8_mfma's rules).
fn fp8_mfma_pipelines(p: &GemmProblem, g: &GpuModel) -> bool {
    has_fp8_mfma(g)
        && p.fp8() == Some(crate::Fp8::E4m3Fnuz)
        && p.b_layout == BLayout::Nk
        && p.k.is_multiple_of(16)
}

/// Values of `p`'s inputs in one 16-bit word of the pipelined mma tiles: 2 for fp8 bytes.
fn per_word(p: &GemmProblem) -> usize {
    2 / p.dtype.size().min(2)
}

/// Rows of a decode tile for `m` rows: 16, 32 or 64, one warp high.
fn decode_rows(m: usize) -> usize {
    m.next_power_of_two().clamp(16, 64)
}

/// The split-K of a decode GEMM: the fewest splits (a power of two up to 16) that give two
/// blocks per CU / SM, each split keeping at least 256 of k.
fn decode_split(p: &GemmProblem, bm: usize, bn: usize, g: &GpuModel) -> usize {
    let tiles = p.m.div_ceil(bm) * p.n.div_ceil(bn);
    let want = 2 * g.compute_units as usize;
    let mut split = 1;
    while split < GPU_MAX_SPLIT_K && tiles * split < want && p.k / (2 * split) >= 256 {
        split *= 2;
    }
    split
}

#[cfg(test)]
mod tests {
    use super::{candidates, heuristic};
    use crate::config::GpuGemmVariant;
    use crate::problem::GemmProblem;
    use crate::{Config, Device, Problem};

    fn gemm(spec: &str) -> GemmProblem {
        match spec.parse() {
            Ok(Problem::Gemm(p)) => p,
            other => unreachable!("a valid GEMM: {other:?}"),
        }
    }

    fn guess(model: &str, spec: &str) -> String {
        let Ok(Device::Gpu(g)) = Device::lookup(model) else {
            unreachable!("{model} is a GPU of the catalog")
        };
        let p = gemm(spec);
        let h = heuristic(&p, Some(g));
        assert!(
            candidates(&p, g).contains(&h),
            "{model} {spec}: {h} is no candidate"
        );
        h.to_string()
    }

    #[test]
    fn nvidia_decode_of_up_to_8_rows_takes_the_skinny_kernel_split_to_fill_the_sms() {
        // Llama-70B TP8 on an H200 (132 SMs): 80 blocks of 16 weight rows take 4 splits for
        // two a SM; 512 blocks need none.
        assert_eq!(
            guess("h200", "gemm:m=1,n=1280,k=8192,dtype=bf16"),
            "gpu skinny 1x16x512 tile 1x4 split-k=4"
        );
        assert_eq!(
            guess("h200", "gemm:m=1,n=8192,k=3584,dtype=bf16"),
            "gpu skinny 1x16x512 tile 1x4"
        );
        assert_eq!(
            guess("a100", "gemm:m=5,n=7168,k=8192,dtype=f16"),
            "gpu skinny 8x16x512 tile 1x4"
        );
        // From 9 rows, with B as [K, N], and where no measurement backs it (AMD), the others.
        for (model, spec) in [
            ("h200", "gemm:m=16,n=1280,k=8192,dtype=bf16"),
            ("h200", "gemm:m=9,n=1280,k=8192,dtype=bf16"),
            ("h200", "gemm:m=1,n=1280,k=8192,dtype=bf16,b=kn"),
            ("mi250", "gemm:m=1,n=1280,k=8192,dtype=bf16"),
        ] {
            let Ok(Device::Gpu(g)) = Device::lookup(model) else {
                unreachable!()
            };
            let h = heuristic(&gemm(spec), Some(g));
            assert_ne!(h.variant, GpuGemmVariant::Skinny, "{model} {spec}: {h}");
        }
    }

    /// Int4 GEMMs (GPTQ's words) take the skinny kernel for decode on every vendor, narrower
    /// where more rows' sums need the registers, split to fill the SMs or CUs; beyond 8 rows
    /// the one-stage tiles that unpack the words as staged, or the tiled default without
    /// matrix cores.
    #[test]
    fn int4_gemms_take_the_skinny_kernel_for_decode_and_staged_tiles_beyond() {
        let qkv = "gemm:m=1,n=1280,k=8192,dtype=bf16,b=kn,int4=128";
        for (model, spec, want) in [
            // 40 blocks of 32 columns: 8 splits for two a SM on 132, 16 on MI300X's 304 CUs.
            ("h200", qkv, "gpu skinny 1x32x512 tile 1x8 split-k=8"),
            ("mi300x", qkv, "gpu skinny 1x32x512 tile 1x8 split-k=16"),
            (
                "rx7900xtx",
                "gemm:m=1,n=1280,k=8192,dtype=f16,b=kn,int4=128",
                "gpu skinny 1x32x512 tile 1x8 split-k=8",
            ),
            (
                "h200",
                "gemm:m=5,n=7168,k=8192,dtype=bf16,b=kn,int4=128",
                "gpu skinny 8x32x512 tile 1x4 split-k=2",
            ),
            (
                "h200",
                "gemm:m=2048,n=1280,k=8192,dtype=f16,b=kn,int4=128",
                "gpu mma 128x128x32 tile 4x4",
            ),
            (
                "mi250",
                "gemm:m=2048,n=1280,k=8192,dtype=bf16,b=kn,int4=128",
                "gpu mfma 128x128x32 tile 2x2",
            ),
            (
                "rx7900xtx",
                "gemm:m=2048,n=1280,k=8192,dtype=bf16,b=kn,int4=128",
                "gpu tiled 64x64x16 tile 4x4",
            ),
        ] {
            assert_eq!(guess(model, spec), want, "{model} {spec}");
        }
        // Never the tiles that copy B's rows as they lie.
        let Ok(Device::Gpu(h200)) = Device::lookup("h200") else {
            unreachable!()
        };
        let prefill = gemm("gemm:m=2048,n=7168,k=8192,dtype=bf16,b=kn,int4=128");
        assert!(candidates(&prefill, h200)
            .iter()
            .all(|c| c.stages == 1 && c.variant != GpuGemmVariant::Wgmma));
    }

    /// fp8 GEMMs (W8A8) take the tiled and skinny variants, the one-stage matrix-core tiles
    /// (which widen the bytes as they stage them) and, from sm_89 on OCP formats with B as
    /// [N, K], the pipelined mma tiles on the bytes themselves, twice as deep in values as
    /// the 16-bit ones, and on sm_90 the wgmma tiles the same way (m64nNk32, TMA boxes of 128
    /// bytes). The guesses follow the 16-bit ones.
    #[test]
    fn fp8_gemms_take_the_variants_that_read_their_bytes() {
        use super::validate;
        use crate::config::GpuGemmConfig;
        for (model, spec, want) in [
            (
                "h200",
                "gemm:m=1,n=1280,k=8192,dtype=fp8_e4m3",
                "gpu skinny 1x16x1024 tile 1x4 split-k=4",
            ),
            (
                "h200",
                "gemm:m=32,n=1280,k=8192,dtype=fp8_e4m3",
                "gpu mma 32x64x64 tile 2x2 stages=4 split-k=16",
            ),
            (
                "h200",
                "gemm:m=2048,n=7168,k=8192,dtype=fp8_e5m2",
                "gpu mma 128x256x64 tile 4x8 stages=3",
            ),
            // No fp8 mma on the A100, nor a format of NVIDIA's in fnuz, nor pipelined copies
            // of a [K, N] B: one stage, widened.
            (
                "a100",
                "gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3",
                "gpu mma 128x128x32 tile 4x4",
            ),
            (
                "h200",
                "gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3fnuz",
                "gpu mma 128x128x32 tile 4x4",
            ),
            (
                "h200",
                "gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3,b=kn",
                "gpu mma 128x128x32 tile 4x4",
            ),
            // CDNA3's fp8 MFMA on its FNUZ bytes; the MI250 has none, nor the MI300X for OCP.
            (
                "mi300x",
                "gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3fnuz",
                "gpu mfma 128x128x64 tile 2x2 stages=2",
            ),
            (
                "mi250",
                "gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3fnuz",
                "gpu mfma 128x128x32 tile 2x2",
            ),
            (
                "mi300x",
                "gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3",
                "gpu mfma 128x128x32 tile 2x2",
            ),
        ] {
            assert_eq!(guess(model, spec), want, "{model} {spec}");
        }
        let lookup = |name: &str| match Device::lookup(name) {
            Ok(Device::Gpu(g)) => g,
            _ => unreachable!("{name} is a GPU"),
        };
        let (h200, a100, mi300x) = (lookup("h200"), lookup("a100"), lookup("mi300x"));
        let p = gemm("gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3,b=nk");
        let offered = candidates(&p, h200);
        assert!(offered.iter().any(|c| c.stages > 1));
        for c in &offered {
            assert!(c.stages == 1 || c.bk.is_multiple_of(64), "{c:?}");
            assert!(!c.tma || c.bk == 128, "{c:?}");
        }
        let wgmma = GpuGemmVariant::Wgmma;
        assert!(offered.iter().any(|c| c.variant == wgmma && c.tma));
        assert!(candidates(&p, a100).iter().all(|c| c.variant != wgmma));
        let fnuz = gemm("gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3fnuz,b=nk");
        assert!(candidates(&fnuz, h200).iter().all(|c| c.variant != wgmma));
        let by_tma = GpuGemmConfig {
            swizzle: 128,
            specialized: true,
            tma: true,
            ..GpuGemmConfig::tile(wgmma, (128, 128, 128), (1, 128), 4, 1)
        };
        validate(&by_tma, &p, h200).unwrap();
        let native = GpuGemmConfig::tile(GpuGemmVariant::Mma, (128, 128, 64), (4, 4), 3, 1);
        validate(&native, &p, h200).unwrap();
        for (config, problem, g, says) in [
            (native, p, a100, "sm_89"),
            (
                native,
                gemm("gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3fnuz,b=nk"),
                h200,
                "FNUZ",
            ),
            (
                native,
                gemm("gemm:m=2048,n=7168,k=8200,dtype=fp8_e4m3,b=nk"),
                h200,
                "multiple of 16",
            ),
            (
                GpuGemmConfig::tile(GpuGemmVariant::Mma, (128, 128, 16), (4, 4), 3, 1),
                p,
                h200,
                "multiple of 32",
            ),
            (by_tma, fnuz, h200, "FNUZ"),
            (by_tma, p, a100, "no wgmma"),
            (
                GpuGemmConfig {
                    bk: 64,
                    swizzle: 64,
                    ..by_tma
                },
                p,
                h200,
                "bk = 128 for fp8_e4m3",
            ),
            (
                GpuGemmConfig { bk: 64, ..by_tma },
                p,
                h200,
                "(64 bytes for bk = 64)",
            ),
            (
                GpuGemmConfig::tile(wgmma, (128, 128, 16), (1, 128), 3, 1),
                p,
                h200,
                "multiple of 32",
            ),
            (
                GpuGemmConfig::tile(wgmma, (128, 128, 512), (1, 128), 3, 1),
                p,
                h200,
                "32 to 256",
            ),
            (
                GpuGemmConfig::tile(GpuGemmVariant::Mfma, (128, 128, 64), (2, 2), 2, 1),
                p,
                mi300x,
                "reads E4M3 FNUZ",
            ),
            (
                GpuGemmConfig::tile(GpuGemmVariant::Mfma, (128, 128, 64), (2, 2), 2, 1),
                gemm("gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3fnuz,b=nk"),
                lookup("mi250"),
                "no fp8 MFMA",
            ),
        ] {
            let e = validate(&config, &problem, g).unwrap_err().to_string();
            assert!(e.contains(says), "{config:?} {problem:?}: {e}");
        }
    }

    /// Swizzled rows and a producer warpgroup are wgmma's alone, swizzles of a width the
    /// descriptors have, dividing the k tile's rows; a stored config without the fields is
    /// unswizzled, unspecialized, and keeps its JSON.
    #[test]
    fn swizzle_widths_are_checked_and_old_configs_keep_their_form() {
        use super::validate;
        use crate::config::GpuGemmConfig;
        let Ok(Device::Gpu(g)) = Device::lookup("h200") else {
            unreachable!()
        };
        let p = gemm("gemm:m=2048,n=7168,k=8192,dtype=bf16,b=nk");
        let wgmma = |bk, swizzle| GpuGemmConfig {
            swizzle,
            ..GpuGemmConfig::tile(GpuGemmVariant::Wgmma, (128, 128, bk), (1, 128), 3, 1)
        };
        for (bk, swizzle) in [(64, 0), (64, 128), (64, 64), (64, 32), (32, 64), (16, 32)] {
            validate(&wgmma(bk, swizzle), &p, g).unwrap();
        }
        for (c, says) in [
            (wgmma(32, 128), "swizzle = 128"),
            (wgmma(64, 96), "swizzle = 96"),
            (wgmma(16, 64), "swizzle = 64"),
            (
                GpuGemmConfig {
                    swizzle: 128,
                    ..GpuGemmConfig::tile(GpuGemmVariant::Mma, (128, 128, 64), (4, 4), 3, 1)
                },
                "only the wgmma variant swizzles",
            ),
            (
                GpuGemmConfig {
                    specialized: true,
                    ..GpuGemmConfig::tile(GpuGemmVariant::Mma, (128, 128, 64), (4, 4), 3, 1)
                },
                "only the wgmma variant has a producer warpgroup",
            ),
        ] {
            let e = validate(&c, &p, g).unwrap_err().to_string();
            assert!(e.contains(says), "{c}: {e}");
        }
        // Both layouts are candidates, swizzled first.
        let all = candidates(&p, g);
        let swizzled = all.iter().position(|c| c.swizzle == 128).unwrap();
        let plain = all
            .iter()
            .position(|c| c.variant == GpuGemmVariant::Wgmma && c.swizzle == 0)
            .unwrap();
        assert!(swizzled < plain);
        let stored = r#"{"variant":"wgmma","bm":128,"bn":128,"bk":64,"tm":1,"tn":128,"stages":3}"#;
        let c: GpuGemmConfig = serde_json::from_str(stored).unwrap();
        assert_eq!(c, wgmma(64, 0));
        assert_eq!(serde_json::to_string(&c).unwrap(), stored);
        let c = wgmma(64, 128);
        assert_eq!(
            c.to_string(),
            "gpu wgmma 128x128x64 tile 1x128 stages=3 swizzle=128"
        );
        let specialized = GpuGemmConfig {
            specialized: true,
            ..c
        };
        validate(&specialized, &p, g).unwrap();
        // A producer warpgroup more than the two that multiply.
        assert_eq!(specialized.threads(), 3 * 128);
        assert_eq!(
            specialized.to_string(),
            "gpu wgmma 128x128x64 tile 1x128 stages=3 swizzle=128 specialized"
        );
        // The copy engine feeds the specialized form, 64 of k a box, 128-byte swizzled.
        let tma = GpuGemmConfig {
            tma: true,
            ..specialized
        };
        validate(&tma, &p, g).unwrap();
        assert!(tma.to_string().ends_with("specialized tma"), "{tma}");
        for c in [
            GpuGemmConfig {
                tma: true,
                ..wgmma(64, 128)
            },
            GpuGemmConfig {
                tma: true,
                swizzle: 64,
                ..specialized
            },
        ] {
            let e = validate(&c, &p, g).unwrap_err().to_string();
            assert!(e.contains("tma: the copy engine feeds"), "{c}: {e}");
        }
        // Split-K ranges are whole k tiles: the boxes stay inside theirs.
        let split = GpuGemmConfig { split_k: 2, ..tma };
        validate(&split, &gemm("gemm:m=512,n=1280,k=8192,dtype=bf16"), g).unwrap();
        assert_eq!(
            serde_json::from_str::<GpuGemmConfig>(&serde_json::to_string(&c).unwrap()).unwrap(),
            c
        );
    }

    #[test]
    fn specialized_tiles_lead_with_the_one_that_fills_the_last_wave() {
        use super::validate;
        use crate::config::GpuGemmConfig;
        let Ok(Device::Gpu(g)) = Device::lookup("h200") else {
            unreachable!("the H200 is in the catalog")
        };
        let first = |spec: &str| {
            let c = candidates(&gemm(spec), g)[0];
            assert!(c.specialized && c.tma, "{c}");
            (c.bm, c.bn, c.split_k)
        };
        // Llama-70B TP8 prefill on 132 SMs: N = 1280 in 8 tiles of 160 (128 blocks, one
        // wave), 7168 in 32 of 224 (512 blocks, 3.9 waves), 8192 in 32 of 256.
        assert_eq!(first("gemm:m=2048,n=1280,k=8192,dtype=bf16"), (128, 160, 1));
        assert_eq!(first("gemm:m=2048,n=7168,k=8192,dtype=bf16"), (128, 224, 1));
        assert_eq!(first("gemm:m=2048,n=8192,k=1024,dtype=bf16"), (128, 256, 1));
        // 512 rows: at most 40 blocks unsplit (128×128), so first 128×160 split 4 ways (128
        // blocks) and 128×192 (112).
        let p = gemm("gemm:m=512,n=1280,k=8192,dtype=bf16");
        let splits: Vec<_> = candidates(&p, g)
            .iter()
            .take_while(|c| c.split_k > 1)
            .map(|c| (c.bn, c.split_k, c.tma))
            .collect();
        assert_eq!(splits, [(160, 4, true), (192, 4, true)]);
        // Every N the instruction takes (multiples of 32 from 64 to 256), and no other.
        let p = gemm("gemm:m=2048,n=7168,k=8192,dtype=bf16");
        let with = |bn: usize| GpuGemmConfig {
            bn,
            tn: bn,
            ..candidates(&p, g)[0]
        };
        for bn in [64, 96, 160, 192, 224, 256] {
            validate(&with(bn), &p, g).unwrap();
        }
        for bn in [48, 80, 288] {
            let e = validate(&with(bn), &p, g).unwrap_err().to_string();
            assert!(e.contains("a multiple of 32 from 64 to 256"), "{bn}: {e}");
        }
    }

    #[test]
    fn specialized_blocks_take_several_c_tiles_where_there_are_two_a_sm() {
        use super::validate;
        use crate::config::GpuGemmConfig;
        let Ok(Device::Gpu(g)) = Device::lookup("h200") else {
            unreachable!("the H200 is in the catalog")
        };
        // 512 tiles of 128×224 on 132 SMs: blocks of 4, 128 of them, all at once; right
        // after the same tile one a block.
        let p = gemm("gemm:m=2048,n=7168,k=8192,dtype=bf16");
        let all = candidates(&p, g);
        assert_eq!((all[0].bn, all[0].block_tiles), (224, 1));
        assert_eq!((all[1].bn, all[1].block_tiles), (224, 4));
        assert_eq!(
            all[1].to_string(),
            "gpu wgmma 128x224x64 tile 1x224 stages=4 swizzle=128 specialized tma block-tiles=4"
        );
        let json = serde_json::to_string(&all[1]).unwrap();
        assert!(json.ends_with(r#""tma":true,"block_tiles":4}"#), "{json}");
        assert_eq!(
            serde_json::from_str::<GpuGemmConfig>(&json).unwrap(),
            all[1]
        );
        // 128 tiles of 128×160 are one wave already.
        let p = gemm("gemm:m=2048,n=1280,k=8192,dtype=bf16");
        assert!(candidates(&p, g).iter().all(|c| c.block_tiles == 1));
        // Only the specialized form hands its stages on to a block's next tile.
        let p = gemm("gemm:m=2048,n=7168,k=8192,dtype=bf16");
        for c in [
            GpuGemmConfig {
                specialized: false,
                tma: false,
                ..all[1]
            },
            GpuGemmConfig {
                block_tiles: 0,
                ..all[1]
            },
            GpuGemmConfig {
                block_tiles: 65,
                ..all[1]
            },
        ] {
            let e = validate(&c, &p, g).unwrap_err().to_string();
            assert!(e.contains("block_tiles = "), "{c}: {e}");
        }
    }

    #[test]
    fn tma_tiles_also_come_in_clusters_sharing_b() {
        use super::validate;
        use crate::config::GpuGemmConfig;
        use crate::gpu::launch::{launches, DevicePtrs};
        let Ok(Device::Gpu(g)) = Device::lookup("h200") else {
            unreachable!("the H200 is in the catalog")
        };
        // After the first tile and its blocks of 4: the same in pairs, then both.
        let p = gemm("gemm:m=2048,n=7168,k=8192,dtype=bf16");
        let all = candidates(&p, g);
        assert_eq!(
            all[..4]
                .iter()
                .map(|c| (c.bn, c.block_tiles, c.cluster))
                .collect::<Vec<_>>(),
            [(224, 1, 1), (224, 4, 1), (224, 1, 2), (224, 4, 2)]
        );
        assert_eq!(
            all[3].to_string(),
            "gpu wgmma 128x224x64 tile 1x224 stages=4 swizzle=128 specialized tma block-tiles=4 cluster=2"
        );
        let json = serde_json::to_string(&all[2]).unwrap();
        assert!(json.ends_with(r#""tma":true,"cluster":2}"#), "{json}");
        assert_eq!(
            serde_json::from_str::<GpuGemmConfig>(&json).unwrap(),
            all[2]
        );
        // 16 m tiles in 8 pairs by 32 n tiles: 512 blocks, or 128 of 4 tiles each; B's box
        // is half the tile, A's the whole.
        let ptrs = DevicePtrs::default();
        let l = launches(&Problem::Gemm(p), &Config::GpuGemm(all[2]), &ptrs).unwrap();
        assert_eq!((l[0].grid, l[0].cluster), ([512, 1, 1], 2));
        let l = launches(&Problem::Gemm(p), &Config::GpuGemm(all[3]), &ptrs).unwrap();
        assert_eq!((l[0].grid, l[0].cluster), ([128, 1, 1], 2));
        // One m tile has nothing to pair.
        let p1 = gemm("gemm:m=128,n=7168,k=8192,dtype=bf16");
        assert!(candidates(&p1, g).iter().all(|c| c.cluster == 1));
        // Pairs by TMA only, of two blocks.
        for c in [
            GpuGemmConfig {
                tma: false,
                ..all[2]
            },
            GpuGemmConfig {
                cluster: 3,
                ..all[2]
            },
            GpuGemmConfig {
                cluster: 0,
                ..all[2]
            },
        ] {
            let e = validate(&c, &p, g).unwrap_err().to_string();
            assert!(e.contains("cluster = ") || e.contains("tma"), "{c}: {e}");
        }
    }
}
