//! Parameter spaces: for a backend, which configs exist for a problem on a device, which are
//! valid and why not, what runs untuned, and a cheap per-problem guess.

mod cpu;
mod gpu;

pub use cpu::{CpuSpace, STREAM_MAX_M};
pub use gpu::{
    dynamic_lds_bytes, flash_split_floats, gemm_kernel_for, has_mfma, has_mma, has_wgmma,
    lds_bytes, lds_limit, lds_limit_of, GpuSpace, GPU_MAX_FLASH_SPLIT, GPU_MAX_HEAD_DIM,
    GPU_MAX_SPLIT_K, GPU_SPLIT_K_WORKSPACE_BYTES,
};

use crate::{Config, Device, KernelError, Problem};

/// The tunable parameters of every family on one backend.
pub trait Space: Send + Sync {
    /// Backend name as stored with results (`cpu`, `hip`, `cuda`).
    fn backend(&self) -> &'static str;

    /// Every config worth timing for `problem` on `device`, each valid by [`Space::validate`].
    fn candidates(&self, problem: &Problem, device: &Device) -> Vec<Config>;

    /// Why `config` cannot run `problem` on `device`, or `Ok` when it can.
    fn validate(
        &self,
        config: &Config,
        problem: &Problem,
        device: &Device,
    ) -> Result<(), KernelError>;

    /// What runs when nothing was tuned: the same config for every problem of a family, so a
    /// winner's speedup over it shows what tuning bought.
    fn default_config(&self, problem: &Problem, device: &Device) -> Config;

    /// A cheap guess from the problem's sizes and the device's caches, used by the runtime for
    /// shapes that were never tuned.
    fn heuristic(&self, problem: &Problem, device: &Device) -> Config;
}
