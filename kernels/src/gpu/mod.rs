//! GPU kernels: the sources in `kernels/hip/` (one source for AMD and NVIDIA through a small
//! prelude), what a config compiles to ([`KernelBuild`]), the offline compile with the HIP
//! compiler ([`hip`]), the resources read back from each code object ([`metadata`]) and the
//! occupancy they allow ([`occupancy`]), and the HIP runtime's device list ([`hip_runtime`],
//! loaded at run time). Everything here runs, and is tested, without a GPU; the on-device
//! paths ([`rocm`], [`cuda`], behind Cargo features) share one interface, [`device`]. The
//! [`emulator`] runs the same sources on the CPU, so every GPU config is verified without a GPU.

mod compiler_io;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod emulator;
pub mod hip;
pub mod hip_runtime;
mod judge;
pub mod launch;
pub mod metadata;
pub mod nvrtc;
pub mod occupancy;
#[cfg(feature = "rocm")]
pub mod rocblas;
#[cfg(feature = "rocm")]
pub mod rocm;
mod scratch;
mod source;

pub use judge::{judge, Verdict};
pub use scratch::remove_temporary_dirs;
pub use source::{KernelBuild, GPU_SOURCE_HASH};
