//! What a tuner writes: devices, kernels, runs, and each problem's results in one transaction.

use sqlx::Row;

use crate::records::{DeviceRecord, KernelRecord, MeasurementRecord, ProblemRecord, RunStatus};
use crate::rows::{
    insert_measurement, upsert_device, upsert_kernel, upsert_problem, NewMeasurement,
};
use crate::{Db, Result};

pub(crate) const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// A fresh row id that stays unique across every database it is merged into.
pub(crate) const NEW_UID: &str = "lower(hex(randomblob(16)))";

/// Write transactions take the write lock up front: a deferred transaction that reads first
/// can fail with SQLITE_BUSY when another process commits in between, where an immediate one
/// just waits out the busy timeout.
pub(crate) const BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// The outcome of one problem, written atomically.
#[derive(Debug)]
pub struct ProblemResult<'a> {
    pub run_id: i64,
    pub device_id: i64,
    pub kernel_id: i64,
    pub problem: &'a ProblemRecord,
    pub measurements: &'a [MeasurementRecord],
    /// Index into `measurements` of the winner, if any candidate passed.
    pub winner: Option<usize>,
    /// Index into `measurements` of the default config's measurement.
    pub default: Option<usize>,
    /// How many of `measurements`, the last ones, were timed in the final round.
    pub final_round: usize,
    pub tool_version: &'a str,
}

impl Db {
    /// The id of a device, inserting it on first sight.
    pub async fn device_id(&self, d: &DeviceRecord) -> Result<i64> {
        upsert_device(&mut *self.pool.acquire().await?, d).await
    }

    /// The id of a kernel version, inserting it on first sight.
    pub async fn kernel_id(&self, k: &KernelRecord) -> Result<i64> {
        upsert_kernel(&mut *self.pool.acquire().await?, k).await
    }

    /// Starts a run measured on `host` into this database.
    pub async fn begin_run(
        &self,
        tool_version: &str,
        command_line: &str,
        device_id: i64,
        host: &str,
    ) -> Result<i64> {
        let row = sqlx::query(&format!(
            "INSERT INTO runs (uid, tool_version, command_line, device_id, host, started_at, status)
             VALUES ({NEW_UID}, ?, ?, ?, ?, {NOW}, 'running') RETURNING id"
        ))
        .bind(tool_version)
        .bind(command_line)
        .bind(device_id)
        .bind(host)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.get(0))
    }

    /// Marks a run finished, releases the problems it still claimed, and rebuilds the winner
    /// snapshots its results invalidated.
    pub async fn finish_run(&self, run_id: i64, status: RunStatus) -> Result<()> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        sqlx::query(&format!(
            "UPDATE runs SET status = ?, finished_at = {NOW} WHERE id = ?"
        ))
        .bind(status.as_str())
        .bind(run_id)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM claims WHERE run_id = ?")
            .bind(run_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.rebuild_snapshots().await
    }

    /// Writes a problem's measurements and winner in one transaction: after a crash either
    /// all of it is there or none. The new winner replaces a local one, and an imported one
    /// only when it is faster.
    pub async fn record_problem(&self, r: &ProblemResult<'_>) -> Result<()> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        let p = r.problem;
        // Recorded, the problem is no longer this run's to hold (see `Db::claim`).
        sqlx::query(
            "DELETE FROM claims WHERE run_id = ? AND device_id = ? AND kernel_id = ? AND problem = ?",
        )
        .bind(r.run_id)
        .bind(r.device_id)
        .bind(r.kernel_id)
        .bind(&p.key)
        .execute(&mut *tx)
        .await?;
        let problem_id = upsert_problem(&mut tx, &p.family, &p.key, &p.fields).await?;
        let mut ids = Vec::with_capacity(r.measurements.len());
        let finals_from = r.measurements.len().saturating_sub(r.final_round);
        for (i, m) in r.measurements.iter().enumerate() {
            let new = NewMeasurement {
                uid: None,
                run_id: r.run_id,
                device_id: r.device_id,
                kernel_id: r.kernel_id,
                problem_id,
                config: &m.config,
                status: m.status,
                message: m.message.as_deref(),
                error: m.error,
                stats: m.stats.as_ref(),
                is_default: r.default == Some(i),
                final_round: i >= finals_from,
                measured_at: None,
            };
            ids.push(insert_measurement(&mut tx, &new).await?);
        }
        if let Some(w) = r.winner {
            let win = &r.measurements[w];
            let median = win.stats.as_ref().map(|s| s.median_ns).unwrap_or(f64::NAN);
            let default_ns = r
                .default
                .and_then(|d| r.measurements[d].stats.as_ref())
                .map(|s| s.median_ns);
            sqlx::query(&format!(
                "INSERT INTO winners (device_id, kernel_id, problem_id, measurement_id, config,
                   median_ns, default_ns, speedup, tool_version, updated_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, {NOW})
                 ON CONFLICT (device_id, kernel_id, problem_id) DO UPDATE SET
                   measurement_id = excluded.measurement_id, config = excluded.config,
                   median_ns = excluded.median_ns, default_ns = excluded.default_ns,
                   speedup = excluded.speedup, tool_version = excluded.tool_version,
                   updated_at = excluded.updated_at
                 WHERE excluded.median_ns < winners.median_ns
                    OR (SELECT r.origin FROM measurements m JOIN runs r ON r.id = m.run_id
                        WHERE m.id = winners.measurement_id) IS NOT 'imported'"
            ))
            .bind(r.device_id)
            .bind(r.kernel_id)
            .bind(problem_id)
            .bind(ids[w])
            .bind(&win.config)
            .bind(median)
            .bind(default_ns)
            .bind(default_ns.map(|d| d / median))
            .bind(r.tool_version)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
