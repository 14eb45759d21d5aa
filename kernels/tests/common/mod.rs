//! Helpers shared by the kernel tests.

use kerntune_kernels::data::ProblemData;
use kerntune_kernels::kernel::Scratch;
use kerntune_kernels::reference::relative_error;
use kerntune_kernels::{Backend, Config, CpuBackend, Device, Isa, Problem};

/// Runs `config` on `data` and returns its error against `reference`.
pub fn error_of(
    data: &mut ProblemData,
    config: &Config,
    reference: &[f64],
    scratch: &mut Scratch,
) -> f64 {
    let problem = data.problem;
    data.out.fill(f32::NAN);
    let buf = scratch.get(CpuBackend.scratch_len(&problem, config));
    CpuBackend
        .run(&problem, config, data.args(), buf)
        .unwrap_or_else(|e| panic!("{problem} with {config}: {e}"));
    relative_error(&data.out, reference)
}

/// Asserts every config matches the reference within the dtype's tolerance; returns how many
/// configs ran.
pub fn check_all(problem: &Problem, configs: &[Config]) -> usize {
    check_all_on(&mut ProblemData::random(problem, 7), configs)
}

/// [`check_all`] on given data (an int4 problem's without zero points, say).
pub fn check_all_on(data: &mut ProblemData, configs: &[Config]) -> usize {
    let problem = data.problem;
    let reference = data.reference();
    let tol = problem.tolerance();
    let mut scratch = Scratch::new();
    for config in configs {
        let err = error_of(data, config, &reference, &mut scratch);
        assert!(
            err <= tol,
            "{problem} with {config}: relative error {err:e} exceeds {tol:e}"
        );
    }
    configs.len()
}

/// A 4-thread Xeon with AMX tiles, described as the tuner's sharing checks describe a
/// colleague's machine: this host's details with that model, level and thread count.
#[allow(dead_code)] // Not every test binary describes one.
pub fn described_amx_host() -> Device {
    let mut info = kerntune_kernels::CpuInfo::detect().clone();
    info.model = "Intel Xeon Platinum 8480+".into();
    info.isa = Isa::Avx512Amx;
    info.avx512_bf16 = true;
    info.threads = 4;
    // The 8480+'s L2 per core; the space's loop-order candidates depend on it.
    info.l2_bytes = 2 << 20;
    Device::Cpu(info)
}

/// A 2-thread AVX-512 host with AVX-512-BF16 and no AMX named `model`: the untuned choices
/// between pairs and widening follow the core its name tells (Intel or Zen 4).
#[allow(dead_code)] // Not every test binary describes one.
pub fn described_avx512_host(model: &str) -> Device {
    let mut info = kerntune_kernels::CpuInfo::detect().clone();
    info.model = model.into();
    info.isa = Isa::Avx512;
    info.avx512_bf16 = true;
    info.threads = 2;
    Device::Cpu(info)
}
