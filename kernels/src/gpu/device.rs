//! One interface over the vendors' on-device paths, so `tune` sweeps an AMD and an NVIDIA GPU
//! with the same loop: open the device, upload a problem once, then per candidate load its
//! compiled code, run it once for verification and time it.
//!
//! Each vendor's path is a Cargo feature (`rocm`, `cuda`). [`open`] answers with a clear
//! [`KernelError::BackendUnavailable`] when the feature is not built, when the vendor's runtime
//! is not installed, or when no device is present; it never panics.

use crate::data::ProblemData;
use crate::device::{GpuModel, Vendor};
use crate::{Config, KernelError, Problem};

use super::launch::DevicePtrs;
use super::KernelBuild;

/// An opened GPU.
pub trait GpuDevice: std::fmt::Debug + Send + Sync {
    /// The backend name stored with every measurement: `hip` or `cuda`.
    fn backend(&self) -> &'static str;
    /// The device's own name, as its runtime reports it.
    fn name(&self) -> &str;
    /// Runtime and driver versions, stored as provenance.
    fn runtime(&self) -> String;
    /// Whether this device is one of `model`: same architecture and a name that matches.
    fn is(&self, model: &GpuModel) -> bool;
    /// Uploads a problem's inputs once. `min_partition` is the smallest paged-attention
    /// partition any candidate will use, which sizes the partial buffers.
    fn upload<'g>(
        &'g self,
        data: &ProblemData,
        min_partition: usize,
    ) -> Result<Box<dyn GpuProblem + 'g>, KernelError>;
    /// Loads a build's compiled code for launches on a caller's buffers and stream (the
    /// runtime library's path); it stays loaded until dropped.
    fn load_build(
        &self,
        build: &KernelBuild,
        code: &[u8],
    ) -> Result<Box<dyn LoadedBuild>, KernelError>;
    /// Prepares a vendor library's config (a rocBLAS solution) for the runtime library's
    /// launches; an error where the library is absent or is another version.
    fn load_library(&self, config: &Config) -> Result<Box<dyn LoadedBuild>, KernelError> {
        Err(KernelError::BackendUnavailable {
            backend: self.backend(),
            reason: format!("`{config}` needs a vendor library this device path lacks"),
        })
    }
}

/// A kernel (or a library's solution) ready for launches on a caller's device memory.
pub trait LoadedBuild: std::fmt::Debug + Send + Sync {
    /// Queues `config` on `problem` over `ptrs` on `stream` (0: the default stream), without
    /// waiting.
    ///
    /// # Safety
    /// `stream` is 0 or a live stream of the device this was loaded on, and every address in
    /// `ptrs` is memory of that device holding what `problem` needs (see
    /// [`super::launch::DevicePtrs`]).
    unsafe fn launch(
        &self,
        problem: &Problem,
        config: &Config,
        ptrs: &DevicePtrs,
        stream: u64,
    ) -> Result<(), KernelError>;
}

/// One problem's data on the device, and the candidate loaded last.
pub trait GpuProblem {
    /// Loads a candidate's compiled code (an AMD code object, or a CUBIN on NVIDIA) and makes it
    /// the one [`run`](Self::run) and [`time`](Self::time) launch.
    fn load(&mut self, build: &KernelBuild, code: &[u8]) -> Result<(), KernelError>;
    /// Launches the loaded candidate once, waits, and returns the output.
    fn run(&mut self, config: &Config) -> Result<Vec<f32>, KernelError>;
    /// Launches the loaded candidate `reps` times, caches flushed before each, timed with the
    /// device's events; nanoseconds per launch.
    fn time(&mut self, config: &Config, reps: usize) -> Result<Vec<f64>, KernelError>;
    /// Candidates a vendor library offers for this problem (rocBLAS solutions for a GEMM on an
    /// AMD device), run and timed like ours without [`load`](Self::load); empty when it
    /// offers none, an error when the library is missing.
    fn library_candidates(&mut self) -> Result<Vec<Config>, KernelError> {
        Ok(Vec::new())
    }
}

/// The error of a missing device path, naming what to do.
#[cfg_attr(all(feature = "rocm", feature = "cuda"), allow(dead_code))]
fn not_built(backend: &'static str, feature: &str) -> KernelError {
    KernelError::BackendUnavailable {
        backend,
        reason: format!(
            "this build has no on-device {backend} backend; rebuild with it: cargo build --release -p kerntune-tuner --features {feature}"
        ),
    }
}

/// Opens device `ordinal` of `vendor` (the runtime's own numbering, after
/// `HIP_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES`).
pub fn open(vendor: Vendor, ordinal: usize) -> Result<Box<dyn GpuDevice>, KernelError> {
    match vendor {
        Vendor::Amd => open_amd(ordinal),
        Vendor::Nvidia => open_nvidia(ordinal),
    }
}

#[cfg(feature = "rocm")]
fn open_amd(ordinal: usize) -> Result<Box<dyn GpuDevice>, KernelError> {
    Ok(Box::new(super::rocm::HipGpu::open(ordinal)?))
}

#[cfg(not(feature = "rocm"))]
fn open_amd(_ordinal: usize) -> Result<Box<dyn GpuDevice>, KernelError> {
    Err(not_built("hip", "rocm"))
}

#[cfg(feature = "cuda")]
fn open_nvidia(ordinal: usize) -> Result<Box<dyn GpuDevice>, KernelError> {
    Ok(Box::new(super::cuda::CudaGpu::open(ordinal)?))
}

#[cfg(not(feature = "cuda"))]
fn open_nvidia(_ordinal: usize) -> Result<Box<dyn GpuDevice>, KernelError> {
    Err(not_built("cuda", "cuda"))
}

/// The smallest paged partition among `configs` (1 when there is none).
pub fn min_partition<'c>(configs: impl IntoIterator<Item = &'c Config>) -> usize {
    configs
        .into_iter()
        .filter_map(|c| match c {
            Config::GpuPaged(g) => Some(g.partition),
            _ => None,
        })
        .min()
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_without_the_feature_says_how_to_get_it() {
        #[cfg(not(feature = "rocm"))]
        {
            let e = open(Vendor::Amd, 0).unwrap_err().to_string();
            assert!(e.contains("--features rocm"), "{e}");
        }
        #[cfg(not(feature = "cuda"))]
        {
            let e = open(Vendor::Nvidia, 0).unwrap_err().to_string();
            assert!(e.contains("--features cuda"), "{e}");
        }
        // With both features built the answer depends on the host; the tuner's GPU tests
        // check it there.
        #[cfg(all(feature = "rocm", feature = "cuda"))]
        for vendor in [Vendor::Amd, Vendor::Nvidia] {
            if let Err(e) = open(vendor, 0) {
                assert!(matches!(e, KernelError::BackendUnavailable { .. }), "{e}");
            }
        }
    }
}
