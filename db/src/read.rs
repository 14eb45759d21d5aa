//! What readers ask: is a problem tuned, and which winners exist.

use sqlx::Row;

use crate::records::WinnerRow;
use crate::{Db, Result};

const WINNERS: &str = "
    SELECT d.identity, k.family, k.backend, k.source_hash, p.key, w.config, w.median_ns,
           w.default_ns, w.speedup, m.throughput, m.unit, w.tool_version, w.updated_at, d.host
    FROM winners w
    JOIN devices d ON d.id = w.device_id
    JOIN kernels k ON k.id = w.kernel_id
    JOIN problems p ON p.id = w.problem_id
    JOIN measurements m ON m.id = w.measurement_id";

impl Db {
    /// Whether a winner exists for this problem on this device and kernel version.
    pub async fn is_tuned(
        &self,
        device_id: i64,
        kernel_id: i64,
        problem_key: &str,
    ) -> Result<bool> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM winners w JOIN problems p ON p.id = w.problem_id
             WHERE w.device_id = ? AND w.kernel_id = ? AND p.key = ?",
        )
        .bind(device_id)
        .bind(kernel_id)
        .bind(problem_key)
        .fetch_one(&self.pool)
        .await?;
        Ok(n > 0)
    }

    /// Every winner, optionally of one device identity, ordered by family and problem.
    pub async fn winners(&self, device_identity: Option<&str>) -> Result<Vec<WinnerRow>> {
        let sql = format!(
            "{WINNERS} WHERE (?1 IS NULL OR d.identity = ?1) ORDER BY k.family, p.key, d.identity"
        );
        let rows = sqlx::query(&sql)
            .bind(device_identity)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| WinnerRow {
                device: r.get(0),
                family: r.get(1),
                backend: r.get(2),
                source_hash: r.get(3),
                problem: r.get(4),
                config: r.get(5),
                median_ns: r.get(6),
                default_ns: r.get(7),
                speedup: r.get(8),
                throughput: r.get(9),
                unit: r.get(10),
                tool_version: r.get(11),
                updated_at: r.get(12),
                host: r.get(13),
            })
            .collect())
    }

    /// What the runtime loads: (problem key, config, backend, source hash) of every winner of
    /// one device, without the provenance columns and without sorting.
    pub async fn winner_configs(
        &self,
        device_identity: &str,
    ) -> Result<Vec<(String, String, String, String)>> {
        let rows = sqlx::query(
            "SELECT p.key, w.config, k.backend, k.source_hash
             FROM winners w
             JOIN problems p ON p.id = w.problem_id
             JOIN kernels k ON k.id = w.kernel_id
             WHERE w.device_id = (SELECT id FROM devices WHERE identity = ?)",
        )
        .bind(device_identity)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect())
    }

    /// Measurements of a problem as (config, status, median_ns), for tests and `tune show`.
    pub async fn measurements(
        &self,
        problem_key: &str,
    ) -> Result<Vec<(String, String, Option<f64>, Option<String>)>> {
        let rows = sqlx::query(
            "SELECT m.config, m.status, m.median_ns, m.message FROM measurements m
             JOIN problems p ON p.id = m.problem_id WHERE p.key = ? ORDER BY m.id",
        )
        .bind(problem_key)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect())
    }

    /// The configs (as JSON) of a problem on a device and kernel whose measurements' message
    /// contains `marker`: the tuner's record of candidates that left the device unusable.
    pub async fn crashed_configs(
        &self,
        device_id: i64,
        kernel_id: i64,
        problem_key: &str,
        marker: &str,
    ) -> Result<Vec<String>> {
        let rows = sqlx::query_scalar(
            "SELECT DISTINCT m.config FROM measurements m JOIN problems p ON p.id = m.problem_id
             WHERE m.device_id = ? AND m.kernel_id = ? AND p.key = ? AND instr(m.message, ?) > 0",
        )
        .bind(device_id)
        .bind(kernel_id)
        .bind(problem_key)
        .bind(marker)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Runs as (id, status), oldest first.
    pub async fn runs(&self) -> Result<Vec<(i64, String)>> {
        let rows = sqlx::query("SELECT id, status FROM runs ORDER BY id")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}
