//! An immutable set of loaded winners and its lookup tables. The dispatcher swaps whole
//! snapshots on reload, so readers never see a half-loaded one.

use std::path::Path;

use kerntune_db::{Db, SnapshotBody};
use kerntune_kernels::config::GemmVariant;
use kerntune_kernels::device::Vendor;
use kerntune_kernels::gpu::GPU_SOURCE_HASH;
use kerntune_kernels::space::STREAM_MAX_M;
use kerntune_kernels::{Config, CpuSpace, Device, GpuSpace, Problem, Space, CPU_SOURCE_HASH};
use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::select::{log_distance, selection_key, split, Dims, Match, StaticKey};

/// The backend whose winners a device uses, and the kernel sources they must come from.
pub fn backend_of(device: &Device) -> (&'static str, &'static str) {
    match device {
        Device::Cpu(_) => ("cpu", CPU_SOURCE_HASH),
        Device::Gpu(g) => match g.vendor {
            Vendor::Amd => ("hip", GPU_SOURCE_HASH),
            Vendor::Nvidia => ("cuda", GPU_SOURCE_HASH),
        },
    }
}

/// The parameter space of a device's kernels.
pub fn space_of(device: &Device) -> &'static (dyn Space + Sync) {
    match device {
        Device::Cpu(_) => &CpuSpace,
        Device::Gpu(_) => &GpuSpace,
    }
}

/// What the loader thread read: a snapshot body or the winner rows.
enum Source {
    Body(Vec<u8>),
    Rows(Vec<(String, String, String, String)>),
}

/// A database read, boxed so [`on_db`] can run it.
pub(crate) type DbRead<'d, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, String>> + Send + 'd>>;

/// Runs `read` on the database at `path` (opened read-only, older schemas too) on a fresh
/// thread with its own single-thread async runtime, so it works from plain threads, C callers
/// and inside a caller's tokio runtime alike.
pub(crate) fn on_db<T: Send>(
    path: &Path,
    read: impl for<'d> FnOnce(&'d Db) -> DbRead<'d, T> + Send,
) -> Result<T, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let db = Db::open_read(path).await.map_err(|e| e.to_string())?;
                let result = read(&db).await;
                db.close().await;
                result
            })
        })
        .join()
        .map_err(|_| "the loader thread panicked".to_string())?
    })
}

/// Reads a device's winners: its snapshot body when `snapshot` and one is stored, else its
/// winner rows.
fn read(path: &Path, identity: &str, snapshot: bool) -> Result<Source, String> {
    let identity = identity.to_string();
    on_db(path, |db| {
        Box::pin(async move {
            let body = if snapshot {
                db.winner_snapshot(&identity)
                    .await
                    .map_err(|e| e.to_string())?
            } else {
                None
            };
            match body {
                Some(b) => Ok(Source::Body(b)),
                None => db
                    .winner_configs(&identity)
                    .await
                    .map(Source::Rows)
                    .map_err(|e| e.to_string()),
            }
        })
    })
}

/// A stored winner after validation: usable, or its key and why not.
type Checked<'a> = Result<(Problem, Config), (&'a str, String)>;

/// Loaded winners of one device.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Per problem, its softmax scale set aside ([`selection_key`]), the tuned problem and
    /// its config.
    exact: FxHashMap<Problem, (Problem, Config)>,
    /// Per static key, the tuned dynamic dimensions and configs, sorted by dimensions.
    buckets: FxHashMap<StaticKey, Vec<(Dims, Config)>>,
    pub loaded: u64,
    /// Rows whose config failed validation: skipped, never executed.
    pub rejected: u64,
    /// Rows measured with other kernel sources.
    pub stale: u64,
    /// Why the snapshot is empty when the database could not be read.
    pub note: Option<String>,
}

impl Snapshot {
    /// Reads the winners of `device` from the database at `path`: the device's snapshot row
    /// when it is current, its winner rows otherwise.
    pub fn load(path: &Path, device: &Device) -> Result<Snapshot, String> {
        let identity = device.identity();
        let source = read(path, &identity, true)?;
        let body;
        let rows: Vec<(&str, &str, &str, &str)> = match &source {
            Source::Body(bytes) => match SnapshotBody::parse(bytes) {
                Ok(parsed) => {
                    body = parsed;
                    body.kernels
                        .iter()
                        .flat_map(|k| {
                            k.configs.iter().flat_map(move |c| {
                                c.problems
                                    .iter()
                                    .map(move |p| (&**p, &*c.config, &*k.backend, &*k.source_hash))
                            })
                        })
                        .collect()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring an unreadable winner snapshot");
                    return match read(path, &identity, false)? {
                        Source::Rows(rows) => Ok(Self::from_rows(&rows, device)),
                        Source::Body(_) => Err("the winner snapshot was read twice".into()),
                    };
                }
            },
            Source::Rows(rows) => return Ok(Self::from_rows(rows, device)),
        };
        Ok(Self::validate(rows, device))
    }

    fn from_rows(rows: &[(String, String, String, String)], device: &Device) -> Snapshot {
        let rows = rows
            .iter()
            .map(|(k, c, b, h)| (k.as_str(), c.as_str(), b.as_str(), h.as_str()))
            .collect();
        Self::validate(rows, device)
    }

    /// Checks (problem key, config, backend, source hash) rows and indexes the usable ones:
    /// those of the device's backend, measured with the kernel sources built in, and valid in
    /// its parameter space.
    fn validate(rows: Vec<(&str, &str, &str, &str)>, device: &Device) -> Snapshot {
        let (backend_here, hash_here) = backend_of(device);
        let space = space_of(device);
        let mut snap = Snapshot::default();
        // Winners share a handful of distinct configs: parse each JSON text once.
        let mut configs: FxHashMap<&str, Result<Config, String>> = FxHashMap::default();
        let mut current = Vec::with_capacity(rows.len());
        for (key, config, backend, hash) in rows {
            if backend != backend_here || hash != hash_here {
                snap.stale += 1;
                continue;
            }
            let parsed = configs
                .entry(config)
                .or_insert_with_key(|c| Config::from_json(c).map_err(|e| e.to_string()))
                .clone();
            current.push((key, parsed));
        }
        // Keys parse and validate independently: spread them over the cores.
        let checked: Vec<Checked<'_>> = current
            .into_par_iter()
            .map(|(key, parsed)| {
                let c = parsed.map_err(|e| (key, e))?;
                let p = key.parse::<Problem>().map_err(|e| (key, e.to_string()))?;
                space
                    .validate(&c, &p, device)
                    .map_err(|e| (key, e.to_string()))?;
                Ok((p, c))
            })
            .collect();
        for result in checked {
            match result {
                Ok((p, c)) => snap.insert(p, c),
                Err((key, reason)) => {
                    snap.rejected += 1;
                    tracing::warn!(problem = %key, %reason, "skipping a tuned config that is not valid here");
                }
            }
        }
        for list in snap.buckets.values_mut() {
            list.sort_by_key(|(d, _)| *d);
        }
        snap
    }

    /// Every exactly tuned problem and its config.
    pub fn winners(&self) -> impl Iterator<Item = (&Problem, &Config)> {
        self.exact.values().map(|(p, c)| (p, c))
    }

    /// No winners, with the reason the dispatcher runs on defaults.
    pub fn empty(note: String) -> Snapshot {
        Snapshot {
            note: Some(note),
            ..Snapshot::default()
        }
    }

    fn insert(&mut self, problem: Problem, config: Config) {
        let (key, dims) = split(&problem);
        self.buckets.entry(key).or_default().push((dims, config));
        self.exact
            .insert(selection_key(&problem), (problem, config));
        self.loaded += 1;
    }

    /// The tuned config for a problem and how it matched; `None` when nothing tuned applies.
    /// Allocation-free: hash lookups and a scan of one static key's few buckets.
    pub fn lookup(&self, problem: &Problem) -> Option<(Config, Match)> {
        if let Some((_, c)) = self.exact.get(&selection_key(problem)) {
            return Some((*c, Match::Exact));
        }
        let (key, dims) = split(problem);
        let list = self.buckets.get(&key)?;
        let fits = |c: &Config| match (c, problem) {
            // The streaming GEMMs only run decode shapes (block-scaled fp8's and int4's,
            // any).
            (Config::Gemm(g), Problem::Gemm(p)) => {
                !matches!(g.variant, GemmVariant::Stream | GemmVariant::StreamDpbf16)
                    || p.m <= STREAM_MAX_M
                    || p.block.is_some()
                    || p.int4.is_some()
            }
            _ => true,
        };
        let bucket = list
            .iter()
            .filter(|(d, c)| d.iter().zip(&dims).all(|(t, a)| t >= a) && fits(c))
            .min_by_key(|(d, _)| *d);
        if let Some((_, c)) = bucket {
            return Some((*c, Match::Bucket));
        }
        list.iter()
            .filter(|(_, c)| fits(c))
            .min_by(|a, b| log_distance(a.0, dims).total_cmp(&log_distance(b.0, dims)))
            .map(|(_, c)| (*c, Match::Nearest))
    }
}
