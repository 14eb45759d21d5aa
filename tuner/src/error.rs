//! The tuner library's error type. Usage errors (bad flags, unknown names, unreadable inputs)
//! map to exit code 2 in the binary.

use kerntune_db::DbError;
use kerntune_kernels::KernelError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TuneError {
    /// The user asked for something that cannot be: the message names the input and the fix.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Db(#[from] DbError),
    /// Ctrl-C: finished problems are committed.
    #[error("interrupted: {done} problems committed, {left} left for the next run")]
    Interrupted { done: usize, left: usize },
    /// Ctrl-C during an offline plan: the builds compiled so far are cached.
    #[error("interrupted: {compiled} builds compiled and cached, {left} left to compile on the next run")]
    PlanInterrupted { compiled: usize, left: usize },
}

impl TuneError {
    /// Whether the binary should exit 2: the input was wrong, nothing ran.
    pub fn is_usage(&self) -> bool {
        match self {
            TuneError::Usage(_) | TuneError::Kernel(_) => true,
            TuneError::Db(e) => matches!(
                e,
                DbError::Open { .. } | DbError::NewerSchema { .. } | DbError::NotKerntune { .. }
            ),
            TuneError::Interrupted { .. } | TuneError::PlanInterrupted { .. } => false,
        }
    }
}

pub type Result<T, E = TuneError> = std::result::Result<T, E>;

pub fn usage(msg: impl Into<String>) -> TuneError {
    TuneError::Usage(msg.into())
}
