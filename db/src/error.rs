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
    /// A database to read or to share from is not there (opening one to tune into creates it).
    #[error("no tuning database at {path}: the file does not exist (tune into it first with `tune --db {path}`, or name an existing one with --db or KERNTUNE_DB)")]
    Missing { path: PathBuf },
    /// The process may read the database but not write it: opened to write, or asked to
    /// change it.
    #[error("tuning database {path} can be read but not written by this process (the file, or the folder SQLite keeps its write-ahead log in, is not writable: a read-only mount, or another user's file); write into a copy of your own (--db), or run as the file's owner")]
    ReadOnly { path: PathBuf },
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

impl DbError {
    /// Whether SQLite answered "database is locked" or "table is locked": another process holds
    /// the file for a moment, and trying again is right.
    pub fn is_locked(&self) -> bool {
        match self {
            DbError::Query(e) => locked(e),
            DbError::Migrate {
                source: sqlx::migrate::MigrateError::Execute(e),
                ..
            } => locked(e),
            _ => false,
        }
    }

    /// Whether SQLite refused to write the file or to create a file beside it
    /// (SQLITE_READONLY, SQLITE_CANTOPEN): this process may not write there.
    pub(crate) fn is_write_refused(&self) -> bool {
        let code = match self {
            DbError::Open { source, .. } | DbError::Query(source) => primary_code(source),
            _ => None,
        };
        matches!(code, Some(8 | 14))
    }
}

/// SQLITE_BUSY (5) or SQLITE_LOCKED (6), extended codes included.
pub(crate) fn locked(e: &sqlx::Error) -> bool {
    primary_code(e).is_some_and(|c| matches!(c, 5 | 6))
}

/// SQLite's primary result code of a database error.
fn primary_code(e: &sqlx::Error) -> Option<i32> {
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .map(|c| c & 0xff),
        _ => None,
    }
}
