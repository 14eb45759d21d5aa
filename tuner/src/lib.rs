//! # kerntune-tuner
//!
//! The library behind the `tune` binary: model shapes ([`models`], [`shapes`], PyTorch
//! TunableOp's GEMM files in [`tunableop`]), measurement
//! ([`measure`]), search strategies ([`search`]), the tuning loop ([`tune`]) and its pace ([`pace`]), the offline GPU
//! plan ([`plan`]), progress on long work ([`progress`]) and sharing results between databases ([`share`]). It is a library so the
//! end-to-end tests can drive the loop with fake backends and the sharing operations without a
//! process per call.

pub mod error;
pub mod gpu_sweep;
pub mod measure;
pub mod models;
pub mod operands;
pub mod pace;
pub mod plan;
pub mod progress;
pub mod search;
pub mod shapes;
pub mod share;
pub mod tunableop;
pub mod tune;

pub use error::{Result, TuneError};

/// Total memory of this machine in bytes (what a CPU shard of weights must fit in).
pub fn host_memory_bytes() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb * 1024.0)
        .unwrap_or(16e9)
}
