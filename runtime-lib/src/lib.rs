//! # kerntune-runtime
//!
//! What an inference server links: [`Dispatcher::open`] loads the tuned winners for the device
//! the process runs on, [`Dispatcher::select`] picks a config for each call in nanoseconds
//! (exact problem, tuned bucket, nearest tuned problem, or the heuristic), and
//! [`Dispatcher::gemm`], [`Dispatcher::flash_attention`] and [`Dispatcher::paged_attention`] run
//! the selected kernel on the caller's buffers. The same API is exported to C (`kerntune.h`,
//! see [`capi`]).
//!
//! A 4-bit checkpoint's tensors become what the int4 GEMMs take once, as the model loads
//! ([`checkpoint`]: AWQ's words repacked, GPTQ's zero points unpacked plus one).
//!
//! On a GPU, [`GpuDispatcher`] does the same with device memory: it loads the device's
//! winners and their compiled kernels from the database and launches each call's tuned kernel
//! on the caller's stream (Cargo features `rocm` and `cuda`; without them it says so).
//!
//! ```
//! use kerntune::{Dispatcher, Match};
//! use kerntune_kernels::kernel::GemmArgs;
//! use kerntune_kernels::{Problem, Tensor};
//!
//! let d = Dispatcher::open("no-such.db"); // runs on defaults, and says so
//! assert!(d.note().is_some());
//! let p: Problem = "gemm:m=2,n=3,k=4".parse().unwrap();
//! let (a, b, mut c) = (vec![1.0f32; 8], vec![1.0f32; 12], vec![0.0f32; 6]);
//! let how = d.gemm(&p, GemmArgs::new(Tensor::F32(&a), Tensor::F32(&b), &mut c)).unwrap();
//! assert_eq!(how, Match::Default);
//! assert_eq!(c, [4.0; 6]);
//! ```

pub mod capi;
pub mod capi_gpu;
pub mod capi_int4;
mod dispatcher;
mod error;
mod gpu;
mod select;
mod snapshot;
mod untuned;

pub use dispatcher::{Dispatcher, Selection, Stats};
pub use error::RuntimeError;
pub use gpu::{GpuDispatcher, GpuStats};
pub use kerntune_kernels::checkpoint;
pub use kerntune_kernels::gpu::launch::DevicePtrs;
pub use select::Match;
