//! How many waves of a kernel fit on a compute unit at once, from its registers, LDS and block
//! size and the model's limits.
//!
//! AMD CDNA: a unified file of 512 vector registers per lane per SIMD (architectural +
//! accumulation, allocated in granules of 8), 4 SIMDs per CU, up to 8 waves per SIMD, 800
//! scalar registers per SIMD (granules of 16), LDS per CU shared by the resident workgroups,
//! and a workgroup's waves spread over the CU's SIMDs.
//!
//! NVIDIA sm_80 / sm_90: 65,536 registers per SM allocated per warp in units of 256, up to 64
//! warps and 32 blocks per SM, shared memory per SM with 1 KiB reserved per block (the
//! CUDA occupancy calculator's rules); reported per SM sub-partition (4 per SM) so both
//! vendors read as waves per SIMD.

use serde::Serialize;

use super::metadata::KernelResources;
use crate::device::{GpuModel, Vendor};

/// Scalar registers per SIMD on GFX9 (CDNA).
const SGPRS_PER_SIMD: u32 = 800;

/// Resident waves per SIMD and what limits them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Occupancy {
    /// Average waves per SIMD with as many workgroups resident as fit (0: none fits).
    pub waves_per_simd: f64,
    pub workgroups_per_cu: u32,
    /// `vgpr`, `sgpr`, `lds`, `waves` (the hardware's wave slots).
    pub limited_by: &'static str,
}

fn round_up(v: u32, granule: u32) -> u32 {
    v.max(1).div_ceil(granule) * granule
}

/// Occupancy of a kernel on either vendor's model.
pub fn of(r: &KernelResources, threads: u32, g: &GpuModel) -> Occupancy {
    match g.vendor {
        Vendor::Amd => amd(r, threads, g),
        Vendor::Nvidia => nvidia(r, threads, g),
    }
}

/// Blocks per SM on NVIDIA at most (sm_80 and sm_90).
const NVIDIA_MAX_BLOCKS: u32 = 32;
/// Shared memory the driver reserves per block on sm_80 and later.
const NVIDIA_RESERVED_SMEM: u32 = 1024;

/// Occupancy of a kernel launched with `threads` per block on an NVIDIA model.
pub fn nvidia(r: &KernelResources, threads: u32, g: &GpuModel) -> Occupancy {
    let warps_per_block = threads.div_ceil(g.wave_size.max(1)).max(1);
    let regs_per_warp = round_up(r.vgpr * 32, 256);
    let limits = [
        ("registers", (g.registers / regs_per_warp) / warps_per_block),
        ("waves", g.max_waves / warps_per_block),
        ("blocks", NVIDIA_MAX_BLOCKS),
        (
            "shared memory",
            g.lds_per_cu / (r.lds + NVIDIA_RESERVED_SMEM),
        ),
    ];
    let (limited_by, blocks) = limits
        .into_iter()
        .min_by_key(|(_, n)| *n)
        .expect("four limits");
    Occupancy {
        waves_per_simd: f64::from(blocks * warps_per_block) / f64::from(g.simds_per_cu.max(1)),
        workgroups_per_cu: blocks,
        limited_by,
    }
}

/// Occupancy of a kernel launched with `threads` per workgroup on an AMD model.
pub fn amd(r: &KernelResources, threads: u32, g: &GpuModel) -> Occupancy {
    let wave = g.wave_size.max(1);
    let simds = g.simds_per_cu.max(1);
    let waves_per_group = threads.div_ceil(wave).max(1);
    // Each SIMD hosts its share of a workgroup's waves.
    let per_simd = waves_per_group.div_ceil(simds);
    let by_vgpr = (g.registers / round_up(r.vgpr.max(r.agpr), 8)).min(g.max_waves);
    let by_sgpr = (SGPRS_PER_SIMD / round_up(r.sgpr, 16)).min(g.max_waves);
    let limits = [
        ("vgpr", by_vgpr / per_simd),
        ("sgpr", by_sgpr / per_simd),
        ("waves", g.max_waves / per_simd),
        ("lds", g.lds_per_cu.checked_div(r.lds).unwrap_or(u32::MAX)),
    ];
    let (limited_by, groups) = limits
        .into_iter()
        .min_by_key(|(_, n)| *n)
        .expect("four limits");
    Occupancy {
        waves_per_simd: f64::from(groups * waves_per_group) / f64::from(simds),
        workgroups_per_cu: groups,
        limited_by,
    }
}
