//! What the offline plan decides about one compiled candidate: keep it for the device run,
//! or prune it with the reason (a compile error, LDS over the limit, spills, too little
//! occupancy).
//!
//! Spills are judged per vendor. On AMD every spill goes to scratch memory and is pruned. On
//! NVIDIA a few spilled registers live in local memory that the L1 cache holds, and a build
//! spilling some can be the fastest: on session 36's H200 the paired 128-key flash tile, which
//! NVRTC 13.5 builds spilling 15 registers, took 705.8 us at 8192 queries against 768.7 for
//! the best tile that spills none. So NVIDIA builds are timed up to [`NVIDIA_SPILL_LIMIT`] spilled registers.

use serde::Serialize;

use super::metadata::KernelResources;
use super::occupancy::{self, Occupancy};
use super::KernelBuild;
use crate::device::{GpuModel, Vendor};

/// Spilled registers a thread an NVIDIA build may have and still be timed: 128 bytes of
/// local memory a thread, 32 KiB for a block of 256 threads, which an SM's L1 holds beside
/// the 51-68 KiB of shared memory the flash tiles that spill take (L1 and shared memory
/// share 256 KiB of an SM on sm_90, 192 on sm_80). The tile FlashAttention-2 takes at head
/// size 128 (128 rows by 64 keys, four warps) spills 17 as this project's sources build it;
/// the rows variant's 128 by 32 tile at head size 128, spilling 41, stays pruned.
pub const NVIDIA_SPILL_LIMIT: u32 = 32;

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
        match g.vendor {
            Vendor::Amd if k.vgpr_spill > 0 || k.sgpr_spill > 0 => {
                return pruned(format!(
                    "spills: {} spills {} vector and {} scalar registers ({} bytes of scratch per lane)",
                    k.name, k.vgpr_spill, k.sgpr_spill, k.scratch
                ));
            }
            Vendor::Nvidia if k.vgpr_spill > NVIDIA_SPILL_LIMIT => {
                return pruned(format!(
                    "spills: {} spills {} registers, more than the {NVIDIA_SPILL_LIMIT} an NVIDIA build may",
                    k.name, k.vgpr_spill
                ));
            }
            _ => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::space::{GpuSpace, Space};

    /// The heuristic build of a flash prefill for `device` and its main kernel's resources,
    /// spilling `spills` registers.
    fn flash_build(device: &str, spills: u32) -> (KernelBuild, Vec<KernelResources>, GpuModel) {
        let device = Device::lookup(device).unwrap();
        let Device::Gpu(g) = &device else {
            unreachable!()
        };
        let p = "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16"
            .parse()
            .unwrap();
        let config = GpuSpace.default_config(&p, &device);
        let build = KernelBuild::new(&p, &config).unwrap();
        let kernels = build
            .entries
            .iter()
            .map(|name| KernelResources {
                name: name.to_string(),
                vgpr: 128,
                agpr: 0,
                sgpr: 0,
                lds: 0,
                scratch: 4 * spills,
                vgpr_spill: spills,
                sgpr_spill: 0,
                wave_size: g.wave_size,
                max_threads: build.threads as u32,
            })
            .collect();
        (build, kernels, (*g).clone())
    }

    #[test]
    fn nvidia_builds_are_timed_up_to_the_spill_limit_and_pruned_past_it() {
        let (build, kernels, g) = flash_build("h200", NVIDIA_SPILL_LIMIT);
        assert!(judge(&build, &Ok(kernels), &g, 1.0).is_kept());
        let (build, kernels, g) = flash_build("h200", NVIDIA_SPILL_LIMIT + 1);
        match judge(&build, &Ok(kernels), &g, 1.0) {
            Verdict::Pruned { reason } => {
                assert!(
                    reason.starts_with("spills: kt_flash spills 33 registers"),
                    "{reason}"
                );
                assert!(reason.contains("more than the 32"), "{reason}");
            }
            kept => panic!("kept: {kept:?}"),
        }
    }

    #[test]
    fn amd_builds_that_spill_at_all_are_pruned() {
        let (build, kernels, g) = flash_build("mi300x", 0);
        assert!(judge(&build, &Ok(kernels), &g, 1.0).is_kept());
        let (build, kernels, g) = flash_build("mi300x", 1);
        match judge(&build, &Ok(kernels), &g, 1.0) {
            Verdict::Pruned { reason } => {
                assert!(
                    reason.starts_with("spills: kt_flash spills 1 vector"),
                    "{reason}"
                )
            }
            kept => panic!("kept: {kept:?}"),
        }
    }
}
