//! The one error type of `kerntune-kernels`.
//!
//! Every variant carries the values involved, so a message printed by the `tune` binary or logged
//! by a server names the offending input and what would be accepted instead.

use crate::Family;

/// Everything that can go wrong while describing or running a kernel.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A problem field is out of range or inconsistent with another field.
    #[error("invalid {family} problem: {field} = {value}: {reason}")]
    InvalidProblem {
        family: Family,
        field: &'static str,
        value: String,
        reason: String,
    },
    /// A problem spec (`gemm:m=1,n=1280,...`) could not be parsed.
    #[error("cannot parse problem spec `{spec}`: {reason}")]
    BadSpec { spec: String, reason: String },
    /// A configuration is outside its parameter space for this problem and device.
    #[error("invalid {family} config: {reason}")]
    InvalidConfig { family: Family, reason: String },
    /// The config belongs to another kernel family than the problem.
    #[error("a {config} config cannot run a {problem} problem")]
    FamilyMismatch { problem: Family, config: Family },
    /// A caller's buffer has the wrong length or element type.
    #[error("buffer `{name}`: {reason}")]
    BadBuffer { name: &'static str, reason: String },

    /// A call's scalar argument (an fp8 cache's scale) out of its range.
    #[error("argument `{name}`: {reason}")]
    BadArgument { name: &'static str, reason: String },
    /// The scratch buffer is smaller than [`crate::Backend::scratch_len`] asked for.
    #[error("scratch buffer holds {got} f32 values but this config needs {needed}")]
    ScratchTooSmall { needed: usize, got: usize },
    /// A device name matched nothing in the catalog.
    #[error("unknown device `{name}`; known devices: {known}")]
    UnknownDevice { name: String, known: String },
    /// The backend this call needs was not compiled in or finds no device.
    #[error("{backend} backend unavailable: {reason}")]
    BackendUnavailable {
        backend: &'static str,
        reason: String,
    },
    /// A GPU build failed on the host emulator: it does not compile as C++, or a launch broke
    /// a rule of the GPU (barriers, whole waves, writes within the output).
    #[error("{build} on the host emulator: {reason}")]
    EmulatorFault { build: String, reason: String },
    /// A kernel left the device unusable to this process (an illegal address, a trap, a
    /// launch that failed: the driver's errors that stick to the context), so every later
    /// call fails too until the process starts again.
    #[error("{backend} device lost: {reason} (nothing more runs on it in this process)")]
    DeviceLost {
        backend: &'static str,
        reason: String,
    },
}

/// Shorthand for results in this crate.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;
