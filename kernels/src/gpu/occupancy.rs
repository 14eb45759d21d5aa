//! How many waves of a kernel fit on a compute unit at once, from its registers, LDS and block
//! size and the model's limits. AMD CDNA: a unified file of 512 vector registers per lane per
//! SIMD (architectural + accumulation, allocated in granules of 8), 4 SIMDs per CU, up to 8
//! waves per SIMD, 800 scalar registers per SIMD (granules of 16), LDS per CU shared by the
//! resident workgroups, and a workgroup's waves spread over the CU's SIMDs.

use serde::Serialize;

use super::metadata::KernelResources;
use crate::device::GpuModel;

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
