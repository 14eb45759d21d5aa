//! Per-device winner snapshots: every winner of one device in a single row, which the runtime
//! reads at start-up instead of one row per winner (at 100,000 winners the row-by-row fetch
//! alone costs more than the whole start-up budget).
//!
//! The body is JSON grouped by kernel version and then by config, so each distinct config text
//! appears once and problem keys borrow straight from the body when parsed. Triggers drop a
//! device's snapshot whenever its winners change; writers rebuild it when they finish, inside
//! the same write lock as the read of the winners, so a snapshot present is always current.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use sqlx::{Row, Sqlite, Transaction};

use crate::write::{BEGIN_WRITE, NOW};
use crate::{Db, DbError, Result};

/// The body's format; a reader refuses other versions and falls back to the winners table.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// A device's winners, grouped by kernel version.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotBody<'a> {
    pub format: u32,
    #[serde(borrow)]
    pub kernels: Vec<SnapshotKernel<'a>>,
}

/// The winners measured with one kernel version.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotKernel<'a> {
    #[serde(borrow)]
    pub backend: Cow<'a, str>,
    #[serde(borrow)]
    pub source_hash: Cow<'a, str>,
    #[serde(borrow)]
    pub configs: Vec<SnapshotConfig<'a>>,
}

/// One config (as its JSON text) and the problems it won.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotConfig<'a> {
    #[serde(borrow)]
    pub config: Cow<'a, str>,
    #[serde(borrow)]
    pub problems: Vec<Cow<'a, str>>,
}

impl<'a> SnapshotBody<'a> {
    /// Parses a stored body, borrowing from it.
    pub fn parse(body: &'a [u8]) -> Result<SnapshotBody<'a>> {
        let parsed: SnapshotBody<'a> =
            serde_json::from_slice(body).map_err(|e| DbError::Malformed {
                what: "winner snapshot",
                reason: e.to_string(),
            })?;
        if parsed.format != SNAPSHOT_FORMAT {
            return Err(DbError::Malformed {
                what: "winner snapshot",
                reason: format!(
                    "format {} (this build reads {SNAPSHOT_FORMAT})",
                    parsed.format
                ),
            });
        }
        Ok(parsed)
    }

    /// Number of winners in the body.
    pub fn len(&self) -> usize {
        self.kernels
            .iter()
            .flat_map(|k| &k.configs)
            .map(|c| c.problems.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Db {
    /// The stored snapshot body of a device, if one is current. `None` for older schemas,
    /// unknown devices and devices whose winners changed since the last rebuild.
    pub async fn winner_snapshot(&self, device_identity: &str) -> Result<Option<Vec<u8>>> {
        if self.schema() < 2 {
            return Ok(None);
        }
        Ok(sqlx::query_scalar(
            "SELECT s.body FROM winner_snapshots s JOIN devices d ON d.id = s.device_id
             WHERE d.identity = ?",
        )
        .bind(device_identity)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Rebuilds the snapshot of every device that has winners and no current snapshot.
    pub async fn rebuild_snapshots(&self) -> Result<()> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        rebuild_snapshots_in(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Rebuilds snapshots inside a writer's transaction, so the winners it reads are the ones it
/// committed.
pub(crate) async fn rebuild_snapshots_in(tx: &mut Transaction<'_, Sqlite>) -> Result<()> {
    let devices: Vec<i64> = sqlx::query_scalar(
        "SELECT DISTINCT device_id FROM winners
             WHERE device_id NOT IN (SELECT device_id FROM winner_snapshots)",
    )
    .fetch_all(&mut **tx)
    .await?;
    for device in devices {
        let rows = sqlx::query(
            "SELECT k.backend, k.source_hash, w.config, p.key
                 FROM winners w
                 JOIN kernels k ON k.id = w.kernel_id
                 JOIN problems p ON p.id = w.problem_id
                 WHERE w.device_id = ?
                 ORDER BY k.backend, k.source_hash, w.config, p.key",
        )
        .bind(device)
        .fetch_all(&mut **tx)
        .await?;
        let mut body = SnapshotBody {
            format: SNAPSHOT_FORMAT,
            kernels: Vec::new(),
        };
        for r in &rows {
            let (backend, hash, config, key): (&str, &str, &str, &str) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let same_kernel = body
                .kernels
                .last()
                .is_some_and(|k| k.backend == backend && k.source_hash == hash);
            if !same_kernel {
                body.kernels.push(SnapshotKernel {
                    backend: backend.into(),
                    source_hash: hash.into(),
                    configs: Vec::new(),
                });
            }
            let kernel = body.kernels.last_mut().expect("pushed above");
            if kernel.configs.last().is_none_or(|c| c.config != config) {
                kernel.configs.push(SnapshotConfig {
                    config: config.into(),
                    problems: Vec::new(),
                });
            }
            let group = kernel.configs.last_mut().expect("pushed above");
            group.problems.push(key.into());
        }
        let bytes = serde_json::to_vec(&body).map_err(|e| DbError::Malformed {
            what: "winner snapshot",
            reason: e.to_string(),
        })?;
        sqlx::query(&format!(
            "INSERT OR REPLACE INTO winner_snapshots (device_id, winners, body, built_at)
                 VALUES (?, ?, ?, {NOW})"
        ))
        .bind(device)
        .bind(rows.len() as i64)
        .bind(bytes)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
