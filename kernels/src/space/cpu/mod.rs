//! The CPU backend's parameter spaces.
//!
//! Constraints come from the kernels themselves: a microkernel shape exists only for the ISA
//! that has it, blocks are multiples of the register tile, the thread count is capped by the
//! host's threads, and working sets stay within what the scratch allocator will hand out.
//! Each family's candidates, validation, default and heuristic live in its own file; this one
//! holds what they share and the [`Space`] they make up.

mod flash;
mod gemm;
mod paged;

use crate::device::{CpuInfo, Isa};
use crate::{Config, Device, Family, KernelError, Problem};

use super::Space;

/// Largest scratch one config may ask for, in f32 values per thread (256 MiB).
const MAX_SCRATCH_PER_THREAD: usize = 64 << 20;
/// M up to which the streaming GEMM may run. Past decode sizes it is still worth sweeping: with
/// B stored `[N, K]` it needs no packing pass, which dominates the packed path up to M of a few
/// hundred.
pub const STREAM_MAX_M: usize = 256;
const MAX_BLOCK: usize = 1 << 16;

/// Parameter spaces of the CPU backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSpace;

fn invalid(family: Family, reason: impl Into<String>) -> KernelError {
    KernelError::InvalidConfig {
        family,
        reason: reason.into(),
    }
}

/// The host a default or heuristic is for: a GPU device's own host where asked about one
/// (the trait's defaults never fail).
fn cpu_of(device: &Device) -> &CpuInfo {
    match device {
        Device::Cpu(c) => c,
        Device::Gpu(_) => CpuInfo::detect(),
    }
}

fn host_of(device: &Device, family: Family) -> Result<&CpuInfo, KernelError> {
    match device {
        Device::Cpu(c) => Ok(c),
        Device::Gpu(g) => Err(invalid(
            family,
            format!("the CPU space does not apply to GPU device {}", g.name),
        )),
    }
}

/// ISA levels worth sweeping on a host: its best and the one below (AVX2 can beat AVX-512 on
/// cores that split 512-bit operations), never the portable fallback when SIMD exists.
fn isa_levels(host: Isa) -> Vec<Isa> {
    let levels: Vec<Isa> = Isa::supported_by(host)
        .into_iter()
        .filter(|&i| i != Isa::Avx512Amx)
        .collect();
    if levels.len() <= 1 {
        return levels;
    }
    levels
        .into_iter()
        .filter(|&i| i != Isa::Portable)
        .rev()
        .take(2)
        .collect()
}

/// Why an `amx` attention config cannot run at `isa` on `host`.
fn amx_refusal(kernel: &str, isa: Isa, host: &CpuInfo) -> String {
    format!(
        "amx {kernel} runs at isa avx512-amx on a host with AMX tiles (AMX-TILE and AMX-BF16, \
         Sapphire Rapids or later, with the kernel's permission for tile data); this config \
         asks for {isa} on {} ({})",
        host.model, host.isa
    )
}

/// The ISA whose tables run a config's ISA (AMX machines use the AVX-512 kernels).
fn kernel_isa(isa: Isa) -> Isa {
    if isa == Isa::Avx512Amx {
        Isa::Avx512
    } else {
        isa
    }
}

/// Thread counts to sweep: powers of two up to the host's threads, and the host's threads.
fn thread_counts(host: &CpuInfo) -> Vec<usize> {
    let mut t: Vec<usize> = (0..)
        .map(|s| 1usize << s)
        .take_while(|&t| t < host.threads)
        .collect();
    t.push(host.threads.max(1));
    t
}

fn check_common(
    family: Family,
    isa: Isa,
    threads: usize,
    host: &CpuInfo,
) -> Result<(), KernelError> {
    if !isa.runs_on(host.isa) {
        return Err(invalid(
            family,
            format!("ISA {isa} does not run on this host ({})", host.isa),
        ));
    }
    if threads == 0 || threads > host.threads.max(1) {
        return Err(invalid(
            family,
            format!(
                "threads = {threads}: must be between 1 and the host's {}",
                host.threads
            ),
        ));
    }
    Ok(())
}

impl Space for CpuSpace {
    fn backend(&self) -> &'static str {
        "cpu"
    }

    fn candidates(&self, problem: &Problem, device: &Device) -> Vec<Config> {
        let Ok(host) = host_of(device, problem.family()) else {
            return Vec::new();
        };
        match problem {
            Problem::Gemm(p) => gemm::candidates(p, host)
                .into_iter()
                .map(Config::Gemm)
                .collect(),
            Problem::Flash(p) => flash::candidates(p, host)
                .into_iter()
                .map(Config::Flash)
                .collect(),
            Problem::Paged(p) => paged::candidates(p, host)
                .into_iter()
                .map(Config::Paged)
                .collect(),
        }
    }

    fn validate(
        &self,
        config: &Config,
        problem: &Problem,
        device: &Device,
    ) -> Result<(), KernelError> {
        let host = host_of(device, problem.family())?;
        if config.is_gpu() {
            return Err(invalid(
                problem.family(),
                format!("`{config}` is a GPU config; the CPU backend runs CPU configs"),
            ));
        }
        match (config, problem) {
            (Config::Gemm(c), Problem::Gemm(p)) => gemm::validate(c, p, host),
            (Config::Flash(c), Problem::Flash(p)) => flash::validate(c, p, host),
            (Config::Paged(c), Problem::Paged(p)) => paged::validate(c, p, host),
            _ => Err(KernelError::FamilyMismatch {
                problem: problem.family(),
                config: config.family(),
            }),
        }
    }

    fn default_config(&self, problem: &Problem, device: &Device) -> Config {
        let host = cpu_of(device);
        match problem {
            // Block-scaled fp8 runs on one variant, so its default is that variant's.
            Problem::Gemm(p) if p.block.is_some() || p.int4.is_some() => {
                Config::Gemm(gemm::block_stream(p, host))
            }
            Problem::Gemm(_) => Config::Gemm(gemm::default(host)),
            Problem::Flash(_) => Config::Flash(flash::default(host)),
            Problem::Paged(_) => Config::Paged(paged::default(host)),
        }
    }

    fn heuristic(&self, problem: &Problem, device: &Device) -> Config {
        let host = cpu_of(device);
        match problem {
            Problem::Gemm(p) => Config::Gemm(gemm::heuristic(p, host)),
            Problem::Flash(p) => Config::Flash(flash::heuristic(p, host)),
            Problem::Paged(p) => Config::Paged(paged::heuristic(p, host)),
        }
    }
}
