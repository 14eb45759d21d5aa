//! The parameter space of the GPU kernels in `kernels/hip/`, for AMD and NVIDIA models of the
//! catalog. Constraints are the hardware's: threads per block a multiple of the wave (64 on
//! CDNA, 32 on NVIDIA) and at most the block limit, LDS / shared memory per block within the
//! model's limit, tiles that divide, MFMA only on CDNA2/3 and only for 16-bit inputs. What the
//! compiler decides (registers, spills, occupancy) is checked after compiling, by the plan.
//! Each family's candidates, validation, default and heuristic live in its own file; this one
//! holds what they share (the models' instructions, shared memory, threads per block) and the
//! [`Space`] they make up.

mod flash;
mod gemm;
mod paged;

use crate::config::{GpuFlashVariant, GpuGemmVariant, GpuPagedConfig};
use crate::device::{GpuModel, Vendor};
use crate::problem::PagedProblem;
use crate::{BLayout, Config, DType, Device, Family, KernelError, Problem, Space};

pub use flash::{flash_split_floats, GPU_MAX_FLASH_SPLIT, GPU_MAX_HEAD_DIM};
pub use gemm::{gemm_kernel_for, GPU_MAX_SPLIT_K, GPU_SPLIT_K_WORKSPACE_BYTES};

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

/// Whether the model has `v_mfma_f32_32x32x16_fp8_fp8` (CDNA3: E4M3 FNUZ bytes).
pub fn has_fp8_mfma(g: &GpuModel) -> bool {
    matches!(g.arch, "gfx940" | "gfx941" | "gfx942")
}

/// Whether the model has `mma.sync.m16n8k32` on fp8 bytes (E4M3 and E5M2: sm_89 and later).
pub fn has_fp8_mma(g: &GpuModel) -> bool {
    g.vendor == Vendor::Nvidia
        && g.arch
            .strip_prefix("sm_")
            .and_then(|v| v.parse::<u32>().ok())
            .is_some_and(|v| v >= 89)
}

/// Whether the model has Hopper's warpgroup MMA (`wgmma.mma_async`), which the arch-specific
/// target sm_90a compiles and only sm_90 devices run.
pub fn has_wgmma(g: &GpuModel) -> bool {
    g.vendor == Vendor::Nvidia && g.arch == "sm_90"
}

/// Values of `dtype` in one 16-byte load (the skinny GEMM's, the grouped paged attention's).
fn vec_of(dtype: DType) -> usize {
    16 / dtype.size()
}

/// LDS bytes one block of a config allocates (as declared in the sources).
pub fn lds_bytes(config: &Config, problem: &Problem, g: &GpuModel) -> usize {
    match (config, problem) {
        (Config::GpuGemm(c), _) => match c.variant {
            GpuGemmVariant::Tiled => 4 * (c.bk * (c.bm + 1) + c.bk * (c.bn + 1)),
            // Two tiles of each with 8 halves of padding when pipelined (16-byte rows).
            // Rows of 16-bit words: fp8 bytes two to a word.
            GpuGemmVariant::Mfma if c.stages > 1 => {
                2 * c.stages * (c.bm + c.bn) * (c.bk * problem.dtype().size() / 2 + 8)
            }
            GpuGemmVariant::Mfma => 2 * (c.bm + c.bn) * (c.bk + 4),
            GpuGemmVariant::Mma if c.stages > 1 => dynamic_lds_bytes(config, problem),
            GpuGemmVariant::Mma => 2 * (c.bm + c.bn) * (c.bk + 8),
            GpuGemmVariant::Wgmma => dynamic_lds_bytes(config, problem),
            GpuGemmVariant::Skinny => 0,
        },
        (Config::GpuFlash(c), Problem::Flash(p)) => match c.variant {
            GpuFlashVariant::Rows => 4 * c.bc * (p.head_dim + p.v_head_dim),
            GpuFlashVariant::Mma => dynamic_lds_bytes(config, problem),
            // 16-bit K [bc][d + 4] and Vᵀ [dv][bc + 4].
            GpuFlashVariant::Mfma => 2 * (c.bc * (p.head_dim + 4) + p.v_head_dim * (c.bc + 4)),
        },
        // Scores and the waves' maxima and sums; then the query (a thread per token) or
        // each wave's P·V sums (groups of lanes).
        (Config::GpuPaged(c), Problem::Paged(p)) => {
            let waves = c.threads / g.wave_size as usize;
            if c.mma {
                return dynamic_lds_bytes(config, problem);
            }
            if c.mfma {
                return paged_mfma_lds_bytes(c, p, waves);
            }
            if c.heads > 1 {
                // Each head's query and scores.
                return 4 * c.heads * (p.head_dim + c.partition);
            }
            let rows = if c.lanes > 1 {
                waves * p.v_head_dim
            } else {
                p.head_dim
            };
            4 * (c.partition + waves + rows)
        }
        _ => 0,
    }
}

/// The matrix-core paged attention's static LDS: one pool holding the query rows (16-bit,
/// padded by 8 halves) and later a 128-column chunk of the heads' outputs (f32), whichever is
/// larger, then each wave's maxima and sums of 16 heads.
fn paged_mfma_lds_bytes(c: &GpuPagedConfig, p: &PagedProblem, waves: usize) -> usize {
    let pool = (2 * c.heads * (p.head_dim + 8)).max(4 * c.heads * 128);
    pool + 2 * 4 * waves * 16
}

/// Alignment of a swizzled wgmma GEMM's tiles in shared memory: the hardware swizzles by
/// address bits 4–9, so each 128-byte-swizzled tile starts on a 1024-byte boundary. The
/// kernel rounds its dynamic shared memory up to one, and declares this much more.
pub const SWIZZLE_ALIGN: usize = 1024;

/// Bytes of dynamic shared memory a build of `config` declares: the pipelined mma GEMM's
/// stages of 16-bit A and B tiles (rows padded by 8 elements; B `[bk][bn + 8]` for a K×N B,
/// else `[bn][bk + 8]`), the wgmma GEMM's stages of A and B in 8×8 core matrices or
/// swizzled rows (no padding: the instruction reads each core matrix as 128 contiguous
/// bytes; swizzled tiles [`SWIZZLE_ALIGN`] more for their alignment; warp-specialized ones
/// two 8-byte mbarriers a stage after them), the mma flash
/// attention's 16-bit K and V tiles (`[bc][d + 8]` each; with `wgmma`, swizzled rows of 64
/// dims without padding, [`SWIZZLE_ALIGN`] more), the tensor-core paged attention's two
/// stages of key (and value) rows (on an fp8 cache, two of its bytes and one widened), its
/// query, weights, scores and row statistics. 0 for
/// builds whose shared memory is all static.
pub fn dynamic_lds_bytes(config: &Config, problem: &Problem) -> usize {
    match (config, problem) {
        (Config::GpuPaged(c), Problem::Paged(p)) if c.mma => {
            // NVIDIA's 32-wide warps: mma is theirs alone (validation).
            let tile = c.mma_tile(32);
            let key_row = p.head_dim + 8;
            // A latent cache's values are read from the key rows.
            let value_row = if p.is_latent() { 0 } else { p.v_head_dim + 8 };
            let weights_row = tile + 8;
            let stage = tile * (key_row + value_row);
            // An fp8 cache's two stages of bytes as they lie, widened into one of 16-bit rows.
            let tiles = match p.fp8() {
                Some(_) => {
                    let values = if p.is_latent() { 0 } else { p.v_head_dim };
                    2 * tile * (p.head_dim + values) + 2 * stage
                }
                None => 2 * 2 * stage,
            };
            tiles + 2 * (16 * key_row + 16 * weights_row) + 4 * (16 * tile + 3 * 16)
        }
        (Config::GpuFlash(c), Problem::Flash(p)) if c.variant == GpuFlashVariant::Mma => {
            if c.wgmma {
                // Two stages and their full and empty mbarriers where specialized, and the
                // two warpgroups' turns where they take turns.
                let stages = if c.specialized { 2 } else { 1 };
                stages * (2 * 2 * c.bc * p.head_dim + if c.specialized { 16 } else { 0 })
                    + if c.pingpong { 16 } else { 0 }
                    + SWIZZLE_ALIGN
            } else {
                // K and V tiles; with 32 rows a warp past head size 64, the Q tile too (the
                // kernel's KT_Q_SHARED).
                let q_rows = if c.lanes == 1 && p.head_dim > 64 {
                    c.br
                } else {
                    0
                };
                2 * (2 * c.bc + q_rows) * (p.head_dim + 8)
            }
        }
        (Config::GpuGemm(c), Problem::Gemm(p))
            if c.variant == GpuGemmVariant::Mma && c.stages > 1 =>
        {
            // Rows of 16-bit words: fp8 bytes two to a word.
            let depth = c.bk * p.dtype.size() / 2;
            let b = match p.b_layout {
                BLayout::Kn => depth * (c.bn + 8),
                BLayout::Nk => c.bn * (depth + 8),
            };
            2 * c.stages * (c.bm * (depth + 8) + b)
        }
        (Config::GpuGemm(c), Problem::Gemm(p)) if c.variant == GpuGemmVariant::Wgmma => {
            c.stages * (c.bm + c.bn) * c.bk * p.dtype.size()
                + if c.swizzle > 0 { SWIZZLE_ALIGN } else { 0 }
                + if c.specialized { 16 * c.stages } else { 0 }
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

impl Space for GpuSpace {
    fn backend(&self) -> &'static str {
        "gpu"
    }

    fn candidates(&self, problem: &Problem, device: &Device) -> Vec<Config> {
        let Ok(g) = gpu_of(device, problem.family()) else {
            return Vec::new();
        };
        let all: Vec<Config> = match problem {
            Problem::Gemm(p) => gemm::candidates(p, g)
                .into_iter()
                .map(Config::GpuGemm)
                .collect(),
            Problem::Flash(p) => flash::candidates(p, g)
                .into_iter()
                .map(Config::GpuFlash)
                .collect(),
            Problem::Paged(_) => paged::candidates()
                .into_iter()
                .map(Config::GpuPaged)
                .collect(),
        };
        // A family's list may name a config twice (a decode tile that is also one of the
        // general tiles): each is offered once, where it first ranks, so no search times it
        // twice.
        let mut seen = std::collections::HashSet::new();
        all.into_iter()
            .filter(|c| seen.insert(*c) && self.validate(c, problem, device).is_ok())
            .collect()
    }

    fn validate(
        &self,
        config: &Config,
        problem: &Problem,
        device: &Device,
    ) -> Result<(), KernelError> {
        let g = gpu_of(device, problem.family())?;
        if let (Problem::Gemm(p), Config::Rocblas(_)) = (problem, config) {
            if let Some(group) = p.int4 {
                return Err(invalid(
                    Family::Gemm,
                    format!("int4 weights (int4 = {group}): rocBLAS multiplies dense matrices; kerntune's GPU GEMMs unpack the words"),
                ));
            }
        }
        match (config, problem) {
            (Config::GpuGemm(c), Problem::Gemm(p)) => gemm::validate(c, p, g)?,
            (Config::GpuFlash(c), Problem::Flash(p)) => flash::validate(c, p, g)?,
            (Config::GpuPaged(c), Problem::Paged(p)) => paged::validate(c, p, g)?,
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
            Problem::Gemm(_) => Config::GpuGemm(gemm::default()),
            Problem::Flash(p) => Config::GpuFlash(flash::default(p)),
            Problem::Paged(p) => Config::GpuPaged(paged::default(p)),
        }
    }

    fn heuristic(&self, problem: &Problem, device: &Device) -> Config {
        let gpu = match device {
            Device::Gpu(g) => Some(*g),
            Device::Cpu(_) => None,
        };
        match problem {
            Problem::Gemm(p) => Config::GpuGemm(gemm::heuristic(p, gpu)),
            Problem::Flash(p) => Config::GpuFlash(flash::heuristic(p, gpu)),
            Problem::Paged(p) => Config::GpuPaged(paged::default(p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode shapes once offered some tiles twice: on Hopper the unswizzled 64x128 wgmma tile
    /// of 3 stages (a decode tile and a general one), on sm_80 and sm_90 four mma tiles of 64
    /// rows at 33 to 64 rows of A.
    #[test]
    fn no_config_is_offered_twice() {
        for device in ["a100", "h100", "h200", "mi250", "mi300x"] {
            let device = Device::lookup(device).unwrap();
            for spec in [
                "gemm:m=1,n=8192,k=4096,dtype=bf16",
                "gemm:m=64,n=28672,k=8192,dtype=bf16",
                "gemm:m=48,n=1280,k=8192,dtype=f16",
                "gemm:m=2048,n=7168,k=8192,dtype=bf16",
                "gemm:m=17,n=130,k=256,dtype=f16,b=kn",
                "gemm:m=4,n=1280,k=8192,dtype=fp8_e4m3",
                "gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3fnuz",
                "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
                "flash:q_len=65,q_heads=4,kv_heads=2,head_dim=80,dtype=f16,causal=false",
                "paged:num_seqs=8,context_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
            ] {
                let p: Problem = spec.parse().unwrap();
                let all = GpuSpace.candidates(&p, &device);
                assert!(!all.is_empty(), "{spec}");
                for (i, c) in all.iter().enumerate() {
                    assert!(!all[..i].contains(c), "{spec} on {device}: {c} twice");
                }
            }
        }
    }
}
