//! Problems claimed by the run tuning them, so that several `tune` processes sharing one
//! database (one a GPU of a node) divide its problems instead of each tuning all of them.

use std::time::Duration;

use sqlx::Row;

use crate::write::{BEGIN_WRITE, NOW};
use crate::{Db, Result};

/// What a run may do with a problem it reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The run holds the problem now: tune it.
    Ours,
    /// A winner is stored (for a run that re-tunes, one stored since it began): nothing to do.
    Tuned,
    /// Another live run holds it: its process.
    Held { host: String, pid: i64 },
}

/// Whether process `pid` of this host exists. A pid reused since its claim was taken reads
/// as alive: that claim then holds until it expires, which costs waiting, never results.
fn alive(pid: i64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let sent = unsafe { libc::kill(pid, 0) } == 0;
    sent || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl Db {
    /// Claims `problem` for `run_id` of this process on `host` for `lease`, unless it is
    /// tuned already (with `tuned_since`, a winner stored at or after that time counts: a run
    /// that re-tunes everything passes by what a concurrent one re-tuned) or another live run
    /// holds it. A run's own claim is renewed. A claim whose process no longer exists on this
    /// host, or whose lease ran out, is taken over.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim(
        &self,
        run_id: i64,
        device_id: i64,
        kernel_id: i64,
        problem: &str,
        host: &str,
        lease: Duration,
        tuned_since: Option<&str>,
    ) -> Result<Claim> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        let tuned: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM winners w JOIN problems p ON p.id = w.problem_id
             WHERE w.device_id = ? AND w.kernel_id = ? AND p.key = ?
               AND (?4 IS NULL OR w.updated_at >= ?4)",
        )
        .bind(device_id)
        .bind(kernel_id)
        .bind(problem)
        .bind(tuned_since)
        .fetch_one(&mut *tx)
        .await?;
        if tuned > 0 {
            return Ok(Claim::Tuned);
        }
        let holder = sqlx::query(&format!(
            "SELECT c.run_id, c.host, c.pid, c.expires_at > {NOW} FROM claims c
             WHERE c.device_id = ? AND c.kernel_id = ? AND c.problem = ?"
        ))
        .bind(device_id)
        .bind(kernel_id)
        .bind(problem)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = holder {
            let (owner, owner_host, pid, current): (i64, String, i64, bool) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            let gone = owner_host == host && !alive(pid);
            if owner != run_id && current && !gone {
                return Ok(Claim::Held {
                    host: owner_host,
                    pid,
                });
            }
        }
        sqlx::query(
            "INSERT INTO claims (device_id, kernel_id, problem, run_id, host, pid, expires_at)
             VALUES (?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?))
             ON CONFLICT (device_id, kernel_id, problem) DO UPDATE SET
               run_id = excluded.run_id, host = excluded.host, pid = excluded.pid,
               expires_at = excluded.expires_at",
        )
        .bind(device_id)
        .bind(kernel_id)
        .bind(problem)
        .bind(run_id)
        .bind(host)
        .bind(i64::from(std::process::id()))
        .bind(format!("+{} seconds", lease.as_secs().max(1)))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Claim::Ours)
    }

    /// When run `run_id` began, as stored (the time `tuned_since` of [`Db::claim`] takes).
    pub async fn run_started_at(&self, run_id: i64) -> Result<String> {
        Ok(
            sqlx::query_scalar("SELECT started_at FROM runs WHERE id = ?")
                .bind(run_id)
                .fetch_one(&self.pool)
                .await?,
        )
    }
}
