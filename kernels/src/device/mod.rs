//! The devices kerntune tunes for: the host CPU, detected at run time, and a catalog of GPU
//! models with their published limits.

mod cpu;
mod gpu;

use std::fmt;

use serde::Serialize;

pub use cpu::{CpuInfo, Isa};
pub use gpu::{GpuModel, Vendor, GPU_CATALOG};

use crate::{KernelError, Result};

/// A device a kernel can be tuned for.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Device {
    Cpu(CpuInfo),
    Gpu(&'static GpuModel),
}

impl Device {
    /// The CPU this process runs on.
    pub fn host() -> Device {
        Self::host_ref().clone()
    }

    /// The CPU this process runs on, detected once and shared: kernel calls validate against it
    /// without cloning (and so allocating) on every call.
    pub fn host_ref() -> &'static Device {
        static HOST: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
        HOST.get_or_init(|| Device::Cpu(CpuInfo::detect().clone()))
    }

    /// Looks a device up by name, case-insensitively: `cpu` (the host) or any GPU model name or
    /// alias (`mi250`, `MI250X`, `gfx90a`, `h100`, `sm_90`).
    pub fn lookup(name: &str) -> Result<Device> {
        let lower = name.trim().to_ascii_lowercase();
        if matches!(lower.as_str(), "cpu" | "host") {
            return Ok(Device::host());
        }
        GpuModel::lookup(&lower)
            .map(Device::Gpu)
            .ok_or_else(|| KernelError::UnknownDevice {
                name: name.to_string(),
                known: std::iter::once("cpu")
                    .chain(GPU_CATALOG.iter().map(|g| g.name))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Short name for tables: `cpu` or the GPU model.
    pub fn name(&self) -> &str {
        match self {
            Device::Cpu(_) => "cpu",
            Device::Gpu(g) => g.name,
        }
    }

    /// What makes a tuning result valid for another machine: results are only reused on a
    /// device with the same identity. For a CPU that is the model, ISA level and thread count
    /// (the thread split is a tuned parameter); for a GPU the architecture and CU count, since
    /// an MI250X and an MI250 share gfx90a but not their CU count.
    pub fn identity(&self) -> String {
        match self {
            Device::Cpu(c) => format!("cpu/{}/{}/{}t", c.model, c.isa, c.threads),
            Device::Gpu(g) => format!("{}/{}/{}cu", g.name, g.arch, g.compute_units),
        }
    }

    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu(c) => write!(f, "{} ({}, {} threads)", c.model, c.isa, c.threads),
            Device::Gpu(g) => write!(f, "{} ({})", g.name, g.arch),
        }
    }
}
