//! Flash attention's GPU space: the rows variant (a row of queries per group of lanes, any
//! input type) and the matrix-core variants (mma on NVIDIA, MFMA on CDNA) for 16-bit inputs.

use crate::config::{GpuFlashConfig, GpuFlashVariant};
use crate::device::GpuModel;
use crate::problem::FlashProblem;
use crate::{DType, Family, KernelError};

use super::{check_threads, has_mfma, has_mma, invalid};

/// Head dimensions the flash kernel holds in registers: beyond this a row does not fit.
pub const GPU_MAX_HEAD_DIM: usize = 256;

pub(super) fn validate(
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

/// Matrix-core variants first, the likeliest winners where they exist (validation drops them
/// elsewhere); larger tiles first. 128-key tiles for mma only, whose tiles are in dynamic
/// shared memory.
pub(super) fn candidates() -> Vec<GpuFlashConfig> {
    let mut out = Vec::new();
    for variant in [GpuFlashVariant::Mma, GpuFlashVariant::Mfma] {
        let wide: &[usize] = if variant == GpuFlashVariant::Mma {
            &[128, 64, 32, 16]
        } else {
            &[64, 32, 16]
        };
        for br in [64, 128, 32, 16] {
            for &bc in wide {
                out.push(GpuFlashConfig {
                    br,
                    bc,
                    lanes: 2,
                    variant,
                });
            }
        }
    }
    for br in [16, 32, 64, 128] {
        for bc in [16, 32, 64] {
            for lanes in [1, 2, 4, 8, 16] {
                out.push(GpuFlashConfig {
                    br,
                    bc,
                    lanes,
                    variant: GpuFlashVariant::Rows,
                });
            }
        }
    }
    out
}

/// What runs untuned: the rows variant, every input type and model.
pub(super) fn default(p: &FlashProblem) -> GpuFlashConfig {
    // Head sizes are multiples of 8 in practice; odd ones get fewer lanes.
    let lanes = [8, 4, 2, 1]
        .into_iter()
        .find(|l| p.head_dim.is_multiple_of(*l))
        .unwrap_or(1);
    GpuFlashConfig {
        br: (256 / lanes).min(64),
        bc: if p.head_dim > 128 { 16 } else { 32 },
        lanes,
        variant: GpuFlashVariant::Rows,
    }
}

/// Matrix cores for 16-bit attention: 64 query rows (four warps of 16 on NVIDIA, two waves of
/// 32 on CDNA) and 64-key tiles, 32 over head size 128 (within 48 KiB of shared memory on
/// NVIDIA); else the default.
pub(super) fn heuristic(p: &FlashProblem, gpu: Option<&GpuModel>) -> GpuFlashConfig {
    let variant = match gpu {
        Some(g) if p.dtype != DType::F32 => {
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
    match variant {
        Some(variant) => GpuFlashConfig {
            br: 64,
            bc: if p.head_dim > 128 { 32 } else { 64 },
            lanes: 2,
            variant,
        },
        None => default(p),
    }
}
