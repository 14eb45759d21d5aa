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
    /// A candidate left the GPU unusable to this process: what was measured before it is
    /// committed, the candidate recorded as crashing (later runs skip it), the rest of the
    /// run left for the next one.
    #[error("{config} on {problem}: {reason}; {done} problems committed, {left} left: run the same command again to go on (it skips this config)")]
    DeviceLost {
        problem: String,
        config: String,
        reason: String,
        done: usize,
        left: usize,
    },
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
                DbError::Open { .. }
                    | DbError::Missing { .. }
                    | DbError::ReadOnly { .. }
                    | DbError::NewerSchema { .. }
                    | DbError::NotKerntune { .. }
            ),
            TuneError::Interrupted { .. }
            | TuneError::PlanInterrupted { .. }
            | TuneError::DeviceLost { .. } => false,
        }
    }
}

/// An error and its causes on one line, each cause once: several errors here (and sqlx's)
/// write their source into their own message as well as returning it as `source()`, so
/// printing every link of the chain repeated the same words two or three times.
pub fn chain_message(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

pub type Result<T, E = TuneError> = std::result::Result<T, E>;

pub fn usage(msg: impl Into<String>) -> TuneError {
    TuneError::Usage(msg.into())
}

#[cfg(test)]
mod tests {
    use super::chain_message;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Leaf(&'static str);

    /// Writes its source into its message, as `DbError::Open` and sqlx's errors do.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot open k.db: {source}")]
    struct Quoting {
        source: Leaf,
    }

    /// Leaves its source out of its message.
    #[derive(Debug, thiserror::Error)]
    #[error("tuning gemm:m=1")]
    struct Terse {
        source: Quoting,
    }

    #[test]
    fn each_cause_is_printed_once() {
        let err = Terse {
            source: Quoting {
                source: Leaf("unable to open database file"),
            },
        };
        assert_eq!(
            chain_message(&err),
            "tuning gemm:m=1: cannot open k.db: unable to open database file"
        );
        assert_eq!(chain_message(&Leaf("alone")), "alone");
    }
}
