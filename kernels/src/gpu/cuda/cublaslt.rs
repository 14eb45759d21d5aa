//! cuBLASLt as the peer of fp8 GEMMs (W8A8). cuBLAS's own GEMM calls take no fp8; its Lt
//! interface does, as PyTorch's `torch._scaled_mm` calls it on NVIDIA: both operands k-major
//! (B as a Linear layer's `[N, K]` weights), scales in device memory, bf16 out. kerntune's
//! kernels take a scale a row of A and a column of C (vLLM's per-token, per-channel W8A8):
//! cuBLASLt takes the same as vectors (`OUTER_VEC_32F`, cuBLAS 12.9 and later) where its
//! heuristic has an algorithm for them, else the first of each as per-tensor scales, as
//! `_scaled_mm` calls it for per-tensor checkpoints; the row says which it timed. A
//! block-scaled GEMM's peer is the same product scaled per tensor: cuBLASLt's 128-block
//! modes (`VEC128_32F`, `BLK128x128_32F`) want scale layouts of their own, not called here,
//! so its time is a lower bound of cuBLASLt's block-scaled one, and the row says so.

use std::ffi::c_void;

use cudarc::cublaslt::{result as lt, sys as lts};
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::{driver, unavailable, CudaGpu, DeviceProblem};
use crate::problem::GemmProblem;
use crate::{BLayout, Fp8, KernelError, Problem};

/// Bytes of workspace cuBLASLt may use: what PyTorch gives it on Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// The descriptors of one matmul, destroyed when dropped (also on an early error), and the
/// algorithm cuBLASLt's heuristic chose for them.
struct Plan {
    handle: lts::cublasLtHandle_t,
    desc: Option<lts::cublasLtMatmulDesc_t>,
    layouts: Vec<lts::cublasLtMatrixLayout_t>,
    pref: Option<lts::cublasLtMatmulPreference_t>,
    algo: Option<lts::cublasLtMatmulAlgo_t>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each was created once by cuBLASLt and is destroyed once, here.
        unsafe {
            if let Some(p) = self.pref.take() {
                let _ = lt::destroy_matmul_pref(p);
            }
            for l in self.layouts.drain(..) {
                let _ = lt::destroy_matrix_layout(l);
            }
            if let Some(d) = self.desc.take() {
                let _ = lt::destroy_matmul_desc(d);
            }
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

/// Sets one attribute of a matmul descriptor to `value`.
///
/// # Safety
/// `desc` is live and `T` is the attribute's type.
unsafe fn set<T>(
    desc: lts::cublasLtMatmulDesc_t,
    attr: lts::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), KernelError> {
    // SAFETY: the caller's promise; `value` outlives the call, which copies it.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            (value as *const T).cast(),
            std::mem::size_of::<T>(),
        )
    }
    .map_err(|e| driver("setting a cuBLASLt matmul attribute", e))
}

/// How the plan scales the operands: a vector along each (a row of A, a column of C) or one
/// value each.
#[derive(Clone, Copy, PartialEq)]
enum Scales {
    Vectors,
    PerTensor,
}

impl Plan {
    /// cuBLASLt's matmul of `p` (fp8 `format`, B `[N, K]`) into bf16, scaled by the vectors
    /// or first values at `scales` (A's, B's), with its heuristic's first algorithm.
    fn new(
        p: &GemmProblem,
        format: lts::cudaDataType,
        (a_scale, b_scale): (u64, u64),
        scales: Scales,
    ) -> Result<Self, KernelError> {
        let handle = lt::create_handle().map_err(|e| driver("starting cuBLASLt", e))?;
        let mut plan = Plan {
            handle,
            desc: None,
            layouts: Vec::new(),
            pref: None,
            algo: None,
        };
        let desc = lt::create_matmul_desc(
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lts::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| driver("creating a cuBLASLt matmul", e))?;
        plan.desc = Some(desc);
        // Row-major C = A·Bᵀ is column-major Cᵀ = B·Aᵀ: cuBLASLt's A is our B (k-major, read
        // transposed), its B our A; its A's outer vector runs along our n, its B's our m.
        let (transpose, keep) = (
            cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T as i32,
            cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N as i32,
        );
        use lts::cublasLtMatmulDescAttributes_t as Attr;
        // SAFETY: a live descriptor; each value is of its attribute's type (operations and
        // scale modes are int32, scale pointers device addresses).
        unsafe {
            set(desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, &transpose)?;
            set(desc, Attr::CUBLASLT_MATMUL_DESC_TRANSB, &keep)?;
            set(
                desc,
                Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                &(b_scale as *const c_void),
            )?;
            set(
                desc,
                Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                &(a_scale as *const c_void),
            )?;
            if scales == Scales::Vectors {
                let outer =
                    lts::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                        as i32;
                set(desc, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer)?;
                set(desc, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer)?;
            }
        }
        let (m, n, k) = (p.m as u64, p.n as u64, p.k as u64);
        for (t, rows, cols, ld) in [
            (format, k, n, k),
            (format, k, m, k),
            (lts::cudaDataType::CUDA_R_16BF, n, m, n),
        ] {
            let layout = lt::create_matrix_layout(t, rows, cols, ld as i64)
                .map_err(|e| driver("creating a cuBLASLt layout", e))?;
            plan.layouts.push(layout);
        }
        let pref =
            lt::create_matmul_pref().map_err(|e| driver("creating cuBLASLt preferences", e))?;
        plan.pref = Some(pref);
        let bytes = WORKSPACE_BYTES as u64;
        // SAFETY: a live preference; the attribute is a u64.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&bytes as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        }
        .map_err(|e| driver("setting cuBLASLt's workspace", e))?;
        let [a_layout, b_layout, d_layout] = plan.layout();
        // SAFETY: every descriptor is live.
        let heuristic = unsafe {
            lt::get_matmul_algo_heuristic(
                handle, desc, a_layout, b_layout, d_layout, d_layout, pref,
            )
        }
        .map_err(|e| driver("cuBLASLt found no fp8 algorithm for the shape", e))?;
        plan.algo = Some(heuristic.algo);
        Ok(plan)
    }

    /// The layouts of cuBLASLt's A (our B), B (our A) and D.
    fn layout(&self) -> [lts::cublasLtMatrixLayout_t; 3] {
        [self.layouts[0], self.layouts[1], self.layouts[2]]
    }
}

impl DeviceProblem {
    /// cuBLASLt on this fp8 GEMM (OCP E4M3 or E5M2, B `[N, K]`), timed as the kernels are:
    /// its fastest algorithm by its own heuristic, bf16 out, with the problem's scales as
    /// vectors where it takes them, else per tensor (the module's docs); the times, and which
    /// scales it took (why per tensor, where the vectors were refused).
    pub fn time_cublaslt_fp8(
        &mut self,
        gpu: &CudaGpu,
        reps: usize,
    ) -> Result<(Vec<f64>, String), KernelError> {
        let Problem::Gemm(p) = self.problem else {
            return Err(unavailable("cuBLASLt is the GEMM peer only"));
        };
        let format = match p.fp8() {
            Some(Fp8::E4m3) => lts::cudaDataType::CUDA_R_8F_E4M3,
            Some(Fp8::E5m2) => lts::cudaDataType::CUDA_R_8F_E5M2,
            Some(Fp8::E4m3Fnuz) => {
                return Err(unavailable(
                    "E4M3 FNUZ (MI300X's) is no format of cuBLASLt's",
                ))
            }
            None => return Err(unavailable("the cuBLASLt peer times fp8 GEMMs")),
        };
        if p.b_layout != BLayout::Nk {
            return Err(unavailable(
                "cuBLASLt's fp8 GEMMs take both operands k-major: B as [N, K]",
            ));
        }
        let (Some(Some(a_scales)), Some(Some(b_scales))) =
            (self.gemm_scales.first(), self.gemm_scales.get(1))
        else {
            return Err(unavailable("the problem's data has no fp8 scales"));
        };
        // SAFETY: only checks whether the library can be loaded; cudarc panics on first use
        // without it, so this comes before any other call.
        if !unsafe { lts::is_culib_present() } {
            return Err(unavailable(
                "no cuBLASLt (libcublasLt.so) on this host: the CUDA toolkit or PyTorch's nvidia wheels have it",
            ));
        }
        let stream = &gpu.stream;
        // The scales' addresses only: one stream orders every use of them.
        let at = (a_scales.device_ptr(stream).0, b_scales.device_ptr(stream).0);
        let vectors = a_scales.len() == p.m && b_scales.len() == p.n;
        let (plan, scales) = match vectors {
            true => match Plan::new(&p, format, at, Scales::Vectors) {
                Ok(plan) => (plan, "per-token and per-channel scales".to_string()),
                Err(e) => (
                    Plan::new(&p, format, at, Scales::PerTensor)?,
                    format!("per-tensor scales; per-token and per-channel ones refused: {e}"),
                ),
            },
            false => (
                Plan::new(&p, format, at, Scales::PerTensor)?,
                match p.block {
                    Some(block) => format!(
                        "per-tensor scales, not the problem's blocks of {block}: a lower bound of its time"
                    ),
                    None => "per-tensor scales".to_string(),
                },
            ),
        };
        let (Some(desc), Some(algo)) = (plan.desc, plan.algo) else {
            unreachable!("Plan::new returns a plan with its descriptor and algorithm")
        };
        let [a_layout, b_layout, d_layout] = plan.layout();
        let mut out = stream
            .alloc_zeros::<half::bf16>(p.m * p.n)
            .map_err(|e| driver("allocating device memory", e))?;
        let mut workspace = stream
            .alloc_zeros::<u8>(WORKSPACE_BYTES)
            .map_err(|e| driver("allocating device memory", e))?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let raw = stream.cu_stream() as lts::cudaStream_t;
        let times = self.timed(gpu, reps, |me| {
            let (a, _ra) = match &me.inputs[0] {
                super::DeviceBuf::Bytes(s) => s.device_ptr(stream),
                _ => return Err(unavailable("fp8 inputs are bytes")),
            };
            let (b, _rb) = match &me.inputs[1] {
                super::DeviceBuf::Bytes(s) => s.device_ptr(stream),
                _ => return Err(unavailable("fp8 inputs are bytes")),
            };
            let (d, _rd) = out.device_ptr_mut(stream);
            let (w, _rw) = workspace.device_ptr_mut(stream);
            // SAFETY: the descriptors are live (the plan outlives the timing); the buffers
            // are the problem's n·k and m·k bytes, m·n bf16 out (C unread with beta 0) and the
            // workspace of the size the preference allowed, all on this stream.
            unsafe {
                lt::matmul(
                    plan.handle,
                    desc,
                    (&alpha as *const f32).cast(),
                    (&beta as *const f32).cast(),
                    b as *const c_void,
                    a_layout,
                    a as *const c_void,
                    b_layout,
                    d as *const c_void,
                    d_layout,
                    d as *mut c_void,
                    d_layout,
                    &algo,
                    w as *mut c_void,
                    WORKSPACE_BYTES,
                    raw,
                )
            }
            .map_err(|e| driver("cuBLASLt fp8 GEMM", e))
        })?;
        Ok((times, scales))
    }
}
