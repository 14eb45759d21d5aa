//! The rows a tuner writes and a reader gets back.

use serde::{Deserialize, Serialize};

/// A device as results are keyed by it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub identity: String,
    /// `cpu` or `gpu`.
    pub kind: String,
    pub model: String,
    pub arch: String,
    pub compute_units: i64,
    pub runtime: String,
    pub host: String,
}

/// A kernel version: results measured with other sources are stale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRecord {
    pub family: String,
    pub backend: String,
    pub variant: String,
    pub source_hash: String,
}

/// A problem by its canonical key, with its fields as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemRecord {
    pub family: String,
    pub key: String,
    pub fields: String,
}

/// What happened to one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// Rejected by the parameter space before running.
    Invalid,
    /// Ran, but its output did not match the reference.
    FailedVerification,
    /// Returned an error or panicked.
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Invalid => "invalid",
            Status::FailedVerification => "failed_verification",
            Status::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Some(match s {
            "ok" => Status::Ok,
            "invalid" => Status::Invalid,
            "failed_verification" => Status::FailedVerification,
            "error" => Status::Error,
            _ => return None,
        })
    }
}

/// Timing statistics of one candidate, in nanoseconds per call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub median_ns: f64,
    pub min_ns: f64,
    pub p20_ns: f64,
    pub p80_ns: f64,
    pub reps: i64,
    /// FLOP/s, or bytes/s when `unit` is `B/s`.
    pub throughput: f64,
    pub unit: String,
    pub cold_cache: bool,
}

/// One candidate's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasurementRecord {
    /// The config as JSON.
    pub config: String,
    pub status: Status,
    pub message: Option<String>,
    /// Relative error against the reference, when it ran.
    pub error: Option<f64>,
    pub stats: Option<Stats>,
}

/// How a tuning run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Done,
    Interrupted,
    Failed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Done => "done",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Failed => "failed",
        }
    }
}

/// A winner with its provenance, as `tune show` and the runtime read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WinnerRow {
    pub device: String,
    pub family: String,
    pub backend: String,
    pub source_hash: String,
    pub problem: String,
    pub config: String,
    pub median_ns: f64,
    pub default_ns: Option<f64>,
    pub speedup: Option<f64>,
    pub throughput: Option<f64>,
    pub unit: Option<String>,
    pub tool_version: String,
    pub updated_at: String,
    pub host: String,
}
