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
    // Each SIMD hosts its share of a workgroup's waves; a workgroup of fewer waves than
    // SIMDs leaves the others to further workgroups (one-wave workgroups fill all four).
    let per_simd = waves_per_group.div_ceil(simds);
    let side_by_side = simds / waves_per_group.min(simds);
    let groups_by = |waves_per_simd: u32| waves_per_simd / per_simd * side_by_side;
    let by_vgpr = (g.registers / round_up(r.vgpr.max(r.agpr), 8)).min(g.max_waves);
    let by_sgpr = (SGPRS_PER_SIMD / round_up(r.sgpr, 16)).min(g.max_waves);
    let limits = [
        ("vgpr", groups_by(by_vgpr)),
        ("sgpr", groups_by(by_sgpr)),
        ("waves", groups_by(g.max_waves)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    fn model(name: &str) -> &'static GpuModel {
        let Device::Gpu(g) = Device::lookup(name).unwrap() else {
            unreachable!("{name} is a GPU")
        };
        g
    }

    fn kernel(vgpr: u32, lds: u32) -> KernelResources {
        KernelResources {
            name: "k".into(),
            vgpr,
            agpr: 0,
            sgpr: 32,
            lds,
            scratch: 0,
            vgpr_spill: 0,
            sgpr_spill: 0,
            wave_size: 64,
            max_threads: 256,
        }
    }

    /// A CDNA SIMD holds 512 / registers waves: two of 243 registers. Workgroups of one,
    /// two or four waves all reach two waves a SIMD (eight, four or two workgroups a CU),
    /// eight-wave ones one workgroup of two a SIMD; LDS bounds the workgroups a CU holds
    /// (three of 18.9 KiB in 64 KiB).
    #[test]
    fn amd_workgroups_of_few_waves_fill_every_simd() {
        let mi300x = model("mi300x");
        for (threads, groups) in [(64, 8), (128, 4), (256, 2), (512, 1)] {
            let o = amd(&kernel(243, 1024), threads, mi300x);
            assert_eq!(o.workgroups_per_cu, groups, "{threads} threads: {o:?}");
            assert_eq!(o.waves_per_simd, 2.0, "{threads} threads: {o:?}");
            assert_eq!(o.limited_by, "vgpr");
        }
        let o = amd(&kernel(243, 19_328), 64, mi300x);
        assert_eq!((o.workgroups_per_cu, o.limited_by), (3, "lds"), "{o:?}");
        assert_eq!(o.waves_per_simd, 0.75);
        // Three-wave workgroups: a SIMD gets at most one wave of each, so two of them.
        let o = amd(&kernel(243, 1024), 192, mi300x);
        assert_eq!((o.workgroups_per_cu, o.waves_per_simd), (2, 1.5), "{o:?}");
        // Few registers: the wave slots limit (8 a SIMD on CDNA).
        let o = amd(&kernel(32, 0), 64, mi300x);
        assert_eq!((o.workgroups_per_cu, o.waves_per_simd), (32, 8.0), "{o:?}");
    }
}
