//! Opening a database: pragmas, schema checks, migrations.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::{DbError, Result};

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The newest schema this build knows: the highest migration version.
pub const SCHEMA_VERSION: i64 = 5;

/// How long a writer waits for another process's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between looks while another process migrates the same file.
const MIGRATE_RETRY: Duration = Duration::from_millis(50);
const MIGRATE_ATTEMPTS: u32 = 100;
/// Retries of an open that SQLite answered "locked" (10 s in all).
const LOCK_ATTEMPTS: u32 = 200;

/// An open tuning database.
#[derive(Debug, Clone)]
pub struct Db {
    pub(crate) pool: SqlitePool,
    path: PathBuf,
    /// The schema version of the file as opened (older only through [`Db::open_read`]).
    schema: i64,
    /// Whether this handle may write (not opened by [`Db::open_read`]).
    writable: bool,
}

/// What opening may do to the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Create if missing, migrate an older schema.
    Write,
    /// The file must exist; an older schema is migrated.
    Migrate,
    /// The file must exist at the current schema.
    Existing,
    /// The file must exist at any schema this build can read; nothing is migrated.
    Read,
}

/// How SQLite is asked to open the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    ReadWrite,
    /// Read-only, through the write-ahead log's index another process made.
    ReadOnly,
    /// Read-only, the main file taken as the whole database, no index or locks.
    Immutable,
}

/// `path` with `suffix` appended to its file name (SQLite's `-wal` and `-shm` files).
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Whether this process may write `path` and keep SQLite's `-wal` and `-shm` files beside it
/// (create them in its folder, or write them where they exist). access(2) answers for the
/// process's own user and for read-only mounts alike, where the permission bits would not.
fn may_write(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let writable = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes()).is_ok_and(|c| {
            // SAFETY: `c` is a NUL-terminated path that outlives the call.
            unsafe {
                libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) == 0
            }
        })
    };
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    writable(path)
        && (writable(folder)
            || [sibling(path, "-wal"), sibling(path, "-shm")]
                .iter()
                .all(|p| writable(p)))
}

impl Db {
    /// Opens (creating if missing) the database at `path`, migrating an older schema.
    pub async fn open(path: &Path) -> Result<Db> {
        Self::open_with(path, Mode::Write).await
    }

    /// Opens an existing database, migrating an older schema; a missing file is an error
    /// rather than a new empty database (`tune db migrate` of a mistyped path).
    pub async fn open_to_migrate(path: &Path) -> Result<Db> {
        Self::open_with(path, Mode::Migrate).await
    }

    /// Opens an existing database without creating or migrating it; a database of another
    /// schema version is refused.
    pub async fn open_existing(path: &Path) -> Result<Db> {
        Self::open_with(path, Mode::Existing).await
    }

    /// Opens an existing database of this or an older schema for reading, without migrating
    /// it: a server upgraded before its database keeps loading winners.
    pub async fn open_read(path: &Path) -> Result<Db> {
        Self::open_with(path, Mode::Read).await
    }

    /// The schema version of the opened file.
    pub fn schema(&self) -> i64 {
        self.schema
    }

    async fn open_with(path: &Path, mode: Mode) -> Result<Db> {
        // SQLite would open such a file read-only without a word, and the first write would
        // fail deep inside a tuning run.
        if matches!(mode, Mode::Write | Mode::Migrate) && path.exists() && !may_write(path) {
            return Err(DbError::ReadOnly {
                path: path.to_path_buf(),
            });
        }
        match Self::open_as(path, mode, Access::ReadWrite).await {
            // A database this process may read but not write, in a folder it may not write
            // either: a read-only mount, a root-owned file in a server's container image.
            // SQLite reads a WAL-mode file through an index (`-shm`) it must create beside it,
            // and refuses. Where no write-ahead log holds commits, the main file is the whole
            // database and is read as immutable, which needs no index; a log in use is read
            // through the index its writer made, if this process may read it.
            Err(e) if matches!(mode, Mode::Read | Mode::Existing) && e.is_write_refused() => {
                let log_in_use =
                    std::fs::metadata(sibling(path, "-wal")).is_ok_and(|m| m.len() > 0);
                let access = if log_in_use {
                    Access::ReadOnly
                } else {
                    Access::Immutable
                };
                Self::open_as(path, mode, access).await.map_err(|_| e)
            }
            other => other,
        }
    }

    async fn open_as(path: &Path, mode: Mode, access: Access) -> Result<Db> {
        let create = mode == Mode::Write;
        let open_err = |source| DbError::Open {
            path: path.to_path_buf(),
            source,
        };
        // SQLite's own answer for a missing file, "unable to open database file", does not
        // say which of a missing file, a missing folder or a permission it was.
        if !create && !path.exists() {
            return Err(DbError::Missing {
                path: path.to_path_buf(),
            });
        }
        let url = format!("sqlite://{}", path.display());
        let options = SqliteConnectOptions::from_str(&url)
            .map_err(open_err)?
            .create_if_missing(create)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            .read_only(access != Access::ReadWrite)
            .immutable(access == Access::Immutable);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|e| match e {
                sqlx::Error::Database(ref d) if d.message().contains("not a database") => {
                    DbError::NotKerntune {
                        path: path.to_path_buf(),
                        reason: "the file is not SQLite".into(),
                    }
                }
                other => open_err(other),
            })?;
        let mut db = Db {
            pool,
            path: path.to_path_buf(),
            schema: 0,
            writable: mode != Mode::Read && access == Access::ReadWrite && may_write(path),
        };
        // Tuners started together on a new file race through creation: switching it to WAL
        // needs the file to itself, and SQLite answers "locked" there without waiting out the
        // busy timeout. Such an answer is retried; every other error stands.
        let mut attempts = 0;
        loop {
            match db.prepare(mode).await {
                Err(e) if e.is_locked() && attempts < LOCK_ATTEMPTS => {
                    attempts += 1;
                    tokio::time::sleep(MIGRATE_RETRY).await;
                }
                Err(e) => return Err(e),
                Ok(()) => return Ok(db),
            }
        }
    }

    /// Checks the schema, sets WAL and migrates as `mode` allows.
    async fn prepare(&mut self, mode: Mode) -> Result<()> {
        let applied = self.check_schema().await?;
        self.schema = applied;
        if mode == Mode::Read && applied >= 1 {
            return Ok(());
        }
        // WAL only after the checks: switching the journal mode writes the file header, and a
        // database this build refuses must be left exactly as it was.
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&self.pool)
            .await?;
        if applied < SCHEMA_VERSION {
            if !matches!(mode, Mode::Write | Mode::Migrate) {
                return Err(DbError::NotKerntune {
                    path: self.path.clone(),
                    reason: format!(
                        "schema version {applied}, this kerntune reads {SCHEMA_VERSION}; open it with `tune` to migrate"
                    ),
                });
            }
            self.migrate().await?;
            self.schema = SCHEMA_VERSION;
        }
        Ok(())
    }

    /// Applies missing migrations. Tuners started together on a new file (one per GPU) race
    /// to migrate it: sqlx takes no lock on SQLite, so the loser fails on tables the winner
    /// just created. The loser waits and looks again until the schema is current.
    async fn migrate(&self) -> Result<()> {
        let mut attempts = 0;
        loop {
            // On a connection of its own, closed after: the migrator leaves a read open on
            // the connection it ran on, and `close`'s checkpoint would wait out the busy
            // timeout (30 s) for it.
            let mut conn = self.pool.acquire().await?;
            let ran = MIGRATOR.run(&mut *conn).await;
            let _ = conn.close().await;
            let Err(source) = ran else {
                return Ok(());
            };
            attempts += 1;
            tokio::time::sleep(MIGRATE_RETRY).await;
            if self.check_schema().await? >= SCHEMA_VERSION {
                return Ok(());
            }
            if attempts == MIGRATE_ATTEMPTS {
                return Err(DbError::Migrate {
                    path: self.path.clone(),
                    source,
                });
            }
        }
    }

    /// Returns the applied schema version (0 for an empty file) after checking the file is
    /// a kerntune database of a schema this build can use.
    async fn check_schema(&self) -> Result<i64> {
        let not_ours = |reason: String| DbError::NotKerntune {
            path: self.path.clone(),
            reason,
        };
        let tables: Vec<String> =
            sqlx::query("SELECT name FROM sqlite_master WHERE type = 'table'")
                .fetch_all(&self.pool)
                .await
                .map_err(|e| {
                    if crate::error::locked(&e) {
                        DbError::Query(e)
                    } else {
                        not_ours(e.to_string())
                    }
                })?
                .into_iter()
                .map(|r| r.get::<String, _>(0))
                .collect();
        if tables.is_empty() {
            return Ok(0);
        }
        if !tables.iter().any(|t| t == "_sqlx_migrations") {
            return Err(not_ours(format!(
                "it has tables ({}) but no kerntune schema",
                tables.join(", ")
            )));
        }
        let found: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success")
                .fetch_one(&self.pool)
                .await?;
        let found = found.unwrap_or(0);
        if found > SCHEMA_VERSION {
            return Err(DbError::NewerSchema {
                path: self.path.clone(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        Ok(found)
    }

    /// Whether this handle may write: not opened for reading only, and not a file this
    /// process may only read.
    pub fn writable(&self) -> bool {
        self.writable
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `PRAGMA integrity_check` and `foreign_key_check`; the problems found, empty when sound.
    pub async fn integrity_problems(&self) -> Result<Vec<String>> {
        let mut out: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_all(&self.pool)
            .await?;
        out.retain(|r: &String| r != "ok");
        let fk = sqlx::query("PRAGMA foreign_key_check")
            .fetch_all(&self.pool)
            .await?;
        for row in fk {
            out.push(format!(
                "foreign key violation in {} row {}",
                row.get::<String, _>(0),
                row.get::<i64, _>(1)
            ));
        }
        Ok(out)
    }

    /// Closes the pool, checkpointing the WAL.
    /// Closes the database. A writer first folds the write-ahead log into the main file
    /// (best effort: another process may be using it), so the file alone is the whole database
    /// when it is copied or handed on.
    pub async fn close(self) {
        if self.writable {
            let _ = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&self.pool)
                .await;
        }
        self.pool.close().await;
    }

    /// Closes the database with everything written to the main file, so it can be renamed or
    /// copied on its own (a WAL file left beside it would not travel with it).
    pub async fn close_for_move(self) -> Result<()> {
        let checkpoint = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&self.pool)
            .await;
        self.pool.close().await;
        checkpoint?;
        Ok(())
    }
}
