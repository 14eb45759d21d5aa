//! The export file: JSON Lines, version 1.
//!
//! ```text
//! {"kerntune_export":1,"tool_version":"0.1.0","schema":2,"exported_at":"...","host":"...","contents":"winners","device":null}
//! {"uid":"...","run":{...},"device":{...},"kernel":{...},"problem":"gemm:m=1,n=8,k=8","config":{...},...}
//! ...
//! {"end":{"rows":42}}
//! ```
//!
//! The first line says what the file is and which version wrote it; every middle line is one
//! self-contained measurement ([`ExportRow`]); the last line counts them, so a file cut short
//! is recognised as such instead of imported in part. CSV exports carry the same columns
//! flattened, for spreadsheets; they are not read back.

use std::io::{BufRead, Write};
use std::path::Path;

use kerntune_db::ExportRow;
use serde::{Deserialize, Serialize};

use crate::error::{usage, Result, TuneError};

/// The export format this build writes and reads.
pub const EXPORT_FORMAT: u32 = 1;

/// The first line of an export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The format version; the key doubles as the file's magic.
    pub kerntune_export: u32,
    pub tool_version: String,
    /// The database schema the rows were read from.
    pub schema: i64,
    pub exported_at: String,
    pub host: String,
    /// `winners` (each winner and its run's default) or `all` (every measurement).
    pub contents: String,
    /// The device identity the export was limited to, if any.
    pub device: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Trailer {
    end: End,
}

#[derive(Debug, Serialize, Deserialize)]
struct End {
    rows: u64,
}

/// Output formats of `tune db export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Jsonl,
    Csv,
}

/// Writes rows in the chosen format.
pub fn write(
    out: &mut dyn Write,
    header: &Header,
    rows: &[ExportRow],
    format: Format,
) -> Result<()> {
    let io = |e: std::io::Error| usage(format!("writing the export: {e}"));
    match format {
        Format::Jsonl => {
            writeln!(out, "{}", line(header)).map_err(io)?;
            for r in rows {
                writeln!(out, "{}", line(r)).map_err(io)?;
            }
            let trailer = Trailer {
                end: End {
                    rows: rows.len() as u64,
                },
            };
            writeln!(out, "{}", line(&trailer)).map_err(io)?;
        }
        Format::Csv => {
            let mut w = csv::Writer::from_writer(out);
            let csv_err = |e: csv::Error| usage(format!("writing the CSV export: {e}"));
            w.write_record(CSV_COLUMNS).map_err(csv_err)?;
            for r in rows {
                w.write_record(csv_record(r)).map_err(csv_err)?;
            }
            w.flush().map_err(io)?;
        }
    }
    Ok(())
}

fn line<T: Serialize>(v: &T) -> String {
    // Plain data with string keys: serialisation cannot fail.
    serde_json::to_string(v).unwrap_or_default()
}

const CSV_COLUMNS: [&str; 28] = [
    "device",
    "device_kind",
    "device_model",
    "device_arch",
    "compute_units",
    "family",
    "backend",
    "source_hash",
    "problem",
    "config",
    "status",
    "winner",
    "is_default",
    "final_round",
    "median_ns",
    "min_ns",
    "p20_ns",
    "p80_ns",
    "reps",
    "throughput",
    "unit",
    "error",
    "message",
    "host",
    "tool_version",
    "measured_at",
    "run_uid",
    "uid",
];

fn csv_record(r: &ExportRow) -> Vec<String> {
    let s = r.stats.as_ref();
    let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    vec![
        r.device.identity.clone(),
        r.device.kind.clone(),
        r.device.model.clone(),
        r.device.arch.clone(),
        r.device.compute_units.to_string(),
        r.kernel.family.clone(),
        r.kernel.backend.clone(),
        r.kernel.source_hash.clone(),
        r.problem.clone(),
        r.config.to_string(),
        r.status.as_str().into(),
        r.winner.to_string(),
        r.is_default.to_string(),
        r.final_round.to_string(),
        opt(s.map(|s| s.median_ns)),
        opt(s.map(|s| s.min_ns)),
        opt(s.map(|s| s.p20_ns)),
        opt(s.map(|s| s.p80_ns)),
        s.map(|s| s.reps.to_string()).unwrap_or_default(),
        opt(s.map(|s| s.throughput)),
        s.map(|s| s.unit.clone()).unwrap_or_default(),
        opt(r.error),
        r.message.clone().unwrap_or_default(),
        r.run.host.clone(),
        r.run.tool_version.clone(),
        r.measured_at.clone(),
        r.run.uid.clone(),
        r.uid.clone(),
    ]
}

/// A parsed export: its header, and each row or why it could not be read (with its line).
#[derive(Debug)]
pub struct Parsed {
    pub header: Header,
    pub rows: Vec<std::result::Result<ExportRow, (usize, String)>>,
}

/// Reads an export file. A file that is not an export, of another format version, or cut
/// short is an error as a whole; a line that does not parse is returned as rejected.
pub fn read(path: &Path) -> Result<Parsed> {
    let name = path.display();
    let file =
        std::fs::File::open(path).map_err(|e| usage(format!("cannot read export {name}: {e}")))?;
    let mut lines = std::io::BufReader::new(file).lines();
    let bad = |why: String| -> TuneError {
        usage(format!("{name} is not a usable kerntune export: {why}"))
    };
    let first = match lines.next() {
        Some(l) => l.map_err(|e| bad(e.to_string()))?,
        None => return Err(bad("the file is empty".into())),
    };
    let value: serde_json::Value = serde_json::from_str(&first).map_err(|_| {
        if first.starts_with("device,") {
            bad("it is a CSV export, which is for spreadsheets; export with --format jsonl to share results".into())
        } else {
            bad("its first line is not a kerntune export header".into())
        }
    })?;
    let version = value
        .get("kerntune_export")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| bad("its first line is not a kerntune export header".into()))?;
    if version != u64::from(EXPORT_FORMAT) {
        return Err(bad(format!(
            "it is export format {version}, this kerntune reads format {EXPORT_FORMAT}; {}",
            if version > u64::from(EXPORT_FORMAT) {
                "upgrade kerntune to import it"
            } else {
                "export it again with this kerntune"
            }
        )));
    }
    let header: Header =
        serde_json::from_value(value).map_err(|e| bad(format!("malformed header: {e}")))?;
    let mut rows = Vec::new();
    let mut end = None;
    for (i, line) in lines.enumerate() {
        let number = i + 2;
        let line = line.map_err(|e| bad(format!("line {number}: {e}")))?;
        if end.is_some() {
            if line.trim().is_empty() {
                continue;
            }
            return Err(bad(format!("line {number} follows the end marker")));
        }
        if line.starts_with("{\"end\"") {
            let t: Trailer = serde_json::from_str(&line)
                .map_err(|e| bad(format!("malformed end marker on line {number}: {e}")))?;
            end = Some(t.end.rows);
            continue;
        }
        rows.push(serde_json::from_str::<ExportRow>(&line).map_err(|e| (number, e.to_string())));
    }
    match end {
        None => Err(bad(format!(
            "it has no end marker after {} rows: the file was cut short (copy it again)",
            rows.len()
        ))),
        Some(n) if n != rows.len() as u64 => Err(bad(format!(
            "its end marker counts {n} rows but it holds {}: lines were added or removed",
            rows.len()
        ))),
        Some(_) => Ok(Parsed { header, rows }),
    }
}
