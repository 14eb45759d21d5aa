//! Dispatching on a GPU: the tuned winners of the device (stored by `tune --device <gpu>`), the
//! compiled code of each winner's build read from the database's compile cache and loaded onto
//! the device once, and each call launched on the caller's device memory and stream.
//!
//! The device paths are Cargo features (`rocm`, `cuda`); without them, or without a device,
//! [`GpuDispatcher::open`] says which is missing. Shapes whose class was never tuned on the
//! device have no compiled kernel here: [`GpuDispatcher::launch`] answers
//! [`RuntimeError::NoGpuKernel`] at once, and the caller runs its own kernel for them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use kerntune_kernels::device::{GpuModel, Vendor};
use kerntune_kernels::gpu::device::{GpuDevice, LoadedBuild};
use kerntune_kernels::gpu::launch::{partial_floats, DevicePtrs};
use kerntune_kernels::gpu::{KernelBuild, GPU_SOURCE_HASH};
use kerntune_kernels::{Config, Device, KernelError, Problem};
use rustc_hash::FxHashMap;

use crate::dispatcher::{Dispatcher, Selection, Stats};
use crate::select::{split, Match, StaticKey};
use crate::snapshot::{on_db, Snapshot};
use crate::RuntimeError;

/// The winners a GPU call selects among and the builds loaded for them, swapped in together:
/// a call never selects a winner whose build is not loaded yet (or, after a reload that
/// failed, at all).
#[derive(Debug, Default)]
struct Kernels {
    snapshot: Arc<Snapshot>,
    by_key: FxHashMap<(StaticKey, Config), Arc<dyn LoadedBuild>>,
    /// Distinct builds loaded.
    builds: u64,
    /// Winners whose build has no compiled code in the database.
    missing: u64,
    /// Builds the device refused to load (wrong target, corrupt code object) and library
    /// solutions it cannot run (library missing or of another version).
    failed: u64,
}

/// Every build loaded on the device since the dispatcher opened, by build key (library
/// solutions by config), kept until it drops. Kernels queued before a reload may still be
/// waiting to run, and a CUDA or HIP graph captured before it launches the old winners'
/// functions on every replay: unloading their module under them is undefined behaviour. A
/// reload also loads only the builds not resident yet, so an unchanged database reloads
/// without touching the device.
#[derive(Debug, Default)]
struct Resident {
    builds: FxHashMap<String, Arc<dyn LoadedBuild>>,
    library: FxHashMap<Config, Arc<dyn LoadedBuild>>,
}

/// What the device holds: counts of loaded builds, and of winners that cannot run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct GpuStats {
    /// Distinct builds (and library solutions) the current winners launch.
    pub builds: u64,
    /// Winners whose build has no compiled code in the database.
    pub missing: u64,
    /// Builds the device refused to load, and library solutions it cannot run.
    pub failed: u64,
    /// Builds and library solutions loaded since the dispatcher opened, those of winners a
    /// reload replaced included: they stay loaded for work queued or captured before it.
    pub resident: u64,
}

/// Loads the winners of one GPU and launches each call's tuned kernel.
#[derive(Debug)]
pub struct GpuDispatcher {
    dispatcher: Dispatcher,
    model: &'static GpuModel,
    // Builds before the device: their modules unload while it is still open.
    kernels: ArcSwap<Kernels>,
    /// Held through a reload's loading, so that two reloads load each build once.
    resident: Mutex<Resident>,
    gpu: Box<dyn GpuDevice>,
    db_path: PathBuf,
}

/// Compile targets whose code objects run on `model`, preferred first. Debian's ROCm 5.2
/// compiles gfx942 work for gfx940 (see `tune plan`), and tuning on the device verified those.
fn targets(model: &GpuModel) -> Vec<&'static str> {
    match (model.vendor, model.arch) {
        (Vendor::Amd, "gfx942") => vec!["gfx942", "gfx940"],
        (_, arch) => vec![arch],
    }
}

/// The builds of `snapshot`'s winners: those in `resident` as they are, the others' code read
/// from the database and loaded onto `gpu`, then kept in `resident`.
fn load_kernels(
    path: &Path,
    model: &GpuModel,
    snapshot: Arc<Snapshot>,
    gpu: &dyn GpuDevice,
    resident: &mut Resident,
) -> Result<Kernels, RuntimeError> {
    let mut builds: FxHashMap<String, (KernelBuild, Vec<(StaticKey, Config)>)> =
        FxHashMap::default();
    // Vendor library solutions (rocBLAS) have no build: the device prepares them itself.
    let mut library: FxHashMap<Config, Vec<StaticKey>> = FxHashMap::default();
    for (problem, config) in snapshot.winners() {
        if let Config::Rocblas(_) = config {
            library.entry(*config).or_default().push(split(problem).0);
            continue;
        }
        let build = KernelBuild::new(problem, config)?;
        builds
            .entry(build.key())
            .or_insert_with(|| (build, Vec::new()))
            .1
            .push((split(problem).0, *config));
    }
    let mut kernels = Kernels {
        snapshot: snapshot.clone(),
        ..Kernels::default()
    };
    for (config, keys) in library {
        let loaded = match resident.library.get(&config) {
            Some(kept) => Ok(kept.clone()),
            None => gpu.load_library(&config).map(|loaded| {
                let loaded: Arc<dyn LoadedBuild> = Arc::from(loaded);
                resident.library.insert(config, loaded.clone());
                loaded
            }),
        };
        match loaded {
            Ok(loaded) => {
                kernels.builds += 1;
                for k in keys {
                    kernels.by_key.insert((k, config), loaded.clone());
                }
            }
            Err(e) => {
                kernels.failed += 1;
                tracing::warn!(%config, error = %e, "a tuned library solution cannot run here");
            }
        }
    }
    for (key, (_, selectors)) in builds.extract_if(|key, _| resident.builds.contains_key(key)) {
        let kept = &resident.builds[&key];
        kernels.builds += 1;
        for s in selectors {
            kernels.by_key.insert(s, kept.clone());
        }
    }
    if builds.is_empty() {
        return Ok(kernels);
    }
    let keys: Vec<String> = builds.keys().cloned().collect();
    let targets = targets(model);
    let code = on_db(path, |db| {
        Box::pin(async move {
            db.code_objects(GPU_SOURCE_HASH, &targets, &keys)
                .await
                .map_err(|e| e.to_string())
        })
    })
    .map_err(RuntimeError::Load)?;
    for (key, (build, selectors)) in builds {
        let Some(object) = code.get(&key) else {
            kernels.missing += selectors.len() as u64;
            tracing::warn!(build = %key, "no compiled code for a tuned build; its shapes are not dispatched");
            continue;
        };
        match gpu.load_build(&build, object) {
            Ok(loaded) => {
                let loaded: Arc<dyn LoadedBuild> = Arc::from(loaded);
                resident.builds.insert(key, loaded.clone());
                kernels.builds += 1;
                for s in selectors {
                    kernels.by_key.insert(s, loaded.clone());
                }
            }
            Err(e) => {
                kernels.failed += 1;
                tracing::warn!(build = %key, error = %e, "the device refused a tuned build");
            }
        }
    }
    Ok(kernels)
}

impl GpuDispatcher {
    /// Opens GPU 0 (after `HIP_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES`), which must be a
    /// `device` (`mi250`, `mi300x`, `h100`, ...), and loads its winners from `db_path`.
    pub fn open(db_path: impl AsRef<Path>, device: &str) -> Result<GpuDispatcher, RuntimeError> {
        Self::open_on(db_path, device, 0)
    }

    /// Opens GPU `ordinal` of those the process sees, as [`open`](Self::open) opens GPU 0:
    /// for servers whose tensor-parallel workers each drive one GPU of several they all see
    /// (a worker of rank r calling `set_device(r)`). Its kernels are loaded on that GPU and
    /// each launch goes to it, on the caller's stream of it.
    pub fn open_on(
        db_path: impl AsRef<Path>,
        device: &str,
        ordinal: usize,
    ) -> Result<GpuDispatcher, RuntimeError> {
        let Device::Gpu(model) = Device::lookup(device)? else {
            return Err(KernelError::BackendUnavailable {
                backend: "gpu",
                reason: format!("`{device}` is the CPU: use Dispatcher::open for host buffers"),
            }
            .into());
        };
        let gpu = kerntune_kernels::gpu::device::open(model.vendor, ordinal)?;
        if !gpu.is(model) {
            return Err(KernelError::BackendUnavailable {
                backend: gpu.backend(),
                reason: format!(
                    "GPU {ordinal} is `{}`, not {} ({})",
                    gpu.name(),
                    model.name,
                    model.arch
                ),
            }
            .into());
        }
        Self::with_device(db_path, model, gpu)
    }

    /// With a device already opened as `model`.
    pub fn with_device(
        db_path: impl AsRef<Path>,
        model: &'static GpuModel,
        gpu: Box<dyn GpuDevice>,
    ) -> Result<GpuDispatcher, RuntimeError> {
        let db_path = db_path.as_ref().to_path_buf();
        let dispatcher = Dispatcher::open_for(&db_path, Device::Gpu(model));
        let mut resident = Resident::default();
        let kernels = if dispatcher.note().is_some() {
            Kernels {
                snapshot: dispatcher.snapshot(),
                ..Kernels::default()
            }
        } else {
            load_kernels(
                &db_path,
                model,
                dispatcher.snapshot(),
                gpu.as_ref(),
                &mut resident,
            )?
        };
        Ok(GpuDispatcher {
            dispatcher,
            model,
            kernels: ArcSwap::from_pointee(kernels),
            resident: Mutex::new(resident),
            gpu,
            db_path,
        })
    }

    /// The device's own name.
    pub fn device_name(&self) -> &str {
        self.gpu.name()
    }

    /// Why no winners are loaded, if none are.
    pub fn note(&self) -> Option<String> {
        self.dispatcher.note()
    }

    /// The config for `problem` and how it matched, as [`Dispatcher::select`].
    pub fn select(&self, problem: &Problem) -> Selection {
        self.dispatcher
            .select_in(&self.kernels.load().snapshot, problem)
    }

    /// Bytes of device scratch a call of `problem` needs with its selected config (paged
    /// attention's partial results, a split-K GEMM's partial products, a split flash
    /// kernel's partial rows; else 0). Each shape has its own winner, so the need is not
    /// monotone in the shape: a decode GEMM of 64 rows split 16 ways needs more than one of
    /// 128 rows split 2 ways. Size one buffer by the most over the shapes served (selection
    /// takes nanoseconds: asking for every M up to the largest batch is cheap), and ask again
    /// after a reload; [`launch`](Self::launch) refuses a call whose scratch is too small.
    pub fn scratch_bytes(&self, problem: &Problem) -> usize {
        let config = self
            .dispatcher
            .peek_in(&self.kernels.load().snapshot, problem);
        scratch_bytes(problem, &config)
    }

    /// Launches the tuned kernel of `problem` on `stream` (0: the default stream) without
    /// waiting; `ptrs` holds the operands, `scratch` the address of `scratch_len` bytes of
    /// device memory (0 and 0 where none is needed). A call whose selected kernel needs more
    /// scratch than `scratch_len` ([`scratch_bytes`](Self::scratch_bytes)) is refused before
    /// anything is launched, [`RuntimeError::NoScratch`]. Returns how the config matched.
    ///
    /// # Safety
    /// Every address is memory of this device holding what `problem` needs (see
    /// [`DevicePtrs`]; `ptrs.partials` is ignored, `scratch` replaces it), `scratch` holds
    /// `scratch_len` bytes, and `stream` is 0 or a live stream of this device.
    pub unsafe fn launch(
        &self,
        problem: &Problem,
        ptrs: &DevicePtrs,
        scratch: u64,
        scratch_len: usize,
        stream: u64,
    ) -> Result<Match, RuntimeError> {
        let kernels = self.kernels.load();
        let Selection { config, matched } = self.dispatcher.select_in(&kernels.snapshot, problem);
        let Some(build) = kernels.by_key.get(&(split(problem).0, config)) else {
            return Err(RuntimeError::NoGpuKernel {
                problem: problem.key(),
                config: config.to_string(),
            });
        };
        // The kernel writes its partial results without bounds: a buffer sized for another
        // shape's winner would be overrun on the device.
        let bytes = scratch_bytes(problem, &config);
        let given = if scratch == 0 { 0 } else { scratch_len };
        if bytes > given {
            return Err(RuntimeError::NoScratch {
                problem: problem.key(),
                config: config.to_string(),
                bytes,
                given,
            });
        }
        let mut ptrs = *ptrs;
        let [outputs, maxima, _] = partial_floats(problem, &config).map(|n| 4 * n as u64);
        ptrs.partials = [scratch, scratch + outputs, scratch + outputs + maxima];
        // SAFETY: the caller's promise on the addresses and the stream.
        unsafe { build.launch(problem, &config, &ptrs, stream) }?;
        Ok(matched)
    }

    /// Re-reads the winners and loads the builds not yet loaded, then swaps both in at
    /// once; on failure the current ones stay, winners and builds alike. Builds the new
    /// winners no longer launch stay loaded until the dispatcher drops (see
    /// [`GpuStats::resident`]), so kernels queued before the reload, and CUDA or HIP graphs
    /// that captured launches before it, still find their code.
    pub fn reload(&self) -> Result<(), RuntimeError> {
        let snapshot = Arc::new(self.dispatcher.read_winners()?);
        // A panic elsewhere while loading leaves whole entries: the registry is still sound.
        let mut resident = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        let kernels = load_kernels(
            &self.db_path,
            self.model,
            snapshot.clone(),
            self.gpu.as_ref(),
            &mut resident,
        )?;
        // The dispatcher's copy serves its statistics and note; calls select among the
        // kernels' own.
        self.dispatcher.store(snapshot);
        self.kernels.store(Arc::new(kernels));
        Ok(())
    }

    /// Selection counters, as [`Dispatcher::stats`].
    pub fn stats(&self) -> Stats {
        self.dispatcher.stats()
    }

    /// Builds loaded on the device, and winners that cannot run.
    pub fn gpu_stats(&self) -> GpuStats {
        let k = self.kernels.load();
        let resident = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        GpuStats {
            builds: k.builds,
            missing: k.missing,
            failed: k.failed,
            resident: (resident.builds.len() + resident.library.len()) as u64,
        }
    }

    /// Adds the problems seen without an exact winner, and their calls, to the file at
    /// `path`, as [`Dispatcher::write_untuned`]: the shapes to tune next on this GPU.
    pub fn write_untuned(&self, path: impl AsRef<Path>) -> Result<usize, RuntimeError> {
        self.dispatcher.write_untuned(path)
    }
}

/// Scratch bytes of `config` on `problem`: paged attention's partial outputs, maxima and sums;
/// a split-K GEMM's partial products.
fn scratch_bytes(problem: &Problem, config: &Config) -> usize {
    4 * partial_floats(problem, config).iter().sum::<usize>()
}
