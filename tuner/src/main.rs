//! `tune`: derive a model's kernel problems, sweep each kernel's configurations on a device,
//! verify every candidate, time it, and store every measurement and the winner.
//!
//! Exit codes: 0 success, 1 failure, 2 usage error (nothing written), 130 interrupted (finished
//! problems committed).

mod cli;
mod db_cmd;
mod plan_cmd;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kerntune_db::Db;
use kerntune_kernels::device::GpuModel;
use kerntune_kernels::env::path_var;
use kerntune_kernels::{Config, CpuBackend, CpuSpace, Device, Space, CPU_SOURCE_HASH};
use kerntune_tuner::error::{chain_message, usage};
use kerntune_tuner::gpu_sweep::GpuSweep;
use kerntune_tuner::measure::{Policy, Workload};
use kerntune_tuner::plan::PlanOptions;
use kerntune_tuner::progress::{fmt_rate, fmt_time, Progress};
use kerntune_tuner::shapes::{expand_all, names_a_model, Derived};
use kerntune_tuner::tune::{self, CpuSweep, Job, Outcome};
use kerntune_tuner::TuneError;

use cli::{Cli, Command, ShapeArgs, TuneArgs};

fn main() -> ExitCode {
    die_quietly_on_a_closed_pipe();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime always builds");
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", chain_message(err.as_ref()));
            match err.downcast_ref::<TuneError>() {
                Some(e) if e.is_usage() => ExitCode::from(2),
                Some(TuneError::Interrupted { .. } | TuneError::PlanInterrupted { .. }) => {
                    ExitCode::from(130)
                }
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// `tune shapes | head` or `tune show | less` closes the pipe before everything is written.
/// Rust ignores SIGPIPE, so the next `println!` would panic with a backtrace; with the signal's
/// default action `tune` ends quietly, as every shell tool does. Nothing is lost: a tuning run
/// prints to standard output only its summary, after its results are committed.
fn die_quietly_on_a_closed_pipe() {
    // SAFETY: the first thing main does, before any other thread exists; SIG_DFL is a valid
    // action for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    kerntune_kernels::env::check_knobs().map_err(usage)?;
    let args = &cli.tune;
    match &cli.command {
        Some(Command::Shapes(s)) => {
            print_shapes(&derive(&s.shapes, &named_device(args)?)?, args.json)
        }
        Some(Command::Show(s)) => show(args, &s.shapes).await,
        Some(Command::Bench(b)) => bench(args, &b.shapes, &b.config).await,
        Some(Command::Db(c)) => db_cmd::run(args, c).await,
        Some(Command::Plan(p)) => plan_cmd::run(args, p).await,
        None => tune_main(args).await,
    }
}

/// The device named by --device (the host CPU without one). Deriving shapes and reading
/// winners need no device present, so any catalog GPU is accepted here.
fn named_device(args: &TuneArgs) -> Result<Device, TuneError> {
    match &args.device {
        Some(name) => Ok(Device::lookup(name)?),
        None => Ok(Device::host()),
    }
}

/// The device for running CPU kernels in this process: `tune bench` and the CPU sweep.
fn pick_device(args: &TuneArgs) -> Result<Device, TuneError> {
    let device = named_device(args)?;
    if let Device::Gpu(g) = device {
        return Err(usage(format!(
            "`tune bench` runs the CPU kernels, not {} ({}); GPU candidates are verified and timed by `tune --device {}`, or planned offline by `tune plan --device {}`",
            g.name, g.arch, g.name, g.name
        )));
    }
    Ok(device)
}

fn derive(shapes: &ShapeArgs, device: &Device) -> Result<Vec<Derived>, TuneError> {
    if shapes.shapes.is_empty() {
        return Err(usage("no --shapes given: name a preset (e.g. --shapes llama70b), a config.json, or a problem such as gemm:m=1,n=1280,k=8192"));
    }
    let flags = shapes.model_flags();
    if !flags.is_empty() && !shapes.shapes.iter().any(|s| names_a_model(s)) {
        return Err(usage(format!(
            "{} {} a model's problems, and no --shapes names a model: problems given as `gemm:...`, `flash:...`, `paged:...`, untuned:PATH or tunableop:PATH are one shard's shapes as written; drop {}, or add a preset or config.json to --shapes",
            flags.join(", "),
            if flags.len() == 1 { "shapes" } else { "shape" },
            if flags.len() == 1 { "it" } else { "them" }
        )));
    }
    let buckets = shapes.buckets(device).map_err(usage)?;
    let memory = match device {
        Device::Cpu(_) => kerntune_tuner::host_memory_bytes(),
        Device::Gpu(g) => g.memory_bytes as f64,
    };
    let expanded = expand_all(&shapes.shapes, shapes.tp.as_deref(), memory, &buckets)?;
    for note in &expanded.notes {
        eprintln!("note: {note}");
    }
    let mut list = expanded.problems;
    // Cheapest first: a run cut short by its budget still covers the most problems.
    list.sort_by(|a, b| a.problem.flops().total_cmp(&b.problem.flops()));
    Ok(list)
}

fn db_path(args: &TuneArgs) -> PathBuf {
    args.db
        .clone()
        .or_else(|| path_var("KERNTUNE_DB"))
        .unwrap_or_else(|| PathBuf::from("kerntune.db"))
}

fn print_shapes(list: &[Derived], json: bool) -> anyhow::Result<()> {
    if json {
        let rows: Vec<_> = list
            .iter()
            .map(|d| serde_json::json!({"key": d.problem.key(), "origin": d.origin, "problem": d.problem}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        // A config.json's origin carries its path: the column is as wide as the longest.
        let width = list
            .iter()
            .map(|d| d.origin.len())
            .max()
            .unwrap_or(0)
            .max(28);
        println!("{:<width$} {:>12}  problem", "origin", "GFLOP");
        for d in list {
            println!(
                "{:<width$} {:>12.3}  {}",
                d.origin,
                d.problem.flops() / 1e9,
                d.problem.key()
            );
        }
        println!("{} problems", list.len());
    }
    Ok(())
}

/// The settings every tuning run shares.
fn job<'a>(args: &TuneArgs, db: &'a Db, device: &'a Device) -> Job<'a> {
    Job {
        db,
        device,
        strategy: args.strategy,
        budget: args.budget,
        total_budget: args.total_budget,
        max_configs: args.max_configs,
        retune: args.retune,
        policy: Policy::default(),
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        progress: Progress::for_stderr(args.json),
        stop: &STOP,
    }
}

/// Raised by the first Ctrl-C: tuning stops between candidates and a plan after the compiles
/// in flight, each keeping what it finished.
static STOP: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C handler that raises [`STOP`]. A second Ctrl-C exits at once, as a user
/// who will not wait for the candidate or compiles in flight expects: the database's
/// transactions keep it sound (a killed run is tested to leave it so), what was committed
/// stays, and the compilers' temporary directories are removed.
pub(crate) fn stop_on_ctrl_c() -> anyhow::Result<&'static AtomicBool> {
    static PRESSED: AtomicUsize = AtomicUsize::new(0);
    ctrlc::set_handler(|| {
        if PRESSED.fetch_add(1, Ordering::SeqCst) == 0 {
            eprintln!("\nstopping after what is in flight (Ctrl-C again to exit at once)");
            STOP.store(true, Ordering::SeqCst);
        } else {
            // Nothing is dropped on the way out: the compilers' temporary directories would
            // stay behind.
            kerntune_kernels::gpu::remove_temporary_dirs();
            std::process::exit(130);
        }
    })
    .context("installing the Ctrl-C handler")?;
    Ok(&STOP)
}

async fn tune_main(args: &TuneArgs) -> anyhow::Result<()> {
    if let Some(name) = &args.device {
        if let Device::Gpu(g) = Device::lookup(name).map_err(TuneError::from)? {
            return tune_gpu(args, g).await;
        }
    }
    let device = named_device(args)?;
    if let Some(n) = args.gpu {
        return Err(usage(format!(
            "--gpu {n} chooses among GPUs, and this run tunes {}: name a GPU with --device (h200, mi300x, ...)",
            device.name()
        ))
        .into());
    }
    let problems = derive(&args.shapes, &device)?;
    let path = db_path(args);
    let db = Db::open(&path).await.map_err(TuneError::from)?;
    stop_on_ctrl_c()?;
    let job = job(args, &db, &device);
    eprintln!(
        "tuning {} problems on {} with {:?} search; database {}",
        problems.len(),
        device,
        args.strategy,
        path.display()
    );
    let mut sweep = CpuSweep::new(&CpuBackend, &CpuSpace);
    let result = tune::run(&job, &mut sweep, &problems).await;
    db.close().await;
    let outcomes = result?;
    print_summary(&outcomes, args.budget, args.json)
}

/// Tunes on a GPU: open it (or say why it cannot be used, writing nothing), plan and compile
/// the candidates offline, then verify and time the kept ones on the device.
async fn tune_gpu(args: &TuneArgs, g: &'static GpuModel) -> anyhow::Result<()> {
    let ordinal = args.gpu.unwrap_or(0);
    let gpu = match kerntune_kernels::gpu::device::open(g.vendor, ordinal) {
        Ok(gpu) => gpu,
        Err(why) => return plan_cmd::no_device(args, g, &why),
    };
    if !gpu.is(g) {
        return Err(usage(format!(
            "--device {}: GPU {ordinal} of this host is `{}`, not {} ({}); name the device present, or choose another GPU with --gpu N (or HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES)",
            args.device.as_deref().unwrap_or(g.name),
            gpu.name(),
            g.name,
            g.arch
        ))
        .into());
    }
    let device = Device::Gpu(g);
    let problems = derive(&args.shapes, &device)?;
    // A missing compiler fails here, before the database is created; so does one that builds
    // only a stand-in of the device's target.
    kerntune_tuner::plan::plan(None, &device, &[], &PlanOptions::default())
        .await?
        .check_loadable_on(g)?;
    let path = db_path(args);
    let db = Db::open(&path).await.map_err(TuneError::from)?;
    stop_on_ctrl_c()?;
    let job = job(args, &db, &device);
    let result = async {
        let (mut sweep, plan) = GpuSweep::prepare(
            &db,
            &device,
            gpu.as_ref(),
            &problems,
            &PlanOptions {
                min_waves: 1.0,
                max_candidates: Some(job.max_configs),
                progress: job.progress,
                stop: Some(job.stop),
                ..Default::default()
            },
        )
        .await?;
        if let Some(w) = &plan.warning {
            eprintln!("warning: {w}");
        }
        let total: usize = plan.problems.iter().map(|p| p.candidates.len()).sum();
        let kept: usize = plan.problems.iter().map(|p| p.kept).sum();
        eprintln!(
            "tuning {} problems on {} ({}, {}) with {:?} search: {kept} of {total} candidates kept by the offline plan ({}); database {}",
            problems.len(),
            g.name,
            gpu.name(),
            gpu.runtime(),
            args.strategy,
            plan.compiler,
            path.display()
        );
        let outcomes = tune::run(&job, &mut sweep, &problems).await;
        for note in &sweep.notes {
            eprintln!("note: {note}");
        }
        outcomes
    }
    .await;
    db.close().await;
    let outcomes = result?;
    print_summary(&outcomes, args.budget, args.json)
}

fn print_summary(outcomes: &[Outcome], budget: Duration, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(outcomes)?);
        return Ok(());
    }
    println!(
        "{:<10} {:>10} {:>12} {:>8} {:>5} {:>5} {:>6}  problem / winner",
        "status", "median", "throughput", "speedup", "runs", "fail", "pruned"
    );
    for o in outcomes {
        println!(
            "{:<10} {:>10} {:>12} {:>8} {:>5} {:>5} {:>6}  {}{}",
            o.status,
            o.median_ns.map(fmt_time).unwrap_or_default(),
            o.throughput
                .zip(o.unit.as_deref())
                .map(|(t, u)| fmt_rate(t, u))
                .unwrap_or_default(),
            o.speedup.map(|s| format!("{s:.2}x")).unwrap_or_default(),
            o.measured,
            o.failed,
            o.pruned,
            o.problem,
            o.winner
                .as_ref()
                .map(|w| format!("\n{:>61}{w}", "-> "))
                .unwrap_or_default()
        );
    }
    let count = |s: &str| outcomes.iter().filter(|o| o.status == s).count();
    println!(
        "{} tuned, {} already tuned, {} without a winner, {} left for the next run (budget){}",
        count("tuned"),
        count("skipped"),
        count("no-winner"),
        count("budget"),
        match count("elsewhere") {
            0 => String::new(),
            n => format!(", {n} still being tuned by other runs"),
        }
    );
    let paced: Vec<f64> = outcomes
        .iter()
        .filter_map(|o| o.search_budget_s)
        .filter(|&b| b < budget.as_secs_f64())
        .collect();
    if let Some(shortest) = paced.iter().copied().reduce(f64::min) {
        println!(
            "{} searches paced to fit --total-budget (shortest {shortest:.1} s of --budget's {:.1} s)",
            paced.len(),
            budget.as_secs_f64()
        );
    }
    Ok(())
}

async fn show(args: &TuneArgs, shapes: &ShapeArgs) -> anyhow::Result<()> {
    let path = db_path(args);
    let identity = match &args.device {
        Some(_) => Some(named_device(args)?.identity()),
        None => None,
    };
    let keys: Option<Vec<String>> = if shapes.shapes.is_empty() {
        None
    } else {
        Some(
            derive(shapes, &Device::host())?
                .iter()
                .map(|d| d.problem.key())
                .collect(),
        )
    };
    let db = Db::open_existing(&path).await.map_err(TuneError::from)?;
    let rows = db.winners(identity.as_deref()).await;
    // Closed before printing: a database left to the process's exit keeps its `-wal` and
    // `-shm` files beside it.
    db.close().await;
    let mut rows = rows?;
    if let Some(keys) = &keys {
        rows.retain(|r| keys.contains(&r.problem));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    for r in &rows {
        let current = match r.backend.as_str() {
            "cpu" => CPU_SOURCE_HASH,
            _ => kerntune_kernels::gpu::GPU_SOURCE_HASH,
        };
        let stale = if r.source_hash != current {
            " STALE (other kernel sources)"
        } else {
            ""
        };
        println!(
            "{}\n    {}  {}  {}  {}  measured {} on {} ({}){stale}",
            r.problem,
            Config::from_json(&r.config)
                .map(|c| c.to_string())
                .unwrap_or_else(|_| r.config.clone()),
            fmt_time(r.median_ns),
            r.throughput
                .zip(r.unit.as_deref())
                .map(|(t, u)| fmt_rate(t, u))
                .unwrap_or_default(),
            r.speedup
                .map(|s| format!("{s:.2}x over default"))
                .unwrap_or_default(),
            r.updated_at,
            r.host,
            r.device
        );
    }
    println!("{} winners", rows.len());
    Ok(())
}

async fn bench(args: &TuneArgs, shapes: &ShapeArgs, which: &str) -> anyhow::Result<()> {
    let device = pick_device(args)?;
    let list = derive(shapes, &device)?;
    let mut out = Vec::new();
    for d in &list {
        let p = &d.problem;
        let config = match which {
            "default" => CpuSpace.default_config(p, &device),
            "heuristic" => CpuSpace.heuristic(p, &device),
            "best" => {
                let db = Db::open_existing(&db_path(args))
                    .await
                    .map_err(TuneError::from)?;
                let rows = db.winners(Some(&device.identity())).await;
                db.close().await;
                let rows = rows?;
                let row = rows.iter().find(|r| r.problem == p.key()).ok_or_else(|| {
                    usage(format!(
                        "no winner for {} on {} in the database; tune it first",
                        p.key(),
                        device.identity()
                    ))
                })?;
                Config::from_json(&row.config)
                    .map_err(|e| usage(format!("stored config is malformed: {e}")))?
            }
            json => Config::from_json(json).map_err(|e| {
                usage(format!(
                    "--config `{json}`: {e}; expected default, heuristic, best or a config as JSON"
                ))
            })?,
        };
        CpuSpace
            .validate(&config, p, &device)
            .map_err(TuneError::from)?;
        let policy = Policy {
            max_time: std::time::Duration::from_secs(2),
            ..Policy::default()
        };
        let mut w = Workload::new(p, &policy);
        let err = w
            .verify(&CpuBackend, &config)
            .map_err(|f| anyhow::anyhow!("{config} failed on {p}: {f:?}"))?;
        let s = w
            .time(&CpuBackend, &config, &policy, None)
            .map_err(|f| anyhow::anyhow!("{f:?}"))?;
        if args.json {
            out.push(
                serde_json::json!({"problem": p.key(), "config": config, "error": err, "stats": s}),
            );
        } else {
            println!(
                "{}\n  {}\n  median {}  min {}  p20 {}  p80 {}  reps {}  {}  error {err:.1e}{}",
                p.key(),
                config,
                fmt_time(s.median_ns),
                fmt_time(s.min_ns),
                fmt_time(s.p20_ns),
                fmt_time(s.p80_ns),
                s.reps,
                fmt_rate(s.throughput, &s.unit),
                if s.cold_cache { "  (cold cache)" } else { "" }
            );
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}
