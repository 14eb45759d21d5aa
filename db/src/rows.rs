//! Row-level writes shared by the tuner's path and the import path: devices, kernels and
//! problems are found by their natural keys or added; measurements are added.

use sqlx::SqliteConnection;

use crate::records::{DeviceRecord, KernelRecord, Stats, Status};
use crate::write::{NEW_UID, NOW};
use crate::Result;

/// The id of a device, inserting it on first sight.
pub(crate) async fn upsert_device(conn: &mut SqliteConnection, d: &DeviceRecord) -> Result<i64> {
    sqlx::query(
        "INSERT INTO devices (identity, kind, model, arch, compute_units, runtime, host)
         VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (identity) DO NOTHING",
    )
    .bind(&d.identity)
    .bind(&d.kind)
    .bind(&d.model)
    .bind(&d.arch)
    .bind(d.compute_units)
    .bind(&d.runtime)
    .bind(&d.host)
    .execute(&mut *conn)
    .await?;
    Ok(
        sqlx::query_scalar("SELECT id FROM devices WHERE identity = ?")
            .bind(&d.identity)
            .fetch_one(&mut *conn)
            .await?,
    )
}

/// The id of a kernel version, inserting it on first sight.
pub(crate) async fn upsert_kernel(conn: &mut SqliteConnection, k: &KernelRecord) -> Result<i64> {
    sqlx::query(
        "INSERT INTO kernels (family, backend, variant, source_hash) VALUES (?, ?, ?, ?)
         ON CONFLICT DO NOTHING",
    )
    .bind(&k.family)
    .bind(&k.backend)
    .bind(&k.variant)
    .bind(&k.source_hash)
    .execute(&mut *conn)
    .await?;
    Ok(sqlx::query_scalar(
        "SELECT id FROM kernels
         WHERE family = ? AND backend = ? AND variant = ? AND source_hash = ?",
    )
    .bind(&k.family)
    .bind(&k.backend)
    .bind(&k.variant)
    .bind(&k.source_hash)
    .fetch_one(&mut *conn)
    .await?)
}

/// The id of a problem by its canonical key, inserting it on first sight.
pub(crate) async fn upsert_problem(
    conn: &mut SqliteConnection,
    family: &str,
    key: &str,
    fields: &str,
) -> Result<i64> {
    sqlx::query(
        "INSERT INTO problems (family, key, fields) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
    )
    .bind(family)
    .bind(key)
    .bind(fields)
    .execute(&mut *conn)
    .await?;
    Ok(sqlx::query_scalar("SELECT id FROM problems WHERE key = ?")
        .bind(key)
        .fetch_one(&mut *conn)
        .await?)
}

/// A measurement row to add. `uid` and `measured_at` are kept when it comes from elsewhere and
/// made fresh when it is measured now.
pub(crate) struct NewMeasurement<'a> {
    pub uid: Option<&'a str>,
    pub run_id: i64,
    pub device_id: i64,
    pub kernel_id: i64,
    pub problem_id: i64,
    pub config: &'a str,
    pub status: Status,
    pub message: Option<&'a str>,
    pub error: Option<f64>,
    pub stats: Option<&'a Stats>,
    pub is_default: bool,
    /// Timed in its problem's final round.
    pub final_round: bool,
    pub measured_at: Option<&'a str>,
}

pub(crate) async fn insert_measurement(
    conn: &mut SqliteConnection,
    m: &NewMeasurement<'_>,
) -> Result<i64> {
    let s = m.stats;
    Ok(sqlx::query_scalar(&format!(
        "INSERT INTO measurements (uid, run_id, device_id, kernel_id, problem_id, config, status,
           message, error, median_ns, min_ns, p20_ns, p80_ns, reps, throughput, unit, cold_cache,
           is_default, final_round, measured_at)
         VALUES (COALESCE(?, {NEW_UID}), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,
                 COALESCE(?, {NOW}))
         RETURNING id"
    ))
    .bind(m.uid)
    .bind(m.run_id)
    .bind(m.device_id)
    .bind(m.kernel_id)
    .bind(m.problem_id)
    .bind(m.config)
    .bind(m.status.as_str())
    .bind(m.message)
    .bind(m.error)
    .bind(s.map(|s| s.median_ns))
    .bind(s.map(|s| s.min_ns))
    .bind(s.map(|s| s.p20_ns))
    .bind(s.map(|s| s.p80_ns))
    .bind(s.map(|s| s.reps))
    .bind(s.map(|s| s.throughput))
    .bind(s.map(|s| s.unit.as_str()))
    .bind(s.map(|s| s.cold_cache).unwrap_or(true))
    .bind(m.is_default)
    .bind(m.final_round)
    .bind(m.measured_at)
    .fetch_one(&mut *conn)
    .await?)
}
