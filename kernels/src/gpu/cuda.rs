//! Running the GPU kernels on an NVIDIA device (Cargo feature `cuda`): the CUDA driver,
//! cuBLAS and cuBLASLt (the fp8 GEMMs' peer, `cublaslt`) through cudarc, loaded at run time,
//! so a build with the feature still starts, and answers clearly, on a host without them. A
//! problem's inputs are uploaded once; each candidate is loaded from its CUBIN, launched,
//! verified against the CPU reference and timed with CUDA events, the L2 cache flushed before
//! every timed launch.

use std::sync::Arc;

mod cublaslt;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::sys::{self, CUdevice_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use serde::Serialize;

use super::launch::{
    flash_split_workspace, launches, split_k_workspace, Arg, DevicePtrs, GemmScalePtrs, Launch,
    TensorMap,
};
use super::KernelBuild;
use crate::data::ProblemData;
use crate::device::GpuModel;
use crate::kernel::KvScales;
use crate::{BLayout, Config, KernelError, Problem, TensorBuf};

fn unavailable(reason: impl Into<String>) -> KernelError {
    KernelError::BackendUnavailable {
        backend: "cuda",
        reason: reason.into(),
    }
}

fn driver(what: &str, e: impl std::fmt::Debug + 'static) -> KernelError {
    let sticky = (&e as &dyn std::any::Any)
        .downcast_ref::<DriverError>()
        .is_some_and(|d| is_sticky(d.0));
    lost_or_unavailable(format!("{what}: {e:?}"), sticky)
}

/// Whether the driver's error leaves the context unusable ("sticky": every later call in
/// the process returns it), as the CUDA driver API documents them.
fn is_sticky(code: sys::CUresult) -> bool {
    use sys::CUresult as R;
    matches!(
        code,
        R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
    )
}

fn lost_or_unavailable(reason: String, sticky: bool) -> KernelError {
    if sticky {
        KernelError::DeviceLost {
            backend: "cuda",
            reason,
        }
    } else {
        unavailable(reason)
    }
}

/// What the driver says about the device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CudaInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sms: i32,
    pub memory_bytes: usize,
    pub l2_bytes: i32,
    pub driver_version: i32,
}

/// An opened NVIDIA device.
#[derive(Debug)]
pub struct CudaGpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pub info: CudaInfo,
}

impl CudaGpu {
    /// Opens device `ordinal`; a clear error without the driver or without a device.
    pub fn open(ordinal: usize) -> Result<CudaGpu, KernelError> {
        // SAFETY: only checks whether libcuda can be loaded; cudarc panics on first use
        // without it, so this comes before any other call.
        if !unsafe { sys::is_culib_present() } {
            return Err(unavailable(
                "no CUDA driver (libcuda.so.1) on this host, so no NVIDIA device can be used",
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| driver(&format!("no usable CUDA device {ordinal}"), e))?;
        let attr = |a| {
            ctx.attribute(a)
                .map_err(|e| driver("reading a device attribute", e))
        };
        let mut version = 0;
        // SAFETY: a valid out-pointer; the driver is loaded (checked above).
        unsafe { sys::cuDriverGetVersion(&mut version) };
        let info = CudaInfo {
            name: ctx
                .name()
                .map_err(|e| driver("reading the device name", e))?,
            compute_capability: (
                attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            sms: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            // SAFETY: the context's own device handle.
            memory_bytes: unsafe { cudarc::driver::result::device::total_mem(ctx.cu_device()) }
                .map_err(|e| driver("reading the device memory", e))?,
            l2_bytes: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            driver_version: version,
        };
        let stream = ctx.default_stream();
        Ok(CudaGpu { ctx, stream, info })
    }

    /// `sm_90` and the like: the target to compile for.
    pub fn arch(&self) -> String {
        let (major, minor) = self.info.compute_capability;
        format!("sm_{major}{minor}")
    }

    /// The catalog model this device is, by name and architecture.
    pub fn model(&self) -> Option<&'static GpuModel> {
        let name = self.info.name.to_ascii_lowercase();
        crate::device::GPU_CATALOG
            .iter()
            .find(|g| g.arch == self.arch() && name.contains(&g.name.to_ascii_lowercase()))
    }

    /// Loads a build's CUBIN (or PTX, which the driver compiles first: code objects cached
    /// before kerntune kept CUBINs).
    pub fn load(&self, build: &KernelBuild, code: &[u8]) -> Result<LoadedKernel, KernelError> {
        let module = if is_cubin(code) {
            // cudarc's safe loader takes PTX text or a file, and its module type has no other
            // constructor: the CUBIN goes through a file the driver reads.
            let image = checked_cubin(code)?;
            let file = tempfile::Builder::new()
                .prefix("kerntune-")
                .suffix(".cubin")
                .tempfile()
                .and_then(|mut f| std::io::Write::write_all(&mut f, image).map(|()| f))
                .map_err(|e| unavailable(format!("writing the CUBIN for the driver: {e}")))?;
            self.ctx
                .load_module(Ptx::from_file(file.path()))
                .map_err(|e| driver("loading the CUBIN module", e))?
        } else {
            let text = String::from_utf8_lossy(code).into_owned();
            self.ctx
                .load_module(Ptx::from_src(text))
                .map_err(|e| driver("loading the PTX module", e))?
        };
        let functions: Vec<CudaFunction> = build
            .entries
            .iter()
            .map(|e| {
                module
                    .load_function(e)
                    .map_err(|err| driver(&format!("finding kernel {e}"), err))
            })
            .collect::<Result<_, _>>()?;
        if build.dynamic_lds > 0 {
            functions[0]
                .set_attribute(DYNAMIC_SHARED, dynamic_lds(build)?)
                .map_err(|e| driver("allowing the kernel its dynamic shared memory", e))?;
        }
        Ok(LoadedKernel { functions })
    }

    fn sync(&self) -> Result<(), KernelError> {
        self.stream
            .synchronize()
            .map_err(|e| driver("a kernel failed", e))
    }
}

/// Whether a code object is a CUBIN (an ELF image) rather than PTX text.
fn is_cubin(code: &[u8]) -> bool {
    code.starts_with(b"\x7fELF")
}

/// A CUBIN whose headers and sections lie within its bytes: the driver reads an image by what
/// its headers say, so a truncated one (a corrupt database's) would be read past its end.
fn checked_cubin(code: &[u8]) -> Result<&[u8], KernelError> {
    use object::read::elf::{FileHeader, SectionHeader};
    let corrupt = |e: object::read::Error| {
        unavailable(format!("the CUBIN ({} bytes) is corrupt: {e}", code.len()))
    };
    let header = object::elf::FileHeader64::<object::Endianness>::parse(code).map_err(corrupt)?;
    let endian = header.endian().map_err(corrupt)?;
    for section in header.sections(endian, code).map_err(corrupt)?.iter() {
        section.data(endian, code).map_err(corrupt)?;
    }
    Ok(code)
}

/// Beyond 48 KiB a kernel's dynamic shared memory needs this attribute set to the amount.
const DYNAMIC_SHARED: sys::CUfunction_attribute =
    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;

fn dynamic_lds(build: &KernelBuild) -> Result<i32, KernelError> {
    i32::try_from(build.dynamic_lds)
        .map_err(|_| unavailable(format!("{} bytes of shared memory", build.dynamic_lds)))
}

/// A build's kernels, loaded.
#[derive(Debug)]
pub struct LoadedKernel {
    functions: Vec<CudaFunction>,
}

/// A tensor map as the driver encodes it, passed to a kernel by value.
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
struct EncodedMap(sys::CUtensorMap);

// SAFETY: a plain 128-byte value with the alignment the kernel's parameter has (kt_tmap).
unsafe impl cudarc::driver::DeviceRepr for EncodedMap {}

/// The driver's encoding of `t` (gpu/launch.rs describes it): a tiled map of 16-bit elements
/// of its rank, innermost dimension first, 128-byte swizzling, zeros past the edges.
fn encode(t: &TensorMap) -> Result<EncodedMap, KernelError> {
    use sys::{
        CUtensorMapDataType as Ty, CUtensorMapFloatOOBfill as Fill,
        CUtensorMapInterleave as Interleave, CUtensorMapL2promotion as L2,
        CUtensorMapSwizzle as Swizzle,
    };
    let (dims, strides, boxes) = (t.dims(), t.strides(), t.boxes());
    let steps = [1u32; 4];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every array holds the rank's entries (strides one fewer); the driver writes
    // the map only.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            if t.bf16 {
                Ty::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
            } else {
                Ty::CU_TENSOR_MAP_DATA_TYPE_FLOAT16
            },
            t.rank,
            t.addr as usize as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            Interleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            Swizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            L2::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            Fill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
    }
    .map_err(|e| driver("encoding a TMA tensor map", e))?;
    // SAFETY: the call succeeded, so the driver wrote the map.
    Ok(EncodedMap(unsafe { map.assume_init() }))
}

/// The driver's encodings of `args`' tensor maps, in order.
fn encode_maps(args: &[Arg]) -> Result<Vec<EncodedMap>, KernelError> {
    args.iter()
        .filter_map(|a| match a {
            Arg::TensorMap(t) => Some(encode(t)),
            _ => None,
        })
        .collect()
}

/// Each launch argument's address for cuLaunchKernel: tensor maps' in `maps` (from
/// [`encode_maps`], outliving the launch), the rest where `args` holds them.
fn params(args: &mut [Arg], maps: &mut [EncodedMap]) -> Vec<*mut std::ffi::c_void> {
    let mut next = maps.iter_mut();
    args.iter_mut()
        .map(|a| match a {
            Arg::TensorMap(_) => {
                let m = next
                    .next()
                    .expect("a map was encoded for each tensor-map argument");
                (&mut m.0 as *mut sys::CUtensorMap).cast()
            }
            a => a.as_param(),
        })
        .collect()
}

impl LoadedKernel {
    /// Queues `launches` in order on `stream`.
    fn launch(&self, stream: &CudaStream, launches: &[Launch]) -> Result<(), KernelError> {
        for l in launches {
            let f = self.functions.get(l.entry).ok_or_else(|| {
                unavailable(format!("the build has no kernel number {}", l.entry))
            })?;
            let maps = encode_maps(&l.args)?;
            let mut maps = maps.iter();
            let mut b = stream.launch_builder(f);
            for a in &l.args {
                match a {
                    Arg::Ptr(p) => b.arg(p),
                    Arg::Int(i) => b.arg(i),
                    Arg::Float(x) => b.arg(x),
                    Arg::TensorMap(_) => b.arg(
                        maps.next()
                            .expect("a map was encoded for each tensor-map argument"),
                    ),
                };
            }
            let cfg = LaunchConfig {
                grid_dim: (l.grid[0], l.grid[1], l.grid[2]),
                block_dim: (l.block, 1, 1),
                shared_mem_bytes: l.shared_bytes,
            };
            // SAFETY: the arguments follow the kernel's signature (gpu::launch); the addresses
            // are the problem's own buffers, sized for it.
            unsafe { b.launch(cfg) }.map_err(|e| driver("launching a kernel", e))?;
        }
        Ok(())
    }
}

/// Inputs on the device: f32, raw 16-bit words, or fp8 bytes.
#[derive(Debug)]
enum DeviceBuf {
    F32(CudaSlice<f32>),
    Half(CudaSlice<u16>),
    Bytes(CudaSlice<u8>),
}

/// One problem's data on the device, a buffer to flush L2 with, and the output.
#[derive(Debug)]
pub struct DeviceProblem {
    problem: Problem,
    inputs: Vec<DeviceBuf>,
    tables: Option<(CudaSlice<u32>, CudaSlice<u32>, usize)>,
    /// Attention with sinks: each query head's sink logit.
    sinks: Option<CudaSlice<f32>>,
    /// Attention with ALiBi: each query head's slope.
    slopes: Option<CudaSlice<f32>>,
    /// Paged attention on fp8 caches: their scales.
    kv_scales: KvScales,
    /// fp8 GEMMs: A's and B's scales.
    /// A GEMM's A scales, B scales and int4 zero points, each where the problem has them.
    gemm_scales: Vec<Option<CudaSlice<f32>>>,
    out: CudaSlice<f32>,
    /// Paged attention: partial outputs, maxima and sums of every partition.
    partials: Option<(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>)>,
    /// GEMM: split-K partial products, as many as any valid config needs.
    workspace: Option<CudaSlice<f32>>,
    flush: CudaSlice<u8>,
}

fn upload(gpu: &CudaGpu, t: &TensorBuf) -> Result<DeviceBuf, KernelError> {
    let err = |e| driver("copying inputs to the device", e);
    // A latent problem's value cache is empty and never read: a word stands in for it, as
    // the driver takes no allocation of nothing.
    if t.is_empty() {
        return Ok(DeviceBuf::Bytes(
            gpu.stream.alloc_zeros::<u8>(16).map_err(err)?,
        ));
    }
    Ok(match t {
        TensorBuf::F32(v) => DeviceBuf::F32(gpu.stream.memcpy_stod(&v[..]).map_err(err)?),
        TensorBuf::F16(v) => {
            let bits: Vec<u16> = v.iter().map(|x| x.to_bits()).collect();
            DeviceBuf::Half(gpu.stream.memcpy_stod(&bits).map_err(err)?)
        }
        TensorBuf::Bf16(v) => {
            let bits: Vec<u16> = v.iter().map(|x| x.to_bits()).collect();
            DeviceBuf::Half(gpu.stream.memcpy_stod(&bits).map_err(err)?)
        }
        TensorBuf::Fp8(_, v) => DeviceBuf::Bytes(gpu.stream.memcpy_stod(&v[..]).map_err(err)?),
        // The words as their bytes (little-endian, as the kernels read them).
        TensorBuf::Int4(_) => {
            DeviceBuf::Bytes(gpu.stream.memcpy_stod(t.view().as_bytes()).map_err(err)?)
        }
    })
}

impl DeviceProblem {
    /// Uploads `data`; `partition` is the smallest paged partition any config will use, which
    /// sizes the partial buffers.
    pub fn upload(
        gpu: &CudaGpu,
        data: &ProblemData,
        min_partition: usize,
    ) -> Result<DeviceProblem, KernelError> {
        let err = |e| driver("allocating device memory", e);
        let inputs = data
            .inputs
            .iter()
            .map(|t| upload(gpu, t))
            .collect::<Result<_, _>>()?;
        let (tables, partials) = match &data.problem {
            Problem::Paged(p) => {
                let parts = p.span().div_ceil(min_partition.max(1));
                let slots = p.num_seqs * p.q_heads * parts;
                (
                    Some((
                        gpu.stream.memcpy_stod(&data.block_tables).map_err(err)?,
                        gpu.stream.memcpy_stod(&data.context_lens).map_err(err)?,
                        data.max_blocks_per_seq,
                    )),
                    Some((
                        gpu.stream
                            .alloc_zeros::<f32>(slots * p.v_head_dim)
                            .map_err(err)?,
                        gpu.stream.alloc_zeros::<f32>(slots).map_err(err)?,
                        gpu.stream.alloc_zeros::<f32>(slots).map_err(err)?,
                    )),
                )
            }
            // Split-KV configs' partial results, at the largest split any may take.
            Problem::Flash(p) => {
                let [o, m, s] = flash_split_workspace(p);
                (
                    None,
                    Some((
                        gpu.stream.alloc_zeros::<f32>(o.max(1)).map_err(err)?,
                        gpu.stream.alloc_zeros::<f32>(m.max(1)).map_err(err)?,
                        gpu.stream.alloc_zeros::<f32>(s.max(1)).map_err(err)?,
                    )),
                )
            }
            _ => (None, None),
        };
        // Twice the L2, zeroed before each timed launch, evicts what the last launch left.
        let flush_bytes = (2 * gpu.info.l2_bytes.max(1) as usize).max(64 << 20);
        Ok(DeviceProblem {
            problem: data.problem,
            inputs,
            tables,
            sinks: match data.sinks.is_empty() {
                true => None,
                false => Some(gpu.stream.memcpy_stod(&data.sinks).map_err(err)?),
            },
            slopes: match data.slopes.is_empty() {
                true => None,
                false => Some(gpu.stream.memcpy_stod(&data.slopes).map_err(err)?),
            },
            kv_scales: data.kv_scales,
            gemm_scales: [&data.a_scales, &data.b_scales, &data.zeros]
                .into_iter()
                .map(|v| match v.is_empty() {
                    true => Ok(None),
                    false => gpu.stream.memcpy_stod(v).map(Some).map_err(err),
                })
                .collect::<Result<Vec<_>, _>>()?,
            out: gpu.stream.alloc_zeros::<f32>(data.out.len()).map_err(err)?,
            partials,
            workspace: match &data.problem {
                Problem::Gemm(p) => Some(
                    gpu.stream
                        .alloc_zeros::<f32>(split_k_workspace(p).max(1))
                        .map_err(err)?,
                ),
                _ => None,
            },
            flush: gpu.stream.alloc_zeros::<u8>(flush_bytes).map_err(err)?,
        })
    }

    /// Launches `config` once (without waiting).
    pub fn launch(
        &mut self,
        gpu: &CudaGpu,
        kernel: &LoadedKernel,
        config: &Config,
    ) -> Result<(), KernelError> {
        let stream = &gpu.stream;
        // The guards order the launch after earlier writes of each buffer; one stream is used
        // throughout, so they are held only until the launch is queued.
        let mut guards = Vec::new();
        let mut addr = |p: (u64, _)| {
            guards.push(p.1);
            p.0
        };
        let mut ptrs = DevicePtrs {
            out: addr(self.out.device_ptr_mut(stream)),
            kv_scales: self.kv_scales,
            ..DevicePtrs::default()
        };
        for (slot, input) in ptrs.inputs.iter_mut().zip(&self.inputs) {
            *slot = match input {
                DeviceBuf::F32(s) => addr(s.device_ptr(stream)),
                DeviceBuf::Half(s) => addr(s.device_ptr(stream)),
                DeviceBuf::Bytes(s) => addr(s.device_ptr(stream)),
            };
        }
        if let Some((tables, lens, max_blocks)) = &self.tables {
            ptrs.block_tables = addr(tables.device_ptr(stream));
            ptrs.context_lens = addr(lens.device_ptr(stream));
            ptrs.max_blocks_per_seq = *max_blocks;
        }
        if let Some(sinks) = &self.sinks {
            ptrs.sinks = addr(sinks.device_ptr(stream));
        }
        if let Some(slopes) = &self.slopes {
            ptrs.slopes = addr(slopes.device_ptr(stream));
        }
        let mut scales = [(0, 0); 3];
        for (slot, buf) in scales.iter_mut().zip(&self.gemm_scales) {
            if let Some(buf) = buf {
                *slot = (addr(buf.device_ptr(stream)), buf.len());
            }
        }
        ptrs.gemm_scales = GemmScalePtrs::of(scales);
        if let Some((o, m, s)) = &mut self.partials {
            ptrs.partials = [
                addr(o.device_ptr_mut(stream)),
                addr(m.device_ptr_mut(stream)),
                addr(s.device_ptr_mut(stream)),
            ];
        }
        if let Some(w) = &mut self.workspace {
            ptrs.partials[0] = addr(w.device_ptr_mut(stream));
        }
        let list = launches(&self.problem, config, &ptrs)?;
        kernel.launch(stream, &list)?;
        drop(guards);
        Ok(())
    }

    /// Runs once and returns the output.
    pub fn run(
        &mut self,
        gpu: &CudaGpu,
        kernel: &LoadedKernel,
        config: &Config,
    ) -> Result<Vec<f32>, KernelError> {
        self.launch(gpu, kernel, config)?;
        gpu.sync()?;
        gpu.stream
            .memcpy_dtov(&self.out)
            .map_err(|e| driver("copying the output back", e))
    }

    /// Times `reps` launches, each after flushing L2, with CUDA events; nanoseconds each.
    pub fn time(
        &mut self,
        gpu: &CudaGpu,
        kernel: &LoadedKernel,
        config: &Config,
        reps: usize,
    ) -> Result<Vec<f64>, KernelError> {
        self.timed(gpu, reps, |me| me.launch(gpu, kernel, config))
    }

    fn timed(
        &mut self,
        gpu: &CudaGpu,
        reps: usize,
        mut launch: impl FnMut(&mut Self) -> Result<(), KernelError>,
    ) -> Result<Vec<f64>, KernelError> {
        let event = || {
            gpu.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| driver("creating a timing event", e))
        };
        // Warm-up: module load, clocks.
        launch(self)?;
        gpu.sync()?;
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            gpu.stream
                .memset_zeros(&mut self.flush)
                .map_err(|e| driver("flushing L2", e))?;
            let (start, end) = (event()?, event()?);
            start
                .record(&gpu.stream)
                .map_err(|e| driver("recording an event", e))?;
            launch(self)?;
            end.record(&gpu.stream)
                .map_err(|e| driver("recording an event", e))?;
            end.synchronize()
                .map_err(|e| driver("a timed kernel failed", e))?;
            let ms = start
                .elapsed_ms(&end)
                .map_err(|e| driver("reading an event", e))?;
            times.push(f64::from(ms) * 1e6);
        }
        Ok(times)
    }

    /// cuBLAS on the same GEMM, as the peer, timed as the kernels are: f32, or f16/bf16 in
    /// with 16-bit output (the GEMM a server calls; cuBLAS's own types through cudarc); with
    /// `f32_out`, 16-bit inputs write f32 as kerntune's kernels do (the same bytes out).
    pub fn time_cublas(
        &mut self,
        gpu: &CudaGpu,
        reps: usize,
        f32_out: bool,
    ) -> Result<Vec<f64>, KernelError> {
        let Problem::Gemm(p) = self.problem else {
            return Err(unavailable("cuBLAS is the GEMM peer only"));
        };
        // B holds words, a quarter of the bytes cuBLAS would read.
        if p.int4.is_some() {
            return Err(unavailable(
                "cuBLAS multiplies dense matrices, not int4 words: time the same shape in bf16",
            ));
        }
        let blas = CudaBlas::new(gpu.stream.clone()).map_err(|e| driver("starting cuBLAS", e))?;
        // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS's first operand is B.
        let (transa, lda) = match p.b_layout {
            BLayout::Kn => (cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N, p.n),
            BLayout::Nk => (cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T, p.k),
        };
        let dims = (p.n as i32, p.m as i32, p.k as i32, lda as i32);
        let mut half_out = gpu
            .stream
            .alloc_zeros::<half::bf16>(p.m * p.n)
            .map_err(|e| driver("allocating device memory", e))?;
        let mut f16_out = gpu
            .stream
            .alloc_zeros::<half::f16>(p.m * p.n)
            .map_err(|e| driver("allocating device memory", e))?;
        let dtype = p.dtype;
        self.timed(gpu, reps, |me| {
            let err = |e| driver("cuBLAS GEMM", e);
            let (n, m, k, lda) = dims;
            match (&me.inputs[0], &me.inputs[1], dtype) {
                (DeviceBuf::Half(a), DeviceBuf::Half(b), dtype) if f32_out => {
                    let in_type = match dtype {
                        crate::DType::Bf16 => cudarc::cublas::sys::cudaDataType_t::CUDA_R_16BF,
                        _ => cudarc::cublas::sys::cudaDataType_t::CUDA_R_16F,
                    };
                    let (alpha, beta) = (1.0f32, 0.0f32);
                    let (a, _ra) = a.device_ptr(&gpu.stream);
                    let (b, _rb) = b.device_ptr(&gpu.stream);
                    let (c, _rc) = me.out.device_ptr_mut(&gpu.stream);
                    // SAFETY: buffers of m·k, k·n and m·n elements, the shapes given; f32
                    // scalars for the f32 compute type, as cuBLAS's table of GemmEx types
                    // has it for 16-bit inputs with f32 output.
                    unsafe {
                        cudarc::cublas::result::gemm_ex(
                            *blas.handle(),
                            transa,
                            cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
                            n,
                            m,
                            k,
                            (&alpha as *const f32).cast(),
                            b as *const _,
                            in_type,
                            lda,
                            a as *const _,
                            in_type,
                            k,
                            (&beta as *const f32).cast(),
                            c as *mut _,
                            cudarc::cublas::sys::cudaDataType_t::CUDA_R_32F,
                            n,
                            cudarc::cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                            cudarc::cublas::sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                        )
                    }
                    .map_err(err)
                }
                (DeviceBuf::F32(a), DeviceBuf::F32(b), _) => {
                    let cfg = gemm_config(transa, n, m, k, lda, 1.0f32, 0.0f32);
                    // SAFETY: buffers of m·k, k·n and m·n elements, the shapes given.
                    unsafe { blas.gemm(cfg, b, a, &mut me.out) }.map_err(err)
                }
                (DeviceBuf::Half(a), DeviceBuf::Half(b), crate::DType::Bf16) => {
                    let (a, b) = (reinterpret::<half::bf16>(a), reinterpret::<half::bf16>(b));
                    let one = half::bf16::ONE;
                    let cfg = gemm_config(transa, n, m, k, lda, one, half::bf16::ZERO);
                    // SAFETY: as above; the 16-bit words are the bf16 values.
                    unsafe { blas.gemm(cfg, &b, &a, &mut half_out) }.map_err(err)
                }
                (DeviceBuf::Half(a), DeviceBuf::Half(b), _) => {
                    let (a, b) = (reinterpret::<half::f16>(a), reinterpret::<half::f16>(b));
                    let one = half::f16::ONE;
                    let cfg = gemm_config(transa, n, m, k, lda, one, half::f16::ZERO);
                    // SAFETY: as above; the 16-bit words are the f16 values.
                    unsafe { blas.gemm(cfg, &b, &a, &mut f16_out) }.map_err(err)
                }
                (DeviceBuf::Bytes(_), DeviceBuf::Bytes(_), _) => Err(unavailable(
                    "an fp8 GEMM as the peer (cuBLAS multiplies fp8 through cuBLASLt, which this peer does not call)",
                )),
                _ => Err(unavailable("mixed input types")),
            }
        })
    }
}

fn gemm_config<T>(
    transa: cudarc::cublas::sys::cublasOperation_t,
    n: i32,
    m: i32,
    k: i32,
    lda: i32,
    alpha: T,
    beta: T,
) -> GemmConfig<T> {
    GemmConfig {
        transa,
        transb: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        m: n,
        n: m,
        k,
        alpha,
        lda,
        ldb: k,
        beta,
        ldc: n,
    }
}

/// The same device memory seen as another 16-bit type.
fn reinterpret<T: cudarc::driver::DeviceRepr>(
    s: &CudaSlice<u16>,
) -> cudarc::driver::CudaView<'_, T> {
    // SAFETY: u16, f16 and bf16 share size and alignment; the bits are the values.
    unsafe { s.transmute::<T>(s.len()) }.expect("same size and alignment")
}

/// A problem on the device with the candidate loaded last, for the tuner's device loop.
struct Loaded<'g> {
    gpu: &'g CudaGpu,
    problem: DeviceProblem,
    kernel: Option<LoadedKernel>,
}

impl super::device::GpuProblem for Loaded<'_> {
    fn load(&mut self, build: &KernelBuild, code: &[u8]) -> Result<(), KernelError> {
        self.kernel = None;
        self.kernel = Some(self.gpu.load(build, code)?);
        Ok(())
    }

    fn run(&mut self, config: &Config) -> Result<Vec<f32>, KernelError> {
        let kernel = self
            .kernel
            .as_ref()
            .ok_or_else(|| unavailable("no kernel loaded"))?;
        self.problem.run(self.gpu, kernel, config)
    }

    fn time(&mut self, config: &Config, reps: usize) -> Result<Vec<f64>, KernelError> {
        let kernel = self
            .kernel
            .as_ref()
            .ok_or_else(|| unavailable("no kernel loaded"))?;
        self.problem.time(self.gpu, kernel, config, reps)
    }
}

impl super::device::GpuDevice for CudaGpu {
    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn name(&self) -> &str {
        &self.info.name
    }

    fn runtime(&self) -> String {
        format!(
            "CUDA driver {}.{}",
            self.info.driver_version / 1000,
            self.info.driver_version % 1000 / 10
        )
    }

    fn is(&self, model: &GpuModel) -> bool {
        self.model()
            .is_some_and(|m| m.arch == model.arch && m.name == model.name)
    }

    fn upload<'g>(
        &'g self,
        data: &ProblemData,
        min_partition: usize,
    ) -> Result<Box<dyn super::device::GpuProblem + 'g>, KernelError> {
        Ok(Box::new(Loaded {
            gpu: self,
            problem: DeviceProblem::upload(self, data, min_partition)?,
            kernel: None,
        }))
    }

    fn load_build(
        &self,
        build: &KernelBuild,
        code: &[u8],
    ) -> Result<Box<dyn super::device::LoadedBuild>, KernelError> {
        Ok(Box::new(RawKernel::load(&self.ctx, build, code)?))
    }
}

/// Tensor maps a runtime build encoded last, by what they describe. A server calls a kernel on
/// the same buffers again and again, and each encode is a driver call on the host before the
/// launch: a TMA GEMM's two would precede every call. A few entries, the oldest replaced
/// (buffers of a server's layers come and go less often than they are reused).
#[derive(Debug)]
struct MapCache<V> {
    entries: std::sync::Mutex<std::collections::VecDeque<(TensorMap, V)>>,
}

/// Tensor maps a runtime build keeps encoded.
const MAP_CACHE_ENTRIES: usize = 16;

impl<V: Copy> MapCache<V> {
    fn new() -> Self {
        MapCache {
            entries: std::sync::Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// `args`' tensor maps in order, each encoded by `encode` unless a map of the same
    /// description is kept.
    fn maps(
        &self,
        args: &[Arg],
        encode: impl Fn(&TensorMap) -> Result<V, KernelError>,
    ) -> Result<Vec<V>, KernelError> {
        // Most launches take no tensor map: those pass without the lock.
        if !args.iter().any(|a| matches!(a, Arg::TensorMap(_))) {
            return Ok(Vec::new());
        }
        // A poisoned lock only means another launch panicked: the entries are whole values.
        let mut kept = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        args.iter()
            .filter_map(|a| match a {
                Arg::TensorMap(t) => Some(t),
                _ => None,
            })
            .map(|t| {
                if let Some((_, v)) = kept.iter().find(|(k, _)| k == t) {
                    return Ok(*v);
                }
                let v = encode(t)?;
                if kept.len() == MAP_CACHE_ENTRIES {
                    kept.pop_front();
                }
                kept.push_back((*t, v));
                Ok(v)
            })
            .collect()
    }
}

/// A build loaded for the runtime library: raw driver handles, launched on a caller's stream,
/// which cudarc's safe launch API (bound to its own streams) cannot take.
#[derive(Debug)]
pub struct RawKernel {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    functions: Vec<sys::CUfunction>,
    maps: MapCache<EncodedMap>,
}

// SAFETY: module and function handles belong to the context, which the driver lets any
// thread use once bound; every use binds it first.
unsafe impl Send for RawKernel {}
// SAFETY: as above; launching mutates nothing here but the map cache, behind its lock.
unsafe impl Sync for RawKernel {}

impl RawKernel {
    fn load(
        ctx: &Arc<CudaContext>,
        build: &KernelBuild,
        code: &[u8],
    ) -> Result<RawKernel, KernelError> {
        ctx.bind_to_thread()
            .map_err(|e| driver("binding the CUDA context", e))?;
        let module = if is_cubin(code) {
            let image = checked_cubin(code)?;
            // SAFETY: an ELF image whose headers and sections lie within it, alive for the call.
            unsafe { cudarc::driver::result::module::load_data(image.as_ptr().cast()) }
                .map_err(|e| driver("loading the CUBIN module", e))?
        } else {
            let image = std::ffi::CString::new(code.strip_suffix(b"\0").unwrap_or(code))
                .map_err(|_| unavailable("the PTX holds a NUL byte"))?;
            // SAFETY: a NUL-terminated PTX image, alive for the call.
            unsafe { cudarc::driver::result::module::load_data(image.as_ptr().cast()) }
                .map_err(|e| driver("loading the PTX module", e))?
        };
        let mut kernel = RawKernel {
            ctx: ctx.clone(),
            module,
            functions: Vec::new(),
            maps: MapCache::new(),
        };
        for e in build.entries {
            let name = std::ffi::CString::new(*e).expect("kernel names have no NUL");
            // SAFETY: the module was just loaded and is not unloaded before `kernel` drops.
            let f = unsafe { cudarc::driver::result::module::get_function(module, name) }
                .map_err(|err| driver(&format!("finding kernel {e}"), err))?;
            kernel.functions.push(f);
        }
        if build.dynamic_lds > 0 {
            // SAFETY: a function of the module just loaded.
            unsafe {
                cudarc::driver::result::function::set_function_attribute(
                    kernel.functions[0],
                    DYNAMIC_SHARED,
                    dynamic_lds(build)?,
                )
            }
            .map_err(|e| driver("allowing the kernel its dynamic shared memory", e))?;
        }
        Ok(kernel)
    }
}

impl Drop for RawKernel {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded by `load`, unloaded once.
            let _ = unsafe { cudarc::driver::result::module::unload(self.module) };
        }
    }
}

impl super::device::LoadedBuild for RawKernel {
    unsafe fn launch(
        &self,
        problem: &Problem,
        config: &Config,
        ptrs: &DevicePtrs,
        stream: u64,
    ) -> Result<(), KernelError> {
        let launches = launches(problem, config, ptrs)?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver("binding the CUDA context", e))?;
        for l in &launches {
            let f = *self.functions.get(l.entry).ok_or_else(|| {
                unavailable(format!("the build has no kernel number {}", l.entry))
            })?;
            let mut args = l.args.clone();
            let mut maps = self.maps.maps(&args, encode)?;
            let mut params = params(&mut args, &mut maps);
            // SAFETY: `params` points at `args` and `maps`, which follow the kernel's
            // signature and outlive the call; the caller vouches for the stream and the
            // addresses.
            unsafe {
                cudarc::driver::result::launch_kernel(
                    f,
                    (l.grid[0], l.grid[1], l.grid[2]),
                    (l.block, 1, 1),
                    l.shared_bytes,
                    stream as usize as sys::CUstream,
                    &mut params,
                )
            }
            .map_err(|e| driver("launching a kernel", e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{
        checked_cubin, driver, is_cubin, is_sticky, lost_or_unavailable, MapCache,
        MAP_CACHE_ENTRIES,
    };
    use std::cell::Cell;

    use cudarc::driver::sys::CUresult as Code;

    use crate::gpu::launch::{Arg, TensorMap};
    use crate::KernelError;

    /// A launch that faulted leaves the context unusable: the device is lost to the process
    /// (the tuner stops its run there); an error that does not stick is the backend's. (A
    /// driver error's text comes from the driver itself, absent here: the codes are checked.)
    #[test]
    fn sticky_driver_errors_lose_the_device() {
        for code in [
            Code::CUDA_ERROR_ILLEGAL_ADDRESS,
            Code::CUDA_ERROR_LAUNCH_FAILED,
            Code::CUDA_ERROR_ILLEGAL_INSTRUCTION,
            Code::CUDA_ERROR_ASSERT,
        ] {
            assert!(is_sticky(code), "{code:?}");
        }
        for code in [
            Code::CUDA_ERROR_OUT_OF_MEMORY,
            Code::CUDA_ERROR_INVALID_VALUE,
            Code::CUDA_ERROR_NO_BINARY_FOR_GPU,
        ] {
            assert!(!is_sticky(code), "{code:?}");
        }
        let lost = lost_or_unavailable("a timed kernel failed: ...".into(), true);
        assert!(lost.to_string().contains("cuda device lost"), "{lost}");
        assert!(matches!(
            driver("starting cuBLAS", "not a driver error"),
            KernelError::BackendUnavailable { .. }
        ));
    }

    #[test]
    fn runtime_launches_encode_each_tensor_map_once_while_it_is_kept() {
        let cache = MapCache::new();
        let encodes = Cell::new(0);
        let encode = |t: &TensorMap| -> Result<u64, KernelError> {
            encodes.set(encodes.get() + 1);
            Ok(t.addr)
        };
        let map = |addr: u64| TensorMap::new(addr, 2048, 8192, (128, 64), true);
        let args = |a: u64, b: u64| {
            vec![
                Arg::Ptr(a),
                Arg::Int(7),
                Arg::TensorMap(map(a)),
                Arg::TensorMap(map(b)),
            ]
        };
        // Two maps a launch, in order; the same buffers again encode nothing.
        assert_eq!(cache.maps(&args(1, 2), encode).unwrap(), [1, 2]);
        assert_eq!(cache.maps(&args(1, 2), encode).unwrap(), [1, 2]);
        assert_eq!(encodes.get(), 2);
        // Another shape of the same buffer is another map.
        let other = [Arg::TensorMap(TensorMap::new(
            1,
            2048,
            4096,
            (128, 64),
            true,
        ))];
        cache.maps(&other, encode).unwrap();
        assert_eq!(encodes.get(), 3);
        // Past the cache's size the oldest go first.
        for addr in 100..100 + MAP_CACHE_ENTRIES as u64 {
            cache.maps(&[Arg::TensorMap(map(addr))], encode).unwrap();
        }
        let before = encodes.get();
        cache.maps(&args(1, 2), encode).unwrap();
        assert_eq!(encodes.get(), before + 2);
        // Launches without maps encode nothing.
        let before = encodes.get();
        assert!(cache.maps(&[Arg::Int(1)], encode).unwrap().is_empty());
        assert_eq!(encodes.get(), before);
        // A failed encode keeps nothing and says why.
        let refuse =
            |_: &TensorMap| -> Result<u64, KernelError> { Err(super::unavailable("no driver")) };
        assert!(cache.maps(&args(5, 6), refuse).is_err());
        assert!(cache.maps(&args(5, 6), encode).is_ok());
    }

    #[test]
    fn a_truncated_or_headless_cubin_is_refused_before_the_driver_reads_it() {
        // Any ELF of this host will do for the checks: this test's own executable.
        let elf = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(is_cubin(&elf) && checked_cubin(&elf).is_ok());
        for bad in [&elf[..elf.len() / 2], &elf[..40], b"\x7fELF".as_slice()] {
            let err = checked_cubin(bad).unwrap_err().to_string();
            assert!(err.contains("is corrupt"), "{} bytes: {err}", bad.len());
        }
        assert!(!is_cubin(
            b"//\n// Generated by NVIDIA NVVM Compiler\n.version 9.0"
        ));
    }
}
