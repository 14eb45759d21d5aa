//! Checks one incoming row before it may enter a database: the device, kernel, problem and
//! config must be ones this build knows, the config must be valid for its kernel's parameter
//! space on that device, and a verified measurement must carry sane statistics. Everything
//! from another file or database is untrusted.

use kerntune_db::{DeviceRecord, ExportRow, ImportRow, Status};
use kerntune_kernels::device::{CpuInfo, GpuModel, Isa};
use kerntune_kernels::{Config, CpuSpace, Device, Problem, Space};

use crate::tune::kernel_record;

/// The device a stored record describes, rebuilt so configs can be validated for it.
pub fn device_of(d: &DeviceRecord) -> Result<Device, String> {
    let device = match d.kind.as_str() {
        "cpu" => {
            let isa: Isa = d.arch.parse()?;
            if !(1..=4096).contains(&d.compute_units) {
                return Err(format!(
                    "CPU device {} has {} threads (expected 1 to 4096)",
                    d.identity, d.compute_units
                ));
            }
            if d.model.is_empty() {
                return Err(format!("CPU device {} has no model name", d.identity));
            }
            // Validation reads the ISA level, thread count and AVX-512-BF16; caches only steer
            // heuristics. The record names the ISA level, not the BF16 extension, so bf16-pair
            // configs are admitted for any AVX-512 device: the runtime validates every winner
            // against its own host before it dispatches one.
            Device::Cpu(CpuInfo {
                model: d.model.clone(),
                threads: d.compute_units as usize,
                isa,
                avx512_bf16: isa >= Isa::Avx512,
                l1d_bytes: 32 << 10,
                l2_bytes: 1 << 20,
                l3_bytes: 32 << 20,
            })
        }
        "gpu" => Device::Gpu(
            GpuModel::lookup(&d.model.to_ascii_lowercase())
                .ok_or_else(|| format!("unknown GPU model `{}`", d.model))?,
        ),
        other => {
            return Err(format!(
                "unknown device kind `{other}` (expected cpu or gpu)"
            ))
        }
    };
    if device.identity() != d.identity {
        return Err(format!(
            "device identity `{}` does not match its own fields (expected `{}`)",
            d.identity,
            device.identity()
        ));
    }
    Ok(device)
}

/// The space that validates a backend's configs, if this build has that backend.
fn space_of(backend: &str) -> Option<&'static dyn Space> {
    match backend {
        "cpu" => Some(&CpuSpace),
        _ => None,
    }
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Checks a row; returns it ready to import, or why not.
pub fn check(row: ExportRow) -> Result<ImportRow, String> {
    if !is_hex(&row.uid, 32) || !is_hex(&row.run.uid, 32) {
        return Err("malformed measurement or run id (expected 32 hex digits)".into());
    }
    let device = device_of(&row.device)?;
    let k = &row.kernel;
    let space = space_of(&k.backend).ok_or_else(|| {
        format!(
            "unknown kernel backend `{}` (this build has: cpu)",
            k.backend
        )
    })?;
    if device.is_cpu() != (k.backend == "cpu") {
        return Err(format!(
            "kernel backend `{}` does not run on device {}",
            k.backend, row.device.identity
        ));
    }
    if !is_hex(&k.source_hash, 16) {
        return Err(format!(
            "malformed kernel source hash `{}` (expected 16 hex digits)",
            k.source_hash
        ));
    }
    let problem: Problem = row
        .problem
        .parse()
        .map_err(|e| format!("problem `{}`: {e}", row.problem))?;
    if problem.key() != row.problem {
        return Err(format!(
            "problem key `{}` is not canonical (expected `{}`)",
            row.problem,
            problem.key()
        ));
    }
    let expected = kernel_record(&problem, &k.backend, &k.source_hash);
    if *k != expected {
        return Err(format!(
            "kernel {}/{}/{} does not match problem family {}",
            k.family,
            k.backend,
            k.variant,
            problem.family()
        ));
    }
    let config = Config::from_json(&row.config.to_string())
        .map_err(|e| format!("config of {}: {e}", row.problem))?;
    if row.status == Status::Ok {
        space
            .validate(&config, &problem, &device)
            .map_err(|e| format!("config of {}: {e}", row.problem))?;
        let s = row
            .stats
            .as_ref()
            .ok_or_else(|| format!("verified measurement of {} has no timings", row.problem))?;
        // Quantiles of one sample set are ordered; a row whose are not was edited or
        // corrupted, and its median cannot be trusted to pick a winner.
        let quantiles = [s.min_ns, s.p20_ns, s.median_ns, s.p80_ns];
        let sane = quantiles.iter().all(|q| q.is_finite() && *q > 0.0)
            && quantiles.windows(2).all(|w| w[0] <= w[1])
            && s.reps >= 1;
        if !sane {
            return Err(format!(
                "verified measurement of {} has impossible timings (min {} <= p20 {} <= median {} <= p80 {} ns expected, {} reps)",
                row.problem, s.min_ns, s.p20_ns, s.median_ns, s.p80_ns, s.reps
            ));
        }
        let tolerance = problem.tolerance();
        match row.error {
            Some(e) if e.is_finite() && (0.0..=tolerance).contains(&e) => {}
            other => {
                return Err(format!(
                    "measurement of {} is marked verified but its error {other:?} is not within {tolerance:e}",
                    row.problem
                ))
            }
        }
    } else if row.winner {
        return Err(format!(
            "winner of {} has status {}",
            row.problem,
            row.status.as_str()
        ));
    }
    let problem_fields = serde_json::to_string(&problem).unwrap_or_default();
    Ok(ImportRow {
        row,
        problem_fields,
        config_text: config.to_json(),
    })
}
