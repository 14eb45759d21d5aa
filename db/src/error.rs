//! The one error type of `kerntune-db`.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The file could not be opened or created.
    #[error("cannot open tuning database {path}: {source} (check the path exists and is writable, or pass --db)")]
    Open {
        path: PathBuf,
        #[source]
        source: sqlx::Error,
    },
    /// The database was written by a newer kerntune.
    #[error("tuning database {path} has schema version {found}, newer than this kerntune supports ({supported}); upgrade kerntune or use another --db. The file was not changed.")]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    /// The file is SQLite but not a kerntune database, or not SQLite at all.
    #[error("{path} is not a kerntune tuning database: {reason}. The file was not changed.")]
    NotKerntune { path: PathBuf, reason: String },
    #[error("migrating tuning database {path}: {source}")]
    Migrate {
        path: PathBuf,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    #[error("tuning database query failed: {0}")]
    Query(#[from] sqlx::Error),
    /// A stored value could not be decoded.
    #[error("tuning database holds a malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
}
