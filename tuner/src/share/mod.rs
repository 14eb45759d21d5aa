//! Sharing tuning results: export, import, merge, diff, verify and gc (`tune db ...`).
//!
//! Every incoming row is untrusted and checked on its own ([`check`]); a bad row is rejected
//! and counted, never written. Whatever fails as a whole (an unreadable file, a cut-short
//! export, a newer format) fails before the target is opened for writing, and writes happen
//! in one transaction, so a failed command leaves the target as it was. Merges are built in
//! a scratch file beside the output and renamed into place only when complete.

pub mod check;
pub mod format;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kerntune_db::{Conflict, Db, ExportRow, GcCounts, GcFilter, ImportCounts, ImportRow, Prefer};
use kerntune_kernels::{Config, CPU_SOURCE_HASH};
use serde::Serialize;

use crate::error::{usage, Result};
use crate::tune::TOOL_VERSION;

/// A rejected row: where it was (file and line, or database) and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejected {
    pub source: String,
    pub reason: String,
}

/// What `tune db import` did.
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    pub rows: usize,
    pub rejected: Vec<Rejected>,
    pub counts: ImportCounts,
}

/// What `tune db merge` did.
#[derive(Debug, Clone, Serialize)]
pub struct MergeReport {
    pub inputs: Vec<String>,
    pub rows: usize,
    pub rejected: Vec<Rejected>,
    pub measurements: u64,
    pub winners: u64,
    pub conflicts: Vec<Conflict>,
}

/// The host name recorded with exports.
pub fn host_name() -> String {
    crate::tune::device_record(&kerntune_kernels::Device::host()).host
}

/// Writes `path` through a scratch file renamed into place, so a failed or interrupted write
/// never leaves a partial file under the final name.
fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> Result<()>,
) -> Result<()> {
    let scratch = scratch_path(path);
    let result = (|| {
        let file = std::fs::File::create(&scratch)
            .map_err(|e| usage(format!("cannot write {}: {e}", path.display())))?;
        let mut out = std::io::BufWriter::new(file);
        write(&mut out)?;
        let file = out
            .into_inner()
            .map_err(|e| usage(format!("writing {}: {e}", path.display())))?;
        file.sync_all()
            .map_err(|e| usage(format!("writing {}: {e}", path.display())))?;
        std::fs::rename(&scratch, path)
            .map_err(|e| usage(format!("cannot write {}: {e}", path.display())))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&scratch);
    }
    result
}

fn scratch_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".partial-{}", std::process::id()));
    path.with_file_name(name)
}

/// `tune db export`: writes the winners (or with `all` every measurement) of `db`, optionally
/// of one device identity, to `out`. Returns the number of rows.
pub async fn export(
    db: &Path,
    device: Option<&str>,
    all: bool,
    format: format::Format,
    out: &Path,
) -> Result<usize> {
    let source = Db::open_existing(db).await?;
    let rows = source.export_rows(device, all).await;
    let schema = source.schema();
    let exported_at = source.now().await;
    source.close().await;
    let (rows, exported_at) = (rows?, exported_at?);
    let header = format::Header {
        kerntune_export: format::EXPORT_FORMAT,
        tool_version: TOOL_VERSION.into(),
        schema,
        exported_at,
        host: host_name(),
        contents: if all { "all" } else { "winners" }.into(),
        device: device.map(String::from),
    };
    write_atomically(out, |w| format::write(w, &header, &rows, format))?;
    Ok(rows.len())
}

/// Checks rows, splitting them into importable ones and rejections labelled by `source`.
fn check_all(
    rows: Vec<std::result::Result<ExportRow, (usize, String)>>,
    source: &str,
    accepted: &mut Vec<ImportRow>,
    rejected: &mut Vec<Rejected>,
) {
    for (i, row) in rows.into_iter().enumerate() {
        let outcome = row
            .map_err(|(line, e)| (line, format!("unreadable row: {e}")))
            .and_then(|r| check::check(r).map_err(|e| (i + 2, e)));
        match outcome {
            Ok(r) => accepted.push(r),
            Err((line, reason)) => rejected.push(Rejected {
                source: format!("{source}:{line}"),
                reason,
            }),
        }
    }
}

/// `tune db import`: checks every row of the export at `file` and files the good ones into
/// `db` in one transaction. With `strict`, any rejected row aborts with nothing written.
pub async fn import(db: &Path, file: &Path, prefer: Prefer, strict: bool) -> Result<ImportReport> {
    let parsed = format::read(file)?;
    let label = file.display().to_string();
    let rows = parsed.rows.len();
    let (mut accepted, mut rejected) = (Vec::new(), Vec::new());
    check_all(parsed.rows, &label, &mut accepted, &mut rejected);
    if strict && !rejected.is_empty() {
        return Err(usage(format!(
            "--strict: {} of {rows} rows of {label} were rejected, nothing imported; first: {}: {}",
            rejected.len(),
            rejected[0].source,
            rejected[0].reason
        )));
    }
    let target = Db::open(db).await?;
    let counts = target.import(&accepted, prefer, &label).await;
    target.close().await;
    Ok(ImportReport {
        rows,
        rejected,
        counts: counts?,
    })
}

/// `tune db merge`: the union of every measurement of `inputs` in a new database at `out`,
/// each problem's winner its fastest verified measurement. Timings of one config that differ
/// by more than `conflict_ratio` between hosts are reported.
pub async fn merge(inputs: &[PathBuf], out: &Path, conflict_ratio: f64) -> Result<MergeReport> {
    if inputs.is_empty() {
        return Err(usage("merge needs at least one input database"));
    }
    if out.exists() {
        return Err(usage(format!(
            "{} exists; merge writes a new database (pick another -o, or remove it)",
            out.display()
        )));
    }
    let (mut accepted, mut rejected) = (Vec::new(), Vec::new());
    let mut rows = 0;
    for input in inputs {
        let db = Db::open_existing(input).await?;
        let exported = db.export_rows(None, true).await;
        db.close().await;
        let exported = exported?;
        rows += exported.len();
        let label = input.display().to_string();
        let exported = exported.into_iter().map(Ok).collect();
        check_all(exported, &label, &mut accepted, &mut rejected);
        // Database rows have no line numbers: name the input only.
        for r in rejected.iter_mut().filter(|r| r.source.starts_with(&label)) {
            r.source.clone_from(&label);
        }
    }
    let scratch = scratch_path(out);
    let built = async {
        let db = Db::open(&scratch).await?;
        let result = async {
            let counts = db.import(&accepted, Prefer::Best, "merge").await?;
            let winners = db.recompute_winners().await?;
            let conflicts = db.conflicts(conflict_ratio).await?;
            Ok::<_, crate::TuneError>((counts, winners, conflicts))
        }
        .await;
        let closed = db.close_for_move().await;
        let built = result?;
        closed?;
        Ok::<_, crate::TuneError>(built)
    }
    .await;
    let (counts, winners, conflicts) = match built {
        Ok(b) => b,
        Err(e) => {
            remove_db_files(&scratch);
            return Err(e);
        }
    };
    let moved = std::fs::rename(&scratch, out);
    remove_db_files(&scratch);
    if let Err(e) = moved {
        return Err(usage(format!("cannot write {}: {e}", out.display())));
    }
    Ok(MergeReport {
        inputs: inputs.iter().map(|p| p.display().to_string()).collect(),
        rows,
        rejected,
        measurements: counts.added,
        winners,
        conflicts,
    })
}

fn remove_db_files(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

/// One problem's winner as `diff` compares it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    pub config: String,
    pub median_ns: f64,
}

/// A winner present in both databases.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Changed {
    pub device: String,
    pub problem: String,
    pub a: Side,
    pub b: Side,
    /// `a` median / `b` median: above 1 when `b` is faster.
    pub speedup_b_over_a: f64,
    pub same_config: bool,
}

/// `tune db diff A B`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Diff {
    /// (device, problem) with a winner only in A.
    pub only_a: Vec<(String, String)>,
    pub only_b: Vec<(String, String)>,
    /// Winners in both with different configs.
    pub different: Vec<Changed>,
    /// Winners in both with the same config (timings may differ).
    pub same: Vec<Changed>,
}

type WinnerKey = (String, String, String, String);

async fn winner_map(path: &Path) -> Result<BTreeMap<WinnerKey, Side>> {
    let db = Db::open_existing(path).await?;
    let rows = db.winners(None).await;
    db.close().await;
    Ok(rows?
        .into_iter()
        .map(|w| {
            (
                (w.device, w.backend, w.source_hash, w.problem),
                Side {
                    config: w.config,
                    median_ns: w.median_ns,
                },
            )
        })
        .collect())
}

/// Compares the winners of two databases, by device identity, kernel version and problem.
pub async fn diff(a: &Path, b: &Path) -> Result<Diff> {
    let (wa, wb) = (winner_map(a).await?, winner_map(b).await?);
    let mut d = Diff::default();
    for (key, sa) in &wa {
        let Some(sb) = wb.get(key) else {
            d.only_a.push((key.0.clone(), key.3.clone()));
            continue;
        };
        // Compare configs as parsed values: key order in stored JSON is not meaningful.
        let same = match (Config::from_json(&sa.config), Config::from_json(&sb.config)) {
            (Ok(x), Ok(y)) => x == y,
            _ => sa.config == sb.config,
        };
        let changed = Changed {
            device: key.0.clone(),
            problem: key.3.clone(),
            a: sa.clone(),
            b: sb.clone(),
            speedup_b_over_a: sa.median_ns / sb.median_ns,
            same_config: same,
        };
        if same {
            d.same.push(changed);
        } else {
            d.different.push(changed);
        }
    }
    for key in wb.keys().filter(|k| !wa.contains_key(*k)) {
        d.only_b.push((key.0.clone(), key.3.clone()));
    }
    Ok(d)
}

/// `tune db verify`: everything wrong with the database at `path`, empty when sound. The file
/// is opened for reading only and never changed.
pub async fn verify(path: &Path) -> Result<Vec<String>> {
    let db = Db::open_read(path).await?;
    let result = verify_open(&db).await;
    db.close().await;
    result
}

/// Runs of the database at `path` still marked running, as (run id, host, start): their
/// tuner was killed (what it finished is committed) or is still going.
pub async fn unfinished_runs(path: &Path) -> Result<Vec<(String, String, String)>> {
    let db = Db::open_read(path).await?;
    let runs = db.unfinished_runs().await;
    db.close().await;
    Ok(runs?)
}

async fn verify_open(db: &Db) -> Result<Vec<String>> {
    let mut problems = db.integrity_problems().await?;
    if db.schema() < kerntune_db::SCHEMA_VERSION {
        problems.push(format!(
            "schema version {} is older than {}; run `tune db migrate` on it",
            db.schema(),
            kerntune_db::SCHEMA_VERSION
        ));
        return Ok(problems);
    }
    problems.extend(db.winner_inconsistencies().await?);
    // Every winner's config must be valid for its kernel's space on its own device.
    for row in db.export_rows(None, false).await? {
        if !row.winner {
            continue;
        }
        let what = format!("winner of {} on {}", row.problem, row.device.identity);
        if let Err(reason) = check::check(row) {
            problems.push(format!("{what}: {reason}"));
        }
    }
    Ok(problems)
}

/// `tune db gc`: drops measurements of stale kernel sources and/or older tool versions.
pub async fn gc(
    db: &Path,
    stale_kernels: bool,
    old_tools: bool,
    dry_run: bool,
) -> Result<GcCounts> {
    let filter = GcFilter {
        stale_kernels: if stale_kernels {
            vec![("cpu".into(), CPU_SOURCE_HASH.into())]
        } else {
            Vec::new()
        },
        keep_tool: old_tools.then(|| TOOL_VERSION.to_string()),
    };
    let target = Db::open_existing(db).await?;
    let counts = target.gc(&filter, dry_run).await;
    target.close().await;
    Ok(counts?)
}
