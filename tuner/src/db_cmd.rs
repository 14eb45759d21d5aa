//! `tune db ...`: the sharing commands, printed as tables or JSON.

use kerntune_db::{Db, Prefer};
use kerntune_kernels::Device;
use kerntune_tuner::error::usage;
use kerntune_tuner::share::{self, Rejected};
use kerntune_tuner::TuneError;

use crate::cli::{DbCommand, PreferArg, TuneArgs};
use crate::db_path;

/// Rejections printed before "... and N more".
const SHOWN: usize = 20;

pub async fn run(args: &TuneArgs, command: &DbCommand) -> anyhow::Result<()> {
    let db = db_path(args);
    match command {
        DbCommand::Export {
            all,
            format,
            output,
        } => {
            let device = match args.device.as_deref() {
                // An identity from another machine is taken as written.
                Some(d) if d.contains('/') => Some(d.to_string()),
                Some(d) => Some(Device::lookup(d).map_err(TuneError::from)?.identity()),
                None => None,
            };
            let n = share::export(&db, device.as_deref(), *all, *format, output).await?;
            eprintln!(
                "exported {n} rows ({}) from {} to {}",
                if *all {
                    "every measurement"
                } else {
                    "winners with their defaults"
                },
                db.display(),
                output.display()
            );
        }
        DbCommand::Import {
            file,
            prefer,
            strict,
        } => {
            let prefer = match prefer {
                PreferArg::Best => Prefer::Best,
                PreferArg::Local => Prefer::Local,
                PreferArg::Imported => Prefer::Imported,
            };
            let r = share::import(&db, file, prefer, *strict).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                let c = &r.counts;
                println!(
                    "{} rows read from {}: {} added, {} already present, {} rejected",
                    r.rows,
                    file.display(),
                    c.added,
                    c.duplicates,
                    r.rejected.len()
                );
                println!(
                    "winners: {} new, {} replaced, {} kept (the target's were {})",
                    c.winners_added,
                    c.winners_replaced,
                    c.winners_kept,
                    match prefer {
                        Prefer::Best => "faster",
                        Prefer::Local => "measured locally or faster",
                        Prefer::Imported => "never kept",
                    }
                );
                print_rejected(&r.rejected);
            }
        }
        DbCommand::Merge {
            inputs,
            output,
            conflict_ratio,
        } => {
            if !(conflict_ratio.is_finite() && *conflict_ratio >= 1.0) {
                return Err(usage(format!(
                    "--conflict-ratio {conflict_ratio}: expected a factor of at least 1, e.g. 1.5"
                ))
                .into());
            }
            let r = share::merge(inputs, output, *conflict_ratio).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "merged {} databases into {}: {} measurements ({} rows read, {} rejected), {} winners",
                    r.inputs.len(),
                    output.display(),
                    r.measurements,
                    r.rows,
                    r.rejected.len(),
                    r.winners
                );
                print_rejected(&r.rejected);
                for c in &r.conflicts {
                    println!(
                        "conflict: {} on {}: the same config timed {:.1} us on {} but {:.1} us on {} ({:.2}x)\n    config {}",
                        c.problem,
                        c.device,
                        c.fast_ns / 1e3,
                        c.fast_host,
                        c.slow_ns / 1e3,
                        c.slow_host,
                        c.ratio(),
                        c.config
                    );
                }
                if !r.conflicts.is_empty() {
                    println!(
                        "{} conflicts: check those hosts for load, throttling or other settings",
                        r.conflicts.len()
                    );
                }
            }
        }
        DbCommand::Diff { a, b } => {
            let d = share::diff(a, b).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&d)?);
            } else {
                print_diff(&d, a, b);
            }
        }
        DbCommand::Verify { file } => {
            let problems = share::verify(file).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&problems)?);
            }
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("  {p}");
                }
                anyhow::bail!(
                    "{} is not sound: {} problems listed above",
                    file.display(),
                    problems.len()
                );
            }
            eprintln!(
                "{} is sound: integrity, foreign keys, schema and every winner's config check out",
                file.display()
            );
            let unfinished = share::unfinished_runs(file).await?;
            if !unfinished.is_empty() {
                eprintln!(
                    "note: {} runs never finished (killed, or still running); the problems they finished are committed, the rest are tuned by the next run",
                    unfinished.len()
                );
            }
        }
        DbCommand::Gc {
            stale_kernels,
            old_tools,
            dry_run,
        } => {
            if !stale_kernels && !old_tools {
                let stale = share::gc(&db, true, false, true).await?;
                let old = share::gc(&db, false, true, true).await?;
                return Err(usage(format!(
                    "gc drops nothing unless asked: --stale-kernels would drop {} measurements ({} winners) of other kernel sources, --old-tools {} ({} winners) of other kerntune versions; add --dry-run to only count",
                    stale.measurements, stale.winners, old.measurements, old.winners
                ))
                .into());
            }
            let c = share::gc(&db, *stale_kernels, *old_tools, *dry_run).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else if *dry_run {
                println!(
                    "would drop {} measurements and {} winners from {} (nothing changed)",
                    c.measurements,
                    c.winners,
                    db.display()
                );
            } else {
                println!(
                    "dropped {} measurements, {} winners, {} empty runs and {} unused kernel versions from {}; {} problems got a new winner from what was left",
                    c.measurements,
                    c.winners,
                    c.runs,
                    c.kernels,
                    db.display(),
                    c.winners_rechosen
                );
            }
        }
        DbCommand::Migrate => {
            let opened = Db::open_to_migrate(&db).await.map_err(TuneError::from)?;
            let schema = opened.schema();
            opened.close().await;
            eprintln!("{} is at schema {schema}", db.display());
        }
    }
    Ok(())
}

fn print_rejected(rejected: &[Rejected]) {
    for r in rejected.iter().take(SHOWN) {
        println!("  rejected {}: {}", r.source, r.reason);
    }
    if rejected.len() > SHOWN {
        println!(
            "  ... and {} more rejected (--json lists all)",
            rejected.len() - SHOWN
        );
    }
}

fn print_diff(d: &share::Diff, a: &std::path::Path, b: &std::path::Path) {
    for (device, problem) in &d.only_a {
        println!("only in {}: {problem} on {device}", a.display());
    }
    for (device, problem) in &d.only_b {
        println!("only in {}: {problem} on {device}", b.display());
    }
    for c in &d.different {
        println!(
            "different winner: {} on {}\n    A {:>10.1} us  {}\n    B {:>10.1} us  {}  ({:.2}x)",
            c.problem,
            c.device,
            c.a.median_ns / 1e3,
            c.a.config,
            c.b.median_ns / 1e3,
            c.b.config,
            c.speedup_b_over_a
        );
    }
    let moved = d
        .same
        .iter()
        .filter(|c| (c.speedup_b_over_a - 1.0).abs() > 0.05)
        .count();
    println!(
        "{} only in A, {} only in B, {} different winners, {} same winner ({} of them timed more than 5% apart)",
        d.only_a.len(),
        d.only_b.len(),
        d.different.len(),
        d.same.len(),
        moved
    );
}
