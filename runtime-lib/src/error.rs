//! The one error type of `kerntune-runtime`.

use kerntune_kernels::KernelError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The kernel rejected the call (buffer sizes, dtypes, invalid problem).
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// Loading or reloading the winners failed; the dispatcher keeps what it had.
    #[error("loading tuned configs: {0}")]
    Load(String),
    #[error("writing untuned shapes to {path}: {source}")]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}
