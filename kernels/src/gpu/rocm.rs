//! Running the GPU kernels on an AMD device (Cargo feature `rocm`): the HIP runtime loaded at
//! run time (libamdhip64.so.6, then .so.5), with a hand-written declaration of the dozen entry
//! points used, whose C signatures are the same in ROCm 5 and 6 (hip-sys would link the
//! library at build time and pins older bindings). Code objects come from the offline plan's
//! cache; a problem's inputs are uploaded once; each candidate is launched, verified against
//! the CPU reference by the caller and timed with hipEvents, caches flushed before each launch.
//! GEMMs also offer rocBLAS's solutions ([`super::rocblas`]) as candidates, run the same way.
//!
//! Never run on a device in this project's sessions (no AMD GPU is lent): the host code builds
//! and is linted in CI; launches are unverified.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::Arc;

use libloading::Library;

use super::launch::{launches, split_k_workspace, Arg, DevicePtrs, GemmScalePtrs, Launch};
use super::rocblas::{Rocblas, RocblasHandle};
use super::KernelBuild;
use crate::config::RocblasConfig;
use crate::data::ProblemData;
use crate::kernel::KvScales;
use crate::problem::GemmProblem;
use crate::{Config, KernelError, Problem, TensorBuf};

type HipError = c_int;
type Ptr = *mut c_void;

const LIBRARIES: &[&str] = &["libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];
/// `hipMemcpyHostToDevice` and `hipMemcpyDeviceToHost`.
const HOST_TO_DEVICE: c_int = 1;
const DEVICE_TO_HOST: c_int = 2;
/// Bytes zeroed before each timed launch: more than an MI300X's 256 MB Infinity Cache, so
/// neither L2 nor the last-level cache holds the previous launch's data.
const FLUSH_BYTES: usize = 512 << 20;

fn unavailable(reason: impl Into<String>) -> KernelError {
    KernelError::BackendUnavailable {
        backend: "hip",
        reason: reason.into(),
    }
}

/// The HIP entry points used, resolved once.
struct Api {
    _library: Library,
    init: unsafe extern "C" fn(c_uint) -> HipError,
    device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    set_device: unsafe extern "C" fn(c_int) -> HipError,
    device_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    malloc: unsafe extern "C" fn(*mut Ptr, usize) -> HipError,
    free: unsafe extern "C" fn(Ptr) -> HipError,
    memcpy: unsafe extern "C" fn(Ptr, *const c_void, usize, c_int) -> HipError,
    memset: unsafe extern "C" fn(Ptr, c_int, usize) -> HipError,
    synchronize: unsafe extern "C" fn() -> HipError,
    module_load_data: unsafe extern "C" fn(*mut Ptr, *const c_void) -> HipError,
    module_get_function: unsafe extern "C" fn(*mut Ptr, Ptr, *const c_char) -> HipError,
    module_unload: unsafe extern "C" fn(Ptr) -> HipError,
    runtime_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    driver_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    #[allow(clippy::type_complexity)]
    launch: unsafe extern "C" fn(
        Ptr,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Ptr,
        *mut Ptr,
        *mut Ptr,
    ) -> HipError,
    event_create: unsafe extern "C" fn(*mut Ptr) -> HipError,
    event_record: unsafe extern "C" fn(Ptr, Ptr) -> HipError,
    event_synchronize: unsafe extern "C" fn(Ptr) -> HipError,
    event_elapsed: unsafe extern "C" fn(*mut f32, Ptr, Ptr) -> HipError,
    event_destroy: unsafe extern "C" fn(Ptr) -> HipError,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HIP runtime")
    }
}

fn check(what: &str, status: HipError) -> Result<(), KernelError> {
    let reason = format!("{what} failed with HIP error {status}");
    match status {
        0 => Ok(()),
        s if STICKY.contains(&s) => Err(KernelError::DeviceLost {
            backend: "hip",
            reason,
        }),
        _ => Err(unavailable(reason)),
    }
}

/// HIP's errors that leave the device unusable to the process, as CUDA's do (the same
/// numbers): an illegal address, a launch timeout, a device-side assert or trap, a launch
/// failure.
const STICKY: [HipError; 4] = [700, 702, 710, 719];

impl Api {
    fn load() -> Result<Api, KernelError> {
        let (library, name) = LIBRARIES
            .iter()
            // SAFETY: loading the HIP runtime runs only its own initialisers.
            .find_map(|n| unsafe { Library::new(n) }.ok().map(|l| (l, *n)))
            .ok_or_else(|| {
                unavailable(format!(
                    "no HIP runtime: none of {} loads",
                    LIBRARIES.join(", ")
                ))
            })?;
        macro_rules! sym {
            ($s:literal) => {
                // SAFETY: the field's type is the HIP C API's signature of this symbol.
                *unsafe { library.get(concat!($s, "\0").as_bytes()) }
                    .map_err(|e| unavailable(format!("{name} lacks {}: {e}", $s)))?
            };
        }
        Ok(Api {
            init: sym!("hipInit"),
            device_count: sym!("hipGetDeviceCount"),
            set_device: sym!("hipSetDevice"),
            device_name: sym!("hipDeviceGetName"),
            malloc: sym!("hipMalloc"),
            free: sym!("hipFree"),
            memcpy: sym!("hipMemcpy"),
            memset: sym!("hipMemset"),
            synchronize: sym!("hipDeviceSynchronize"),
            module_load_data: sym!("hipModuleLoadData"),
            module_get_function: sym!("hipModuleGetFunction"),
            module_unload: sym!("hipModuleUnload"),
            runtime_version: sym!("hipRuntimeGetVersion"),
            driver_version: sym!("hipDriverGetVersion"),
            launch: sym!("hipModuleLaunchKernel"),
            event_create: sym!("hipEventCreate"),
            event_record: sym!("hipEventRecord"),
            event_synchronize: sym!("hipEventSynchronize"),
            event_elapsed: sym!("hipEventElapsedTime"),
            event_destroy: sym!("hipEventDestroy"),
            _library: library,
        })
    }
}

/// An opened AMD device.
#[derive(Debug)]
pub struct HipGpu {
    api: Arc<Api>,
    ordinal: c_int,
    pub name: String,
    /// `hipRuntimeGetVersion` and `hipDriverGetVersion`.
    pub versions: (i32, i32),
    /// rocBLAS, loaded on first use.
    rocblas: std::sync::OnceLock<Result<Arc<Rocblas>, KernelError>>,
}

/// A device allocation, freed on drop.
#[derive(Debug)]
struct DeviceMem<'g> {
    gpu: &'g HipGpu,
    ptr: Ptr,
    bytes: usize,
}

impl Drop for DeviceMem<'_> {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from hipMalloc and is freed once.
        unsafe { (self.gpu.api.free)(self.ptr) };
    }
}

impl HipGpu {
    /// Opens device `ordinal`; a clear error without the runtime or without a device.
    pub fn open(ordinal: usize) -> Result<HipGpu, KernelError> {
        // The probe's errors name the library and HIP's own error text ("no ROCm-capable
        // device is detected"), clearer than a bare status code.
        let listed = super::hip_runtime::probe().map_err(unavailable)?;
        let ordinal = c_int::try_from(ordinal).unwrap_or(c_int::MAX);
        if listed.iter().all(|d| d.index != ordinal) {
            return Err(unavailable(format!(
                "HIP device {ordinal} absent: the runtime lists {}",
                listed
                    .iter()
                    .map(|d| format!("{} {}", d.index, d.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let api = Api::load()?;
        // SAFETY: plain calls into the loaded runtime with valid out-pointers.
        unsafe {
            check("hipInit", (api.init)(0))?;
            let mut n = 0;
            check("hipGetDeviceCount", (api.device_count)(&mut n))?;
            if ordinal >= n {
                return Err(unavailable(format!(
                    "device {ordinal} absent: {n} HIP devices"
                )));
            }
            check("hipSetDevice", (api.set_device)(ordinal))?;
            let mut buf = [0 as c_char; 256];
            check(
                "hipDeviceGetName",
                (api.device_name)(buf.as_mut_ptr(), buf.len() as c_int, ordinal),
            )?;
            let name = std::ffi::CStr::from_ptr(buf.as_ptr())
                .to_string_lossy()
                .into_owned();
            let (mut runtime, mut driver) = (0, 0);
            check("hipRuntimeGetVersion", (api.runtime_version)(&mut runtime))?;
            check("hipDriverGetVersion", (api.driver_version)(&mut driver))?;
            Ok(HipGpu {
                api: Arc::new(api),
                ordinal,
                name,
                versions: (runtime, driver),
                rocblas: std::sync::OnceLock::new(),
            })
        }
    }

    /// rocBLAS, loaded once; the error says why it is unavailable.
    pub fn rocblas(&self) -> Result<&Arc<Rocblas>, KernelError> {
        self.rocblas
            .get_or_init(|| Rocblas::load().map(Arc::new))
            .as_ref()
            .map_err(Clone::clone)
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceMem<'_>, KernelError> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check("hipMalloc", unsafe {
            (self.api.malloc)(&mut ptr, bytes.max(4))
        })?;
        Ok(DeviceMem {
            gpu: self,
            ptr,
            bytes,
        })
    }

    fn upload<T: Copy>(&self, host: &[T]) -> Result<DeviceMem<'_>, KernelError> {
        let bytes = std::mem::size_of_val(host);
        let mem = self.alloc(bytes)?;
        // SAFETY: `mem` holds `bytes`; `host` is that many readable bytes.
        check("hipMemcpy", unsafe {
            (self.api.memcpy)(mem.ptr, host.as_ptr().cast(), bytes, HOST_TO_DEVICE)
        })?;
        Ok(mem)
    }

    /// Loads a code object (from the plan's cache) and finds the build's kernels.
    pub fn load(&self, build: &KernelBuild, code_object: &[u8]) -> Result<HipKernel, KernelError> {
        let mut module = std::ptr::null_mut();
        // SAFETY: the image outlives the call; the runtime copies what it keeps.
        check("hipModuleLoadData", unsafe {
            (self.api.module_load_data)(&mut module, code_object.as_ptr().cast())
        })?;
        // Built before the lookups so a missing entry point still unloads the module.
        let mut kernel = HipKernel {
            api: self.api.clone(),
            ordinal: self.ordinal,
            module,
            functions: Vec::with_capacity(build.entries.len()),
        };
        for e in build.entries {
            let name = CString::new(*e).expect("kernel names have no NUL");
            let mut f = std::ptr::null_mut();
            // SAFETY: a loaded module and a NUL-terminated name.
            check("hipModuleGetFunction", unsafe {
                (self.api.module_get_function)(&mut f, module, name.as_ptr())
            })?;
            kernel.functions.push(f);
        }
        Ok(kernel)
    }
}

/// A build's kernels, loaded; the module is unloaded on drop.
#[derive(Debug)]
pub struct HipKernel {
    api: Arc<Api>,
    ordinal: c_int,
    module: Ptr,
    functions: Vec<Ptr>,
}

// SAFETY: module and function handles are process-wide HIP objects; HIP allows launching
// them from any thread.
unsafe impl Send for HipKernel {}
// SAFETY: as above; launching takes no lock of ours and mutates nothing here.
unsafe impl Sync for HipKernel {}

impl HipKernel {
    /// Launches `launches` in order on `stream` (null: the null stream), without waiting.
    ///
    /// # Safety
    /// `stream` is null or a live stream of this device, and every address in `launches` is
    /// device memory of this device holding what its problem needs (see
    /// [`super::launch::DevicePtrs`]).
    pub unsafe fn launch(&self, launches: &[Launch], stream: Ptr) -> Result<(), KernelError> {
        // The null stream is the calling thread's current device's: make it this one.
        // SAFETY: a plain runtime call.
        check("hipSetDevice", unsafe {
            (self.api.set_device)(self.ordinal)
        })?;
        for l in launches {
            let f = *self.functions.get(l.entry).ok_or_else(|| {
                unavailable(format!("the build has no kernel number {}", l.entry))
            })?;
            if l.args.iter().any(|a| matches!(a, Arg::TensorMap(_))) {
                return Err(unavailable(
                    "TMA tensor maps are NVIDIA's (sm_90); no HIP kernel takes one".to_string(),
                ));
            }
            let mut args = l.args.clone();
            let mut params: Vec<Ptr> = args.iter_mut().map(Arg::as_param).collect();
            // SAFETY: `params` points at `args`, which follow the kernel's signature
            // (gpu::launch) and outlive the call; the runtime copies arguments at launch.
            // The caller vouches for the stream and the addresses.
            check("hipModuleLaunchKernel", unsafe {
                (self.api.launch)(
                    f,
                    l.grid[0],
                    l.grid[1],
                    l.grid[2],
                    l.block,
                    1,
                    1,
                    l.shared_bytes,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })?;
        }
        Ok(())
    }
}

impl Drop for HipKernel {
    fn drop(&mut self) {
        // SAFETY: `module` came from hipModuleLoadData and is unloaded once, after every
        // launch of its functions was waited for by the caller.
        unsafe { (self.api.module_unload)(self.module) };
    }
}

/// One problem's data on the device.
#[derive(Debug)]
pub struct HipProblem<'g> {
    gpu: &'g HipGpu,
    problem: Problem,
    inputs: Vec<DeviceMem<'g>>,
    tables: Option<(DeviceMem<'g>, DeviceMem<'g>, usize)>,
    /// Attention with sinks: each query head's sink logit.
    sinks: Option<DeviceMem<'g>>,
    /// Attention with ALiBi: each query head's slope.
    slopes: Option<DeviceMem<'g>>,
    /// Paged attention on fp8 caches: their scales.
    kv_scales: KvScales,
    /// fp8 GEMMs: A's and B's scales, with how many each holds.
    /// A GEMM's A scales, B scales and int4 zero points, each where the problem has them.
    gemm_scales: Vec<Option<(DeviceMem<'g>, usize)>>,
    partials: Option<(DeviceMem<'g>, DeviceMem<'g>, DeviceMem<'g>)>,
    /// GEMM: split-K partial products, as many as any valid config needs.
    workspace: Option<DeviceMem<'g>>,
    out: DeviceMem<'g>,
    flush: DeviceMem<'g>,
}

impl<'g> HipProblem<'g> {
    /// Uploads `data`; `min_partition` sizes the paged partial buffers as in the CUDA path.
    pub fn upload(
        gpu: &'g HipGpu,
        data: &ProblemData,
        min_partition: usize,
    ) -> Result<HipProblem<'g>, KernelError> {
        let inputs = data
            .inputs
            .iter()
            .map(|t| match t {
                // A latent problem's value cache is empty and never read: a word stands in.
                _ if t.is_empty() => gpu.alloc(16),
                TensorBuf::F32(v) => gpu.upload(v),
                TensorBuf::F16(v) => gpu.upload(&v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                TensorBuf::Bf16(v) => {
                    gpu.upload(&v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                }
                TensorBuf::Fp8(_, v) => gpu.upload(&v[..]),
                TensorBuf::Int4(v) => gpu.upload(&v[..]),
            })
            .collect::<Result<_, _>>()?;
        let (tables, partials) = match &data.problem {
            Problem::Paged(p) => {
                let slots = p.num_seqs * p.q_heads * p.span().div_ceil(min_partition.max(1));
                (
                    Some((
                        gpu.upload(&data.block_tables)?,
                        gpu.upload(&data.context_lens)?,
                        data.max_blocks_per_seq,
                    )),
                    Some((
                        gpu.alloc(4 * slots * p.v_head_dim)?,
                        gpu.alloc(4 * slots)?,
                        gpu.alloc(4 * slots)?,
                    )),
                )
            }
            _ => (None, None),
        };
        Ok(HipProblem {
            gpu,
            problem: data.problem,
            inputs,
            tables,
            sinks: match data.sinks.is_empty() {
                true => None,
                false => Some(gpu.upload(&data.sinks)?),
            },
            slopes: match data.slopes.is_empty() {
                true => None,
                false => Some(gpu.upload(&data.slopes)?),
            },
            kv_scales: data.kv_scales,
            gemm_scales: [&data.a_scales, &data.b_scales, &data.zeros]
                .into_iter()
                .map(|v| match v.is_empty() {
                    true => Ok(None),
                    false => gpu.upload(v).map(|m| Some((m, v.len()))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            partials,
            workspace: match &data.problem {
                Problem::Gemm(p) => Some(gpu.alloc(4 * split_k_workspace(p).max(1))?),
                _ => None,
            },
            out: gpu.alloc(4 * data.out.len())?,
            flush: gpu.alloc(FLUSH_BYTES)?,
        })
    }

    /// The device addresses of this problem's buffers.
    fn ptrs(&self) -> DevicePtrs {
        let addr = |m: &DeviceMem<'_>| m.ptr as u64;
        let mut inputs = [0; 3];
        for (slot, mem) in inputs.iter_mut().zip(&self.inputs) {
            *slot = addr(mem);
        }
        let mut ptrs = DevicePtrs {
            inputs,
            out: addr(&self.out),
            kv_scales: self.kv_scales,
            ..DevicePtrs::default()
        };
        if let Some((tables, lens, max_blocks)) = &self.tables {
            ptrs.block_tables = addr(tables);
            ptrs.context_lens = addr(lens);
            ptrs.max_blocks_per_seq = *max_blocks;
        }
        if let Some(sinks) = &self.sinks {
            ptrs.sinks = addr(sinks);
        }
        if let Some(slopes) = &self.slopes {
            ptrs.slopes = addr(slopes);
        }
        let mut scales = [(0, 0); 3];
        for (slot, buf) in scales.iter_mut().zip(&self.gemm_scales) {
            if let Some((mem, len)) = buf {
                *slot = (addr(mem), *len);
            }
        }
        ptrs.gemm_scales = GemmScalePtrs::of(scales);
        if let Some((o, m, s)) = &self.partials {
            ptrs.partials = [addr(o), addr(m), addr(s)];
        }
        if let Some(w) = &self.workspace {
            ptrs.partials[0] = addr(w);
        }
        ptrs
    }

    /// Launches `config` once on the null stream (without waiting).
    pub fn launch(&self, kernel: &HipKernel, config: &Config) -> Result<(), KernelError> {
        let launches = launches(&self.problem, config, &self.ptrs())?;
        // SAFETY: the null stream, and this problem's own buffers, allocated for it.
        unsafe { kernel.launch(&launches, std::ptr::null_mut()) }
    }

    /// Runs once and returns the output.
    pub fn run(&self, kernel: &HipKernel, config: &Config) -> Result<Vec<f32>, KernelError> {
        self.run_with(&mut || self.launch(kernel, config))
    }

    /// Times `reps` launches with hipEvents, caches flushed before each; nanoseconds each.
    pub fn time(
        &self,
        kernel: &HipKernel,
        config: &Config,
        reps: usize,
    ) -> Result<Vec<f64>, KernelError> {
        self.time_with(reps, &mut || self.launch(kernel, config))
    }

    /// Runs `launch` once on the null stream, waits, and returns the output.
    fn run_with(
        &self,
        launch: &mut dyn FnMut() -> Result<(), KernelError>,
    ) -> Result<Vec<f32>, KernelError> {
        launch()?;
        let api = &self.gpu.api;
        let mut host = vec![0f32; self.out.bytes / 4];
        // SAFETY: synchronise, then copy `bytes` into a host buffer of that size.
        unsafe {
            check("hipDeviceSynchronize", (api.synchronize)())?;
            check(
                "hipMemcpy",
                (api.memcpy)(
                    host.as_mut_ptr().cast(),
                    self.out.ptr,
                    self.out.bytes,
                    DEVICE_TO_HOST,
                ),
            )?;
        }
        Ok(host)
    }

    /// Times `reps` runs of `launch` (on the null stream) with hipEvents, caches flushed
    /// before each; nanoseconds each.
    fn time_with(
        &self,
        reps: usize,
        launch: &mut dyn FnMut() -> Result<(), KernelError>,
    ) -> Result<Vec<f64>, KernelError> {
        let api = &self.gpu.api;
        launch()?;
        // SAFETY: plain runtime calls on events this function creates and destroys.
        unsafe {
            check("hipDeviceSynchronize", (api.synchronize)())?;
            let (mut start, mut end) = (std::ptr::null_mut(), std::ptr::null_mut());
            check("hipEventCreate", (api.event_create)(&mut start))?;
            check("hipEventCreate", (api.event_create)(&mut end))?;
            let mut times = Vec::with_capacity(reps);
            let result = (|| {
                for _ in 0..reps {
                    check(
                        "hipMemset",
                        (api.memset)(self.flush.ptr, 0, self.flush.bytes),
                    )?;
                    check(
                        "hipEventRecord",
                        (api.event_record)(start, std::ptr::null_mut()),
                    )?;
                    launch()?;
                    check(
                        "hipEventRecord",
                        (api.event_record)(end, std::ptr::null_mut()),
                    )?;
                    check("hipEventSynchronize", (api.event_synchronize)(end))?;
                    let mut ms = 0f32;
                    check(
                        "hipEventElapsedTime",
                        (api.event_elapsed)(&mut ms, start, end),
                    )?;
                    times.push(f64::from(ms) * 1e6);
                }
                Ok(())
            })();
            (api.event_destroy)(start);
            (api.event_destroy)(end);
            result.map(|()| times)
        }
    }
}

/// A problem on the device with the candidate loaded last, for the tuner's device loop.
struct Loaded<'g> {
    problem: HipProblem<'g>,
    kernel: Option<HipKernel>,
    /// Created on the first rocBLAS candidate.
    blas: Option<RocblasHandle>,
}

impl Loaded<'_> {
    fn blas(&mut self) -> Result<&mut RocblasHandle, KernelError> {
        if self.blas.is_none() {
            self.blas = Some(self.problem.gpu.rocblas()?.handle()?);
        }
        Ok(self.blas.as_mut().expect("just set"))
    }

    /// A rocBLAS config of this problem: the GEMM and the config's solution, checked against
    /// the loaded rocBLAS version.
    fn blas_call(&mut self, c: &RocblasConfig) -> Result<GemmProblem, KernelError> {
        let Problem::Gemm(p) = self.problem.problem else {
            return Err(unavailable("rocBLAS solutions run GEMMs only"));
        };
        let lib = self.problem.gpu.rocblas()?;
        if lib.version != c.version {
            return Err(unavailable(format!(
                "solution {} is of rocBLAS version {}, this host has {}",
                c.solution, c.version, lib.version
            )));
        }
        Ok(p)
    }
}

impl super::device::GpuProblem for Loaded<'_> {
    fn load(&mut self, build: &KernelBuild, code: &[u8]) -> Result<(), KernelError> {
        // The previous module goes first: every launch of it was waited for.
        self.kernel = None;
        self.kernel = Some(self.problem.gpu.load(build, code)?);
        Ok(())
    }

    fn run(&mut self, config: &Config) -> Result<Vec<f32>, KernelError> {
        if let Config::Rocblas(c) = config {
            let p = self.blas_call(c)?;
            self.blas()?;
            let Loaded { problem, blas, .. } = self;
            let (blas, ptrs) = (blas.as_mut().expect("created above"), problem.ptrs());
            // SAFETY: the problem's own buffers, on the null stream.
            return problem.run_with(&mut || unsafe {
                blas.gemm(&p, &ptrs, Some(c.solution), std::ptr::null_mut())
            });
        }
        let kernel = self
            .kernel
            .as_ref()
            .ok_or_else(|| unavailable("no kernel loaded"))?;
        self.problem.run(kernel, config)
    }

    fn time(&mut self, config: &Config, reps: usize) -> Result<Vec<f64>, KernelError> {
        if let Config::Rocblas(c) = config {
            let p = self.blas_call(c)?;
            self.blas()?;
            let Loaded { problem, blas, .. } = self;
            let (blas, ptrs) = (blas.as_mut().expect("created above"), problem.ptrs());
            // SAFETY: the problem's own buffers, on the null stream.
            return problem.time_with(reps, &mut || unsafe {
                blas.gemm(&p, &ptrs, Some(c.solution), std::ptr::null_mut())
            });
        }
        let kernel = self
            .kernel
            .as_ref()
            .ok_or_else(|| unavailable("no kernel loaded"))?;
        self.problem.time(kernel, config, reps)
    }

    fn library_candidates(&mut self) -> Result<Vec<Config>, KernelError> {
        let Problem::Gemm(p) = self.problem.problem else {
            return Ok(Vec::new());
        };
        // rocBLAS multiplies dense matrices: int4 words are kerntune's kernels' alone.
        if p.int4.is_some() {
            return Ok(Vec::new());
        }
        let ptrs = self.problem.ptrs();
        // SAFETY: the problem's own buffers.
        unsafe { self.blas()?.solutions(&p, &ptrs) }
    }
}

/// A rocBLAS solution ready for the runtime library: one handle, used by one caller at a time.
#[derive(Debug)]
struct BlasLaunch {
    handle: std::sync::Mutex<RocblasHandle>,
    solution: i32,
    ordinal: c_int,
    api: Arc<Api>,
}

impl super::device::LoadedBuild for BlasLaunch {
    unsafe fn launch(
        &self,
        problem: &Problem,
        _config: &Config,
        ptrs: &DevicePtrs,
        stream: u64,
    ) -> Result<(), KernelError> {
        let Problem::Gemm(p) = problem else {
            return Err(unavailable("rocBLAS solutions run GEMMs only"));
        };
        // SAFETY: a plain runtime call; rocBLAS launches on the current device's null stream.
        check("hipSetDevice", unsafe {
            (self.api.set_device)(self.ordinal)
        })?;
        let mut handle = self
            .handle
            .lock()
            .map_err(|_| unavailable("a rocBLAS call panicked earlier"))?;
        // SAFETY: the caller's promise on the addresses and the stream.
        unsafe { handle.gemm(p, ptrs, Some(self.solution), stream as usize as Ptr) }
    }
}

impl super::device::GpuDevice for HipGpu {
    fn backend(&self) -> &'static str {
        "hip"
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn runtime(&self) -> String {
        format!("HIP runtime {} driver {}", self.versions.0, self.versions.1)
    }

    /// By name: ROCm 5 and 6 lay `hipDeviceProp_t` (which holds gcnArchName) out differently,
    /// and the name ("AMD Instinct MI250X / MI250") is what the catalog is keyed on anyway. A
    /// code object of another target fails to load, so a wrong match cannot produce results.
    fn is(&self, model: &crate::device::GpuModel) -> bool {
        let squashed: String = self
            .name
            .to_ascii_lowercase()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        model.vendor == crate::device::Vendor::Amd && squashed.contains(model.name)
    }

    fn upload<'g>(
        &'g self,
        data: &ProblemData,
        min_partition: usize,
    ) -> Result<Box<dyn super::device::GpuProblem + 'g>, KernelError> {
        Ok(Box::new(Loaded {
            problem: HipProblem::upload(self, data, min_partition)?,
            kernel: None,
            blas: None,
        }))
    }

    fn load_build(
        &self,
        build: &KernelBuild,
        code: &[u8],
    ) -> Result<Box<dyn super::device::LoadedBuild>, KernelError> {
        Ok(Box::new(self.load(build, code)?))
    }

    fn load_library(
        &self,
        config: &Config,
    ) -> Result<Box<dyn super::device::LoadedBuild>, KernelError> {
        let Config::Rocblas(c) = config else {
            return Err(unavailable(format!("`{config}` is not a library config")));
        };
        let lib = self.rocblas()?;
        if lib.version != c.version {
            return Err(unavailable(format!(
                "the winner is rocBLAS {} solution {}, this host has rocBLAS {}; retune",
                c.version, c.solution, lib.version_text
            )));
        }
        Ok(Box::new(BlasLaunch {
            handle: std::sync::Mutex::new(lib.handle()?),
            solution: c.solution,
            ordinal: self.ordinal,
            api: self.api.clone(),
        }))
    }
}

impl super::device::LoadedBuild for HipKernel {
    unsafe fn launch(
        &self,
        problem: &Problem,
        config: &Config,
        ptrs: &DevicePtrs,
        stream: u64,
    ) -> Result<(), KernelError> {
        let launches = launches(problem, config, ptrs)?;
        // SAFETY: the caller's promise, passed on.
        unsafe { HipKernel::launch(self, &launches, stream as usize as Ptr) }
    }
}

#[cfg(test)]
mod tests {
    use super::check;
    use crate::KernelError;

    /// A fault in a kernel (an illegal address, a trap) loses the device to the process: the
    /// tuner stops its run there; other errors are the backend's.
    #[test]
    fn sticky_hip_errors_lose_the_device() {
        assert!(check("synchronizing", 0).is_ok());
        for code in [700, 710, 719] {
            let e = check("synchronizing", code).unwrap_err();
            assert!(matches!(e, KernelError::DeviceLost { .. }), "{code}: {e:?}");
            assert!(e.to_string().contains("hip device lost"), "{e}");
        }
        let e = check("allocating", 2).unwrap_err();
        assert!(matches!(e, KernelError::BackendUnavailable { .. }), "{e:?}");
    }
}
