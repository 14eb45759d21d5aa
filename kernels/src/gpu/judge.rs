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
    // The code object counts static LDS; the main kernel (the first entry) may take dynamic
    // shared memory at launch on top, which lifts NVIDIA's 48 KiB static limit.
    let with_dynamic = |k: &KernelResources| {
        let mut k = k.clone();
        if k.name == build.entries[0] {
            k.lds += build.dynamic_lds as u32;
        }
        k
    };
    let limit = crate::space::lds_limit_of(build.dynamic_lds, g);
    for k in kernels.iter().map(with_dynamic) {
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
    let main = with_dynamic(
        kernels
            .iter()
            .find(|k| k.name == build.entries[0])
            .expect("checked above"),
    );
    let main = &main;
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
