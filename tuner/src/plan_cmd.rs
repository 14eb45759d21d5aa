//! `tune plan` and what `tune --device <gpu>` does on a host without that GPU.

use kerntune_db::Db;
use kerntune_kernels::device::{GpuModel, Vendor};
use kerntune_kernels::gpu::hip_runtime;
use kerntune_kernels::{Device, GpuSpace, Space};
use kerntune_tuner::error::usage;
use kerntune_tuner::plan::{plan, Plan, PlanOptions};
use kerntune_tuner::progress::Progress;
use kerntune_tuner::TuneError;

use crate::cli::{PlanArgs, TuneArgs};
use crate::{db_path, derive};

pub async fn run(args: &TuneArgs, p: &PlanArgs) -> anyhow::Result<()> {
    let Some(name) = &args.device else {
        return Err(usage(
            "tune plan needs --device, e.g. --device mi250, --device mi300x or --device h100",
        )
        .into());
    };
    let device = Device::lookup(name).map_err(TuneError::from)?;
    if !(p.min_occupancy.is_finite() && p.min_occupancy >= 0.0) {
        return Err(usage(format!(
            "--min-occupancy {}: expected waves per SIMD (AMD) or warps per scheduler (NVIDIA), e.g. 1 or 2",
            p.min_occupancy
        ))
        .into());
    }
    let problems = derive(&p.shapes, &device)?;
    // A missing compiler, a target it lacks or (with --emulate) no host C++ compiler fail
    // here, before the database is created.
    let check = PlanOptions {
        emulate: p.emulate,
        ..Default::default()
    };
    plan(None, &device, &[], &check).await?;
    let path = db_path(args);
    let db = Db::open(&path).await.map_err(TuneError::from)?;
    let options = PlanOptions {
        min_waves: p.min_occupancy,
        max_candidates: p.max_candidates,
        emulate: p.emulate,
        jobs: p.jobs,
        progress: Progress::for_stderr(args.json),
        stop: Some(crate::stop_on_ctrl_c()?),
    };
    let result = plan(Some(&db), &device, &problems, &options).await;
    db.close().await;
    let plan = result?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print_plan(&plan);
    }
    Ok(())
}

fn print_plan(plan: &Plan) {
    if let Some(w) = &plan.warning {
        eprintln!("warning: {w}");
    }
    println!(
        "{} ({}), kernel sources {}, {}",
        plan.device, plan.target, plan.source_hash, plan.compiler
    );
    println!("{:>6} {:>6} {:>10}  problem", "cands", "kept", "device s");
    for p in &plan.problems {
        println!(
            "{:>6} {:>6} {:>10.1}  {}",
            p.candidates.len(),
            p.kept,
            p.estimate_s,
            p.problem
        );
    }
    let total: usize = plan.problems.iter().map(|p| p.candidates.len()).sum();
    let kept: usize = plan.problems.iter().map(|p| p.kept).sum();
    println!(
        "{} problems, {total} candidates, {kept} kept; {} distinct builds, {} compiled now, {} from the cache",
        plan.problems.len(),
        plan.builds,
        plan.compiled,
        plan.builds - plan.compiled
    );
    if let Some(e) = &plan.emulated {
        println!(
            "host emulator ({}): {} runs of kept builds against the reference, {} wrong or failing",
            e.compiler, e.runs, e.failed
        );
    }
    for (kind, n) in &plan.pruned {
        println!("pruned {n}: {kind}");
    }
    // One example of each pruning reason, so the numbers can be checked.
    let mut shown = std::collections::BTreeSet::new();
    for p in &plan.problems {
        for c in &p.candidates {
            if let kerntune_kernels::gpu::Verdict::Pruned { reason } = &c.verdict {
                let kind = reason.split(':').next().unwrap_or(reason).to_string();
                if shown.insert(kind) {
                    println!("  e.g. {} {}: {reason}", p.problem, c.config);
                }
            }
        }
    }
    println!(
        "estimated device time for the kept candidates: {:.0} s (about {:.2} s per candidate besides its kernel time)",
        plan.estimate_s,
        kerntune_tuner::plan::PER_CANDIDATE_S
    );
}

/// `tune --device <gpu>` where this build cannot tune on it (`why`): what the device run
/// would cover, from the parameter space alone (nothing compiled, nothing written), and why it
/// cannot run.
pub fn no_device(
    args: &TuneArgs,
    g: &'static GpuModel,
    why: &kerntune_kernels::KernelError,
) -> anyhow::Result<()> {
    let device = Device::Gpu(g);
    let problems = derive(&args.shapes, &device)?;
    let candidates: usize = problems
        .iter()
        .map(|d| GpuSpace.candidates(&d.problem, &device).len())
        .sum();
    let why = why.to_string();
    let found = match g.vendor {
        // The runtime's own device list, whether or not this build can use it.
        Vendor::Amd => match hip_runtime::probe() {
            Ok(devices) => format!(
                "the HIP runtime lists {} ({}), but {why}",
                devices
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                devices.len()
            ),
            Err(e) if why.contains(&e) => format!("no {} device was found: {e}", g.arch),
            Err(e) => format!("no {} device was found: {e}; and {why}", g.arch),
        },
        Vendor::Nvidia => format!("no {} device could be used: {why}", g.arch),
    };
    eprintln!(
        "plan for {} ({}): {} problems, {candidates} candidates in the GPU space{}",
        g.name,
        g.arch,
        problems.len(),
        format_args!(
            "; compile and prune them offline, without a GPU: tune plan --device {} {}",
            args.device.as_deref().unwrap_or(g.arch),
            args.shapes
                .shapes
                .iter()
                .map(|s| format!("--shapes {s}"))
                .collect::<Vec<_>>()
                .join(" ")
        )
    );
    Err(usage(format!(
        "cannot tune on device `{}` ({}, {}): {found}. Nothing was written. Devices present: cpu ({}).",
        args.device.as_deref().unwrap_or(g.name),
        g.name,
        g.arch,
        Device::host()
    ))
    .into())
}
