//! Keeping a shared database honest: timing conflicts between hosts, consistency checks for
//! `tune db verify`, and dropping stale rows when asked.

use serde::Serialize;
use sqlx::query::{Query, QueryScalar};
use sqlx::sqlite::SqliteArguments;
use sqlx::{Row, Sqlite};

use crate::exchange::recompute_missing_winners;
use crate::snapshot::rebuild_snapshots_in;
use crate::write::BEGIN_WRITE;
use crate::{Db, DbError, Result};

/// The same config on the same device identity and kernel version, timed far apart by two
/// hosts: one of them was loaded, throttled or misconfigured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conflict {
    pub device: String,
    pub problem: String,
    pub config: String,
    pub fast_host: String,
    pub fast_ns: f64,
    pub slow_host: String,
    pub slow_ns: f64,
}

impl Conflict {
    pub fn ratio(&self) -> f64 {
        self.slow_ns / self.fast_ns
    }
}

/// What `gc` would drop or dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcCounts {
    pub measurements: u64,
    pub winners: u64,
    pub runs: u64,
    pub kernels: u64,
    /// Winners re-chosen among the measurements left.
    pub winners_rechosen: u64,
}

/// Which rows `gc` drops: measured with kernel sources other than `keep_sources` (per
/// backend), or by tool versions other than `keep_tool`.
#[derive(Debug, Clone, Default)]
pub struct GcFilter {
    /// (backend, current source hash): other hashes of that backend are stale.
    pub stale_kernels: Vec<(String, String)>,
    pub keep_tool: Option<String>,
}

/// The SQL condition on a measurement `m` that `filter` drops.
fn doomed(filter: &GcFilter) -> (String, Vec<String>) {
    let mut terms = Vec::new();
    let mut binds = Vec::new();
    for (backend, hash) in &filter.stale_kernels {
        terms.push(
            "m.kernel_id IN (SELECT id FROM kernels WHERE backend = ? AND source_hash <> ?)"
                .to_string(),
        );
        binds.push(backend.clone());
        binds.push(hash.clone());
    }
    if let Some(tool) = &filter.keep_tool {
        terms.push("m.run_id IN (SELECT id FROM runs WHERE tool_version <> ?)".to_string());
        binds.push(tool.clone());
    }
    if terms.is_empty() {
        terms.push("0".into());
    }
    (terms.join(" OR "), binds)
}

fn bound<'q>(sql: &'q str, binds: &'q [String]) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    binds.iter().fold(sqlx::query(sql), |q, b| q.bind(b))
}

fn bound_scalar<'q>(
    sql: &'q str,
    binds: &'q [String],
) -> QueryScalar<'q, Sqlite, i64, SqliteArguments<'q>> {
    binds.iter().fold(sqlx::query_scalar(sql), |q, b| q.bind(b))
}

impl Db {
    /// Conflicts: verified medians of one config that differ by more than `ratio` between
    /// two hosts, each pair reported once with its fastest and slowest host.
    pub async fn conflicts(&self, ratio: f64) -> Result<Vec<Conflict>> {
        let rows = sqlx::query(
            "WITH per_host AS (
               SELECT d.identity AS device, p.key AS problem, m.kernel_id, m.config, r.host,
                      MIN(m.median_ns) AS ns
               FROM measurements m
               JOIN runs r ON r.id = m.run_id
               JOIN devices d ON d.id = m.device_id
               JOIN problems p ON p.id = m.problem_id
               WHERE m.status = 'ok' AND m.median_ns > 0
               GROUP BY d.identity, p.key, m.kernel_id, m.config, r.host)
             SELECT f.device, f.problem, f.config, f.host, f.ns, s.host, s.ns
             FROM per_host f JOIN per_host s
               ON s.device = f.device AND s.problem = f.problem AND s.kernel_id = f.kernel_id
                  AND s.config = f.config AND s.host <> f.host
             WHERE s.ns > f.ns * ?
               AND f.ns = (SELECT MIN(x.ns) FROM per_host x WHERE x.device = f.device
                           AND x.problem = f.problem AND x.kernel_id = f.kernel_id
                           AND x.config = f.config)
               AND s.ns = (SELECT MAX(x.ns) FROM per_host x WHERE x.device = f.device
                           AND x.problem = f.problem AND x.kernel_id = f.kernel_id
                           AND x.config = f.config)
             GROUP BY f.device, f.problem, f.kernel_id, f.config
             ORDER BY s.ns / f.ns DESC",
        )
        .bind(ratio)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| Conflict {
                device: r.get(0),
                problem: r.get(1),
                config: r.get(2),
                fast_host: r.get(3),
                fast_ns: r.get(4),
                slow_host: r.get(5),
                slow_ns: r.get(6),
            })
            .collect())
    }

    /// Schema-level consistency beyond SQLite's own checks: every winner points at a verified
    /// measurement of its own device, kernel, problem and config.
    pub async fn winner_inconsistencies(&self) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT p.key, d.identity,
                    CASE
                      WHEN m.id IS NULL THEN 'its measurement is missing'
                      WHEN m.status <> 'ok' THEN 'its measurement has status ' || m.status
                      WHEN m.device_id <> w.device_id OR m.kernel_id <> w.kernel_id
                        OR m.problem_id <> w.problem_id
                        THEN 'its measurement belongs to another device, kernel or problem'
                      WHEN m.config <> w.config THEN 'its config differs from its measurement'
                    END
             FROM winners w
             JOIN problems p ON p.id = w.problem_id
             JOIN devices d ON d.id = w.device_id
             LEFT JOIN measurements m ON m.id = w.measurement_id
             WHERE m.id IS NULL OR m.status <> 'ok' OR m.device_id <> w.device_id
                OR m.kernel_id <> w.kernel_id OR m.problem_id <> w.problem_id
                OR m.config <> w.config",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| {
                format!(
                    "winner of {} on {}: {}",
                    r.get::<String, _>(0),
                    r.get::<String, _>(1),
                    r.get::<String, _>(2)
                )
            })
            .collect())
    }

    /// Runs still marked running: their tuner was killed or is still going.
    pub async fn unfinished_runs(&self) -> Result<Vec<(String, String, String)>> {
        let rows = sqlx::query(
            "SELECT uid, host, started_at FROM runs WHERE status = 'running' ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }

    /// Drops the rows `filter` selects (or only counts them with `dry_run`) in one
    /// transaction; a problem whose winner goes gets the fastest verified measurement left.
    pub async fn gc(&self, filter: &GcFilter, dry_run: bool) -> Result<GcCounts> {
        if !dry_run && !self.writable() {
            return Err(DbError::ReadOnly {
                path: self.path().to_path_buf(),
            });
        }
        let (cond, binds) = doomed(filter);
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        let measurements = format!("SELECT COUNT(*) FROM measurements m WHERE {cond}");
        let winners = format!(
            "SELECT COUNT(*) FROM winners w JOIN measurements m ON m.id = w.measurement_id
             WHERE {cond}"
        );
        let mut counts = GcCounts {
            measurements: bound_scalar(&measurements, &binds)
                .fetch_one(&mut *tx)
                .await? as u64,
            winners: bound_scalar(&winners, &binds).fetch_one(&mut *tx).await? as u64,
            ..GcCounts::default()
        };
        if dry_run {
            return Ok(counts);
        }
        let drop_winners = format!(
            "DELETE FROM winners WHERE measurement_id IN
               (SELECT m.id FROM measurements m WHERE {cond})"
        );
        bound(&drop_winners, &binds).execute(&mut *tx).await?;
        let drop_measurements = format!(
            "DELETE FROM measurements WHERE id IN (SELECT m.id FROM measurements m WHERE {cond})"
        );
        bound(&drop_measurements, &binds).execute(&mut *tx).await?;
        counts.runs = sqlx::query(
            "DELETE FROM runs WHERE status <> 'running'
               AND id NOT IN (SELECT run_id FROM measurements)",
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        counts.kernels = sqlx::query(
            "DELETE FROM kernels WHERE id NOT IN (SELECT kernel_id FROM measurements)
               AND id NOT IN (SELECT kernel_id FROM winners)",
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        counts.winners_rechosen = recompute_missing_winners(&mut tx).await?;
        rebuild_snapshots_in(&mut tx).await?;
        tx.commit().await?;
        Ok(counts)
    }
}
