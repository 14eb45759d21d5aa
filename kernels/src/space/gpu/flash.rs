//! Flash attention's GPU space: the rows variant (a row of queries per group of lanes, any
//! input type) and the matrix-core variants (mma on NVIDIA, MFMA on CDNA) for 16-bit inputs.

use crate::config::{GpuFlashConfig, GpuFlashVariant};
use crate::device::GpuModel;
use crate::problem::FlashProblem;
use crate::{DType, Family, KernelError};

use super::{check_threads, has_mfma, has_mma, has_wgmma, invalid, GPU_SPLIT_K_WORKSPACE_BYTES};

/// Head dimensions the flash kernel holds in registers: beyond this a row does not fit.
pub const GPU_MAX_HEAD_DIM: usize = 256;

/// Blocks that may share the keys of one query tile (split-KV).
pub const GPU_MAX_FLASH_SPLIT: usize = 8;

/// Floats of split-KV partial results a config of `split` needs on `p`: each block's
/// unnormalized output rows, then their maxima, then their sums.
pub fn flash_split_floats(p: &FlashProblem, split: usize) -> [usize; 3] {
    if split <= 1 {
        return [0; 3];
    }
    let slots = split * p.batch * p.q_len * p.q_heads;
    [slots * p.v_head_dim, slots, slots]
}

/// Dims of q and of the output row one lane of the rows variant holds in registers. Past
/// this the two arrays alone fill the register file: at head size 128 one lane a row spilled
/// 153–179 registers on sm_90 and 487–550 on gfx90a in every tile shape, and NVRTC took tens
/// of seconds over each such build, the slowest of a plan by far.
const FLASH_MAX_DIMS_PER_LANE: usize = 64;

/// Whether `lanes` leave each lane of the rows variant more than
/// [`FLASH_MAX_DIMS_PER_LANE`] of `p.head_dim`, where more lanes would divide it and the
/// value heads (an odd head size has no other choice).
fn too_few_lanes(p: &FlashProblem, lanes: usize) -> bool {
    p.head_dim / lanes > FLASH_MAX_DIMS_PER_LANE && lanes < 32 && divides(p, 2 * lanes)
}

/// Whether `lanes` divide both the key and the value heads.
fn divides(p: &FlashProblem, lanes: usize) -> bool {
    p.head_dim.is_multiple_of(lanes) && p.v_head_dim.is_multiple_of(lanes)
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
    if c.wgmma && c.variant != GpuFlashVariant::Mma {
        return Err(invalid(
            f,
            "wgmma: warpgroup MMA is a choice of the mma variant only: take wgmma = false",
        ));
    }
    if c.specialized && !(c.wgmma && c.br == 128 && !c.paired) {
        return Err(invalid(
            f,
            format!(
                "specialized: a producer warpgroup feeds the two warpgroups of the unpaired wgmma tiles of 128 rows (not wgmma = {}, br = {}, paired = {}): take specialized = false",
                c.wgmma, c.br, c.paired
            ),
        ));
    }
    if c.pingpong && !c.specialized {
        return Err(invalid(
            f,
            "pingpong: the turns are the warp-specialized tiles' two multiplying warpgroups': take pingpong = false",
        ));
    }
    if c.tma && !c.specialized {
        return Err(invalid(
            f,
            "tma: the tensor-memory copies are the warp-specialized tiles' producer's: take tma = false",
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
    if c.split != 1 {
        if !c.split.is_power_of_two() || c.split > GPU_MAX_FLASH_SPLIT {
            return Err(invalid(
                f,
                format!(
                    "split = {}: must be a power of two up to {GPU_MAX_FLASH_SPLIT}",
                    c.split
                ),
            ));
        }
        if c.variant != GpuFlashVariant::Mma || c.paired {
            return Err(invalid(
                f,
                format!(
                    "split = {}: splitting the keys is a choice of the unpaired mma variant only: take split = 1",
                    c.split
                ),
            ));
        }
        let bytes = 4 * flash_split_floats(p, c.split).iter().sum::<usize>();
        if bytes > GPU_SPLIT_K_WORKSPACE_BYTES {
            return Err(invalid(
                f,
                format!(
                    "split = {} needs {} MiB of partial results for {} query rows of {} heads; at most {} MiB",
                    c.split,
                    bytes >> 20,
                    p.batch * p.q_len,
                    p.q_heads,
                    GPU_SPLIT_K_WORKSPACE_BYTES >> 20
                ),
            ));
        }
    }
    if !c.bc.is_power_of_two() || c.bc > 128 {
        return Err(invalid(
            f,
            format!("bc = {} must be a power of two up to 128", c.bc),
        ));
    }
    if c.prefetch && c.variant != GpuFlashVariant::Mfma {
        return Err(invalid(
            f,
            "prefetch: only the MFMA variant loads the next key tile into registers (the mma one copies it by cp.async stages): take prefetch = false",
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
        if !p.head_dim.is_multiple_of(tile) || !p.v_head_dim.is_multiple_of(tile) {
            return Err(invalid(
                f,
                format!(
                    "the {variant} variant needs head_dim {} and v_head_dim {} multiples of {tile}",
                    p.head_dim, p.v_head_dim
                ),
            ));
        }
        // Two threads a row on average: a warp's 16 rows, a wave's 32; mma warps of 32 rows
        // (two row tiles) have one.
        let warp_rows = c.variant == GpuFlashVariant::Mma && c.lanes == 1;
        if c.br == 0
            || !c.br.is_multiple_of(tile)
            || c.bc == 0
            || !c.bc.is_multiple_of(tile)
            || !(c.lanes == 2 || warp_rows)
        {
            let lanes = if c.variant == GpuFlashVariant::Mma {
                "1 or 2"
            } else {
                "2"
            };
            return Err(invalid(
                f,
                format!(
                    "{variant} tiles: br = {} and bc = {} must be multiples of {tile}, lanes = {} must be {lanes}",
                    c.br, c.bc, c.lanes
                ),
            ));
        }
        // A thread of a 32-row warp holds head_dim of O's accumulators (two rows of each row
        // tile): past 128, with S's, more than the 255 registers a thread has.
        if warp_rows && p.head_dim > 128 {
            return Err(invalid(
                f,
                format!(
                    "lanes = 1 (32 query rows a warp) holds {} of O's accumulators a thread at head_dim {}, more than fit beside S's in 255 registers past 128: take lanes = 2",
                    p.head_dim, p.head_dim
                ),
            ));
        }
        if warp_rows && (c.wgmma || !c.br.is_multiple_of(32)) {
            return Err(invalid(
                f,
                format!(
                    "lanes = 1 (32 query rows a warp) takes mma.sync tiles of whole warps, not br = {}{}: take lanes = 2",
                    c.br,
                    if c.wgmma { " by wgmma" } else { "" }
                ),
            ));
        }
        if c.wgmma {
            validate_wgmma(c, p, g)?;
        }
        return check_threads(f, c.threads(), g);
    }
    // Lanes of a row exchange partial dot products by shuffles inside one wave, and share
    // its output row.
    if !c.lanes.is_power_of_two() || c.lanes > 32 || !divides(p, c.lanes) {
        return Err(invalid(
            f,
            format!(
                "lanes = {} must be a power of two up to 32 dividing head_dim {} and v_head_dim {}",
                c.lanes, p.head_dim, p.v_head_dim
            ),
        ));
    }
    if too_few_lanes(p, c.lanes) {
        // The fewest lanes the rule accepts.
        let enough = (1..=5)
            .map(|e| c.lanes << e)
            .find(|&l| divides(p, l) && !too_few_lanes(p, l))
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

/// The wgmma form's own rules: sm_90, whole warpgroups of query rows (64 a warpgroup), and
/// key tiles and head sizes of 64 or 128 (the instruction's N for S and for O; K and V rows
/// in 128-byte swizzled pieces of 64 dims).
fn validate_wgmma(c: &GpuFlashConfig, p: &FlashProblem, g: &GpuModel) -> Result<(), KernelError> {
    let f = Family::Flash;
    if !has_wgmma(g) {
        return Err(invalid(
            f,
            format!(
                "wgmma: {} ({}) has no wgmma instructions (sm_90 only); take wgmma = false",
                g.name, g.arch
            ),
        ));
    }
    if !matches!(p.head_dim, 64 | 128) || !matches!(c.bc, 64 | 128) || !c.br.is_multiple_of(64) {
        return Err(invalid(
            f,
            format!(
                "wgmma: head_dim {} and bc = {} must be 64 or 128, br = {} a multiple of 64 (whole warpgroups)",
                p.head_dim, c.bc, c.br
            ),
        ));
    }
    // V's tiles share K's swizzled layout, and O the instruction's N of the keys' width.
    if p.narrow_values() {
        return Err(invalid(
            f,
            format!(
                "wgmma: value heads of v_head_dim {} narrower than head_dim {}: take wgmma = false (mma.sync)",
                p.v_head_dim, p.head_dim
            ),
        ));
    }
    Ok(())
}

/// Matrix-core variants first, the likeliest winners where they exist (validation drops them
/// elsewhere): on sm_90 the mma tiles by warpgroup MMA before those by mma.sync; larger
/// tiles first. 128-key tiles for mma only, whose tiles are in dynamic shared memory; mma
/// tiles paired (causal problems) and not; mma tiles with their keys split, first of all
/// where 64-row tiles give the device's multiprocessors fewer than two blocks each (a long
/// prefill of few heads: each block's run of keys is then the time).
pub(super) fn candidates(p: &FlashProblem, g: &GpuModel) -> Vec<GpuFlashConfig> {
    let mut out = all_candidates();
    let blocks = p.q_len.div_ceil(64) * p.q_heads * p.batch;
    if blocks < 2 * g.compute_units as usize {
        // A stable sort keeps each group's order.
        out.sort_by_key(|c| c.split == 1);
    }
    out
}

fn all_candidates() -> Vec<GpuFlashConfig> {
    let mut out = Vec::new();
    // Warpgroup MMA (sm_90), first of the matrix-core forms: unsplit, paired, split; the
    // 128-row tiles also warp-specialized, each after its plain form, copying by cp.async
    // and by TMA, each without and with the two warpgroups taking turns.
    let wgmma = |br, bc, paired, split| GpuFlashConfig {
        paired,
        split,
        wgmma: true,
        ..GpuFlashConfig::new(GpuFlashVariant::Mma, br, bc, 2)
    };
    let specialized = |out: &mut Vec<GpuFlashConfig>, c: GpuFlashConfig| {
        for (tma, pingpong) in [(false, false), (false, true), (true, false), (true, true)] {
            out.push(GpuFlashConfig {
                specialized: true,
                pingpong,
                tma,
                ..c
            });
        }
    };
    for (br, bc) in [(128, 128), (64, 128), (128, 64), (64, 64)] {
        out.push(wgmma(br, bc, false, 1));
        if br == 128 {
            specialized(&mut out, wgmma(br, bc, false, 1));
        }
    }
    for br in [128, 64] {
        out.push(wgmma(br, 128, true, 1));
    }
    for br in [128, 64] {
        for split in [2, 4] {
            out.push(wgmma(br, 128, false, split));
            if br == 128 {
                specialized(&mut out, wgmma(br, 128, false, split));
            }
        }
    }
    // Warps of 32 query rows (mma.sync, one thread a row): FlashAttention-2's layout, each K
    // and V fragment feeding two row tiles; key tiles of up to 64, as S's registers double
    // (at head size 128, ptxas fits 32-key tiles in 255 registers and spills 64-key ones).
    for br in [128, 64] {
        for bc in [32, 64] {
            for paired in [false, true] {
                out.push(GpuFlashConfig {
                    paired,
                    ..GpuFlashConfig::new(GpuFlashVariant::Mma, br, bc, 1)
                });
            }
        }
    }
    for bc in [32, 64] {
        for split in [2, 4] {
            out.push(GpuFlashConfig {
                split,
                ..GpuFlashConfig::new(GpuFlashVariant::Mma, 128, bc, 1)
            });
        }
    }
    for variant in [GpuFlashVariant::Mma, GpuFlashVariant::Mfma] {
        let (wide, pairings): (&[usize], &[bool]) = if variant == GpuFlashVariant::Mma {
            (&[128, 64, 32, 16], &[false, true])
        } else {
            (&[64, 32, 16], &[false])
        };
        // MFMA: each tile with the next key tile's loads in flight over its products, then
        // without (fewer registers: more waves a SIMD for the smaller tiles).
        let prefetches: &[bool] = if variant == GpuFlashVariant::Mfma {
            &[true, false]
        } else {
            &[false]
        };
        for br in [64, 128, 32, 16] {
            for &bc in wide {
                for &paired in pairings {
                    for &prefetch in prefetches {
                        out.push(GpuFlashConfig {
                            paired,
                            prefetch,
                            ..GpuFlashConfig::new(variant, br, bc, 2)
                        });
                    }
                }
            }
        }
        // Split-KV, for few long query tiles (a long causal prefill of few heads): the
        // largest tiles, two or four blocks a tile.
        if variant == GpuFlashVariant::Mma {
            for br in [128, 64] {
                for bc in [128, 64] {
                    for split in [2, 4] {
                        out.push(GpuFlashConfig {
                            split,
                            ..GpuFlashConfig::new(variant, br, bc, 2)
                        });
                    }
                }
            }
        }
    }
    for br in [16, 32, 64, 128] {
        for bc in [16, 32, 64] {
            for lanes in [1, 2, 4, 8, 16] {
                out.push(GpuFlashConfig::new(GpuFlashVariant::Rows, br, bc, lanes));
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
        .find(|&l| divides(p, l))
        .unwrap_or(1);
    GpuFlashConfig::new(
        GpuFlashVariant::Rows,
        (256 / lanes).min(64),
        if p.head_dim > 128 { 16 } else { 32 },
        lanes,
    )
}

/// Matrix cores for 16-bit attention; else the default. On NVIDIA up to head size 128, the
/// unpaired tiles measured best on an H200 (Llama-70B TP8 prefill, head size 128, each
/// length's whole space in one run): 64 query rows by 128 keys at 512 queries, 128 by 128 at
/// 2048 and 8192 (taken from 1024). Paired 128-key tiles were faster at 8192 but spill 15
/// registers on sm_90, which the plan prunes. On CDNA up to head size 128, 128 query rows
/// (four waves of 32) by 64 keys, the next key tile prefetched (not measured: no AMD device
/// has been lent). Elsewhere 64 query rows (four warps of 16 on NVIDIA, two waves of 32 on
/// CDNA) and 64-key tiles, 32 over head size 128.
pub(super) fn heuristic(p: &FlashProblem, gpu: Option<&GpuModel>) -> GpuFlashConfig {
    if let Some(g) = gpu.filter(|g| has_mma(g) && p.dtype != DType::F32) {
        let measured = GpuFlashConfig::new(
            GpuFlashVariant::Mma,
            if p.q_len >= 1024 { 128 } else { 64 },
            128,
            2,
        );
        if p.head_dim <= 128 && validate(&measured, p, g).is_ok() {
            return measured;
        }
    }
    let whole = |tile: usize| p.head_dim.is_multiple_of(tile) && p.v_head_dim.is_multiple_of(tile);
    let variant = match gpu {
        Some(g) if p.dtype != DType::F32 => {
            if has_mma(g) && whole(16) {
                Some(GpuFlashVariant::Mma)
            } else if has_mfma(g) && whole(32) {
                Some(GpuFlashVariant::Mfma)
            } else {
                None
            }
        }
        _ => None,
    };
    match variant {
        // CDNA up to head size 128: four waves of 32 queries, 64-key tiles, the next one's
        // loads in flight (at 64 queries a block, K's and V's 64-key tiles of head size 128
        // fill half the LDS: one block, two waves, a CU).
        Some(GpuFlashVariant::Mfma) if p.head_dim <= 128 => GpuFlashConfig {
            prefetch: true,
            ..GpuFlashConfig::new(GpuFlashVariant::Mfma, 128, 64, 2)
        },
        Some(variant) => {
            GpuFlashConfig::new(variant, 64, if p.head_dim > 128 { 32 } else { 64 }, 2)
        }
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

    /// A GPU of the catalog and a flash problem, by name and spec.
    fn on(model: &str, spec: &str) -> (&'static GpuModel, FlashProblem) {
        let Ok(Device::Gpu(g)) = Device::lookup(model) else {
            unreachable!("{model} is a GPU of the catalog")
        };
        let Ok(Problem::Flash(p)) = spec.parse() else {
            unreachable!("a valid flash problem: {spec}")
        };
        (g, p)
    }

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
        let rows = GpuFlashConfig::new(GpuFlashVariant::Rows, 32, 16, lanes);
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

    /// Split-KV tiles come first where unsplit tiles leave the device half empty, last where
    /// the problem has blocks enough; f32 and AMD get none.
    #[test]
    fn split_tiles_come_first_for_few_long_rows() {
        let first = |model: &str, spec: &str| {
            let (g, p) = on(model, spec);
            let valid: Vec<GpuFlashConfig> = candidates(&p, g)
                .into_iter()
                .filter(|c| validate(c, &p, g).is_ok())
                .collect();
            (valid[0].split, valid.iter().filter(|c| c.split > 1).count())
        };
        // Llama-70B TP8 at 2048 tokens: 32 tiles of 64 by 8 heads, 256 blocks for 132 SMs;
        // 12 mma.sync split tiles (4 of 32 rows a warp) and 12 wgmma (8 of them
        // warp-specialized: by cp.async and by TMA, with turns and without).
        let tp8 = "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16";
        assert_eq!(first("h200", tp8), (2, 24));
        // 1024 tokens of 32 heads, 512 blocks: split-KV last, and only in two (four would
        // need 68 MiB of partial results).
        let many = "flash:q_len=1024,q_heads=32,kv_heads=8,head_dim=128,dtype=bf16";
        assert_eq!(first("h200", many), (1, 12));
        assert_eq!(first("mi300x", tp8).1, 0);
        assert_eq!(first("h200", &tp8.replace("bf16", "f32")).1, 0);
    }

    /// Warps of 32 query rows (`lanes` 1): mma.sync tiles of whole warps, first of the
    /// mma.sync candidates, named by their lanes, and with the Q tile in shared memory past
    /// head size 64 (its fragments would take the registers O and S need).
    #[test]
    fn warps_of_32_rows_are_whole_mma_sync_warps_with_q_shared_past_head_size_64() {
        let tp8 = "flash:q_len=4096,q_heads=64,kv_heads=8,head_dim=128,dtype=bf16";
        let (g, p) = on("a100", tp8);
        let all: Vec<GpuFlashConfig> = candidates(&p, g)
            .into_iter()
            .filter(|c| validate(c, &p, g).is_ok())
            .collect();
        let c = all[0];
        assert_eq!(c.to_string(), "gpu mma br=128 bc=32 lanes=1");
        assert_eq!(c.threads(), 128);
        // Two heights by two key tiles, paired and not; their four splits would need more
        // partial results than the workspace holds.
        assert_eq!(all.iter().filter(|c| c.lanes == 1).count(), 8);
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains(r#""lanes":1"#), "{json}");
        assert_eq!(serde_json::from_str::<GpuFlashConfig>(&json).unwrap(), c);
        let bytes = |spec: &str| {
            let problem: Problem = spec.parse().unwrap();
            crate::space::dynamic_lds_bytes(&crate::Config::GpuFlash(c), &problem)
        };
        // K and V tiles of 32 keys, and the 128 query rows, each row 8 halves wider.
        assert_eq!(bytes(tp8), 2 * (2 * 32 + 128) * 136);
        assert_eq!(
            bytes(&tp8.replace("head_dim=128", "head_dim=64")),
            2 * 2 * 32 * 72
        );
        let refused = |model: &str, c: GpuFlashConfig| {
            let (g, p) = on(model, tp8);
            validate(&c, &p, g).unwrap_err().to_string()
        };
        let half_warp = GpuFlashConfig { br: 16, ..c };
        assert!(refused("a100", half_warp).contains("take lanes = 2"));
        let by_wgmma = GpuFlashConfig { wgmma: true, ..c };
        assert!(refused("h200", by_wgmma).contains("take lanes = 2"));
        let mfma = GpuFlashConfig {
            variant: GpuFlashVariant::Mfma,
            ..c
        };
        assert!(refused("mi300x", mfma).contains("must be 2"));
        let (g, wide) = on("a100", &tp8.replace("head_dim=128", "head_dim=256"));
        let err = validate(&c, &wide, g).unwrap_err().to_string();
        assert!(
            err.contains("head_dim 256") && err.contains("take lanes = 2"),
            "{err}"
        );
    }

    /// Warpgroup MMA: sm_90 only, head sizes and key tiles of 64 or 128, whole warpgroups;
    /// first among the matrix-core candidates where it applies.
    #[test]
    fn wgmma_tiles_are_checked_and_come_first_on_sm90() {
        // Blocks enough (64 heads of 4096 queries): unsplit first.
        let tp8 = "flash:q_len=4096,q_heads=64,kv_heads=8,head_dim=128,dtype=bf16";
        let (g, p) = on("h200", tp8);
        let all = candidates(&p, g);
        let c = all[0];
        assert!(c.wgmma && c.split == 1, "{c}");
        assert_eq!(c.to_string(), "gpu mma br=128 bc=128 wgmma");
        validate(&c, &p, g).unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.ends_with(r#""wgmma":true}"#), "{json}");
        assert_eq!(serde_json::from_str::<GpuFlashConfig>(&json).unwrap(), c);
        let refused = |model: &str, spec: &str, c: GpuFlashConfig| {
            let (g, p) = on(model, spec);
            validate(&c, &p, g).unwrap_err().to_string()
        };
        assert!(refused("a100", tp8, c).contains("no wgmma instructions"));
        let d80 = tp8.replace("head_dim=128", "head_dim=80");
        assert!(refused("h200", &d80, c).contains("must be 64 or 128"));
        let narrow = GpuFlashConfig { br: 32, ..c };
        assert!(refused("h200", tp8, narrow).contains("whole warpgroups"));
        let rows = GpuFlashConfig {
            variant: GpuFlashVariant::Rows,
            ..c
        };
        assert!(refused("h200", tp8, rows).contains("mma variant only"));
        let (g, p) = on("a100", tp8);
        assert!(candidates(&p, g)
            .iter()
            .filter(|c| validate(c, &p, g).is_ok())
            .all(|c| !c.wgmma));
    }

    /// Warp-specialized: the unpaired wgmma tiles of 128 rows, each right after its plain
    /// form, with a producer warpgroup more, then taking turns, then copying by TMA.
    #[test]
    fn warp_specialized_tiles_are_the_unpaired_wgmma_tiles_of_128_rows() {
        let tp8 = "flash:q_len=4096,q_heads=64,kv_heads=8,head_dim=128,dtype=bf16";
        let (g, p) = on("h200", tp8);
        let all = candidates(&p, g);
        let c = all[1];
        assert_eq!(c.to_string(), "gpu mma br=128 bc=128 wgmma specialized");
        assert_eq!(
            GpuFlashConfig {
                specialized: false,
                ..c
            },
            all[0]
        );
        assert_eq!((c.threads(), all[0].threads()), (384, 256));
        validate(&c, &p, g).unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert!(
            json.ends_with(r#""wgmma":true,"specialized":true}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<GpuFlashConfig>(&json).unwrap(), c);
        // Stored configs from before it read as plain.
        let old = json.replace(r#","specialized":true"#, "");
        assert!(
            !serde_json::from_str::<GpuFlashConfig>(&old)
                .unwrap()
                .specialized
        );
        assert!(all
            .iter()
            .filter(|c| c.specialized)
            .all(|c| c.br == 128 && c.wgmma && !c.paired));
        for other in [
            GpuFlashConfig { br: 64, ..c },
            GpuFlashConfig { wgmma: false, ..c },
            GpuFlashConfig { paired: true, ..c },
        ] {
            let e = validate(&other, &p, g).unwrap_err().to_string();
            assert!(e.contains("specialized = false"), "{other}: {e}");
        }
        // Taking turns: right after its specialized form; specialized tiles only.
        let turns = all[2];
        assert_eq!(
            turns.to_string(),
            "gpu mma br=128 bc=128 wgmma specialized pingpong"
        );
        assert_eq!(
            GpuFlashConfig {
                pingpong: false,
                tma: false,
                ..turns
            },
            c
        );
        validate(&turns, &p, g).unwrap();
        let json = serde_json::to_string(&turns).unwrap();
        assert!(
            json.ends_with(r#""specialized":true,"pingpong":true}"#),
            "{json}"
        );
        assert_eq!(
            serde_json::from_str::<GpuFlashConfig>(&json).unwrap(),
            turns
        );
        let e = validate(
            &GpuFlashConfig {
                pingpong: true,
                ..all[0]
            },
            &p,
            g,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("take pingpong = false"), "{e}");
        // By TMA, without and with turns, after the cp.async forms.
        assert_eq!(
            (all[3].to_string(), all[4].to_string()),
            (
                "gpu mma br=128 bc=128 wgmma specialized tma".to_string(),
                "gpu mma br=128 bc=128 wgmma specialized tma pingpong".to_string()
            )
        );
        validate(&all[4], &p, g).unwrap();
        let json = serde_json::to_string(&all[4]).unwrap();
        assert_eq!(
            serde_json::from_str::<GpuFlashConfig>(&json).unwrap(),
            all[4]
        );
        let e = validate(
            &GpuFlashConfig {
                tma: true,
                ..all[0]
            },
            &p,
            g,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("take tma = false"), "{e}");
    }

    #[test]
    fn the_nvidia_guess_follows_the_tiles_measured_best_by_length() {
        let guess = |model: &str, spec: &str| {
            let (g, p) = on(model, spec);
            let c = heuristic(&p, Some(g));
            validate(&c, &p, g).unwrap_or_else(|e| panic!("{model} {spec}: {c}: {e}"));
            assert!(
                candidates(&p, g).contains(&c),
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
        // Beyond head size 128, where nothing was measured, the earlier guess.
        assert_eq!(
            guess("h200", "flash:q_len=2048,q_heads=8,head_dim=256,dtype=bf16"),
            "gpu mma br=64 bc=32"
        );
        // On CDNA (never measured) four waves and the next key tile prefetched: the two-wave
        // 64-key tile of head size 128 fills half the LDS, one block and two waves a CU.
        assert_eq!(
            guess("mi250", &llama(2048, "")),
            "gpu mfma br=128 bc=64 prefetch"
        );
        assert_eq!(
            guess(
                "mi300x",
                "flash:q_len=2048,q_heads=8,head_dim=256,dtype=bf16"
            ),
            "gpu mfma br=64 bc=32"
        );
    }

    #[test]
    fn the_default_is_valid_for_every_head_size() {
        for head_dim in 1..=GPU_MAX_HEAD_DIM {
            let p = problem(head_dim);
            validate(&default(&p), &p, h200())
                .unwrap_or_else(|e| panic!("head_dim {head_dim}: {e}"));
            // And for value heads of every narrower width.
            for v in [1, head_dim / 2, head_dim.saturating_sub(1)] {
                let Ok(p) = p.with_v_head_dim(v) else {
                    continue;
                };
                validate(&default(&p), &p, h200())
                    .unwrap_or_else(|e| panic!("head_dim {head_dim}, v_head_dim {v}: {e}"));
            }
        }
    }

    /// Narrow value heads: the warpgroup-MMA tiles (V in K's swizzled layout) are refused
    /// naming v_head_dim; the matrix-core tiles need it whole in their multiple; rows whose
    /// lanes do not divide it are refused naming it; the heuristic is an mma.sync tile on
    /// NVIDIA, MFMA on CDNA where the width allows, the default where it does not.
    #[test]
    fn narrow_value_heads_take_whole_tiles_and_no_wgmma() {
        let deepseek =
            "flash:q_len=4096,q_heads=16,kv_heads=16,head_dim=128,v_head_dim=64,dtype=bf16";
        let (g, p) = on("h200", deepseek);
        let all = candidates(&p, g);
        let valid: Vec<_> = all.iter().filter(|c| validate(c, &p, g).is_ok()).collect();
        assert!(valid.iter().all(|c| !c.wgmma));
        assert!(valid.iter().any(|c| c.variant == GpuFlashVariant::Mma));
        let wg = all.iter().find(|c| c.wgmma).unwrap();
        let e = validate(wg, &p, g).unwrap_err().to_string();
        assert!(
            e.contains("v_head_dim 64") && e.contains("wgmma = false"),
            "{e}"
        );
        let h = heuristic(&p, Some(g));
        assert!(h.variant == GpuFlashVariant::Mma && !h.wgmma, "{h}");
        validate(&h, &p, g).unwrap();
        let odd = deepseek.replace("v_head_dim=64", "v_head_dim=24");
        let (g, p) = on("h200", &odd);
        let mma = GpuFlashConfig::new(GpuFlashVariant::Mma, 64, 64, 2);
        let e = validate(&mma, &p, g).unwrap_err().to_string();
        assert!(e.contains("v_head_dim 24 multiples of 16"), "{e}");
        let rows = GpuFlashConfig::new(GpuFlashVariant::Rows, 32, 16, 16);
        let e = validate(&rows, &p, g).unwrap_err().to_string();
        assert!(e.contains("dividing head_dim 128 and v_head_dim 24"), "{e}");
        assert_eq!(heuristic(&p, Some(g)), default(&p));
        let (g, p) = on("mi250", deepseek);
        let h = heuristic(&p, Some(g));
        assert_eq!(h.variant, GpuFlashVariant::Mfma, "{h}");
        validate(&h, &p, g).unwrap();
    }
}
