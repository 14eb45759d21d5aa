//! `gpu-check`: on a machine with an NVIDIA GPU, compile the GPU kernels with NVRTC for the
//! device, verify every family on the device against the CPU reference (awkward sizes
//! first), tune a few Llama-3.1-70B TP8 problems per family and DeepSeek-V3's TP8 latent
//! decode, and print tuned vs default vs cuBLAS as ratios. `scripts/gpu-check.sh` builds and runs it; the flash-attention peer
//! (PyTorch SDPA) is timed by `bench/sdpa_peer.py` in the same script.
//!
//! Usage: `gpu-check [--family gemm|flash|paged]... [--only-variant V | --skip-variant V]...
//! [--problem SPEC]... [--max-candidates N] [--reps N] [--json FILE] [--trace]`
//!
//! `--problem` times the problems given (every candidate of each, up to `--max-candidates`)
//! instead of the Llama-3.1-70B and DeepSeek-V3 set, and skips the awkward sizes; `--config` (a config as
//! JSON, as `tune bench` takes it) times exactly the configs given, for profiling one under
//! a profiler such as Nsight Compute.
//!
//! A problem whose upload, launch or timing fails is reported and the check goes on; the
//! script runs each family in a process of its own, so a kernel that leaves the CUDA context
//! unusable costs only its family's results, and the wgmma kernels (the GEMM's variant and
//! the flash tiles by warpgroup MMA, never yet run on a device) in more, by `--only-variant`
//! / `--skip-variant` (`wgmma` names both; `cluster` the GEMM tiles run in clusters).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context};
use kerntune_kernels::config::GpuGemmVariant;
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::gpu::cuda::{CudaGpu, DeviceProblem, LoadedKernel};
use kerntune_kernels::gpu::nvrtc::NvrtcCompiler;
use kerntune_kernels::gpu::KernelBuild;
use kerntune_kernels::{Config, DType, Device, GpuSpace, Problem, Space};
use kerntune_tuner::error::chain_message;
use kerntune_tuner::measure::{check_rows, Failure};
use rayon::prelude::*;
use serde::Serialize;

/// Sizes that are multiples of no tile, one row, primes, GQA 8, odd head sizes, a sliding
/// window starting inside a block (the paged kernel's; flash's windowed builds, another
/// compile of every tile, are left to the emulator for the check's five minutes).
const AWKWARD: &[&str] = &[
    "gemm:m=1,n=1,k=1",
    "gemm:m=37,n=101,k=67,dtype=f32",
    "gemm:m=17,n=130,k=257,dtype=f16,b=kn",
    "gemm:m=3,n=1280,k=8192,dtype=bf16",
    // FP8 checkpoints' GEMMs (W8A8): scales per token and channel, decode and odd sizes.
    "gemm:m=3,n=1280,k=8192,dtype=fp8_e4m3",
    "gemm:m=37,n=101,k=67,dtype=fp8_e5m2",
    // Block-scaled (DeepSeek-V3's FP8 checkpoints): k of a partial last group, n crossing
    // weight blocks.
    "gemm:m=37,n=101,k=300,dtype=fp8_e4m3,block=128",
    // Int4 (GPTQ's words, W4A16): groups of one word, a prompt's rows and a decode step's.
    "gemm:m=37,n=101,k=264,dtype=bf16,b=kn,int4=8",
    "gemm:m=3,n=1280,k=8192,dtype=f16,b=kn,int4=128",
    "flash:q_len=1,q_heads=1,kv_heads=1,head_dim=64",
    "flash:q_len=37,kv_len=101,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
    "flash:q_len=65,q_heads=4,kv_heads=2,head_dim=80,dtype=f16,causal=false",
    "paged:num_seqs=3,context_len=1,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
    "paged:num_seqs=5,context_len=1000,q_heads=8,kv_heads=8,head_dim=64,block_size=32,dtype=f16",
    "paged:num_seqs=3,context_len=707,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,window=300",
    // gpt-oss's attention: sinks, a window of 128 in every other layer.
    "flash:q_len=37,kv_len=300,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16,window=128,sinks=true",
    "paged:num_seqs=3,context_len=707,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16,sinks=true",
    // Gemma 2's: scores soft-capped (at 1 here, below most of them, where 50 bends none of
    // these).
    "flash:q_len=65,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16,softcap=1",
    "paged:num_seqs=3,context_len=707,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16,softcap=1",
    // Bloom's at TP8 (14 heads of 128, ALiBi), chunked after cached keys: the bias counts
    // from each query's position.
    "flash:q_len=37,kv_len=101,q_heads=14,kv_heads=14,head_dim=128,dtype=bf16,alibi=true",
    // Fp8 caches (vLLM's --kv-cache-dtype fp8): E4M3 under bf16 queries, E5M2 under f16.
    "paged:num_seqs=3,context_len=707,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,kv_dtype=fp8_e4m3",
    "paged:num_seqs=5,context_len=1000,q_heads=8,kv_heads=8,head_dim=64,block_size=32,dtype=f16,kv_dtype=fp8_e5m2",
    // Latent caches (DeepSeek's multi-head latent attention): rows of 576 whose first 512 are
    // the values, bf16 and E4M3; rows of 128 with values of 64 (the grouped kernel).
    "paged:num_seqs=3,context_len=707,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,dtype=bf16",
    "paged:num_seqs=3,context_len=707,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,dtype=bf16,kv_dtype=fp8_e4m3",
    "paged:num_seqs=3,context_len=300,q_heads=4,kv_heads=2,head_dim=128,v_head_dim=64,dtype=f16",
    // Its prefill: keys of 192, values of 128, chunked after a cached prefix.
    "flash:q_len=65,kv_len=300,q_heads=4,kv_heads=4,head_dim=192,v_head_dim=128,dtype=bf16,scale=0.1352",
];

/// Llama-3.1-70B at tensor parallelism 8, bf16: decode and prefill GEMMs, prefill attention,
/// decode attention.
const LLAMA70B_TP8: &[&str] = &[
    "gemm:m=1,n=1280,k=8192,dtype=bf16",
    "gemm:m=16,n=7168,k=8192,dtype=bf16",
    "gemm:m=1,n=8192,k=3584,dtype=bf16",
    "gemm:m=2048,n=1280,k=8192,dtype=bf16",
    "gemm:m=2048,n=8192,k=1024,dtype=bf16",
    "gemm:m=2048,n=7168,k=8192,dtype=bf16",
    // The first decode GEMM again as an FP8 checkpoint runs it (W8A8): half the weight bytes.
    "gemm:m=1,n=1280,k=8192,dtype=fp8_e4m3",
    // And as a 4-bit GPTQ or AWQ checkpoint runs it (W4A16): a quarter of the bytes.
    "gemm:m=1,n=1280,k=8192,dtype=bf16,b=kn,int4=128",
    "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
    "paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
];

/// DeepSeek-V3 at tensor parallelism 8, bf16: its latent decode (16 heads on one row of 576,
/// values its first 512) in the blocks of 64 vLLM allocates on sm_90; and one decode step of
/// its FP8 checkpoint's gate and up projection (block-scaled, 128).
const DEEPSEEK_V3_TP8: &[&str] = &[
    "gemm:m=1,n=4608,k=7168,dtype=fp8_e4m3,block=128",
    "paged:num_seqs=32,context_len=4096,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=64,dtype=bf16,scale=0.1352",
];

#[derive(Debug, Serialize)]
struct Row {
    problem: String,
    candidates: usize,
    verified: usize,
    failed: Vec<String>,
    default_ns: Option<f64>,
    best_ns: Option<f64>,
    best: Option<String>,
    /// The fastest config as `--config` takes it, for profiling it again.
    best_config: Option<Config>,
    cublas_ns: Option<f64>,
    /// cuBLAS writing f32, as kerntune's GEMM does, where the inputs are 16-bit (`cublas_ns`
    /// is cuBLAS writing them in the inputs' type, as servers call it).
    cublas_f32_ns: Option<f64>,
    /// fp8 GEMMs: cuBLASLt on the same bytes (bf16 out), as PyTorch's `_scaled_mm` calls
    /// it, with the scales `cublaslt_scales` names (per token and channel, as kerntune's, where
    /// cuBLASLt takes them); `cublaslt_note` says why not where it could not run.
    cublaslt_ns: Option<f64>,
    cublaslt_scales: Option<String>,
    cublaslt_note: Option<String>,
    /// Every verified config's median, fastest first, with its main kernel's registers and
    /// spilled registers as ptxas allocated them: which of the tiles that spill pay.
    timed: Vec<(String, f64, u32, u32)>,
}

/// One build as NVRTC compiled it: the CUBIN, and its main kernel's registers and spills.
#[derive(Clone)]
struct Compiled {
    cubin: Vec<u8>,
    registers: u32,
    spilled: u32,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Check<'a> {
    gpu: &'a CudaGpu,
    nvrtc: &'a NvrtcCompiler,
    device: Device,
    arch: String,
    trace: bool,
    started: Instant,
    compiled: Mutex<HashMap<String, Result<Compiled, String>>>,
    /// Whether a kernel left the device unusable (every later call of the process fails).
    lost: AtomicBool,
}

/// Whether `e` is the device lost to the process (a kernel's sticky fault).
fn lost(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<kerntune_kernels::KernelError>(),
            Some(kerntune_kernels::KernelError::DeviceLost { .. })
        )
    })
}

impl Check<'_> {
    /// Each config's CUBIN, compiled in parallel; a build another problem compiled (the same
    /// source, defines and target: sizes are arguments, not defines) is taken from the cache.
    fn compile(&self, p: &Problem, configs: &[Config]) -> Vec<(Config, Result<Compiled, String>)> {
        configs
            .par_iter()
            .map(|c| (*c, self.compile_one(p, c)))
            .collect()
    }

    fn compile_one(&self, p: &Problem, c: &Config) -> Result<Compiled, String> {
        let b = KernelBuild::new(p, c).map_err(|e| e.to_string())?;
        let key = b.key();
        if let Some(done) = self.compiled.lock().expect("not poisoned").get(&key) {
            return done.clone();
        }
        let out = self
            .nvrtc
            .compile(&b, &self.arch, b.threads as u32)
            .map(|out| {
                let main = out.kernels.iter().find(|k| k.name == b.entries[0]);
                Compiled {
                    registers: main.map_or(0, |k| k.vgpr),
                    spilled: main.map_or(0, |k| k.vgpr_spill),
                    cubin: out.cubin,
                }
            });
        self.compiled
            .lock()
            .expect("not poisoned")
            .insert(key, out.clone());
        out
    }

    /// Compiles every distinct build of `runs` in one parallel batch, before any is timed: a
    /// problem at a time, each batch waited for its slowest compile with cores idle (the flash
    /// family's awkward sizes took most of its minute on the H200 that way).
    fn prepare(&self, runs: &[(Problem, Vec<Config>)]) {
        let mut seen = std::collections::HashSet::new();
        let builds: Vec<(&Problem, &Config)> = runs
            .iter()
            .flat_map(|(p, configs)| configs.iter().map(move |c| (p, c)))
            .filter(|(p, c)| KernelBuild::new(p, c).is_ok_and(|b| seen.insert(b.key())))
            .collect();
        let t = Instant::now();
        builds.par_iter().for_each(|(p, c)| {
            // Errors are kept in the cache and reported with the problem that hits them.
            let _ = self.compile_one(p, c);
        });
        if self.trace {
            eprintln!(
                "[{:7.2} s] compiled {} builds in {:.2} s",
                self.started.elapsed().as_secs_f64(),
                builds.len(),
                t.elapsed().as_secs_f64()
            );
        }
    }

    fn load(&self, p: &Problem, c: &Config, cubin: &[u8]) -> anyhow::Result<LoadedKernel> {
        let build = KernelBuild::new(p, c)?;
        Ok(self.gpu.load(&build, cubin)?)
    }

    /// With `--trace`, a step and the seconds since the check started, on stderr at once: a
    /// check stopped by its time limit shows where it was.
    fn trace(&self, what: std::fmt::Arguments<'_>) {
        if self.trace {
            eprintln!("[{:7.2} s] {what}", self.started.elapsed().as_secs_f64());
        }
    }

    /// [`sweep`](Self::sweep), or None with the error printed; None at once once the
    /// device is lost to the process.
    fn sweep_or_report(&self, p: &Problem, configs: &[Config], reps: usize) -> Option<Row> {
        if self.lost.load(Ordering::SeqCst) {
            println!("      SKIPPED {}: the device was lost above", p.key());
            return None;
        }
        match self.sweep(p, configs, reps) {
            Ok(row) => Some(row),
            Err(e) => {
                if lost(&e) {
                    self.lost.store(true, Ordering::SeqCst);
                }
                println!("      ERROR {}: {}", p.key(), chain_message(e.as_ref()));
                None
            }
        }
    }

    /// Verifies and (with `reps > 0`) times each config; failures are listed, never timed.
    fn sweep(&self, p: &Problem, configs: &[Config], reps: usize) -> anyhow::Result<Row> {
        let data = ProblemData::random(p, 7);
        let rows = data.verify_rows();
        let reference = data.reference_rows(&rows);
        let min_partition = configs
            .iter()
            .filter_map(|c| match c {
                Config::GpuPaged(g) => Some(g.partition),
                _ => None,
            })
            .min()
            .unwrap_or(1);
        let mut on_device = DeviceProblem::upload(self.gpu, &data, min_partition)?;
        let default = GpuSpace.default_config(p, &self.device);
        let mut row = Row {
            problem: p.key(),
            candidates: configs.len(),
            verified: 0,
            failed: Vec::new(),
            default_ns: None,
            best_ns: None,
            best: None,
            best_config: None,
            cublas_ns: None,
            cublas_f32_ns: None,
            cublaslt_ns: None,
            cublaslt_scales: None,
            cublaslt_note: None,
            timed: Vec::new(),
        };
        let len = data.row_len();
        self.trace(format_args!(
            "{}: compiling {} configs",
            p.key(),
            configs.len()
        ));
        let compiled = self.compile(p, configs);
        self.trace(format_args!("{}: compiled", p.key()));
        for (c, build) in compiled {
            let resources = build.as_ref().map_or((0, 0), |b| (b.registers, b.spilled));
            let outcome = build.map_err(anyhow::Error::msg).and_then(|build| {
                self.trace(format_args!("  {c}: loading"));
                let kernel = self.load(p, &c, &build.cubin)?;
                self.trace(format_args!("  {c}: running"));
                let out = on_device.run(self.gpu, &kernel, &c)?;
                match check_rows(p, &out, len, &rows, &reference) {
                    Err(Failure::Wrong(worst)) => bail!("relative error {worst:.2e}"),
                    Err(Failure::Error(e) | Failure::Lost(e)) => bail!("{e}"),
                    Ok(_) => Ok(kernel),
                }
            });
            match outcome {
                // Nothing more runs in this process: the candidate is the row's last.
                Err(e) if lost(&e) => {
                    row.failed
                        .push(format!("{c}: {}", chain_message(e.as_ref())));
                    self.lost.store(true, Ordering::SeqCst);
                    break;
                }
                Err(e) => row
                    .failed
                    .push(format!("{c}: {}", chain_message(e.as_ref()))),
                Ok(kernel) => {
                    row.verified += 1;
                    if reps == 0 {
                        continue;
                    }
                    self.trace(format_args!("  {c}: timing"));
                    let ns = median(on_device.time(self.gpu, &kernel, &c, reps)?);
                    row.timed
                        .push((c.to_string(), ns, resources.0, resources.1));
                    if c == default {
                        row.default_ns = Some(ns);
                    }
                    if row.best_ns.is_none_or(|b| ns < b) {
                        row.best_ns = Some(ns);
                        row.best = Some(c.to_string());
                        row.best_config = Some(c);
                    }
                }
            }
        }
        row.timed.sort_by(|a, b| a.1.total_cmp(&b.1));
        // cuBLAS's fp8 GEMMs are cuBLASLt's: fp8 rows have that peer instead, beside the
        // goals (which are bf16's), and its failure is a note, not the row's.
        let timing = reps > 0 && !self.lost.load(Ordering::SeqCst);
        match p {
            Problem::Gemm(g) if timing && g.fp8().is_some() => {
                match on_device.time_cublaslt_fp8(self.gpu, reps) {
                    Ok((times, scales)) => {
                        row.cublaslt_ns = Some(median(times));
                        row.cublaslt_scales = Some(scales);
                    }
                    Err(e) => row.cublaslt_note = Some(e.to_string()),
                }
            }
            // cuBLAS takes no int4 words: the bf16 row of the same shape is the peer.
            Problem::Gemm(g) if g.int4.is_some() => {}
            Problem::Gemm(g) if timing => {
                row.cublas_ns = Some(median(on_device.time_cublas(self.gpu, reps, false)?));
                if g.dtype != DType::F32 {
                    row.cublas_f32_ns = Some(median(on_device.time_cublas(self.gpu, reps, true)?));
                }
            }
            _ => {}
        }
        Ok(row)
    }
}

/// Which GEMM variants a run samples from (`--only-variant`, `--skip-variant`); `wgmma`
/// also names the flash tiles by warpgroup MMA, so that they too can run apart.
#[derive(Debug, Default)]
struct Variants {
    only: Vec<String>,
    skip: Vec<String>,
}

impl Variants {
    /// Names a filter may give besides the GEMM variants: `cluster`, the GEMM tiles that
    /// run in clusters of blocks.
    const FORMS: [&'static str; 1] = ["cluster"];

    fn admits(&self, c: &Config) -> bool {
        let names = match c {
            Config::GpuGemm(g) if g.cluster > 1 => vec![g.variant.to_string(), "cluster".into()],
            Config::GpuGemm(g) => vec![g.variant.to_string()],
            Config::GpuFlash(f) if f.wgmma => vec![GpuGemmVariant::Wgmma.to_string()],
            Config::GpuFlash(f) => vec![format!("{:?}", f.variant).to_lowercase()],
            _ => return true,
        };
        (self.only.is_empty() || self.only.iter().any(|o| names.contains(o)))
            && !self.skip.iter().any(|s| names.contains(s))
    }
}

/// At most `max` candidates besides the default and the heuristic: the first half of them
/// from the front of the space's order (its likeliest winners), the rest spread evenly over
/// the remainder; GEMM variants as `variants` admits (none where `--only-variant` admits
/// none of the problem's).
fn candidates(p: &Problem, device: &Device, max: usize, variants: &Variants) -> Vec<Config> {
    let all: Vec<Config> = GpuSpace
        .candidates(p, device)
        .into_iter()
        .filter(|c| variants.admits(c))
        .collect();
    // A run of chosen variants leaves problems they do not apply to to the others.
    if all.is_empty() && !variants.only.is_empty() {
        return all;
    }
    let front = (max / 2).min(all.len());
    let rest = &all[front..];
    let spread = (max - front).min(rest.len());
    let step = rest.len() as f64 / spread.max(1) as f64;
    let mut picked: Vec<Config> = all[..front].to_vec();
    picked.extend((0..spread).map(|i| rest[(i as f64 * step) as usize]));
    for c in [
        GpuSpace.default_config(p, device),
        GpuSpace.heuristic(p, device),
    ] {
        if !picked.contains(&c) {
            picked.push(c);
        }
    }
    picked
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {}", chain_message(e.as_ref()));
            std::process::ExitCode::from(2)
        }
    }
}

/// Returns whether every candidate verified.
fn run() -> anyhow::Result<bool> {
    let mut max_candidates = 24;
    let mut reps = 20;
    let mut json = None;
    let mut families: Vec<String> = Vec::new();
    let mut variants = Variants::default();
    let mut problems: Vec<String> = Vec::new();
    let mut configs: Vec<Config> = Vec::new();
    let mut trace = false;
    let usage = "usage: gpu-check [--family gemm|flash|paged]... [--only-variant V | --skip-variant V]... [--problem SPEC]... [--config JSON]... [--max-candidates N] [--reps N] [--json FILE] [--trace]";
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{a} needs a value; {usage}"))
        };
        match a.as_str() {
            "--max-candidates" => max_candidates = value()?.parse()?,
            "--reps" => reps = value()?.parse()?,
            "--json" => json = Some(value()?),
            "--trace" => trace = true,
            "--config" => {
                let json = value()?;
                configs.push(
                    Config::from_json(&json)
                        .with_context(|| format!("--config {json}; {usage}"))?,
                );
            }
            "--problem" => {
                let spec = value()?;
                spec.parse::<Problem>()
                    .with_context(|| format!("--problem {spec}; {usage}"))?;
                problems.push(spec);
            }
            "--family" => {
                let f = value()?;
                if !["gemm", "flash", "paged"].contains(&f.as_str()) {
                    bail!("--family {f}: not a kernel family; {usage}");
                }
                families.push(f);
            }
            "--only-variant" | "--skip-variant" => {
                let v = value()?;
                let known: Vec<String> = GpuGemmVariant::ALL
                    .iter()
                    .map(|v| v.to_string())
                    .chain(Variants::FORMS.iter().map(|f| f.to_string()))
                    .collect();
                if !known.contains(&v) {
                    bail!(
                        "{a} {v}: not a GEMM variant or form ({}); {usage}",
                        known.join(", ")
                    );
                }
                if a == "--only-variant" {
                    variants.only.push(v);
                } else {
                    variants.skip.push(v);
                }
            }
            other => bail!("unknown argument {other}; {usage}"),
        }
    }
    let wanted = |spec: &&&str| {
        families.is_empty() || families.iter().any(|f| spec.split(':').next() == Some(f))
    };
    let started = Instant::now();
    let gpu = CudaGpu::open(0)?;
    let nvrtc = NvrtcCompiler::find()?;
    let model = gpu.model().with_context(|| {
        format!(
            "{} ({}) is not in the device catalog",
            gpu.info.name,
            gpu.arch()
        )
    })?;
    println!(
        "device: {} ({}, {} SMs, {:.0} GiB, L2 {} MiB, driver {}), compiler {}",
        gpu.info.name,
        gpu.arch(),
        gpu.info.sms,
        gpu.info.memory_bytes as f64 / (1u64 << 30) as f64,
        gpu.info.l2_bytes >> 20,
        gpu.info.driver_version,
        nvrtc.version
    );
    let check = Check {
        gpu: &gpu,
        nvrtc: &nvrtc,
        device: Device::Gpu(model),
        arch: gpu.arch(),
        trace,
        started,
        compiled: Mutex::default(),
        lost: AtomicBool::new(false),
    };

    let mut failures = 0;
    let awkward: &[&str] = if problems.is_empty() { AWKWARD } else { &[] };
    let timed: Vec<&str> = if problems.is_empty() {
        LLAMA70B_TP8
            .iter()
            .chain(DEEPSEEK_V3_TP8)
            .copied()
            .filter(|s| wanted(&s))
            .collect()
    } else {
        problems.iter().map(String::as_str).collect()
    };
    // Each problem with the configs it runs: 12 candidates of each awkward size, verified;
    // `--config`'s or up to `--max-candidates` of each timed problem.
    let runs = |specs: &[&str], max: usize, given: &[Config]| -> anyhow::Result<Vec<_>> {
        let mut runs = Vec::new();
        for spec in specs {
            let p: Problem = spec.parse()?;
            let configs = if given.is_empty() {
                candidates(&p, &check.device, max, &variants)
            } else {
                given.to_vec()
            };
            if !configs.is_empty() {
                runs.push((p, configs));
            }
        }
        Ok(runs)
    };
    let awkward: Vec<&str> = awkward.iter().copied().filter(|s| wanted(&s)).collect();
    let awkward = runs(&awkward, 12, &[])?;
    let timed = runs(&timed, max_candidates, &configs)?;
    check.prepare(&[awkward.as_slice(), timed.as_slice()].concat());
    if !awkward.is_empty() {
        println!("\n== verification on the device (every family, awkward sizes)");
    }
    for (p, configs) in &awkward {
        let Some(row) = check.sweep_or_report(p, configs, 0) else {
            failures += 1;
            continue;
        };
        println!(
            "{:>3}/{:<3} verified  {}",
            row.verified, row.candidates, row.problem
        );
        for f in &row.failed {
            println!("      FAILED {f}");
        }
        failures += row.failed.len();
    }

    let title = if problems.is_empty() {
        "Llama-3.1-70B and DeepSeek-V3 TP8, bf16 (and fp8 decode GEMMs, one block-scaled)"
    } else {
        "the problems given"
    };
    println!("\n== {title}: tuned vs default vs cuBLAS (medians of {reps} cold-L2 launches)");
    println!(
        "{:>10} {:>10} {:>10} {:>8} {:>9}  problem / best config",
        "default", "tuned", "cuBLAS", "vs def", "vs peer"
    );
    let mut rows: Vec<Row> = Vec::new();
    // Rewritten after every problem: a process the script's time limit stops, or a kernel
    // that takes the CUDA context down, keeps the rows timed before it.
    let save = |rows: &[Row]| -> anyhow::Result<()> {
        if let Some(path) = &json {
            std::fs::write(path, serde_json::to_string_pretty(rows)?)
                .with_context(|| format!("writing --json {path}"))?;
        }
        Ok(())
    };
    save(&rows)?;
    for (p, configs) in &timed {
        let Some(row) = check.sweep_or_report(p, configs, reps) else {
            failures += 1;
            continue;
        };
        let us = |v: Option<f64>| v.map(|v| format!("{:.1}us", v / 1e3)).unwrap_or("-".into());
        let ratio = |a: Option<f64>, b: Option<f64>| {
            a.zip(b)
                .map(|(a, b)| format!("{:.2}x", a / b))
                .unwrap_or("-".into())
        };
        println!(
            "{:>10} {:>10} {:>10} {:>8} {:>9}  {}\n{:>52}{}",
            us(row.default_ns),
            us(row.best_ns),
            us(row.cublas_ns),
            ratio(row.default_ns, row.best_ns),
            ratio(row.cublas_ns, row.best_ns),
            row.problem,
            "",
            match (&row.best, row.verified) {
                (Some(best), _) => best.as_str(),
                (None, 0) => "(nothing verified)",
                (None, _) => "(verified, not timed: --reps 0)",
            }
        );
        if row.cublas_f32_ns.is_some() {
            println!(
                "{:>52}cuBLAS writing f32 as kerntune does: {}, tuned {}",
                "",
                us(row.cublas_f32_ns),
                ratio(row.cublas_f32_ns, row.best_ns)
            );
        }
        if let (Some(_), Some(scales)) = (row.cublaslt_ns, &row.cublaslt_scales) {
            println!(
                "{:>52}cuBLASLt fp8 ({scales}, bf16 out): {}, tuned {}",
                "",
                us(row.cublaslt_ns),
                ratio(row.cublaslt_ns, row.best_ns)
            );
        }
        if let Some(note) = &row.cublaslt_note {
            println!("{:>52}cuBLASLt fp8 not timed: {note}", "");
        }
        for f in &row.failed {
            println!("      FAILED {f}");
        }
        failures += row.failed.len();
        rows.push(row);
        save(&rows)?;
    }
    println!(
        "\n{failures} candidates failed verification or to run; {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
    Ok(failures == 0)
}

#[cfg(test)]
mod tests {
    use super::{Variants, AWKWARD, DEEPSEEK_V3_TP8, LLAMA70B_TP8};
    use kerntune_kernels::{Config, Device, GpuSpace, Problem, Space};

    /// The problems a device run checks are problems, and the GPU spaces offer each of them
    /// candidates on the H200 and the MI250 (a typo here would only show on a device).
    #[test]
    fn every_checked_problem_parses_and_has_candidates() {
        for spec in AWKWARD.iter().chain(LLAMA70B_TP8).chain(DEEPSEEK_V3_TP8) {
            let p: Problem = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
            for name in ["h200", "mi250"] {
                let device = Device::lookup(name).unwrap();
                assert!(
                    !GpuSpace.candidates(&p, &device).is_empty(),
                    "{name}: no candidates for {spec}"
                );
            }
        }
    }

    /// The script's GEMM processes between them run every candidate once: the plain ones,
    /// the wgmma ones outside clusters, and the clusters.
    #[test]
    fn the_gemm_processes_split_the_candidates_between_them() {
        let p: Problem = "gemm:m=2048,n=7168,k=8192,dtype=bf16".parse().unwrap();
        let device = Device::lookup("h200").unwrap();
        let all = GpuSpace.candidates(&p, &device);
        let filter = |only: &[&str], skip: &[&str]| Variants {
            only: only.iter().map(|s| s.to_string()).collect(),
            skip: skip.iter().map(|s| s.to_string()).collect(),
        };
        let runs = [
            filter(&[], &["wgmma"]),
            filter(&["wgmma"], &["cluster"]),
            filter(&["cluster"], &[]),
        ];
        for c in &all {
            let takers = runs.iter().filter(|v| v.admits(c)).count();
            assert_eq!(takers, 1, "{c}");
        }
        let clustered = |c: &Config| matches!(c, Config::GpuGemm(g) if g.cluster > 1);
        assert!(all.iter().any(clustered));
        assert!(all.iter().filter(|c| runs[2].admits(c)).all(clustered));
    }
}
