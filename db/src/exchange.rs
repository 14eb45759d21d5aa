//! Rows that travel between databases: export, import, and the winner rules they follow.
//!
//! An exported measurement is self-contained (its run, device, kernel and problem travel with
//! it), so a file cut short or edited by hand is checked row by row. Runs and measurements
//! keep the stable ids they were given where they were measured: importing or merging the
//! same rows twice adds nothing.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, Sqlite, Transaction};

use crate::records::{DeviceRecord, KernelRecord, Stats, Status};
use crate::rows::{
    insert_measurement, upsert_device, upsert_kernel, upsert_problem, NewMeasurement,
};
use crate::snapshot::rebuild_snapshots_in;
use crate::write::{BEGIN_WRITE, NOW};
use crate::{Db, Result};

/// The run a measurement came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub uid: String,
    pub tool_version: String,
    pub command_line: String,
    /// The host that measured it.
    pub host: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub status: String,
}

/// One measurement with everything needed to file it in another database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportRow {
    pub uid: String,
    pub run: RunInfo,
    pub device: DeviceRecord,
    pub kernel: KernelRecord,
    /// Canonical problem key.
    pub problem: String,
    /// The config as a JSON object.
    pub config: serde_json::Value,
    pub status: Status,
    pub message: Option<String>,
    pub error: Option<f64>,
    pub stats: Option<Stats>,
    /// The default config's measurement, kept so a winner's speedup travels with it.
    pub is_default: bool,
    /// Timed in its problem's final round (absent in files written before schema 4).
    #[serde(default)]
    pub final_round: bool,
    pub measured_at: String,
    /// Whether it is its problem's winner in the exporting database.
    pub winner: bool,
}

/// An export row that passed the importer's checks, with the problem's fields as JSON.
#[derive(Debug, Clone)]
pub struct ImportRow {
    pub row: ExportRow,
    pub problem_fields: String,
    /// The config in the canonical JSON text local tuners store, so the same config from two
    /// sources compares equal as text.
    pub config_text: String,
}

/// Which winner an import keeps when the target already has one for the same device, kernel
/// version and problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prefer {
    /// The faster one.
    #[default]
    Best,
    /// A winner measured into the target stays; imported ones compete on speed.
    Local,
    /// The imported one.
    Imported,
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImportCounts {
    /// Measurements added.
    pub added: u64,
    /// Measurements the target already had (same id).
    pub duplicates: u64,
    pub winners_added: u64,
    pub winners_replaced: u64,
    /// Imported winners that lost to the target's own.
    pub winners_kept: u64,
}

const EXPORT_SELECT: &str = "
    SELECT m.uid, r.uid, r.tool_version, r.command_line, r.host, r.started_at, r.finished_at,
           r.status, d.identity, d.kind, d.model, d.arch, d.compute_units, d.runtime, r.host,
           k.family, k.backend, k.variant, k.source_hash, p.key, m.config, m.status, m.message,
           m.error, m.median_ns, m.min_ns, m.p20_ns, m.p80_ns, m.reps, m.throughput, m.unit,
           m.cold_cache, m.is_default, m.measured_at,
           EXISTS (SELECT 1 FROM winners w WHERE w.measurement_id = m.id) AS is_winner,
           m.id, m.final_round
    FROM measurements m
    JOIN runs r ON r.id = m.run_id
    JOIN devices d ON d.id = m.device_id
    JOIN kernels k ON k.id = m.kernel_id
    JOIN problems p ON p.id = m.problem_id";

fn export_row(r: &SqliteRow) -> ExportRow {
    let config: String = r.get(20);
    let status: String = r.get(21);
    let median: Option<f64> = r.get(24);
    ExportRow {
        uid: r.get(0),
        run: RunInfo {
            uid: r.get(1),
            tool_version: r.get(2),
            command_line: r.get(3),
            host: r.get(4),
            started_at: r.get(5),
            finished_at: r.get(6),
            status: r.get(7),
        },
        device: DeviceRecord {
            identity: r.get(8),
            kind: r.get(9),
            model: r.get(10),
            arch: r.get(11),
            compute_units: r.get(12),
            runtime: r.get(13),
            host: r.get(14),
        },
        kernel: KernelRecord {
            family: r.get(15),
            backend: r.get(16),
            variant: r.get(17),
            source_hash: r.get(18),
        },
        problem: r.get(19),
        // A stored config that is not JSON travels as a string; the importer rejects it.
        config: serde_json::from_str(&config).unwrap_or(serde_json::Value::String(config)),
        // Stored statuses are checked by the schema.
        status: Status::parse(&status).unwrap_or(Status::Error),
        message: r.get(22),
        error: r.get(23),
        stats: median.map(|median_ns| Stats {
            median_ns,
            min_ns: r.get::<Option<f64>, _>(25).unwrap_or(median_ns),
            p20_ns: r.get::<Option<f64>, _>(26).unwrap_or(median_ns),
            p80_ns: r.get::<Option<f64>, _>(27).unwrap_or(median_ns),
            reps: r.get::<Option<i64>, _>(28).unwrap_or(0),
            throughput: r.get::<Option<f64>, _>(29).unwrap_or(0.0),
            unit: r.get::<Option<String>, _>(30).unwrap_or_default(),
            cold_cache: r.get(31),
        }),
        is_default: r.get(32),
        final_round: r.get(36),
        measured_at: r.get(33),
        winner: r.get(34),
    }
}

impl Db {
    /// The database's clock as an RFC 3339 UTC timestamp, as rows are stamped.
    pub async fn now(&self) -> Result<String> {
        Ok(sqlx::query_scalar(&format!("SELECT {NOW}"))
            .fetch_one(&self.pool)
            .await?)
    }

    /// Measurements to export, oldest first: every one with `all`, otherwise each winner and
    /// the default-config measurement of the winner's run (so its speedup travels with it).
    pub async fn export_rows(
        &self,
        device_identity: Option<&str>,
        all: bool,
    ) -> Result<Vec<ExportRow>> {
        let sql = format!(
            "{EXPORT_SELECT}
             WHERE (?1 IS NULL OR d.identity = ?1)
               AND (?2 OR EXISTS (SELECT 1 FROM winners w WHERE w.measurement_id = m.id)
                    OR (m.is_default AND m.run_id = (
                        SELECT wm.run_id FROM winners w JOIN measurements wm
                          ON wm.id = w.measurement_id
                        WHERE w.device_id = m.device_id AND w.kernel_id = m.kernel_id
                          AND w.problem_id = m.problem_id)))
             ORDER BY m.id"
        );
        let rows = sqlx::query(&sql)
            .bind(device_identity)
            .bind(all)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(export_row).collect())
    }

    /// Files checked rows in one transaction: devices, kernels, problems and runs are matched
    /// by their natural keys or added, measurements by id; winners follow `prefer`. Runs
    /// first seen here are marked imported from `source`. Rebuilds the winner snapshots.
    pub async fn import(
        &self,
        rows: &[ImportRow],
        prefer: Prefer,
        source: &str,
    ) -> Result<ImportCounts> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        let mut ids = Ids::default();
        let mut counts = ImportCounts::default();
        let mut winners = Vec::new();
        for r in rows {
            let (id, added) = file_row(&mut tx, &mut ids, r, source).await?;
            if added {
                counts.added += 1;
            } else {
                counts.duplicates += 1;
            }
            if r.row.winner && r.row.status == Status::Ok {
                winners.push(id);
            }
        }
        for id in winners {
            match offer_winner(&mut tx, id, prefer).await? {
                Offer::Added => counts.winners_added += 1,
                Offer::Replaced => counts.winners_replaced += 1,
                Offer::Kept => counts.winners_kept += 1,
            }
        }
        rebuild_snapshots_in(&mut tx).await?;
        tx.commit().await?;
        Ok(counts)
    }

    /// Makes each (device, kernel version, problem)'s winner its fastest verified measurement
    /// (ties broken by id), as a merge defines it. Returns the number of winners.
    pub async fn recompute_winners(&self) -> Result<u64> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        sqlx::query("DELETE FROM winners").execute(&mut *tx).await?;
        let set = recompute_missing_winners(&mut tx).await?;
        rebuild_snapshots_in(&mut tx).await?;
        tx.commit().await?;
        Ok(set)
    }
}

/// Gives every (device, kernel version, problem) with verified measurements but no winner
/// its fastest one (ties broken by id); returns how many it set. A run that held a final
/// round for the problem offers only that round's measurements, as its tuner chose among
/// them: a search timing faster than its own final-round timing was a lucky one.
pub(crate) async fn recompute_missing_winners(tx: &mut Transaction<'_, Sqlite>) -> Result<u64> {
    let best: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM (
           SELECT m.id, ROW_NUMBER() OVER (
             PARTITION BY m.device_id, m.kernel_id, m.problem_id ORDER BY m.median_ns, m.uid)
             AS rank
           FROM measurements m
           WHERE m.status = 'ok' AND m.median_ns IS NOT NULL
             AND NOT EXISTS (SELECT 1 FROM winners w WHERE w.device_id = m.device_id
                             AND w.kernel_id = m.kernel_id AND w.problem_id = m.problem_id)
             AND (m.final_round OR NOT EXISTS (
                   SELECT 1 FROM measurements f WHERE f.run_id = m.run_id
                     AND f.device_id = m.device_id AND f.kernel_id = m.kernel_id
                     AND f.problem_id = m.problem_id AND f.final_round)))
         WHERE rank = 1",
    )
    .fetch_all(&mut **tx)
    .await?;
    for &id in &best {
        set_winner(tx, id).await?;
    }
    Ok(best.len() as u64)
}

/// Row ids already resolved inside one import.
#[derive(Default)]
struct Ids {
    devices: HashMap<String, i64>,
    kernels: HashMap<(String, String, String, String), i64>,
    problems: HashMap<String, i64>,
    runs: HashMap<String, i64>,
}

/// Inserts one measurement (and whatever it refers to); returns its id and whether it is new.
async fn file_row(
    tx: &mut Transaction<'_, Sqlite>,
    ids: &mut Ids,
    r: &ImportRow,
    source: &str,
) -> Result<(i64, bool)> {
    let row = &r.row;
    if let Some(id) = sqlx::query_scalar::<_, i64>("SELECT id FROM measurements WHERE uid = ?")
        .bind(&row.uid)
        .fetch_optional(&mut **tx)
        .await?
    {
        return Ok((id, false));
    }
    let device = match ids.devices.get(&row.device.identity) {
        Some(&id) => id,
        None => {
            let id = upsert_device(tx, &row.device).await?;
            ids.devices.insert(row.device.identity.clone(), id);
            id
        }
    };
    let k = &row.kernel;
    let kernel_key = (
        k.family.clone(),
        k.backend.clone(),
        k.variant.clone(),
        k.source_hash.clone(),
    );
    let kernel = match ids.kernels.get(&kernel_key) {
        Some(&id) => id,
        None => {
            let id = upsert_kernel(tx, k).await?;
            ids.kernels.insert(kernel_key, id);
            id
        }
    };
    let problem = match ids.problems.get(&row.problem) {
        Some(&id) => id,
        None => {
            let id = upsert_problem(tx, &k.family, &row.problem, &r.problem_fields).await?;
            ids.problems.insert(row.problem.clone(), id);
            id
        }
    };
    let run = match ids.runs.get(&row.run.uid) {
        Some(&id) => id,
        None => {
            let u = &row.run;
            sqlx::query(
                "INSERT INTO runs (uid, tool_version, command_line, device_id, host, started_at,
                   finished_at, status, origin, imported_from)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'imported', ?) ON CONFLICT (uid) DO NOTHING",
            )
            .bind(&u.uid)
            .bind(&u.tool_version)
            .bind(&u.command_line)
            .bind(device)
            .bind(&u.host)
            .bind(&u.started_at)
            .bind(&u.finished_at)
            .bind(&u.status)
            .bind(source)
            .execute(&mut **tx)
            .await?;
            let id: i64 = sqlx::query_scalar("SELECT id FROM runs WHERE uid = ?")
                .bind(&u.uid)
                .fetch_one(&mut **tx)
                .await?;
            ids.runs.insert(u.uid.clone(), id);
            id
        }
    };
    let new = NewMeasurement {
        uid: Some(&row.uid),
        run_id: run,
        device_id: device,
        kernel_id: kernel,
        problem_id: problem,
        config: &r.config_text,
        status: row.status,
        message: row.message.as_deref(),
        error: row.error,
        stats: row.stats.as_ref(),
        is_default: row.is_default,
        final_round: row.final_round,
        measured_at: Some(&row.measured_at),
    };
    let id = insert_measurement(tx, &new).await?;
    Ok((id, true))
}

enum Offer {
    Added,
    Replaced,
    Kept,
}

/// Offers an imported measurement as its problem's winner.
async fn offer_winner(tx: &mut Transaction<'_, Sqlite>, id: i64, prefer: Prefer) -> Result<Offer> {
    let current: Option<(i64, f64, String, f64)> = sqlx::query_as(
        "SELECT w.measurement_id, w.median_ns, r.origin, m.median_ns
         FROM measurements m
         JOIN winners w ON w.device_id = m.device_id AND w.kernel_id = m.kernel_id
                       AND w.problem_id = m.problem_id
         JOIN measurements wm ON wm.id = w.measurement_id
         JOIN runs r ON r.id = wm.run_id
         WHERE m.id = ?",
    )
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((current_id, current_ns, origin, offered_ns)) = current else {
        set_winner(tx, id).await?;
        return Ok(Offer::Added);
    };
    let take = current_id != id
        && match prefer {
            Prefer::Imported => true,
            Prefer::Local if origin == "local" => false,
            Prefer::Local | Prefer::Best => offered_ns < current_ns,
        };
    if take {
        set_winner(tx, id).await?;
        Ok(Offer::Replaced)
    } else {
        Ok(Offer::Kept)
    }
}

/// The median of the default config in a measurement `m`'s run.
const DEFAULT_NS: &str = "(SELECT MIN(d.median_ns) FROM measurements d
    WHERE d.device_id = m.device_id AND d.kernel_id = m.kernel_id AND d.problem_id = m.problem_id
      AND d.run_id = m.run_id AND d.is_default AND d.status = 'ok')";

/// Makes a measurement its problem's winner, with the default of the same run for speedup.
async fn set_winner(tx: &mut Transaction<'_, Sqlite>, id: i64) -> Result<()> {
    sqlx::query(&format!(
        "INSERT INTO winners (device_id, kernel_id, problem_id, measurement_id, config, median_ns,
           default_ns, speedup, tool_version, updated_at)
         SELECT m.device_id, m.kernel_id, m.problem_id, m.id, m.config, m.median_ns,
                {DEFAULT_NS}, {DEFAULT_NS} / m.median_ns, r.tool_version, {NOW}
         FROM measurements m
         JOIN runs r ON r.id = m.run_id
         WHERE m.id = ?
         ON CONFLICT (device_id, kernel_id, problem_id) DO UPDATE SET
           measurement_id = excluded.measurement_id, config = excluded.config,
           median_ns = excluded.median_ns, default_ns = excluded.default_ns,
           speedup = excluded.speedup, tool_version = excluded.tool_version,
           updated_at = excluded.updated_at"
    ))
    .bind(id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
