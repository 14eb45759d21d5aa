//! The offline GPU compile cache: one row per (kernel source hash, target, compiler, build).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sqlx::Row;

use crate::write::{BEGIN_WRITE, NOW};
use crate::{Db, Result};

/// What one compile left: resources (JSON) and the code object, or the compiler's message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileRecord {
    pub build: String,
    pub ok: bool,
    pub message: Option<String>,
    pub resources: Option<String>,
    #[serde(skip)]
    pub code_object: Option<Vec<u8>>,
}

impl Db {
    /// Cached compiles of these builds for one source hash, target and compiler.
    pub async fn compiles(
        &self,
        source_hash: &str,
        target: &str,
        compiler: &str,
    ) -> Result<HashMap<String, CompileRecord>> {
        let rows = sqlx::query(
            "SELECT build, status, message, resources, code_object FROM gpu_compiles
             WHERE source_hash = ? AND target = ? AND compiler = ?",
        )
        .bind(source_hash)
        .bind(target)
        .bind(compiler)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let build: String = r.get(0);
                let status: String = r.get(1);
                (
                    build.clone(),
                    CompileRecord {
                        build,
                        ok: status == "ok",
                        message: r.get(2),
                        resources: r.get(3),
                        code_object: r.get(4),
                    },
                )
            })
            .collect())
    }

    /// Stores compiles in one transaction; a build already stored is left as it is.
    pub async fn store_compiles(
        &self,
        source_hash: &str,
        target: &str,
        compiler: &str,
        records: &[CompileRecord],
    ) -> Result<()> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        for r in records {
            sqlx::query(&format!(
                "INSERT INTO gpu_compiles (source_hash, target, compiler, build, status, message,
                   resources, code_object, compiled_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, {NOW})
                 ON CONFLICT (source_hash, target, compiler, build) DO NOTHING"
            ))
            .bind(source_hash)
            .bind(target)
            .bind(compiler)
            .bind(&r.build)
            .bind(if r.ok { "ok" } else { "failed" })
            .bind(&r.message)
            .bind(&r.resources)
            .bind(&r.code_object)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The code objects of `builds` for the runtime library: for each build, a successful
    /// compile of these kernel sources for one of `targets` (the first preferred, then the
    /// newest), whichever compiler made it. Builds without one are absent. Databases from
    /// before the compile cache (schema < 3) have none.
    pub async fn code_objects(
        &self,
        source_hash: &str,
        targets: &[&str],
        builds: &[String],
    ) -> Result<HashMap<String, Vec<u8>>> {
        let mut found = HashMap::new();
        if self.schema() < 3 || targets.is_empty() {
            return Ok(found);
        }
        let list = vec!["?"; targets.len()].join(", ");
        let sql = format!(
            "SELECT code_object FROM gpu_compiles
             WHERE source_hash = ? AND build = ? AND status = 'ok' AND code_object IS NOT NULL
               AND target IN ({list})
             ORDER BY target = ? DESC, compiled_at DESC LIMIT 1"
        );
        for build in builds {
            let mut q = sqlx::query(&sql).bind(source_hash).bind(build);
            for t in targets {
                q = q.bind(*t);
            }
            if let Some(row) = q.bind(targets[0]).fetch_optional(&self.pool).await? {
                found.insert(build.clone(), row.get(0));
            }
        }
        Ok(found)
    }
}
