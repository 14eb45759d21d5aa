//! # kerntune-db
//!
//! The tuning database: one SQLite file, written through sqlx, with migrations under
//! `db/migrations`. It keeps every measurement a tuner made (failures too, as data), which run
//! made it, on which device and with which kernel sources, and the winner per
//! (device, kernel version, problem).
//!
//! Opening a database sets WAL mode, a busy timeout and foreign keys, migrates an older schema
//! and refuses a newer one without touching it. A tuner records each problem in one transaction,
//! so a crash or Ctrl-C never leaves half a problem behind.

mod claims;
mod compiles;
mod error;
mod exchange;
mod maintain;
mod open;
mod read;
mod records;
mod rows;
mod snapshot;
mod write;

pub use snapshot::{SnapshotBody, SnapshotConfig, SnapshotKernel, SNAPSHOT_FORMAT};
pub use write::ProblemResult;

pub use claims::Claim;
pub use compiles::CompileRecord;
pub use error::DbError;
pub use exchange::{ExportRow, ImportCounts, ImportRow, Prefer, RunInfo};
pub use maintain::{Conflict, GcCounts, GcFilter};
pub use open::{Db, SCHEMA_VERSION};
pub use records::{
    DeviceRecord, KernelRecord, MeasurementRecord, ProblemRecord, RunStatus, Stats, Status,
    WinnerRow,
};

/// Shorthand for results in this crate.
pub type Result<T, E = DbError> = std::result::Result<T, E>;
