//! What the offline plan decides about one compiled candidate: keep it for the device run,
//! or prune it with the reason (a compile error, LDS over the limit, spills, too little
//! occupancy).

use serde::Serialize;

use super::metadata::KernelResources;
use super::occupancy::{self, Occupancy};
use super::KernelBuild;
use crate::device::GpuModel;

/// The verdict on one candidate.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "lowercase")]
pub enum Verdict {
    Keep { occupancy: Occupancy },
    Pruned { reason: String },
}

impl Verdict {
    pub fn is_kept(&self) -> bool {
        matches!(self, Verdict::Keep { .. })
    }
}

/// Judges a compile result. `min_waves` is the least average waves per SIMD worth timing.
pub fn judge(
    build: &KernelBuild,
    compiled: &Result<Vec<KernelResources>, String>,
    g: &GpuModel,
    min_waves: f64,
) -> Verdict {
    let pruned = |reason: String| Verdict::Pruned { reason };
    let kernels = match compiled {
        Ok(k) => k,
        Err(e) if e.contains("local memory") || e.contains("too much shared data") => {
            return pruned(format!("over-LDS: {e}"));
        }
        Err(e) => return pruned(format!("compile failed: {e}")),
    };
    for entry in build.entries {
        if !kernels.iter().any(|k| k.name == *entry) {
            return pruned(format!("the code object lacks kernel {entry}"));
        }
    }
    // Dynamic shared memory at launch lifts NVIDIA's 48 KiB static limit.
    let limit = crate::space::lds_limit_of(build.dynamic_lds, g);
    for k in kernels.iter().map(|k| build.at_launch(k)) {
        if k.vgpr_spill > 0 || k.sgpr_spill > 0 {
            return pruned(format!(
                "spills: {} spills {} vector and {} scalar registers ({} bytes of scratch per lane)",
                k.name, k.vgpr_spill, k.sgpr_spill, k.scratch
            ));
        }
        if k.lds as usize > limit {
            return pruned(format!(
                "over-LDS: {} uses {} bytes of LDS, {} allows {limit}",
                k.name, k.lds, g.name
            ));
        }
    }
    // The main kernel does the work; helpers such as a reduction are small.
    let main = &build.at_launch(
        kernels
            .iter()
            .find(|k| k.name == build.entries[0])
            .expect("checked above"),
    );
    let occupancy = occupancy::of(main, build.threads as u32, g);
    if occupancy.workgroups_per_cu == 0 {
        return pruned(format!(
            "does not fit a CU: limited by {} ({} VGPRs, {} bytes LDS, {} threads)",
            occupancy.limited_by, main.vgpr, main.lds, build.threads
        ));
    }
    if occupancy.waves_per_simd < min_waves {
        return pruned(format!(
            "low occupancy: {:.2} waves per SIMD (limited by {}), below {min_waves}",
            occupancy.waves_per_simd, occupancy.limited_by
        ));
    }
    Verdict::Keep { occupancy }
}
