//! Flash attention's GPU space: the rows variant (a row of queries per group of lanes, any
//! input type) and the matrix-core variants (mma on NVIDIA, MFMA on CDNA) for 16-bit inputs.

use crate::config::{GpuFlashConfig, GpuFlashVariant};
use crate::device::GpuModel;
use crate::problem::FlashProblem;
use crate::{DType, Family, KernelError};

use super::{check_threads, has_mfma, has_mma, invalid};

/// Head dimensions the flash kernel holds in registers: beyond this a row does not fit.
pub const GPU_MAX_HEAD_DIM: usize = 256;

/// Dims of q and of the output row one lane of the rows variant holds in registers. Past
/// this the two arrays alone fill the register file: at head size 128 one lane a row spilled
/// 153–179 registers on sm_90 and 487–550 on gfx90a in every tile shape, and NVRTC took tens
/// of seconds over each such build, the slowest of a plan by far.
const FLASH_MAX_DIMS_PER_LANE: usize = 64;

/// Whether `lanes` leave each lane of the rows variant more than
/// [`FLASH_MAX_DIMS_PER_LANE`] of `head_dim`, where more lanes would divide it (an odd head
/// size has no other choice).
fn too_few_lanes(head_dim: usize, lanes: usize) -> bool {
    head_dim / lanes > FLASH_MAX_DIMS_PER_LANE && lanes < 32 && head_dim.is_multiple_of(2 * lanes)
}

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
    if c.paired && c.variant != GpuFlashVariant::Mma {
        return Err(invalid(
            f,
            "paired query tiles are a choice of the mma variant only: take paired = false",
        ));
    }
    if c.paired && !p.causal {
        return Err(invalid(
            f,
            "paired query tiles even out a causal mask's work; without one every tile is equal: take paired = false",
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
    if too_few_lanes(p.head_dim, c.lanes) {
        // The fewest lanes the rule accepts.
        let enough = (1..=5)
            .map(|e| c.lanes << e)
            .find(|&l| p.head_dim.is_multiple_of(l) && !too_few_lanes(p.head_dim, l))
            .unwrap_or(32);
        return Err(invalid(
            f,
            format!(
                "lanes = {} leaves {} dims of head_dim {} to each lane, more than the {FLASH_MAX_DIMS_PER_LANE} that fit in registers: take lanes = {enough} or more",
                c.lanes,
                p.head_dim / c.lanes,
                p.head_dim,
            ),
        ));
    }
    check_threads(f, c.br * c.lanes, g)
}

/// Matrix-core variants first, the likeliest winners where they exist (validation drops them
/// elsewhere); larger tiles first. 128-key tiles for mma only, whose tiles are in dynamic
/// shared memory; mma tiles paired (causal problems) and not.
pub(super) fn candidates() -> Vec<GpuFlashConfig> {
    let mut out = Vec::new();
    for variant in [GpuFlashVariant::Mma, GpuFlashVariant::Mfma] {
        let (wide, pairings): (&[usize], &[bool]) = if variant == GpuFlashVariant::Mma {
            (&[128, 64, 32, 16], &[false, true])
        } else {
            (&[64, 32, 16], &[false])
        };
        for br in [64, 128, 32, 16] {
            for &bc in wide {
                for &paired in pairings {
                    out.push(GpuFlashConfig {
                        br,
                        bc,
                        lanes: 2,
                        variant,
                        paired,
                    });
                }
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
                    paired: false,
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
        paired: false,
    }
}

/// Matrix cores for 16-bit attention; else the default. On NVIDIA up to head size 128, the
/// unpaired tiles measured best on an H200 (Llama-70B TP8 prefill, head size 128, each
/// length's whole space in one run): 64 query rows by 128 keys at 512 queries, 128 by 128 at
/// 2048 and 8192 (taken from 1024). Paired 128-key tiles were faster at 8192 but spill 15
/// registers on sm_90, which the plan prunes. Elsewhere 64 query rows (four warps of 16 on
/// NVIDIA, two waves of 32 on CDNA) and 64-key tiles, 32 over head size 128.
pub(super) fn heuristic(p: &FlashProblem, gpu: Option<&GpuModel>) -> GpuFlashConfig {
    if let Some(g) = gpu.filter(|g| has_mma(g) && p.dtype != DType::F32) {
        let measured = GpuFlashConfig {
            br: if p.q_len >= 1024 { 128 } else { 64 },
            bc: 128,
            lanes: 2,
            variant: GpuFlashVariant::Mma,
            paired: false,
        };
        if p.head_dim <= 128 && validate(&measured, p, g).is_ok() {
            return measured;
        }
    }
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
            paired: false,
        },
        None => default(p),
    }
}

#[cfg(test)]
mod tests {
    use super::{candidates, default, heuristic, validate, GPU_MAX_HEAD_DIM};
    use crate::config::{GpuFlashConfig, GpuFlashVariant};
    use crate::device::GpuModel;
    use crate::problem::FlashProblem;
    use crate::{Device, Problem};

    fn problem(head_dim: usize) -> FlashProblem {
        match format!("flash:q_len=64,q_heads=2,head_dim={head_dim}").parse() {
            Ok(Problem::Flash(p)) => p,
            other => unreachable!("a valid flash problem: {other:?}"),
        }
    }

    fn h200() -> &'static GpuModel {
        match Device::lookup("h200") {
            Ok(Device::Gpu(g)) => g,
            other => unreachable!("the H200 is a GPU: {other:?}"),
        }
    }

    fn check(head_dim: usize, lanes: usize) -> Result<(), String> {
        let rows = GpuFlashConfig {
            br: 32,
            bc: 16,
            lanes,
            variant: GpuFlashVariant::Rows,
            paired: false,
        };
        validate(&rows, &problem(head_dim), h200()).map_err(|e| e.to_string())
    }

    #[test]
    fn lanes_that_leave_a_row_beyond_the_registers_are_refused_naming_enough() {
        let err = check(128, 1).unwrap_err();
        assert!(
            err.contains("lanes = 1 leaves 128 dims of head_dim 128")
                && err.contains("take lanes = 2"),
            "{err}"
        );
        assert!(check(256, 1).unwrap_err().contains("take lanes = 4"));
        assert!(check(256, 2).unwrap_err().contains("take lanes = 4"));
        check(256, 4).unwrap();
        check(128, 2).unwrap();
        check(64, 1).unwrap();
        // Only where more lanes divide the head size: 65 dims a lane is the best 130 allows.
        assert!(check(130, 1).unwrap_err().contains("take lanes = 2"));
        check(130, 2).unwrap();
        check(131, 1).unwrap();
    }

    #[test]
    fn the_nvidia_guess_follows_the_tiles_measured_best_by_length() {
        let guess = |model: &str, spec: &str| {
            let Ok(Device::Gpu(g)) = Device::lookup(model) else {
                unreachable!("{model} is a GPU of the catalog")
            };
            let Ok(Problem::Flash(p)) = spec.parse() else {
                unreachable!("a valid flash problem: {spec}")
            };
            let c = heuristic(&p, Some(g));
            validate(&c, &p, g).unwrap_or_else(|e| panic!("{model} {spec}: {c}: {e}"));
            assert!(
                candidates().contains(&c),
                "{model} {spec}: {c} is no candidate"
            );
            c.to_string()
        };
        let llama = |q: usize, more: &str| {
            format!("flash:q_len={q},q_heads=8,kv_heads=1,head_dim=128,dtype=bf16{more}")
        };
        assert_eq!(guess("h200", &llama(512, "")), "gpu mma br=64 bc=128");
        assert_eq!(guess("h200", &llama(2048, "")), "gpu mma br=128 bc=128");
        assert_eq!(guess("a100", &llama(8192, "")), "gpu mma br=128 bc=128");
        assert_eq!(
            guess("h200", &llama(8192, ",causal=false")),
            "gpu mma br=128 bc=128"
        );
        // Beyond head size 128 and on AMD, where nothing was measured, the earlier guess.
        assert_eq!(
            guess("h200", "flash:q_len=2048,q_heads=8,head_dim=256,dtype=bf16"),
            "gpu mma br=64 bc=32"
        );
        assert_eq!(guess("mi250", &llama(2048, "")), "gpu mfma br=64 bc=64");
    }

    #[test]
    fn the_default_is_valid_for_every_head_size() {
        for head_dim in 1..=GPU_MAX_HEAD_DIM {
            let p = problem(head_dim);
            validate(&default(&p), &p, h200())
                .unwrap_or_else(|e| panic!("head_dim {head_dim}: {e}"));
        }
    }
}
