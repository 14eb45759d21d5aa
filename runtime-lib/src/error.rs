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
    /// A host-memory call on a dispatcher opened for a GPU.
    #[error("this dispatcher serves {device}, whose kernels take device memory: call GpuDispatcher::launch, or open a dispatcher for the CPU for host buffers")]
    HostCallOnGpu { device: &'static str },
    /// No compiled kernel for the selected config of this shape class: it was never tuned on
    /// this device (or its compile is missing from the database). The caller runs its own
    /// kernel for it.
    #[error("no compiled kernel for {problem} (config {config}) in the database; tune this shape class on the device: tune --device <gpu> --shapes {problem}")]
    NoGpuKernel { problem: String, config: String },
    /// The selected kernel needs more device scratch than the call passed (none, or too
    /// little): nothing was launched.
    #[error("{problem} runs config {config}, which needs {bytes} bytes of device scratch and the call passed {given}; pass at least scratch_bytes() of this problem (size one buffer by the most over the shapes served, and ask again after a reload)")]
    NoScratch {
        problem: String,
        config: String,
        bytes: usize,
        given: usize,
    },
    #[error("writing untuned shapes to {path}: {source}")]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}
