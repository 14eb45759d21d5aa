//! The parameter space of the GPU kernels in `kernels/hip/`, for AMD and NVIDIA models of the
//! catalog. Constraints are the hardware's: threads per block a multiple of the wave (64 on
//! CDNA, 32 on NVIDIA) and at most the block limit, LDS / shared memory per block within the
//! model's limit, tiles that divide, MFMA only on CDNA2/3 and only for 16-bit inputs. What the
//! compiler decides (registers, spills, occupancy) is checked after compiling, by the plan.

use crate::config::{
    GpuFlashConfig, GpuFlashVariant, GpuGemmConfig, GpuGemmVariant, GpuPagedConfig,
};
use crate::device::{GpuModel, Vendor};
use crate::problem::{FlashProblem, GemmProblem, PagedProblem};
use crate::{BLayout, Config, DType, Device, Family, KernelError, Problem, Space};

/// Head dimensions the flash kernel holds in registers: beyond this a row does not fit.
pub const GPU_MAX_HEAD_DIM: usize = 256;

/// Blocks that may share the k range of one GEMM tile (split-K).
pub const GPU_MAX_SPLIT_K: usize = 16;

/// The most device memory a split-K GEMM's partial products may take; splits needing more
/// are invalid (they belong to prefill shapes, which have tiles enough without them).
pub const GPU_SPLIT_K_WORKSPACE_BYTES: usize = 64 << 20;

/// The GPU kernels' parameter space.
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuSpace;

fn invalid(family: Family, reason: impl Into<String>) -> KernelError {
    KernelError::InvalidConfig {
        family,
        reason: reason.into(),
    }
}

fn gpu_of(device: &Device, family: Family) -> Result<&'static GpuModel, KernelError> {
    match device {
        Device::Gpu(g) => Ok(g),
        Device::Cpu(_) => Err(invalid(
            family,
            "the GPU space applies to GPU devices; the host CPU uses the CPU space",
        )),
    }
}

/// Whether the model has the MFMA instructions the MFMA GEMM uses.
pub fn has_mfma(g: &GpuModel) -> bool {
    matches!(g.arch, "gfx90a" | "gfx940" | "gfx941" | "gfx942")
}

/// Whether the model has the `mma.sync.m16n8k16` tensor-core instructions (sm_80 and later).
pub fn has_mma(g: &GpuModel) -> bool {
    g.vendor == Vendor::Nvidia
        && g.arch
            .strip_prefix("sm_")
            .and_then(|v| v.parse::<u32>().ok())
            .is_some_and(|v| v >= 80)
}

/// Whether the model has Hopper's warpgroup MMA (`wgmma.mma_async`), which the arch-specific
/// target sm_90a compiles and only sm_90 devices run.
pub fn has_wgmma(g: &GpuModel) -> bool {
    g.vendor == Vendor::Nvidia && g.arch == "sm_90"
}

/// Accumulators a thread of the wgmma variant holds: `tm` tiles of 64 rows by `tn`, `tn / 2`
/// floats each over a warpgroup's 128 threads.
const WGMMA_MAX_ACCUMULATORS: usize = 128;

/// Dims of the query and of the P·V sums a lane of grouped paged attention holds.
const PAGED_MAX_DIMS_PER_LANE: usize = 16;

/// Accumulators a lane of the skinny variant holds: `bm` rows of A by `tn` weight rows.
const SKINNY_MAX_ACCUMULATORS: usize = 32;

/// Values of `dtype` in one 16-byte load (the skinny GEMM's, the grouped paged attention's).
fn vec_of(dtype: DType) -> usize {
    16 / dtype.size()
}

/// LDS bytes one block of a config allocates (as declared in the sources).
pub fn lds_bytes(config: &Config, problem: &Problem, g: &GpuModel) -> usize {
    match (config, problem) {
        (Config::GpuGemm(c), _) => match c.variant {
            GpuGemmVariant::Tiled => 4 * (c.bk * (c.bm + 1) + c.bk * (c.bn + 1)),
            GpuGemmVariant::Mfma => 2 * (c.bm + c.bn) * (c.bk + 4),
            GpuGemmVariant::Mma if c.stages > 1 => dynamic_lds_bytes(config, problem),
            GpuGemmVariant::Mma => 2 * (c.bm + c.bn) * (c.bk + 8),
            GpuGemmVariant::Wgmma => dynamic_lds_bytes(config, problem),
            GpuGemmVariant::Skinny => 0,
        },
        (Config::GpuFlash(c), Problem::Flash(p)) => match c.variant {
            GpuFlashVariant::Rows => 4 * 2 * c.bc * p.head_dim,
            GpuFlashVariant::Mma => dynamic_lds_bytes(config, problem),
            // 16-bit K [bc][d + 4] and Vᵀ [d][bc + 4].
            GpuFlashVariant::Mfma => 2 * (c.bc * (p.head_dim + 4) + p.head_dim * (c.bc + 4)),
        },
        // Scores and the waves' maxima and sums; then the query (a thread per token) or
        // each wave's P·V sums (groups of lanes).
        (Config::GpuPaged(c), Problem::Paged(p)) => {
            let waves = c.threads / g.wave_size as usize;
            let rows = if c.lanes > 1 { waves } else { 1 };
            4 * (c.partition + waves + rows * p.head_dim)
        }
        _ => 0,
    }
}

/// Bytes of dynamic shared memory a build of `config` declares: the pipelined mma GEMM's
/// stages of 16-bit A and B tiles (rows padded by 8 elements; B `[bk][bn + 8]` for a K×N B,
/// else `[bn][bk + 8]`), the wgmma GEMM's stages of A and B in 8×8 core matrices (no
/// padding: the instruction reads each core matrix as 128 contiguous bytes), the mma flash
/// attention's 16-bit K and V tiles (`[bc][d + 8]` each). 0 for builds whose shared memory is
/// all static.
pub fn dynamic_lds_bytes(config: &Config, problem: &Problem) -> usize {
    match (config, problem) {
        (Config::GpuFlash(c), Problem::Flash(p)) if c.variant == GpuFlashVariant::Mma => {
            2 * 2 * c.bc * (p.head_dim + 8)
        }
        (Config::GpuGemm(c), Problem::Gemm(p))
            if c.variant == GpuGemmVariant::Mma && c.stages > 1 =>
        {
            let b = match p.b_layout {
                BLayout::Kn => c.bk * (c.bn + 8),
                BLayout::Nk => c.bn * (c.bk + 8),
            };
            2 * c.stages * (c.bm * (c.bk + 8) + b)
        }
        (Config::GpuGemm(c), Problem::Gemm(_)) if c.variant == GpuGemmVariant::Wgmma => {
            2 * c.stages * (c.bm + c.bn) * c.bk
        }
        _ => 0,
    }
}

/// Static LDS a block of our kernels may use: the model's limit, and on NVIDIA the 48 KiB of
/// static shared memory. Builds with dynamic shared memory may use the model's whole
/// per-block limit ([`lds_limit_of`]): the device path opts in for each.
pub fn lds_limit(g: &GpuModel) -> usize {
    match g.vendor {
        Vendor::Amd => g.lds_per_block as usize,
        Vendor::Nvidia => (g.lds_per_block as usize).min(48 * 1024),
    }
}

/// The LDS limit for a build taking `dynamic_lds` bytes of dynamic shared memory
/// ([`dynamic_lds_bytes`]): the model's per-block limit where it takes any, else
/// [`lds_limit`].
pub fn lds_limit_of(dynamic_lds: usize, g: &GpuModel) -> usize {
    if dynamic_lds > 0 {
        g.lds_per_block as usize
    } else {
        lds_limit(g)
    }
}

/// A matrix-core GEMM variant's first two rules: the model has its `instructions`, and the
/// inputs are 16-bit.
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
            format!("the {variant} variant takes f16 or bf16 inputs"),
        ));
    }
    Ok(())
}

fn check_threads(family: Family, threads: usize, g: &GpuModel) -> Result<(), KernelError> {
    let wave = g.wave_size as usize;
    if threads == 0 || !threads.is_multiple_of(wave) || threads > g.max_threads_per_block as usize {
        return Err(invalid(
            family,
            format!(
                "{threads} threads per block: must be a multiple of the {wave}-wide wave, at most {}",
                g.max_threads_per_block
            ),
        ));
    }
    Ok(())
}

impl GpuSpace {
    fn validate_gemm(
        &self,
        c: &GpuGemmConfig,
        p: &GemmProblem,
        g: &GpuModel,
    ) -> Result<(), KernelError> {
        let f = Family::Gemm;
        let pow2 = |v: usize| v.is_power_of_two() && v <= 512;
        if !(pow2(c.bm) && pow2(c.bn) && pow2(c.bk) && pow2(c.tm) && pow2(c.tn)) {
            return Err(invalid(
                f,
                format!(
                    "tile {}x{}x{} / {}x{}: every size must be a power of two up to 512",
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
                if !c.bm.is_multiple_of(32 * c.tm)
                    || !c.bn.is_multiple_of(32 * c.tn)
                    || !c.bk.is_multiple_of(8)
                {
                    return Err(invalid(
                        f,
                        format!(
                            "MFMA tiles: {}x{} must be multiples of 32·{}x32·{} and bk = {} of 8",
                            c.bm, c.bn, c.tm, c.tn, c.bk
                        ),
                    ));
                }
            }
            GpuGemmVariant::Mma => {
                matrix_cores(
                    g,
                    p,
                    has_mma(g),
                    "mma",
                    "mma.sync.m16n8k16 tensor-core instructions",
                )?;
                if !c.bm.is_multiple_of(16 * c.tm)
                    || !c.bn.is_multiple_of(8 * c.tn)
                    || !c.bk.is_multiple_of(16)
                {
                    return Err(invalid(
                        f,
                        format!(
                            "mma tiles: {}x{} must be multiples of 16·{}x8·{} and bk = {} of 16",
                            c.bm, c.bn, c.tm, c.tn, c.bk
                        ),
                    ));
                }
            }
            GpuGemmVariant::Wgmma => self.validate_wgmma(c, p, g)?,
            GpuGemmVariant::Skinny => self.validate_skinny(c, p)?,
        }
        if !(1..=4).contains(&c.stages) {
            return Err(invalid(f, format!("stages = {}: must be 1 to 4", c.stages)));
        }
        if c.stages > 1 {
            if !matches!(c.variant, GpuGemmVariant::Mma | GpuGemmVariant::Wgmma) {
                return Err(invalid(
                    f,
                    format!(
                        "stages = {}: only the mma and wgmma variants pipeline their k tiles",
                        c.stages
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
            // 16-byte copies of 8 elements: rows of A and B must start 16-byte aligned.
            if !pipelines(p) {
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

    /// The wgmma variant's own rules: sm_90, 16-bit inputs, B as `[N, K]` (both operands
    /// k-major in shared memory), rows of 8 elements for the 16-byte copies, 64-row
    /// warpgroup tiles of an N the instruction has, and 3 or 4 stages.
    fn validate_wgmma(
        &self,
        c: &GpuGemmConfig,
        p: &GemmProblem,
        g: &GpuModel,
    ) -> Result<(), KernelError> {
        let f = Family::Gemm;
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
        if !p.k.is_multiple_of(8) {
            return Err(invalid(
                f,
                format!(
                    "the wgmma variant copies rows in 16-byte pieces: k = {} must be a multiple of 8",
                    p.k
                ),
            ));
        }
        if !(1..=2).contains(&c.tm)
            || !matches!(c.tn, 64 | 128 | 256)
            || c.tm * c.tn / 2 > WGMMA_MAX_ACCUMULATORS
            || !c.bm.is_multiple_of(64 * c.tm)
            || !c.bn.is_multiple_of(c.tn)
            || !(16..=128).contains(&c.bk)
        {
            return Err(invalid(
                f,
                format!(
                    "wgmma tiles: tm = {} (1 or 2) tiles of 64 rows by tn = {} (64, 128 or 256), at most {WGMMA_MAX_ACCUMULATORS} accumulators a thread, dividing {}x{}; bk = {} from 16 to 128",
                    c.tm, c.tn, c.bm, c.bn, c.bk
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
        Ok(())
    }

    /// The skinny variant's rules: B as `[N, K]` (each weight row read along k), rows that
    /// start 16-byte aligned, a whole number of 16-byte steps per tile, and accumulators
    /// that stay in registers.
    fn validate_skinny(&self, c: &GpuGemmConfig, p: &GemmProblem) -> Result<(), KernelError> {
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

    fn validate_flash(
        &self,
        c: &GpuFlashConfig,
        p: &FlashProblem,
        g: &GpuModel,
    ) -> Result<(), KernelError> {
        let f = Family::Flash;
        if p.head_dim > GPU_MAX_HEAD_DIM {
            return Err(invalid(
                f,
                format!(
                    "head_dim {} exceeds the {GPU_MAX_HEAD_DIM} a thread holds in registers",
                    p.head_dim
                ),
            ));
        }
        if !c.bc.is_power_of_two() || c.bc > 128 {
            return Err(invalid(
                f,
                format!("bc = {} must be a power of two up to 128", c.bc),
            ));
        }
        // The matrix-core variants: the instructions, and the multiple of 16 (mma.sync's rows
        // and k step) or 32 (MFMA's) that rows, key tiles and the head size must be.
        let matrix = match c.variant {
            GpuFlashVariant::Rows => None,
            GpuFlashVariant::Mma => Some(("mma", "mma.sync tensor cores", has_mma(g), 16)),
            GpuFlashVariant::Mfma => Some(("MFMA", "MFMA instructions", has_mfma(g), 32)),
        };
        if let Some((variant, instructions, present, tile)) = matrix {
            if !present {
                return Err(invalid(
                    f,
                    format!("{} ({}) has no {instructions}", g.name, g.arch),
                ));
            }
            if p.dtype == DType::F32 {
                return Err(invalid(
                    f,
                    format!("the {variant} variant takes f16 or bf16 inputs"),
                ));
            }
            if !p.head_dim.is_multiple_of(tile) {
                return Err(invalid(
                    f,
                    format!(
                        "the {variant} variant needs head_dim {} a multiple of {tile}",
                        p.head_dim
                    ),
                ));
            }
            if c.br == 0
                || !c.br.is_multiple_of(tile)
                || c.bc == 0
                || !c.bc.is_multiple_of(tile)
                || c.lanes != 2
            {
                return Err(invalid(
                    f,
                    format!(
                        "{variant} tiles: br = {} and bc = {} must be multiples of {tile}, lanes = {} must be 2",
                        c.br, c.bc, c.lanes
                    ),
                ));
            }
            return check_threads(f, c.br * c.lanes, g);
        }
        // Lanes of a row exchange partial dot products by shuffles inside one wave.
        if !c.lanes.is_power_of_two() || c.lanes > 32 || !p.head_dim.is_multiple_of(c.lanes) {
            return Err(invalid(
                f,
                format!(
                    "lanes = {} must be a power of two up to 32 dividing head_dim {}",
                    c.lanes, p.head_dim
                ),
            ));
        }
        check_threads(f, c.br * c.lanes, g)
    }

    fn validate_paged(
        &self,
        c: &GpuPagedConfig,
        p: &PagedProblem,
        g: &GpuModel,
    ) -> Result<(), KernelError> {
        let f = Family::Paged;
        if c.partition == 0 || !c.partition.is_multiple_of(p.block_size) || c.partition > 8192 {
            return Err(invalid(
                f,
                format!(
                    "partition = {} must be a positive multiple of block_size {} up to 8192",
                    c.partition, p.block_size
                ),
            ));
        }
        if c.lanes > 1 {
            let vec = vec_of(p.dtype);
            if !c.lanes.is_power_of_two()
                || c.lanes > 32
                || !p.head_dim.is_multiple_of(c.lanes * vec)
                || p.head_dim / c.lanes > PAGED_MAX_DIMS_PER_LANE
            {
                return Err(invalid(
                    f,
                    format!(
                        "lanes = {}: a power of two up to 32 whose lanes each take whole 16-byte pieces ({vec} values) of head_dim {}, at most {PAGED_MAX_DIMS_PER_LANE} dims a lane",
                        c.lanes, p.head_dim
                    ),
                ));
            }
        } else if c.lanes != 1 {
            return Err(invalid(f, "lanes = 0: a token takes at least one thread"));
        }
        check_threads(f, c.threads, g)
    }

    /// The GEMM candidates, the likeliest winners first (a budgeted search takes the first):
    /// matrix-core variants before the skinny and tiled ones on models that have them, and
    /// for decode shapes the one-warp-high split-K tiles first, after the skinny ones where A
    /// has at most 8 rows.
    fn gemm_candidates(&self, p: &GemmProblem, g: &GpuModel) -> Vec<Config> {
        let mut out = Vec::new();
        let mut push = |variant, (bm, bn, bk), (tm, tn), stages, split_k| {
            out.push(GpuGemmConfig {
                variant,
                bm,
                bn,
                bk,
                tm,
                tn,
                stages,
                split_k,
            })
        };
        // Decode: a few rows give few tiles; split-K fills the device.
        let decode = p.m <= 64;
        let splits: &[usize] = if decode { &[1, 2, 4, 8, 16] } else { &[1] };
        if has_mma(g) && p.dtype != DType::F32 {
            let mma = GpuGemmVariant::Mma;
            if pipelines(p) {
                if decode {
                    let bm = decode_rows(p.m);
                    for &split in splits.iter().rev() {
                        for (bn, tn) in [(64, 2), (128, 4)] {
                            for (bk, stages) in [(32, 4), (64, 3)] {
                                push(mma, (bm, bn, bk), (bm / 16, tn), stages, split);
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
                            push(wgmma, (64, bn, 64), (1, bn), 3, split);
                        }
                    }
                    for (bm, bn, tm, tn) in [
                        (128, 256, 1, 256),
                        (128, 128, 1, 128),
                        (256, 128, 1, 128),
                        (128, 256, 2, 128),
                        (64, 256, 1, 256),
                        (64, 128, 1, 128),
                    ] {
                        for (bk, stages) in [(64, 3), (64, 4), (32, 4)] {
                            push(wgmma, (bm, bn, bk), (tm, tn), stages, 1);
                        }
                    }
                }
                // Eight warps of 64×64 on the largest tiles (as CUTLASS's sm_80 GEMMs), then
                // 64 to 192 of k in flight on the others; shared memory is dynamic, up to the
                // model's per-block limit (validation).
                for (bm, bn) in [(128, 256), (256, 128)] {
                    for (bk, stages) in [(32, 3), (32, 4), (64, 3)] {
                        push(mma, (bm, bn, bk), (4, 8), stages, 1);
                    }
                }
                for (bm, bn) in [(128, 128), (128, 64), (64, 128), (64, 64)] {
                    for (bk, stages) in [(32, 3), (32, 4), (64, 3), (32, 2)] {
                        for tile in [(4, 4), (4, 2), (2, 4), (2, 2)] {
                            push(mma, (bm, bn, bk), tile, stages, 1);
                        }
                    }
                }
            } else {
                if decode {
                    let bm = decode_rows(p.m);
                    for &split in splits.iter().rev() {
                        push(mma, (bm, 64, 32), (bm / 16, 2), 1, split);
                    }
                }
                for (bm, bn) in [(128, 128), (128, 64), (64, 128), (64, 64)] {
                    for bk in [32, 16, 64] {
                        for tile in [(4, 4), (4, 2), (2, 4), (2, 2), (1, 2)] {
                            push(mma, (bm, bn, bk), tile, 1, 1);
                        }
                    }
                }
            }
        }
        if has_mfma(g) && p.dtype != DType::F32 {
            if decode {
                for &split in splits.iter().rev() {
                    push(GpuGemmVariant::Mfma, (32, 64, 64), (1, 1), 1, split);
                    push(GpuGemmVariant::Mfma, (32, 128, 64), (1, 2), 1, split);
                }
            }
            for (bm, bn) in [(128, 128), (256, 128), (128, 64), (64, 128), (64, 64)] {
                for bk in [32, 16, 64] {
                    for tile in [(2, 2), (1, 2), (2, 1), (1, 1)] {
                        push(GpuGemmVariant::Mfma, (bm, bn, bk), tile, 1, 1);
                    }
                }
            }
        }
        // GEMV-style decode (few rows, weights `[N, K]`): no matrix cores, so on every model;
        // before the tiled variant, and first of all for the fewest rows (below).
        let skinny = GpuGemmVariant::Skinny;
        let vec = vec_of(p.dtype);
        if p.m <= SKINNY_MAX_ROWS && p.b_layout == BLayout::Nk && p.k.is_multiple_of(vec) {
            let bm = p.m.next_power_of_two();
            for &split in splits.iter().rev() {
                for (groups, tn) in [(8, 2), (4, 4), (8, 1)] {
                    for steps in [2, 1] {
                        push(
                            skinny,
                            (bm, groups * tn, 32 * vec * steps),
                            (1, tn),
                            1,
                            split,
                        );
                    }
                }
            }
        }
        for &split in splits[1..].iter().rev() {
            push(GpuGemmVariant::Tiled, (32, 32, 32), (2, 2), 1, split);
        }
        for (bm, bn) in [(32, 32), (64, 64), (64, 128), (128, 64), (128, 128)] {
            for bk in [8, 16, 32] {
                for tile in [(2, 2), (4, 4), (8, 4), (4, 8), (8, 8)] {
                    push(GpuGemmVariant::Tiled, (bm, bn, bk), tile, 1, 1);
                }
            }
        }
        // The skinny tiles go first where A has so few rows that the matrix cores' tiles are
        // mostly padding (a stable sort keeps each variant's order).
        if p.m <= SKINNY_FIRST_ROWS {
            out.sort_by_key(|c| c.variant != skinny);
        }
        out.into_iter().map(Config::GpuGemm).collect()
    }
}

/// Rows of A up to which the skinny variant is a candidate: beyond them a weight byte feeds
/// more multiply-adds than the vector units keep up with at full memory bandwidth.
const SKINNY_MAX_ROWS: usize = 16;

/// Rows of A up to which the skinny candidates come first.
const SKINNY_FIRST_ROWS: usize = 8;

/// Whether the pipelined mma variant's 16-byte copies apply: rows of A and B (k, and n for a
/// K×N B) multiples of 8 elements.
fn pipelines(p: &GemmProblem) -> bool {
    p.k.is_multiple_of(8) && (p.b_layout == BLayout::Nk || p.n.is_multiple_of(8))
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

impl Space for GpuSpace {
    fn backend(&self) -> &'static str {
        "gpu"
    }

    fn candidates(&self, problem: &Problem, device: &Device) -> Vec<Config> {
        let Ok(g) = gpu_of(device, problem.family()) else {
            return Vec::new();
        };
        let all = match problem {
            Problem::Gemm(p) => self.gemm_candidates(p, g),
            Problem::Flash(_) => {
                let mut out = Vec::new();
                // Matrix-core variants first, the likeliest winners where they exist
                // (validation drops them elsewhere); larger tiles first. 128-key tiles for
                // mma only, whose tiles are in dynamic shared memory.
                for variant in [GpuFlashVariant::Mma, GpuFlashVariant::Mfma] {
                    for br in [64, 128, 32, 16] {
                        let wide: &[usize] = if variant == GpuFlashVariant::Mma {
                            &[128, 64, 32, 16]
                        } else {
                            &[64, 32, 16]
                        };
                        for &bc in wide {
                            out.push(Config::GpuFlash(GpuFlashConfig {
                                br,
                                bc,
                                lanes: 2,
                                variant,
                            }));
                        }
                    }
                }
                for br in [16, 32, 64, 128] {
                    for bc in [16, 32, 64] {
                        for lanes in [1, 2, 4, 8, 16] {
                            out.push(Config::GpuFlash(GpuFlashConfig {
                                br,
                                bc,
                                lanes,
                                variant: GpuFlashVariant::Rows,
                            }));
                        }
                    }
                }
                out
            }
            // Groups of lanes per token first (16-byte loads of whole rows), then a thread
            // per token.
            Problem::Paged(_) => [16, 8, 4, 32, 1]
                .into_iter()
                .flat_map(|lanes| {
                    [256, 512, 1024].into_iter().flat_map(move |partition| {
                        [64, 128, 256, 512].map(|threads| {
                            Config::GpuPaged(GpuPagedConfig {
                                partition,
                                threads,
                                lanes,
                            })
                        })
                    })
                })
                .collect(),
        };
        all.into_iter()
            .filter(|c| self.validate(c, problem, device).is_ok())
            .collect()
    }

    fn validate(
        &self,
        config: &Config,
        problem: &Problem,
        device: &Device,
    ) -> Result<(), KernelError> {
        let g = gpu_of(device, problem.family())?;
        match (config, problem) {
            (Config::GpuGemm(c), Problem::Gemm(p)) => self.validate_gemm(c, p, g)?,
            (Config::GpuFlash(c), Problem::Flash(p)) => self.validate_flash(c, p, g)?,
            (Config::GpuPaged(c), Problem::Paged(p)) => self.validate_paged(c, p, g)?,
            // Which solutions exist only rocBLAS on the device can say; here only what is
            // never valid is refused.
            (Config::Rocblas(c), Problem::Gemm(_)) => {
                if g.vendor != Vendor::Amd {
                    return Err(invalid(
                        Family::Gemm,
                        format!("rocBLAS solutions run on AMD GPUs, not on {}", g.name),
                    ));
                }
                if c.solution < 0 {
                    return Err(invalid(
                        Family::Gemm,
                        format!("rocBLAS solution index {} is negative", c.solution),
                    ));
                }
            }
            (c, p) if !c.is_gpu() => {
                return Err(invalid(
                    p.family(),
                    format!("`{c}` is a CPU config; a GPU runs GPU configs"),
                ))
            }
            _ => {
                return Err(KernelError::FamilyMismatch {
                    problem: problem.family(),
                    config: config.family(),
                })
            }
        }
        let lds = lds_bytes(config, problem, g);
        let limit = lds_limit_of(dynamic_lds_bytes(config, problem), g);
        if lds > limit {
            return Err(invalid(
                problem.family(),
                if limit == lds_limit(g) {
                    format!(
                        "needs {lds} bytes of LDS per block; {} allows {limit} to the kernels' static allocations",
                        g.name
                    )
                } else {
                    format!(
                        "needs {lds} bytes of shared memory per block; {} allows {limit}",
                        g.name
                    )
                },
            ));
        }
        Ok(())
    }

    fn default_config(&self, problem: &Problem, _device: &Device) -> Config {
        match problem {
            Problem::Gemm(_) => Config::GpuGemm(GpuGemmConfig {
                variant: GpuGemmVariant::Tiled,
                bm: 64,
                bn: 64,
                bk: 16,
                tm: 4,
                tn: 4,
                stages: 1,
                split_k: 1,
            }),
            Problem::Flash(p) => {
                // Head sizes are multiples of 8 in practice; odd ones get fewer lanes.
                let lanes = [8, 4, 2, 1]
                    .into_iter()
                    .find(|l| p.head_dim.is_multiple_of(*l))
                    .unwrap_or(1);
                Config::GpuFlash(GpuFlashConfig {
                    br: (256 / lanes).min(64),
                    bc: if p.head_dim > 128 { 16 } else { 32 },
                    lanes,
                    variant: GpuFlashVariant::Rows,
                })
            }
            Problem::Paged(p) => Config::GpuPaged(GpuPagedConfig {
                partition: 512usize.next_multiple_of(p.block_size),
                // 256 makes ptxas spill a word on sm_90; 128 spills nowhere.
                threads: 128,
                lanes: 1,
            }),
        }
    }

    fn heuristic(&self, problem: &Problem, device: &Device) -> Config {
        let gpu = match device {
            Device::Gpu(g) => Some(*g),
            Device::Cpu(_) => None,
        };
        let (mfma, mma) = match (problem, device) {
            (Problem::Gemm(p), Device::Gpu(g)) => (
                has_mfma(g) && p.dtype != DType::F32,
                has_mma(g) && p.dtype != DType::F32,
            ),
            _ => (false, false),
        };
        let flash_matrix = match (problem, device) {
            (Problem::Flash(p), Device::Gpu(g)) if p.dtype != DType::F32 => {
                if has_mma(g) && p.head_dim.is_multiple_of(16) {
                    Some(GpuFlashVariant::Mma)
                } else if has_mfma(g) && p.head_dim.is_multiple_of(32) {
                    Some(GpuFlashVariant::Mfma)
                } else {
                    None
                }
            }
            _ => None,
        };
        match problem {
            // Matrix cores for 16-bit attention: 64 query rows (four warps of 16 on NVIDIA, two
            // waves of 32 on CDNA) and 64-key tiles, 32 over head size 128 (within 48 KiB of
            // shared memory on NVIDIA).
            Problem::Flash(p) => match flash_matrix {
                Some(variant) => Config::GpuFlash(GpuFlashConfig {
                    br: 64,
                    bc: if p.head_dim > 128 { 32 } else { 64 },
                    lanes: 2,
                    variant,
                }),
                None => self.default_config(problem, device),
            },
            // Tensor cores for prefill-sized 16-bit GEMMs where rows allow 16-byte copies: the
            // largest tile of 8 warps that still gives every SM a block (128×256, 3 stages of
            // 32; then 128×128, 4 stages), else 64×128.
            Problem::Gemm(p) if mma && p.m > 64 && pipelines(p) => {
                let sms = gpu.map_or(1, |g| g.compute_units as usize);
                let tiles = |bm: usize, bn: usize| p.m.div_ceil(bm) * p.n.div_ceil(bn);
                let (bm, bn, tm, tn, stages) = [(128, 256, 4, 8, 3), (128, 128, 4, 4, 4)]
                    .into_iter()
                    .find(|&(bm, bn, ..)| tiles(bm, bn) >= sms)
                    .unwrap_or((64, 128, 2, 4, 4));
                Config::GpuGemm(GpuGemmConfig {
                    variant: GpuGemmVariant::Mma,
                    bm,
                    bn,
                    bk: 32,
                    tm,
                    tn,
                    stages,
                    split_k: 1,
                })
            }
            // Rows not of 8 elements: a 128×128 tile over 8 warps, plain loads.
            Problem::Gemm(p) if mma && p.m > 64 => Config::GpuGemm(GpuGemmConfig {
                variant: GpuGemmVariant::Mma,
                bm: 128,
                bn: 128,
                bk: 32,
                tm: 4,
                tn: 4,
                stages: 1,
                split_k: 1,
            }),
            // Tensor cores for decode: one warp high, four stages of 32 streaming the weights,
            // split-K until every SM has two blocks.
            Problem::Gemm(p) if mma && pipelines(p) => {
                let bm = decode_rows(p.m);
                Config::GpuGemm(GpuGemmConfig {
                    variant: GpuGemmVariant::Mma,
                    bm,
                    bn: 64,
                    bk: 32,
                    tm: bm / 16,
                    tn: 2,
                    stages: 4,
                    split_k: gpu.map_or(1, |g| decode_split(p, bm, 64, g)),
                })
            }
            Problem::Gemm(p) if mfma && p.m >= 64 => Config::GpuGemm(GpuGemmConfig {
                variant: GpuGemmVariant::Mfma,
                bm: 128,
                bn: 128,
                bk: 32,
                tm: 2,
                tn: 2,
                stages: 1,
                split_k: 1,
            }),
            // Decode elsewhere: few rows, many columns; a narrow tile, split-K as above.
            Problem::Gemm(p) if p.m <= 64 => Config::GpuGemm(GpuGemmConfig {
                variant: GpuGemmVariant::Tiled,
                bm: 32,
                bn: 32,
                bk: 32,
                tm: 2,
                tn: 2,
                stages: 1,
                split_k: gpu.map_or(1, |g| decode_split(p, 32, 32, g)),
            }),
            _ => self.default_config(problem, device),
        }
    }
}
