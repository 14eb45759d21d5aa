//! The dispatcher: loaded winners, selection, kernel calls, statistics and capture of untuned
//! shapes.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use kerntune_kernels::env::path_var;
use kerntune_kernels::kernel::{Args, FlashArgs, GemmArgs, PagedArgs, Scratch};
use kerntune_kernels::{Backend, Config, CpuBackend, Device, Problem};
use rustc_hash::FxHashMap;

use crate::select::Match;
use crate::snapshot::{space_of, Snapshot};
use crate::RuntimeError;

/// A selected config and how it matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    pub config: Config,
    pub matched: Match,
}

/// Dispatch counters, readable at any time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Stats {
    pub exact: u64,
    pub bucket: u64,
    pub nearest: u64,
    pub defaults: u64,
    /// Winners loaded and usable.
    pub loaded: u64,
    /// Stored configs skipped because they failed validation.
    pub rejected: u64,
    /// Stored winners measured with other kernel sources, ignored.
    pub stale: u64,
    /// Distinct problems seen that were not tuned exactly.
    pub untuned: u64,
}

#[derive(Debug, Default)]
struct Counters {
    by_match: [AtomicU64; 4],
}

thread_local! {
    // Each calling thread keeps its scratch: grown on the first call of a larger problem, then
    // reused, so steady-state calls allocate nothing.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// Loads the winners for the device this process runs on and dispatches each call to its
/// tuned kernel.
#[derive(Debug)]
pub struct Dispatcher {
    snapshot: ArcSwap<Snapshot>,
    db_path: PathBuf,
    device: Device,
    counters: Counters,
    /// Problems dispatched without an exact winner, with their counts. Only touched on misses,
    /// and only with `try_lock`, so the hot path never waits.
    untuned: Mutex<FxHashMap<Problem, u64>>,
    record_on_drop: Option<PathBuf>,
}

impl Dispatcher {
    /// Opens the database for the host CPU. A missing or unreadable database is not fatal: the
    /// dispatcher runs on defaults and [`Dispatcher::note`] says why.
    pub fn open(db_path: impl AsRef<Path>) -> Dispatcher {
        Self::open_for(db_path, Device::host())
    }

    /// Opens the database for a named device.
    pub fn open_for(db_path: impl AsRef<Path>, device: Device) -> Dispatcher {
        let db_path = db_path.as_ref().to_path_buf();
        let snapshot = load_or_empty(&db_path, &device);
        Dispatcher {
            snapshot: ArcSwap::from_pointee(snapshot),
            db_path,
            device,
            counters: Counters::default(),
            untuned: Mutex::new(FxHashMap::default()),
            record_on_drop: path_var("KERNTUNE_RECORD_UNTUNED"),
        }
    }

    /// Why the dispatcher runs on defaults, if it does.
    pub fn note(&self) -> Option<String> {
        self.snapshot.load().note.clone()
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The winners loaded now.
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Re-reads the database and swaps the new winners in atomically; calls in flight finish
    /// with the snapshot they started with. On failure the current winners stay.
    pub fn reload(&self) -> Result<(), RuntimeError> {
        self.store(Arc::new(self.read_winners()?));
        Ok(())
    }

    /// The database's winners as they are now, not yet swapped in.
    pub(crate) fn read_winners(&self) -> Result<Snapshot, RuntimeError> {
        Snapshot::load(&self.db_path, &self.device).map_err(RuntimeError::Load)
    }

    /// Swaps `snap` in; calls in flight finish with the one they started with.
    pub(crate) fn store(&self, snap: Arc<Snapshot>) {
        self.snapshot.store(snap);
    }

    /// The config for `problem` and how it matched. Lock-free and allocation-free except the
    /// first time an untuned problem is seen (recorded for `write_untuned`).
    pub fn select(&self, problem: &Problem) -> Selection {
        self.select_in(&self.snapshot.load(), problem)
    }

    /// [`select`](Self::select) among the winners of `snap`, counted as this dispatcher's.
    pub(crate) fn select_in(&self, snap: &Snapshot, problem: &Problem) -> Selection {
        let (config, matched) = snap.lookup(problem).unwrap_or_else(|| {
            (
                space_of(&self.device).heuristic(problem, &self.device),
                Match::Default,
            )
        });
        self.counters.by_match[matched as usize].fetch_add(1, Ordering::Relaxed);
        if matched != Match::Exact {
            if let Ok(mut map) = self.untuned.try_lock() {
                match map.get_mut(problem) {
                    Some(n) => *n += 1,
                    None => {
                        map.insert(*problem, 1);
                    }
                }
            }
        }
        Selection { config, matched }
    }

    /// The config [`select_in`](Self::select_in) would pick, without counting the call.
    pub(crate) fn peek_in(&self, snap: &Snapshot, problem: &Problem) -> Config {
        snap.lookup(problem)
            .map(|(c, _)| c)
            .unwrap_or_else(|| space_of(&self.device).heuristic(problem, &self.device))
    }

    fn run(&self, problem: &Problem, args: Args<'_>) -> Result<Match, RuntimeError> {
        if let Device::Gpu(g) = &self.device {
            return Err(RuntimeError::HostCallOnGpu { device: g.name });
        }
        let sel = self.select(problem);
        let backend = CpuBackend;
        let len = backend.scratch_len(problem, &sel.config);
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            backend.run(problem, &sel.config, args, s.get(len))
        })?;
        Ok(sel.matched)
    }

    /// `C = A·B` with the tuned kernel.
    pub fn gemm(&self, problem: &Problem, args: GemmArgs<'_>) -> Result<Match, RuntimeError> {
        self.run(problem, Args::Gemm(args))
    }

    /// Flash attention prefill with the tuned kernel.
    pub fn flash_attention(
        &self,
        problem: &Problem,
        args: FlashArgs<'_>,
    ) -> Result<Match, RuntimeError> {
        self.run(problem, Args::Flash(args))
    }

    /// Paged attention decode with the tuned kernel.
    pub fn paged_attention(
        &self,
        problem: &Problem,
        args: PagedArgs<'_>,
    ) -> Result<Match, RuntimeError> {
        self.run(problem, Args::Paged(args))
    }

    pub fn stats(&self) -> Stats {
        let snap = self.snapshot.load();
        let c = |m: Match| self.counters.by_match[m as usize].load(Ordering::Relaxed);
        Stats {
            exact: c(Match::Exact),
            bucket: c(Match::Bucket),
            nearest: c(Match::Nearest),
            defaults: c(Match::Default),
            loaded: snap.loaded,
            rejected: snap.rejected,
            stale: snap.stale,
            untuned: self.untuned.lock().map(|m| m.len() as u64).unwrap_or(0),
        }
    }

    /// Adds the problems seen without an exact winner, and their calls, to the file at
    /// `path` in the format `tune --shapes untuned:PATH` reads (`key<TAB>calls` a line, most
    /// called first), and returns how many problems this dispatcher saw. The file is merged,
    /// not replaced: the dispatchers of a tensor-parallel server's workers and successive
    /// server runs add to it in turn (see `untuned.rs`).
    pub fn write_untuned(&self, path: impl AsRef<Path>) -> Result<usize, RuntimeError> {
        let path = path.as_ref();
        let rows: Vec<(String, u64)> = self
            .untuned
            .lock()
            .map(|m| m.iter().map(|(p, n)| (p.key(), *n)).collect())
            .unwrap_or_default();
        crate::untuned::merge_into(path, &rows).map_err(|source| RuntimeError::Write {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(rows.len())
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        if let Some(path) = self.record_on_drop.take() {
            if let Err(e) = self.write_untuned(&path) {
                tracing::warn!(error = %e, "could not record untuned shapes");
            }
        }
    }
}

fn load_or_empty(path: &Path, device: &Device) -> Snapshot {
    if !path.exists() {
        let note = format!(
            "no tuning database at {}: running on default configs",
            path.display()
        );
        tracing::warn!("{note}");
        return Snapshot::empty(note);
    }
    match Snapshot::load(path, device) {
        Ok(s) => s,
        Err(e) => {
            let note = format!(
                "tuning database {} unreadable ({e}): running on default configs",
                path.display()
            );
            tracing::warn!("{note}");
            Snapshot::empty(note)
        }
    }
}
