//! # kerntune-kernels
//!
//! The kernels kerntune tunes and the vocabulary every other crate speaks:
//!
//! - [`Problem`]: what a call computes (GEMM, flash-attention prefill, paged-attention decode),
//!   validated on construction, with a stable text key.
//! - [`Config`] and [`Space`]: the tunable parameters of each family per backend, their
//!   candidates and constraints, a default and a cheap heuristic.
//! - [`Device`]: the host CPU (detected) and a catalog of GPU models with their limits.
//! - [`Backend`]: one interface to run a problem with a config on caller buffers; the CPU
//!   backend ([`CpuBackend`]) runs everywhere.
//! - [`reference`]: plain f64 implementations every config is verified against.
//! - [`checkpoint`]: 4-bit checkpoints' tensors (GPTQ's, AWQ's) as the int4 GEMMs take them.
//!
//! ```
//! use kerntune_kernels::{Backend, CpuBackend, CpuSpace, Device, Problem, Space, TensorBuf};
//! use kerntune_kernels::kernel::{Args, GemmArgs, Scratch};
//!
//! let problem: Problem = "gemm:m=3,n=5,k=7".parse().unwrap();
//! let device = Device::host();
//! let config = CpuSpace.heuristic(&problem, &device);
//! let a = TensorBuf::from_f32(problem.dtype(), &[1.0; 21]);
//! let b = TensorBuf::from_f32(problem.dtype(), &[2.0; 35]);
//! let mut c = vec![0.0f32; 15];
//! let mut scratch = Scratch::new();
//! let buf = scratch.get(CpuBackend.scratch_len(&problem, &config));
//! let args = Args::Gemm(GemmArgs::new(a.view(), b.view(), &mut c));
//! CpuBackend.run(&problem, &config, args, buf).unwrap();
//! assert!(c.iter().all(|&x| x == 14.0));
//! ```

pub mod checkpoint;
pub mod config;
pub mod cpu;
pub mod data;
pub mod device;
mod dtype;
pub mod env;
mod error;
pub mod gpu;
pub mod kernel;
pub mod problem;
pub mod reference;
pub mod shapes;
pub mod space;

pub use config::{
    Config, FlashConfig, GemmConfig, GpuFlashConfig, GpuFlashVariant, GpuGemmConfig,
    GpuGemmVariant, GpuPagedConfig, PagedConfig,
};
pub use cpu::CpuBackend;
pub use device::{CpuInfo, Device, GpuModel, Isa};
pub use dtype::{DType, Fp8, Tensor, TensorBuf};
pub use error::{KernelError, Result};
pub use kernel::Backend;
pub use problem::{
    BLayout, Family, FlashProblem, GemmProblem, PagedProblem, Problem, Scale, SoftCap,
};
pub use space::{CpuSpace, GpuSpace, Space};

/// Hash of the CPU kernel sources (and config definitions) this library was built from, part of
/// every tuning record's key: results measured with other kernel code are stale.
pub const CPU_SOURCE_HASH: &str = env!("KERNTUNE_CPU_SOURCE_HASH");
