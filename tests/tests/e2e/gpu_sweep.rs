//! The GPU tuning loop and the runtime's GPU dispatch end to end without a GPU: the real offline
//! plan (the HIP compiler, compiles cached in a real database) feeds a stand-in MI250 whose
//! launch runs the loaded build's own kernel source on the host emulator (64-wide waves,
//! MFMA), gets some candidates wrong and fails others on purpose, and reports synthetic times. What is checked is the loop's own work, the part a user's MI250
//! run shares with this test: the cached code objects reach the device, every candidate is
//! verified before it is timed, wrong and failing candidates are recorded and never win, the
//! winner is the fastest verified one, and results are stored under the `hip` backend and the
//! GPU sources' hash, resumable like CPU runs (after Ctrl-C or a kernel that loses the
//! device); then the runtime library loads the winners'
//! code objects from the database and launches each call's winner on the caller's addresses.
//!
//! Needs the HIP compiler (Debian: hipcc, libamdhip64-dev); without it the test says so and
//! checks nothing else, unless `KERNTUNE_REQUIRE_HIP` is set (CI), which makes it fail.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::ffi::CStr;

use kerntune::capi::{KtDtype, KtMatch, KtStats, KtStatus};
use kerntune::capi_gpu::{
    kt_gpu_free, kt_gpu_gemm, kt_gpu_gemm_block_scaled, kt_gpu_gemm_block_scratch_bytes,
    kt_gpu_gemm_int4, kt_gpu_gemm_int4_scratch_bytes, kt_gpu_gemm_scaled,
    kt_gpu_gemm_scratch_bytes, kt_gpu_note, kt_gpu_reload, kt_gpu_stats, kt_gpu_write_untuned,
    KtGpuDispatcher, KtGpuStats,
};
use kerntune::{GpuDispatcher, RuntimeError};
use kerntune_db::Db;
use kerntune_e2e::job;
use kerntune_kernels::config::RocblasConfig;
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::device::GpuModel;
use kerntune_kernels::gpu::device::{GpuDevice, GpuProblem, LoadedBuild};
use kerntune_kernels::gpu::emulator::Emulator;
use kerntune_kernels::gpu::launch::{launches, partial_floats, Arg, DevicePtrs, Launch};
use kerntune_kernels::gpu::{KernelBuild, GPU_SOURCE_HASH};
use kerntune_kernels::kernel::Scratch;
use kerntune_kernels::space::gemm_kernel_for;
use kerntune_kernels::{
    Backend, Config, CpuBackend, CpuSpace, Device, Family, GpuSpace, KernelError, Problem, Space,
};
use kerntune_tuner::gpu_sweep::GpuSweep;
use kerntune_tuner::plan::PlanOptions;
use kerntune_tuner::shapes::Derived;
use kerntune_tuner::tune;

/// Which way a candidate misbehaves on the stand-in device, by a hash of its config.
#[derive(Debug, PartialEq)]
enum Fate {
    Right(f64),
    Wrong,
    Fails,
}

fn fate(config: &Config, default: &Config) -> Fate {
    // The stand-in "rocBLAS" solution is the fastest, so the runtime must serve it.
    if let Config::Rocblas(_) = config {
        return Fate::Right(5_000.0);
    }
    let h = config
        .to_string()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    if config == default {
        return Fate::Right(50_000.0);
    }
    match h % 5 {
        0 => Fate::Wrong,
        1 => Fate::Fails,
        _ => Fate::Right(10_000.0 + (h % 997) as f64 * 100.0),
    }
}

/// Each runtime launch: its build, launch list and stream.
type Launched = Arc<Mutex<Vec<(String, Vec<Launch>, u64)>>>;

#[derive(Debug, Default)]
struct StandIn {
    uploads: AtomicUsize,
    loads: Arc<AtomicUsize>,
    /// Builds the runtime loaded and has not dropped: a module still loaded on a device.
    resident: Arc<AtomicUsize>,
    timed_unverified: Arc<AtomicUsize>,
    launched: Launched,
    /// Which family's first candidate other than the default faults the way a kernel that
    /// traps does on a device: that call and every later one fail with the device lost.
    lose: Option<Family>,
    /// The config that lost the device, once one has.
    lost: Arc<Mutex<Option<Config>>>,
    /// Which family's first candidate other than the default raises `stop` while it runs,
    /// as Ctrl-C does in the `tune` binary.
    interrupt: Option<Family>,
    stop: Arc<AtomicBool>,
    /// Every config run, in order.
    ran: Arc<Mutex<Vec<Config>>>,
}

/// A build "loaded" for the runtime: records its launches.
#[derive(Debug)]
struct StandInBuild {
    key: String,
    launched: Launched,
    resident: Arc<AtomicUsize>,
}

impl StandInBuild {
    fn new(key: String, gpu: &StandIn) -> StandInBuild {
        gpu.resident.fetch_add(1, Ordering::SeqCst);
        StandInBuild {
            key,
            launched: gpu.launched.clone(),
            resident: gpu.resident.clone(),
        }
    }
}

impl Drop for StandInBuild {
    fn drop(&mut self) {
        self.resident.fetch_sub(1, Ordering::SeqCst);
    }
}

impl LoadedBuild for StandInBuild {
    unsafe fn launch(
        &self,
        problem: &Problem,
        config: &Config,
        ptrs: &DevicePtrs,
        stream: u64,
    ) -> Result<(), KernelError> {
        // A library solution has no launch list of ours.
        let list = match config {
            Config::Rocblas(_) => Vec::new(),
            _ => launches(problem, config, ptrs)?,
        };
        self.launched
            .lock()
            .unwrap()
            .push((self.key.clone(), list, stream));
        Ok(())
    }
}

/// The stand-in's "rocBLAS" solution, offered for every GEMM.
const LIBRARY: Config = Config::Rocblas(RocblasConfig {
    solution: 3,
    version: 40200,
});

struct StandInProblem {
    data: ProblemData,
    emulator: Emulator,
    default: Config,
    loaded: Option<String>,
    verified: Option<Config>,
    loads: Arc<AtomicUsize>,
    timed_unverified: Arc<AtomicUsize>,
    lose: Option<Family>,
    lost: Arc<Mutex<Option<Config>>>,
    interrupt: Option<Family>,
    stop: Arc<AtomicBool>,
    ran: Arc<Mutex<Vec<Config>>>,
}

impl StandInProblem {
    /// The sticky error of a lost device, for every call once one is lost.
    fn gone(&self) -> Result<(), KernelError> {
        match *self.lost.lock().unwrap() {
            Some(c) => Err(KernelError::DeviceLost {
                backend: "hip",
                reason: format!("stand-in: lost running {c}"),
            }),
            None => Ok(()),
        }
    }
}

impl GpuDevice for StandIn {
    fn backend(&self) -> &'static str {
        "hip"
    }
    fn name(&self) -> &str {
        "stand-in for an AMD Instinct MI250X / MI250"
    }
    fn runtime(&self) -> String {
        "no runtime (test)".into()
    }
    fn is(&self, model: &GpuModel) -> bool {
        model.arch == "gfx90a"
    }
    fn upload<'g>(
        &'g self,
        data: &ProblemData,
        _min_partition: usize,
    ) -> Result<Box<dyn GpuProblem + 'g>, KernelError> {
        self.uploads.fetch_add(1, Ordering::SeqCst);
        let device = Device::lookup("mi250").unwrap();
        let Device::Gpu(g) = device else {
            unreachable!("the MI250 is a GPU")
        };
        Ok(Box::new(StandInProblem {
            data: data.clone(),
            emulator: Emulator::new(g)?,
            default: GpuSpace.default_config(&data.problem, &device),
            loaded: None,
            verified: None,
            loads: self.loads.clone(),
            timed_unverified: self.timed_unverified.clone(),
            lose: self.lose,
            lost: self.lost.clone(),
            interrupt: self.interrupt,
            stop: self.stop.clone(),
            ran: self.ran.clone(),
        }))
    }
    fn load_build(
        &self,
        build: &KernelBuild,
        code: &[u8],
    ) -> Result<Box<dyn LoadedBuild>, KernelError> {
        assert!(code.starts_with(b"\x7fELF"), "not a code object");
        Ok(Box::new(StandInBuild::new(build.key(), self)))
    }
    fn load_library(&self, config: &Config) -> Result<Box<dyn LoadedBuild>, KernelError> {
        assert_eq!(*config, LIBRARY);
        Ok(Box::new(StandInBuild::new("rocblas".into(), self)))
    }
}

impl GpuProblem for StandInProblem {
    fn load(&mut self, build: &KernelBuild, code: &[u8]) -> Result<(), KernelError> {
        // The plan's cached code object, as the real device path would load it.
        assert!(code.starts_with(b"\x7fELF"), "not a code object");
        self.gone()?;
        self.loads.fetch_add(1, Ordering::SeqCst);
        self.loaded = Some(build.key());
        Ok(())
    }

    fn run(&mut self, config: &Config) -> Result<Vec<f32>, KernelError> {
        let problem: Problem = self.data.problem;
        if *config != LIBRARY {
            assert_eq!(
                self.loaded.as_deref(),
                Some(KernelBuild::new(&problem, config)?.key().as_str()),
                "run before its build was loaded"
            );
        }
        self.gone()?;
        self.ran.lock().unwrap().push(*config);
        if self.lose == Some(problem.family()) && *config != self.default && *config != LIBRARY {
            *self.lost.lock().unwrap() = Some(*config);
            self.gone()?;
        }
        if self.interrupt == Some(problem.family()) && *config != self.default {
            self.stop.store(true, Ordering::SeqCst);
        }
        let fate = fate(config, &self.default);
        if fate == Fate::Fails {
            return Err(KernelError::BackendUnavailable {
                backend: "hip",
                reason: "stand-in launch failure".into(),
            });
        }
        // Ours run as compiled from kernels/hip; the "library" solution is the CPU kernel.
        let mut out = if *config == LIBRARY {
            let cpu = CpuSpace.default_config(&problem, Device::host_ref());
            let mut scratch = Scratch::new();
            let len = CpuBackend.scratch_len(&problem, &cpu);
            CpuBackend.run(&problem, &cpu, self.data.args(), scratch.get(len))?;
            self.data.out.clone()
        } else {
            self.emulator.run(&self.data, config)?
        };
        if fate == Fate::Wrong {
            for v in &mut out {
                *v = *v * 1.5 + 0.25;
            }
        }
        self.verified = Some(*config);
        Ok(out)
    }

    fn time(&mut self, config: &Config, reps: usize) -> Result<Vec<f64>, KernelError> {
        self.gone()?;
        if self.verified != Some(*config) {
            self.timed_unverified.fetch_add(1, Ordering::SeqCst);
        }
        match fate(config, &self.default) {
            Fate::Right(ns) => Ok(vec![ns; reps]),
            _ => panic!("{config} timed although it failed"),
        }
    }

    fn library_candidates(&mut self) -> Result<Vec<Config>, KernelError> {
        // rocBLAS's GEMMs take no fp8 scales.
        Ok(match self.data.problem {
            Problem::Gemm(g) if g.fp8().is_none() => vec![LIBRARY],
            _ => Vec::new(),
        })
    }
}

/// Whether the HIP compiler the plan needs is here; without it `test` says it did not run
/// (and fails where `KERNTUNE_REQUIRE_HIP` is set, as in CI).
fn hip_compiler(test: &str) -> bool {
    match kerntune_kernels::gpu::hip::HipCompiler::find() {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var_os("KERNTUNE_REQUIRE_HIP").is_none(),
                "KERNTUNE_REQUIRE_HIP is set but {e}"
            );
            eprintln!("{test} did not run: {e}");
            false
        }
    }
}

/// The plan of the tests that stop a run: 8 candidates a problem, any occupancy.
fn eight_candidates() -> PlanOptions<'static> {
    PlanOptions {
        min_waves: 1.0,
        max_candidates: Some(8),
        ..Default::default()
    }
}

/// The same command again after a run stopped in `problems[1]`, on a stand-in device that
/// works: the finished first problem is skipped, the rest tuned. Returns what it ran.
async fn run_again(db: &Db, device: &Device, problems: &[Derived]) -> Vec<Config> {
    let gpu = StandIn::default();
    let mut job = job(db, device);
    job.max_configs = 8;
    let (mut sweep, _) = GpuSweep::prepare(db, device, &gpu, problems, &eight_candidates())
        .await
        .unwrap();
    let out = tune::run(&job, &mut sweep, problems).await.unwrap();
    assert_eq!(
        out.iter().map(|o| o.status.as_str()).collect::<Vec<_>>(),
        ["skipped", "tuned", "tuned"],
        "{out:#?}"
    );
    let ran = gpu.ran.lock().unwrap().clone();
    ran
}

/// A small GEMM, flash and paged problem for the stand-in MI250.
fn one_of_each_family() -> Vec<Derived> {
    [
        "gemm:m=5,n=96,k=70,dtype=bf16",
        "flash:q_len=19,kv_len=40,q_heads=4,kv_heads=1,head_dim=64,dtype=f16",
        "paged:num_seqs=3,context_len=70,q_heads=8,kv_heads=2,head_dim=64,block_size=16,dtype=bf16",
    ]
    .iter()
    .map(|s| Derived {
        problem: s.parse().unwrap(),
        origin: "test".into(),
    })
    .collect()
}

#[tokio::test]
async fn the_gpu_loop_verifies_times_and_stores_like_the_cpu_loop() {
    if !hip_compiler("the_gpu_loop_verifies_times_and_stores_like_the_cpu_loop") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("gpu.db")).await.unwrap();
    let device = Device::lookup("mi250").unwrap();
    let problems = one_of_each_family();
    let gpu = StandIn::default();
    let (mut sweep, plan) = GpuSweep::prepare(
        &db,
        &device,
        &gpu,
        &problems,
        &PlanOptions {
            min_waves: 1.0,
            max_candidates: Some(8),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(plan.target, "gfx90a");
    let mut job = job(&db, &device);
    job.max_configs = 8;
    let out = tune::run(&job, &mut sweep, &problems).await.unwrap();
    assert!(out.iter().all(|o| o.status == "tuned"), "{out:#?}");
    assert_eq!(gpu.uploads.load(Ordering::SeqCst), problems.len());
    assert!(gpu.loads.load(Ordering::SeqCst) >= problems.len());
    assert_eq!(gpu.timed_unverified.load(Ordering::SeqCst), 0);

    let winners = db.winners(Some(&device.identity())).await.unwrap();
    assert_eq!(winners.len(), problems.len());
    let mut seen = [0usize; 3];
    for (d, p) in problems.iter().zip(&plan.problems) {
        let w = winners
            .iter()
            .find(|w| w.problem == d.problem.key())
            .unwrap();
        assert_eq!(
            (w.backend.as_str(), w.source_hash.as_str()),
            ("hip", GPU_SOURCE_HASH)
        );
        let default = GpuSpace.default_config(&d.problem, &device);
        let rows = db.measurements(&d.problem.key()).await.unwrap();
        // Every planned candidate is stored: pruned ones with the plan's reason.
        assert!(rows.len() >= p.kept.min(8), "{rows:#?}");
        let mut fastest = f64::INFINITY;
        for (config, status, median, message) in &rows {
            let c = Config::from_json(config).unwrap();
            match (status.as_str(), fate(&c, &default)) {
                ("ok", Fate::Right(ns)) => {
                    assert_eq!(*median, Some(ns));
                    fastest = fastest.min(ns);
                    seen[0] += 1;
                }
                ("failed_verification", Fate::Wrong) => seen[1] += 1,
                ("error", Fate::Fails) => {
                    assert!(message.as_deref().unwrap().contains("stand-in"));
                    seen[2] += 1;
                }
                ("invalid", _) => {
                    assert!(message.as_deref().unwrap().starts_with("pruned offline: "));
                }
                other => panic!("{c}: stored {other:?}"),
            }
        }
        assert_eq!(w.median_ns, fastest, "{}", d.problem.key());
        assert_eq!(
            w.default_ns,
            Some(50_000.0),
            "the default is always measured"
        );
        assert!(matches!(
            fate(&Config::from_json(&w.config).unwrap(), &default),
            Fate::Right(_)
        ));
    }
    assert!(seen.iter().all(|&n| n > 0), "each fate occurred: {seen:?}");

    // A second run resumes: nothing is uploaded again.
    let again = tune::run(&job, &mut sweep, &problems).await.unwrap();
    assert!(again.iter().all(|o| o.status == "skipped"));
    assert_eq!(gpu.uploads.load(Ordering::SeqCst), problems.len());
    drop(sweep);
    db.close().await;

    // The runtime library on the "same device": the winners' code objects come from the
    // database and each call launches its winner's build on the caller's addresses.
    let launched = gpu.launched.clone();
    let resident = gpu.resident.clone();
    let Device::Gpu(model) = device else {
        unreachable!()
    };
    let runtime =
        GpuDispatcher::with_device(dir.path().join("gpu.db"), model, Box::new(gpu)).unwrap();
    assert_eq!(runtime.note(), None);
    let stats = runtime.gpu_stats();
    assert_eq!(
        stats.builds, 3,
        "two builds and the library solution: {stats:?}"
    );
    assert_eq!((stats.missing, stats.failed), (0, 0));
    let ptrs = DevicePtrs {
        inputs: [0x1000, 0x2000, 0x3000],
        out: 0x4000,
        block_tables: 0x5000,
        context_lens: 0x6000,
        max_blocks_per_seq: 5,
        partials: [0; 3],
        sinks: 0,
        ..DevicePtrs::default()
    };
    for (d, w) in problems.iter().zip(&plan.problems) {
        let p = &d.problem;
        let scratch = runtime.scratch_bytes(p);
        let winner = runtime.select(p).config;
        // Paged attention's partial results, or a split-K GEMM's partial products.
        let needs = partial_floats(p, &winner).iter().sum::<usize>();
        assert_eq!(scratch, 4 * needs, "{}", w.problem);
        assert_eq!(
            needs > 0,
            matches!(p, Problem::Paged(_)) || matches!(winner, Config::GpuGemm(g) if g.split_k > 1)
        );
        // SAFETY: the stand-in device dereferences nothing.
        let how = unsafe { runtime.launch(p, &ptrs, 0x9000, scratch, 7) }.unwrap();
        assert_eq!(how, kerntune::Match::Exact);
        let (key, list, stream) = launched.lock().unwrap().pop().unwrap();
        assert_eq!(stream, 7);
        if winner == LIBRARY {
            // The GEMM's winner is the library's solution: launched through the library.
            assert!(matches!(p, Problem::Gemm(_)));
            assert_eq!(key, "rocblas");
            continue;
        }
        assert_eq!(key, KernelBuild::new(p, &winner).unwrap().key());
        assert!(list.last().unwrap().args.contains(&Arg::Ptr(0x4000)));
        if needs > 0 {
            // The partial results go to the caller's scratch.
            assert!(list[0].args.contains(&Arg::Ptr(0x9000)));
            // Without scratch, or with a byte too little (a buffer sized for another
            // shape's winner), the call is refused, saying how much it needs and got, and
            // nothing is launched.
            let before = launched.lock().unwrap().len();
            for (addr, len, given) in [
                (0, 0, 0),
                (0, scratch, 0),
                (0x9000, scratch - 1, scratch - 1),
            ] {
                // SAFETY: as above.
                let err = unsafe { runtime.launch(p, &ptrs, addr, len, 7) }.unwrap_err();
                assert!(
                    matches!(err, RuntimeError::NoScratch { bytes, given: g, .. } if bytes == scratch && g == given),
                    "{err}"
                );
                assert!(
                    err.to_string().contains(&format!("passed {given}")),
                    "{err}"
                );
            }
            assert_eq!(launched.lock().unwrap().len(), before);
        }
    }
    // An input the kernel cannot read where it lies (here an odd address for 16-bit values)
    // is refused, naming it, before anything is launched: on a device it would fault.
    let flash = problems
        .iter()
        .map(|d| &d.problem)
        .find(|p| matches!(p, Problem::Flash(_)))
        .unwrap();
    let before = launched.lock().unwrap().len();
    let odd = DevicePtrs {
        inputs: [0x1000, 0x2001, 0x3000],
        ..ptrs
    };
    // SAFETY: as above.
    let err = unsafe { runtime.launch(flash, &odd, 0x9000, 1 << 20, 0) }.unwrap_err();
    assert!(
        matches!(
            &err,
            RuntimeError::Kernel(KernelError::BadBuffer { name: "K", .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("0x2001"), "{err}");
    assert_eq!(launched.lock().unwrap().len(), before);
    // A smaller batch of the tuned GEMM's class runs the tuned build (bucket); a class never
    // tuned on the device has no kernel, and says so without launching.
    let smaller: Problem = "gemm:m=2,n=96,k=70,dtype=bf16".parse().unwrap();
    // SAFETY: as above.
    let how = unsafe { runtime.launch(&smaller, &ptrs, 0x9000, 1 << 20, 0) }.unwrap();
    assert_eq!(how, kerntune::Match::Bucket);
    let untuned_problem: Problem = "gemm:m=2,n=64,k=64,dtype=f16".parse().unwrap();
    let before = launched.lock().unwrap().len();
    // SAFETY: as above.
    let err = unsafe { runtime.launch(&untuned_problem, &ptrs, 0, 0, 0) }.unwrap_err();
    assert!(matches!(err, RuntimeError::NoGpuKernel { .. }), "{err}");
    assert!(err.to_string().contains("tune --device"), "{err}");
    assert_eq!(launched.lock().unwrap().len(), before);

    // A reload of an unchanged database loads nothing.
    let opened = runtime.gpu_stats();
    assert_eq!(opened.resident, 3, "{opened:?}");
    assert_eq!(resident.load(Ordering::SeqCst), 3);
    runtime.reload().unwrap();
    assert_eq!(runtime.gpu_stats(), opened);
    assert_eq!(resident.load(Ordering::SeqCst), 3);

    // A reload that changes a winner loads the new winner's build beside the old one, which
    // stays loaded: kernels queued before the reload, and CUDA or HIP graphs captured
    // before it, still launch the old build's functions, and unloading its module under
    // them would be undefined on a device.
    let gpu_db = dir.path().join("gpu.db");
    let served = runtime.select(flash).config;
    let build_of = |c: &Config| KernelBuild::new(flash, c).unwrap().key();
    let other = [
        GpuSpace.default_config(flash, &device),
        GpuSpace.heuristic(flash, &device),
    ]
    .into_iter()
    .find(|c| build_of(c) != build_of(&served))
    .unwrap();
    set_winner(&gpu_db, flash, &other, false);
    runtime.reload().unwrap();
    assert_eq!(runtime.select(flash).config, other);
    // SAFETY: as above.
    unsafe { runtime.launch(flash, &ptrs, 0x9000, 1 << 20, 0) }.unwrap();
    assert_eq!(launched.lock().unwrap().pop().unwrap().0, build_of(&other));
    let swapped = runtime.gpu_stats();
    assert_eq!((swapped.builds, swapped.resident), (3, 4), "{swapped:?}");
    assert_eq!(resident.load(Ordering::SeqCst), 4);

    // A reload that fails leaves the winners and their builds as they were, together: here
    // the flash problem's winner changes in the database to a build not loaded yet while
    // the compiled code is dropped, so that build cannot load. Swapping the winners in
    // before their builds loaded would have the calls select a winner with no kernel.
    let unloaded = GpuSpace
        .candidates(flash, &device)
        .into_iter()
        .find(|c| build_of(c) != build_of(&served) && build_of(c) != build_of(&other))
        .unwrap();
    set_winner(&gpu_db, flash, &unloaded, true);
    let err = runtime.reload().unwrap_err();
    assert!(matches!(err, RuntimeError::Load(_)), "{err}");
    assert_eq!(runtime.select(flash).config, other);
    // SAFETY: as above.
    let how = unsafe { runtime.launch(flash, &ptrs, 0x9000, 1 << 20, 0) }.unwrap();
    assert_eq!(how, kerntune::Match::Exact);
    let (key, _, _) = launched.lock().unwrap().pop().unwrap();
    assert_eq!(key, build_of(&other));
    assert_eq!(runtime.gpu_stats(), swapped);

    // Back to the first winner, whose build is still loaded: the reload needs no compiled
    // code (there is none left) and loads nothing.
    set_winner(&gpu_db, flash, &served, false);
    runtime.reload().unwrap();
    assert_eq!(runtime.select(flash).config, served);
    // SAFETY: as above.
    unsafe { runtime.launch(flash, &ptrs, 0x9000, 1 << 20, 0) }.unwrap();
    assert_eq!(launched.lock().unwrap().pop().unwrap().0, build_of(&served));
    assert_eq!(resident.load(Ordering::SeqCst), 4);

    // The C ABI on the same dispatcher: what the device holds, a reload, a launch, and the
    // shapes served without an exact winner written for `tune --shapes untuned:PATH`.
    let handle = KtGpuDispatcher::into_raw(runtime);
    let (mut counts, mut held) = (KtStats::default(), KtGpuStats::default());
    // SAFETY: a live handle and writable outputs.
    unsafe {
        assert_eq!(kt_gpu_stats(handle, &mut counts, &mut held), KtStatus::Ok);
        assert_eq!(kt_gpu_reload(handle), KtStatus::Ok);
        assert_eq!(
            kt_gpu_stats(handle, std::ptr::null_mut(), std::ptr::null_mut()),
            KtStatus::Ok
        );
        assert_eq!(CStr::from_ptr(kt_gpu_note(handle)).to_str().unwrap(), "");
    }
    assert_eq!((held.builds, held.resident), (3, 4), "{held:?}");
    assert!(
        counts.exact > 0 && counts.bucket > 0 && counts.defaults > 0,
        "{counts:?}"
    );
    let gemm = match problems[0].problem {
        Problem::Gemm(g) => g,
        _ => unreachable!("the first problem is the GEMM"),
    };
    let ptr = |a: u64| a as usize as *const std::ffi::c_void;
    let mut how = KtMatch::Default;
    // SAFETY: the stand-in device dereferences nothing.
    let status = unsafe {
        let bytes = kt_gpu_gemm_scratch_bytes(handle, gemm.m, gemm.n, gemm.k, KtDtype::Bf16, true);
        kt_gpu_gemm(
            handle,
            gemm.m,
            gemm.n,
            gemm.k,
            KtDtype::Bf16,
            true,
            ptr(0x1000),
            ptr(0x2000),
            0x4000 as *mut f32,
            0x9000 as *mut std::ffi::c_void,
            bytes,
            std::ptr::null_mut(),
            &mut how,
        )
    };
    assert_eq!(status, KtStatus::Ok);
    assert_eq!(how, KtMatch::Exact);
    let untuned = dir.path().join("untuned.txt");
    let path = std::ffi::CString::new(untuned.to_str().unwrap()).unwrap();
    // SAFETY: a live handle and a NUL-terminated path; freed once.
    unsafe {
        assert_eq!(kt_gpu_write_untuned(handle, path.as_ptr()), KtStatus::Ok);
        kt_gpu_free(handle);
    }
    let text = std::fs::read_to_string(&untuned).unwrap();
    assert!(text.contains(&smaller.key()), "{text}");
    assert!(text.contains(&untuned_problem.key()), "{text}");
    // Freeing the dispatcher unloads every build it held.
    assert_eq!(resident.load(Ordering::SeqCst), 0);
}

/// An FP8 checkpoint's decode GEMM (W8A8, MI300X's fnuz E4M3 as a server on one would hold
/// it, here on the stand-in MI250): its candidates verified on the emulator with the call's
/// scales, a verified winner stored, and kt_gpu_gemm_scaled() launching it with the caller's
/// scale buffers after the sizes; kt_gpu_gemm() and scales of a wrong length are refused with
/// nothing launched.
#[tokio::test]
async fn an_fp8_gemm_is_tuned_and_launched_with_its_scales() {
    if !hip_compiler("an_fp8_gemm_is_tuned_and_launched_with_its_scales") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("gpu.db")).await.unwrap();
    let device = Device::lookup("mi250").unwrap();
    let problems = vec![Derived {
        problem: "gemm:m=5,n=96,k=80,dtype=fp8_e4m3fnuz".parse().unwrap(),
        origin: "test".into(),
    }];
    let gpu = StandIn::default();
    let (mut sweep, _) = GpuSweep::prepare(&db, &device, &gpu, &problems, &eight_candidates())
        .await
        .unwrap();
    let mut job = job(&db, &device);
    job.max_configs = 8;
    let out = tune::run(&job, &mut sweep, &problems).await.unwrap();
    assert_eq!(out[0].status, "tuned", "{out:#?}");
    assert_eq!(gpu.timed_unverified.load(Ordering::SeqCst), 0);
    drop(sweep);
    let p = problems[0].problem;
    let default = GpuSpace.default_config(&p, &device);
    let rows = db.measurements(&p.key()).await.unwrap();
    // Ours only (no library solution for fp8), each stored with what it did.
    assert!(rows.len() >= 2, "{rows:#?}");
    for (config, status, ..) in &rows {
        let c = Config::from_json(config).unwrap();
        assert!(c.is_gpu() && c != LIBRARY, "{c}");
        match (status.as_str(), fate(&c, &default)) {
            ("ok", Fate::Right(_))
            | ("failed_verification", Fate::Wrong)
            | ("error", Fate::Fails)
            | ("invalid", _) => {}
            other => panic!("{c}: stored {other:?}"),
        }
    }
    let winner = db.winners(Some(&device.identity())).await.unwrap();
    let winner = Config::from_json(&winner[0].config).unwrap();
    assert!(matches!(fate(&winner, &default), Fate::Right(_)));
    db.close().await;

    let launched = gpu.launched.clone();
    let Device::Gpu(model) = device else {
        unreachable!()
    };
    let runtime =
        GpuDispatcher::with_device(dir.path().join("gpu.db"), model, Box::new(gpu)).unwrap();
    let Problem::Gemm(g) = p else {
        unreachable!("a GEMM")
    };
    let handle = KtGpuDispatcher::into_raw(runtime);
    let ptr = |a: u64| a as usize as *const std::ffi::c_void;
    let scales = |a: u64| a as usize as *const f32;
    let scratch = 1 << 20;
    let mut how = KtMatch::Default;
    // Scales per token (m of them) and per tensor. SAFETY: the stand-in dereferences nothing.
    let call = |a_len: usize, b_len: usize, how: &mut KtMatch| unsafe {
        kt_gpu_gemm_scaled(
            handle,
            g.m,
            g.n,
            g.k,
            KtDtype::Fp8E4m3Fnuz,
            true,
            ptr(0x1000),
            scales(0x7000),
            a_len,
            ptr(0x2000),
            scales(0x8000),
            b_len,
            0x4000 as *mut f32,
            0x9000 as *mut std::ffi::c_void,
            scratch,
            std::ptr::null_mut(),
            how,
        )
    };
    assert_eq!(call(g.m, 1, &mut how), KtStatus::Ok);
    assert_eq!(how, KtMatch::Exact);
    let (key, list, _) = launched.lock().unwrap().pop().unwrap();
    assert_eq!(key, KernelBuild::new(&p, &winner).unwrap().key());
    // After A, B, C (or the partial products) and the sizes: each scale buffer and its step,
    // then the square of fnuz E4M3's reading factor (2^7).
    assert_eq!(
        list[0].args[3..11],
        [
            Arg::Int(5),
            Arg::Int(96),
            Arg::Int(80),
            Arg::Ptr(0x7000),
            Arg::Int(1),
            Arg::Ptr(0x8000),
            Arg::Int(0),
            Arg::Float(16384.0),
        ]
    );
    // kt_gpu_gemm has no scales to give; scales of neither 1 nor m values are named.
    let before = launched.lock().unwrap().len();
    // SAFETY: as above.
    let plain = unsafe {
        kt_gpu_gemm(
            handle,
            g.m,
            g.n,
            g.k,
            KtDtype::Fp8E4m3Fnuz,
            true,
            ptr(0x1000),
            ptr(0x2000),
            0x4000 as *mut f32,
            0x9000 as *mut std::ffi::c_void,
            scratch,
            std::ptr::null_mut(),
            &mut how,
        )
    };
    assert_eq!(plain, KtStatus::InvalidArgument);
    // SAFETY: the library's own NUL-terminated message.
    let msg = unsafe { CStr::from_ptr(kerntune::capi::kt_last_error()) };
    assert!(
        msg.to_str().unwrap().contains("kt_gpu_gemm_scaled"),
        "{msg:?}"
    );
    assert_eq!(call(3, 1, &mut how), KtStatus::InvalidArgument);
    // SAFETY: as above.
    let msg = unsafe { CStr::from_ptr(kerntune::capi::kt_last_error()) };
    assert!(msg.to_str().unwrap().contains("a_scales"), "{msg:?}");
    assert_eq!(launched.lock().unwrap().len(), before);
    // SAFETY: a live handle, freed once.
    unsafe { kt_gpu_free(handle) };
}

/// A block-scaled fp8 GEMM (DeepSeek-V3's scheme) beside a per-channel one on the stand-in
/// MI250: the block-scaled one is tuned on the configs that scale each group of k apart
/// (tiled, skinny, MFMA tiles no deeper than a group), compiled by the HIP compiler and
/// verified against its reference by the emulator; the per-channel one is tuned as before. The
/// runtime serves it through kt_gpu_gemm_block_scaled(), launching its own winner with the
/// scale rows' length (the groups of k) after each scale buffer; per-channel scale counts are
/// refused by name with nothing launched.
#[tokio::test]
async fn a_block_scaled_gemm_is_tuned_on_the_configs_that_scale_each_group() {
    if !hip_compiler("a_block_scaled_gemm_is_tuned_on_the_configs_that_scale_each_group") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("gpu.db")).await.unwrap();
    let device = Device::lookup("mi250").unwrap();
    let problems: Vec<Derived> = [
        "gemm:m=5,n=96,k=160,dtype=fp8_e4m3fnuz,block=32",
        "gemm:m=5,n=96,k=128,dtype=fp8_e4m3fnuz",
    ]
    .iter()
    .map(|s| Derived {
        problem: s.parse().unwrap(),
        origin: "test".into(),
    })
    .collect();
    let gpu = StandIn::default();
    let (mut sweep, _) = GpuSweep::prepare(&db, &device, &gpu, &problems, &eight_candidates())
        .await
        .unwrap();
    let mut job = job(&db, &device);
    job.max_configs = 8;
    let out = tune::run(&job, &mut sweep, &problems).await.unwrap();
    assert_eq!(out[0].status, "tuned", "{out:#?}");
    assert_eq!(out[1].status, "tuned", "{out:#?}");
    drop(sweep);
    let blocks = problems[0].problem.key();
    let Problem::Gemm(blocked) = problems[0].problem else {
        unreachable!("a GEMM")
    };
    let rows = db.measurements(&blocks).await.unwrap();
    assert!(
        rows.iter().any(|(_, status, ..)| status == "ok"),
        "{rows:#?}"
    );
    let reads_blocks =
        |c: &Config| matches!(c, Config::GpuGemm(g) if gemm_kernel_for(g, &blocked).is_ok());
    for (config, ..) in &rows {
        let config = Config::from_json(config).unwrap();
        assert!(reads_blocks(&config), "{config}");
    }
    let winners = db.winners(Some(&device.identity())).await.unwrap();
    let winner = winners.iter().find(|w| w.problem == blocks).unwrap();
    assert!(
        reads_blocks(&Config::from_json(&winner.config).unwrap()),
        "{winner:#?}"
    );
    // Every config run for it was one of its own space's.
    let ran = gpu.ran.lock().unwrap().clone();
    let own: Vec<Config> = GpuSpace
        .candidates(&problems[0].problem, &device)
        .into_iter()
        .chain([
            GpuSpace.default_config(&problems[0].problem, &device),
            GpuSpace.heuristic(&problems[0].problem, &device),
        ])
        .collect();
    assert!(own.iter().all(reads_blocks), "{own:?}");
    assert!(ran.iter().any(|c| own.contains(c)), "{ran:?}");
    db.close().await;

    let launched = gpu.launched.clone();
    let Device::Gpu(model) = device else {
        unreachable!()
    };
    let runtime =
        GpuDispatcher::with_device(dir.path().join("gpu.db"), model, Box::new(gpu)).unwrap();
    let Problem::Gemm(g) = problems[0].problem else {
        unreachable!("a GEMM")
    };
    let (a_len, b_len) = g.block_scale_lens().unwrap();
    assert_eq!((a_len, b_len), (5 * 5, 3 * 5));
    let handle = KtGpuDispatcher::into_raw(runtime);
    // SAFETY: a live handle.
    let scratch =
        unsafe { kt_gpu_gemm_block_scratch_bytes(handle, g.m, g.n, g.k, KtDtype::Fp8E4m3Fnuz, 32) };
    let mut how = KtMatch::Default;
    // SAFETY: the stand-in dereferences nothing.
    let call = |a_len: usize, b_len: usize, how: &mut KtMatch| unsafe {
        kt_gpu_gemm_block_scaled(
            handle,
            g.m,
            g.n,
            g.k,
            KtDtype::Fp8E4m3Fnuz,
            32,
            0x1000 as *const std::ffi::c_void,
            0x7000 as *const f32,
            a_len,
            0x2000 as *const std::ffi::c_void,
            0x8000 as *const f32,
            b_len,
            0x4000 as *mut f32,
            0x9000 as *mut std::ffi::c_void,
            scratch.max(1),
            std::ptr::null_mut(),
            how,
        )
    };
    assert_eq!(call(a_len, b_len, &mut how), KtStatus::Ok);
    assert_eq!(how, KtMatch::Exact);
    let (key, list, _) = launched.lock().unwrap().pop().unwrap();
    let winner = Config::from_json(&winner.config).unwrap();
    assert_eq!(
        key,
        KernelBuild::new(&problems[0].problem, &winner)
            .unwrap()
            .key()
    );
    assert!(key.contains("KT_BLOCK=32"), "{key}");
    // After the sizes: each scale buffer and its rows' length (5 groups of k), then the
    // square of fnuz E4M3's reading factor (2^7).
    assert_eq!(
        list[0].args[3..11],
        [
            Arg::Int(5),
            Arg::Int(96),
            Arg::Int(160),
            Arg::Ptr(0x7000),
            Arg::Int(5),
            Arg::Ptr(0x8000),
            Arg::Int(5),
            Arg::Float(16384.0),
        ]
    );
    // A per-token and per-channel count is another GEMM's: named, nothing launched.
    let before = launched.lock().unwrap().len();
    assert_eq!(call(g.m, g.n, &mut how), KtStatus::InvalidArgument);
    // SAFETY: the library's own NUL-terminated message.
    let msg = unsafe { CStr::from_ptr(kerntune::capi::kt_last_error()) };
    let msg = msg.to_str().unwrap();
    assert!(
        msg.contains("a_scales") && msg.contains("block = 32"),
        "{msg}"
    );
    assert_eq!(launched.lock().unwrap().len(), before);
    // A block of no multiple of 32: no scratch size, the reason named.
    // SAFETY: a live handle.
    let none =
        unsafe { kt_gpu_gemm_block_scratch_bytes(handle, g.m, g.n, g.k, KtDtype::Fp8E4m3Fnuz, 48) };
    assert_eq!(none, 0);
    // SAFETY: the library's own NUL-terminated message.
    let msg = unsafe { CStr::from_ptr(kerntune::capi::kt_last_error()) };
    assert!(msg.to_str().unwrap().contains("block"), "{msg:?}");
    // SAFETY: a live handle, freed once.
    unsafe { kt_gpu_free(handle) };
}

/// An int4 GEMM (GPTQ's words) beside the same shape in f16 on the stand-in MI250: the int4 one
/// is tuned on the configs that unpack its words (tiled, one-stage MFMA, skinny), compiled by
/// the HIP compiler and verified by the emulator against its reference with random zero
/// points; the dense one as before. The runtime serves it through kt_gpu_gemm_int4(),
/// launching its own winner with the scales and zero points after the sizes (no zero points:
/// a null address); a scale count of another group is refused by name, nothing launched.
#[tokio::test]
async fn an_int4_gemm_is_tuned_on_the_configs_that_unpack_its_words() {
    if !hip_compiler("an_int4_gemm_is_tuned_on_the_configs_that_unpack_its_words") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("gpu.db")).await.unwrap();
    let device = Device::lookup("mi250").unwrap();
    let problems: Vec<Derived> = [
        "gemm:m=5,n=96,k=512,dtype=f16,b=kn,int4=64",
        "gemm:m=5,n=96,k=512,dtype=f16,b=kn",
    ]
    .iter()
    .map(|s| Derived {
        problem: s.parse().unwrap(),
        origin: "test".into(),
    })
    .collect();
    let gpu = StandIn::default();
    let (mut sweep, _) = GpuSweep::prepare(&db, &device, &gpu, &problems, &eight_candidates())
        .await
        .unwrap();
    let mut job = job(&db, &device);
    job.max_configs = 8;
    let out = tune::run(&job, &mut sweep, &problems).await.unwrap();
    assert_eq!(out[0].status, "tuned", "{out:#?}");
    assert_eq!(out[1].status, "tuned", "{out:#?}");
    drop(sweep);
    let int4 = &problems[0].problem;
    let Problem::Gemm(g) = *int4 else {
        unreachable!("a GEMM")
    };
    let rows = db.measurements(&int4.key()).await.unwrap();
    assert!(
        rows.iter().any(|(_, status, ..)| status == "ok"),
        "{rows:#?}"
    );
    let unpacks = |c: &Config| matches!(c, Config::GpuGemm(c) if gemm_kernel_for(c, &g).is_ok());
    for (config, ..) in &rows {
        assert!(unpacks(&Config::from_json(config).unwrap()), "{config}");
    }
    let winners = db.winners(Some(&device.identity())).await.unwrap();
    let winner = winners.iter().find(|w| w.problem == int4.key()).unwrap();
    let winner = Config::from_json(&winner.config).unwrap();
    assert!(unpacks(&winner), "{winner}");
    db.close().await;

    let launched = gpu.launched.clone();
    let Device::Gpu(model) = device else {
        unreachable!()
    };
    let runtime =
        GpuDispatcher::with_device(dir.path().join("gpu.db"), model, Box::new(gpu)).unwrap();
    let handle = KtGpuDispatcher::into_raw(runtime);
    // SAFETY: a live handle.
    let scratch =
        unsafe { kt_gpu_gemm_int4_scratch_bytes(handle, g.m, g.n, g.k, KtDtype::F16, 64) };
    let groups = g.k / 64 * g.n;
    let mut how = KtMatch::Default;
    // SAFETY: the stand-in dereferences nothing.
    let call = |scales: usize, zeros: usize, how: &mut KtMatch| unsafe {
        kt_gpu_gemm_int4(
            handle,
            g.m,
            g.n,
            g.k,
            KtDtype::F16,
            64,
            0x1000 as *const std::ffi::c_void,
            0x2000 as *const u32,
            0x7000 as *const f32,
            scales,
            0x8000 as *const f32,
            zeros,
            0x4000 as *mut f32,
            0x9000 as *mut std::ffi::c_void,
            scratch.max(1),
            std::ptr::null_mut(),
            how,
        )
    };
    for (zeros, address) in [(groups, 0x8000), (0, 0)] {
        assert_eq!(call(groups, zeros, &mut how), KtStatus::Ok);
        assert_eq!(how, KtMatch::Exact);
        let (key, list, _) = launched.lock().unwrap().pop().unwrap();
        assert_eq!(key, KernelBuild::new(int4, &winner).unwrap().key());
        assert!(key.contains("KT_INT4=64"), "{key}");
        assert_eq!(
            list[0].args[3..8],
            [
                Arg::Int(5),
                Arg::Int(96),
                Arg::Int(512),
                Arg::Ptr(0x7000),
                Arg::Ptr(address),
            ]
        );
    }
    // One scale per column (a per-channel checkpoint's count) is another group's: named.
    let before = launched.lock().unwrap().len();
    assert_eq!(call(g.n, 0, &mut how), KtStatus::InvalidArgument);
    // SAFETY: the library's own NUL-terminated message.
    let msg = unsafe { CStr::from_ptr(kerntune::capi::kt_last_error()) };
    let msg = msg.to_str().unwrap();
    assert!(
        msg.contains("scales") && msg.contains("takes 768, [8, 96]"),
        "{msg}"
    );
    assert_eq!(launched.lock().unwrap().len(), before);
    // SAFETY: a live handle, freed once.
    unsafe { kt_gpu_free(handle) };
}

/// Sets `problem`'s stored winner to `config` behind the runtime's back, as another tuner
/// would; with `drop_compiles` the compiled code of every build goes too.
fn set_winner(db: &std::path::Path, problem: &Problem, config: &Config, drop_compiles: bool) {
    let status = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); \
             c.execute('DELETE FROM winner_snapshots'); \
             c.execute('UPDATE winners SET config = ? WHERE problem_id = (SELECT id FROM problems WHERE key = ?)', (sys.argv[2], sys.argv[3])); \
             sys.argv[4] == '1' and c.execute('DROP TABLE IF EXISTS gpu_compiles'); c.commit(); c.close()",
        )
        .arg(db)
        .arg(config.to_json())
        .arg(problem.key())
        .arg(if drop_compiles { "1" } else { "0" })
        .status()
        .expect("python3 with sqlite3 is available (README, Set-up)");
    assert!(status.success());
}

/// A candidate that faults the way a kernel that traps does on a device leaves it unusable to
/// the process: the run stops there with what it measured committed and that candidate
/// recorded as crashing, says how to go on, and the next run (a new process, a working
/// device) tunes what was left without running that candidate again.
#[tokio::test]
async fn a_candidate_that_loses_the_device_stops_the_run_and_is_skipped_after() {
    if !hip_compiler("a_candidate_that_loses_the_device_stops_the_run_and_is_skipped_after") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("gpu.db")).await.unwrap();
    let device = Device::lookup("mi250").unwrap();
    let problems = one_of_each_family();
    let options = eight_candidates();
    let mut job = job(&db, &device);
    job.max_configs = 8;
    let flash = problems[1].problem.key();

    let gpu = StandIn {
        lose: Some(Family::Flash),
        ..StandIn::default()
    };
    let (mut sweep, _) = GpuSweep::prepare(&db, &device, &gpu, &problems, &options)
        .await
        .unwrap();
    let err = tune::run(&job, &mut sweep, &problems).await.unwrap_err();
    let crashed = gpu
        .lost
        .lock()
        .unwrap()
        .expect("a flash candidate lost the device");
    let text = err.to_string();
    assert!(
        matches!(&err, kerntune_tuner::error::TuneError::DeviceLost { problem, done: 1, left: 2, .. } if *problem == flash),
        "{text}"
    );
    assert!(
        text.contains(&crashed.to_string()) && text.contains("run the same command again"),
        "{text}"
    );
    // Nothing ran after the loss.
    assert_eq!(gpu.ran.lock().unwrap().last(), Some(&crashed));
    // The GEMM before it is tuned; the flash problem is not, its crashing candidate stored.
    let winners = db.winners(Some(&device.identity())).await.unwrap();
    assert_eq!(
        winners
            .iter()
            .map(|w| w.problem.as_str())
            .collect::<Vec<_>>(),
        [problems[0].problem.key().as_str()]
    );
    let rows = db.measurements(&flash).await.unwrap();
    let row = rows
        .iter()
        .find(|r| Config::from_json(&r.0).unwrap() == crashed)
        .unwrap();
    assert_eq!(row.1, "error");
    assert!(row.3.as_deref().unwrap().starts_with(tune::LOST), "{row:?}");
    assert!(
        rows.iter().filter(|r| r.1 == "ok").count() >= 1,
        "the default before it: {rows:?}"
    );
    assert!(db
        .measurements(&problems[2].problem.key())
        .await
        .unwrap()
        .is_empty());
    drop(sweep);

    // The next run, on a device that works: the rest is tuned, that candidate is not run.
    assert!(!run_again(&db, &device, &problems).await.contains(&crashed));
    let skipped = db
        .measurements(&flash)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| Config::from_json(&r.0).unwrap() == crashed && r.1 == "invalid")
        .count();
    assert_eq!(skipped, 1, "recorded as pruned by the second run");
    db.close().await;
}

/// Ctrl-C in the middle of a problem on the device (the `tune` binary raises the job's stop
/// flag): the run stops after the candidate running, with the problems before committed and
/// nothing of the interrupted one, and the same command again tunes what was left without
/// running the finished problem's candidates again.
#[tokio::test]
async fn ctrl_c_on_the_device_keeps_finished_problems_and_the_next_run_goes_on() {
    if !hip_compiler("ctrl_c_on_the_device_keeps_finished_problems_and_the_next_run_goes_on") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("gpu.db")).await.unwrap();
    let device = Device::lookup("mi250").unwrap();
    let problems = one_of_each_family();
    let options = eight_candidates();
    let gpu = StandIn {
        interrupt: Some(Family::Flash),
        ..StandIn::default()
    };
    let stop = gpu.stop.clone();
    let mut job = job(&db, &device);
    job.max_configs = 8;
    job.stop = &stop;
    let (gemm, flash) = (problems[0].problem.key(), problems[1].problem.key());

    let (mut sweep, _) = GpuSweep::prepare(&db, &device, &gpu, &problems, &options)
        .await
        .unwrap();
    let err = tune::run(&job, &mut sweep, &problems).await.unwrap_err();
    assert!(
        matches!(
            err,
            kerntune_tuner::error::TuneError::Interrupted { done: 1, left: 2 }
        ),
        "{err}"
    );
    // The candidate running when the flag went up was the last to run.
    let ran = gpu.ran.lock().unwrap().clone();
    let default = GpuSpace.default_config(&problems[1].problem, &device);
    let others: Vec<_> = ran
        .iter()
        .filter(|c| matches!(c, Config::GpuFlash(_)) && **c != default)
        .collect();
    assert_eq!(others.len(), 1, "{ran:?}");
    assert_eq!(ran.last(), Some(others[0]), "{ran:?}");
    let winners = db.winners(Some(&device.identity())).await.unwrap();
    assert_eq!(
        winners
            .iter()
            .map(|w| w.problem.as_str())
            .collect::<Vec<_>>(),
        [gemm.as_str()]
    );
    assert!(!db.measurements(&gemm).await.unwrap().is_empty());
    assert!(db.measurements(&flash).await.unwrap().is_empty());
    drop(sweep);

    // The same command again, nothing interrupting it.
    assert!(!run_again(&db, &device, &problems)
        .await
        .iter()
        .any(|c| matches!(c, Config::GpuGemm(_) | Config::Rocblas(_))));
    db.close().await;
}
