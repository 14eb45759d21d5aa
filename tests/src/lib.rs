//! End-to-end tests of kerntune: the tuner driven with real and fake backends into a real
//! SQLite database. Shared helpers live here; the tests are in `tests/tests/`.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kerntune_kernels::config::{GemmConfig, GemmVariant, Inner, Split};
use kerntune_kernels::kernel::Args;
use kerntune_kernels::{
    Backend, Config, CpuBackend, CpuSpace, Device, KernelError, Problem, Space,
};
use kerntune_tuner::measure::Policy;
use kerntune_tuner::progress::Progress;
use kerntune_tuner::search::Strategy;
use kerntune_tuner::shapes::Derived;
use kerntune_tuner::tune::{CpuSweep, Job};

/// A config that returns zeros instantly: fast and wrong.
pub fn wrong_config() -> Config {
    marker(7)
}

/// A config whose run panics.
pub fn panicking_config() -> Config {
    marker(11)
}

fn marker(tiles: usize) -> Config {
    let host = kerntune_kernels::CpuInfo::detect();
    Config::Gemm(GemmConfig {
        variant: GemmVariant::Packed,
        isa: kerntune_kernels::Isa::Portable,
        mr: 4,
        nr: 8,
        mc: 4 * tiles,
        kc: 64,
        nc: 8 * tiles,
        split: Split::N,
        threads: host.threads.min(1),
        prefetch: true,
        inner: Inner::M,
    })
}

/// The CPU backend, except for the two marker configs.
#[derive(Debug)]
pub struct FakeBackend;

impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn scratch_len(&self, problem: &Problem, config: &Config) -> usize {
        CpuBackend.scratch_len(problem, config)
    }
    fn run(
        &self,
        problem: &Problem,
        config: &Config,
        args: Args<'_>,
        scratch: &mut [f32],
    ) -> Result<(), KernelError> {
        if *config == wrong_config() {
            if let Args::Gemm(g) = args {
                g.c.fill(0.0);
            }
            return Ok(());
        }
        if *config == panicking_config() {
            panic!("the fake kernel crashed");
        }
        CpuBackend.run(problem, config, args, scratch)
    }
}

/// The CPU space with the marker configs first in every GEMM candidate list.
#[derive(Debug)]
pub struct FakeSpace;

impl Space for FakeSpace {
    fn backend(&self) -> &'static str {
        "cpu"
    }
    fn candidates(&self, problem: &Problem, device: &Device) -> Vec<Config> {
        let mut c = Vec::new();
        if matches!(problem, Problem::Gemm(_)) {
            c.push(wrong_config());
            c.push(panicking_config());
        }
        c.extend(CpuSpace.candidates(problem, device).into_iter().take(6));
        c
    }
    fn validate(
        &self,
        config: &Config,
        problem: &Problem,
        device: &Device,
    ) -> Result<(), KernelError> {
        CpuSpace.validate(config, problem, device)
    }
    fn default_config(&self, problem: &Problem, device: &Device) -> Config {
        CpuSpace.default_config(problem, device)
    }
    fn heuristic(&self, problem: &Problem, device: &Device) -> Config {
        CpuSpace.heuristic(problem, device)
    }
}

/// The CPU sweep with `backend` and `space` (real or fake).
pub fn cpu<'a>(backend: &'a dyn Backend, space: &'a dyn Space) -> CpuSweep<'a> {
    CpuSweep::new(backend, space)
}

/// Small problems of every family.
pub fn small_problems() -> Vec<Derived> {
    [
        "gemm:m=3,n=37,k=29,dtype=f32",
        "gemm:m=17,n=64,k=100,dtype=bf16,b=kn",
        "flash:q_len=19,kv_len=40,q_heads=4,kv_heads=1,head_dim=64,dtype=f16",
        "paged:num_seqs=3,context_len=70,q_heads=8,kv_heads=2,head_dim=64,block_size=16,dtype=bf16",
    ]
    .iter()
    .map(|s| Derived {
        problem: s.parse().unwrap(),
        origin: "test".into(),
    })
    .collect()
}

/// A fast job: short budgets, warm timing, few repetitions.
pub fn job<'a>(db: &'a kerntune_db::Db, device: &'a Device) -> Job<'a> {
    Job {
        db,
        device,
        strategy: Strategy::Exhaustive,
        budget: Duration::from_secs(5),
        total_budget: Duration::from_secs(120),
        max_configs: 12,
        retune: false,
        policy: Policy {
            min_reps: 3,
            max_reps: 5,
            max_time: Duration::from_millis(50),
            target_ci: 0.5,
            rotate_bytes: 0,
        },
        command_line: "test".into(),
        progress: Progress::Quiet,
        stop: &NEVER,
    }
}

/// The stop flag of [`job`]: nothing raises it (a test that stops a job gives it its own).
static NEVER: AtomicBool = AtomicBool::new(false);
