//! What launching a GPU config means, written once for both vendors: the kernels of a build to
//! launch in order, each with its grid, block size and arguments, over device addresses. The
//! tuner's device paths fill the addresses with their own buffers; the runtime library fills
//! them with a server's. The argument lists follow the signatures in `kernels/hip/`.

use std::ffi::c_void;

use crate::config::{GpuFlashVariant, GpuGemmVariant};
use crate::kernel::KvScales;
use crate::problem::{FlashProblem, GemmProblem};
use crate::space::{
    flash_split_floats, GPU_MAX_FLASH_SPLIT, GPU_MAX_SPLIT_K, GPU_SPLIT_K_WORKSPACE_BYTES,
};
use crate::{Config, DType, KernelError, Problem};

/// One kernel argument, by value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A device address.
    Ptr(u64),
    Int(i32),
    Float(f32),
    /// A tensor map for the tensor-memory copy engine (NVIDIA sm_90), passed by value.
    TensorMap(TensorMap),
}

/// What a TMA tensor map describes: a tensor of 16-bit elements at `addr` of `rank` (2 to
/// 4) dimensions, innermost first: `dims` extents (1 past the rank), dimension 0 contiguous
/// and `strides` the bytes between consecutive indices of the others; copied in boxes of
/// `boxes` elements into shared memory with 128-byte swizzling (rows of 64 elements, as the
/// swizzled wgmma tiles), zeros for elements outside the tensor. The CUDA backend has the
/// driver encode it (`cuTensorMapEncodeTiled`); the host emulator reads the same
/// description from [`TensorMap::words`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorMap {
    pub addr: u64,
    pub rank: u32,
    pub bf16: bool,
    /// The description as the emulator's `kt_tmap` holds it: address, dims 0 and 1, stride
    /// 1, boxes 0 and 1, swizzle bytes, element bytes, then dims 2 and 3, strides 2 and 3,
    /// boxes 2 and 3 (the one copy of them: an argument is at most this large).
    pub words: [u64; 16],
}

impl TensorMap {
    /// A row-major matrix of `rows` × `cols`, in boxes of `box_rows` × `box_cols`.
    pub fn new(
        addr: u64,
        rows: usize,
        cols: usize,
        (box_rows, box_cols): (u32, u32),
        bf16: bool,
    ) -> Self {
        let (rows, cols) = (rows as u64, cols as u64);
        TensorMap::tiled(
            addr,
            2,
            [cols, rows, 1, 1],
            [2 * cols, 0, 0],
            [box_cols, box_rows, 1, 1],
            bf16,
        )
    }

    /// Any rank up to 4: extents, byte strides and box, innermost first.
    pub fn tiled(
        addr: u64,
        rank: u32,
        dims: [u64; 4],
        strides: [u64; 3],
        boxes: [u32; 4],
        bf16: bool,
    ) -> Self {
        let mut words = [0; 16];
        words[..14].copy_from_slice(&[
            addr,
            dims[0],
            dims[1],
            strides[0],
            boxes[0].into(),
            boxes[1].into(),
            128,
            2,
            dims[2],
            dims[3],
            strides[1],
            strides[2],
            boxes[2].into(),
            boxes[3].into(),
        ]);
        TensorMap {
            addr,
            rank,
            bf16,
            words,
        }
    }

    /// Extents, innermost first (1 past the rank).
    pub fn dims(&self) -> [u64; 4] {
        let w = &self.words;
        [w[1], w[2], w[8], w[9]]
    }

    /// Byte strides of dimensions 1 to 3.
    pub fn strides(&self) -> [u64; 3] {
        let w = &self.words;
        [w[3], w[10], w[11]]
    }

    /// The box's extents, innermost first.
    pub fn boxes(&self) -> [u32; 4] {
        let w = &self.words;
        [w[4], w[5], w[12], w[13]].map(|b| b as u32)
    }
}

impl Arg {
    /// The address of the value, as `hipModuleLaunchKernel` / `cuLaunchKernel` take each
    /// argument. A tensor map's is its emulator description: a device backend encodes it
    /// first (CUDA) or refuses it (HIP).
    pub fn as_param(&mut self) -> *mut c_void {
        match self {
            Arg::Ptr(p) => (p as *mut u64).cast(),
            Arg::Int(i) => (i as *mut i32).cast(),
            Arg::Float(x) => (x as *mut f32).cast(),
            Arg::TensorMap(t) => t.words.as_mut_ptr().cast(),
        }
    }
}

/// One kernel launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// Index into the build's entry points.
    pub entry: usize,
    pub grid: [u32; 3],
    /// Blocks a thread-block cluster takes along x (1: no clusters). The CUDA builds declare
    /// it in the kernel (`__cluster_dims__`); the host emulator runs a cluster's blocks
    /// together.
    pub cluster: u32,
    pub block: u32,
    /// Bytes of dynamic shared memory (the build's [`KernelBuild::dynamic_lds`] for its main
    /// kernel, else 0).
    ///
    /// [`KernelBuild::dynamic_lds`]: super::KernelBuild::dynamic_lds
    pub shared_bytes: u32,
    pub args: Vec<Arg>,
}

/// An fp8 GEMM's scales in device memory, f32: `a_len` of them at `a` (1 for the tensor, or
/// one per row of A) and `b_len` at `b` (1, or one per column of C); an int4 GEMM's group
/// scales at `b` and zero points at `zeros` (`zeros_len` 0: none, 8 throughout); nothing
/// for other GEMMs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GemmScalePtrs {
    pub a: u64,
    pub a_len: usize,
    pub b: u64,
    pub b_len: usize,
    pub zeros: u64,
    pub zeros_len: usize,
}

impl GemmScalePtrs {
    /// From A's scales, B's and the zero points as (address, count) pairs, in that order, as a
    /// device path holds its buffers ((0, 0) for one the problem lacks).
    pub fn of([(a, a_len), (b, b_len), (zeros, zeros_len)]: [(u64, usize); 3]) -> Self {
        GemmScalePtrs {
            a,
            a_len,
            b,
            b_len,
            zeros,
            zeros_len,
        }
    }
}

/// Device addresses of one call's operands, and its fp8 caches' or GEMM's scales.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DevicePtrs {
    /// GEMM: A, B. Flash: Q, K, V. Paged: query, key cache, value cache (unread by a latent
    /// problem, whose values are the key rows': 0 will do).
    pub inputs: [u64; 3],
    /// The f32 output, laid out as the CPU kernels lay theirs.
    pub out: u64,
    /// Paged only: `u32` block tables (`num_seqs × max_blocks_per_seq`) and context lengths.
    pub block_tables: u64,
    pub context_lens: u64,
    pub max_blocks_per_seq: usize,
    /// Paged: partial outputs, maxima and sums, of [`partial_slots`] slots (outputs
    /// `v_head_dim` floats per slot). Split-K GEMM: the partial products, in the first.
    /// [`partial_floats`] sizes them.
    pub partials: [u64; 3],
    /// Attention with sinks: the `q_heads` f32 sink logits (0 without).
    pub sinks: u64,
    /// Attention with ALiBi: the `q_heads` f32 slopes (0 without).
    pub slopes: u64,
    /// Paged attention on fp8 caches: their scales (kernel arguments, not buffers).
    pub kv_scales: KvScales,
    /// fp8 GEMMs: A's and B's scales.
    pub gemm_scales: GemmScalePtrs,
}

/// Paged attention's partition slots for `config` (0 for other families): the partial buffers
/// must hold this many.
pub fn partial_slots(problem: &Problem, config: &Config) -> usize {
    match (problem, config) {
        (Problem::Paged(p), Config::GpuPaged(c)) => {
            p.num_seqs * p.q_heads * p.span().div_ceil(c.partition.max(1))
        }
        _ => 0,
    }
}

/// Floats each of the three [`DevicePtrs::partials`] buffers must hold for `config`: paged
/// attention's and split-KV flash attention's partial outputs, maxima and sums; a split-K
/// GEMM's partial products (`split_k` slices of M×N, in the first); nothing otherwise.
pub fn partial_floats(problem: &Problem, config: &Config) -> [usize; 3] {
    match (problem, config) {
        (Problem::Paged(p), Config::GpuPaged(_)) => {
            let slots = partial_slots(problem, config);
            [slots * p.v_head_dim, slots, slots]
        }
        (Problem::Gemm(p), Config::GpuGemm(c)) if c.split_k > 1 => [c.split_k * p.m * p.n, 0, 0],
        (Problem::Flash(p), Config::GpuFlash(c)) => flash_split_floats(p, c.split),
        _ => [0; 3],
    }
}

/// Floats of split-K partial products that any valid config of `problem` needs at most: a
/// device path allocates this once per problem.
pub fn split_k_workspace(problem: &GemmProblem) -> usize {
    let most = GPU_MAX_SPLIT_K * problem.m * problem.n;
    most.min(GPU_SPLIT_K_WORKSPACE_BYTES / 4)
}

/// Floats of split-KV partial results (outputs, maxima, sums) that any valid config of
/// `problem` needs at most: the largest split whose workspace is within the limit.
pub fn flash_split_workspace(problem: &FlashProblem) -> [usize; 3] {
    // Splits are powers of two (validation).
    (0..=GPU_MAX_FLASH_SPLIT.trailing_zeros())
        .rev()
        .map(|e| flash_split_floats(problem, 1 << e))
        .find(|f| 4 * f.iter().sum::<usize>() <= GPU_SPLIT_K_WORKSPACE_BYTES)
        .unwrap_or([0; 3])
}

/// Bytes every input's device address must be a multiple of under `config`: 16 where the
/// kernel reads its inputs in 16-byte pieces (`cp.async` copies, 16-byte loads), else the
/// element size. A device faults on a misaligned access and, on NVIDIA, the context stays
/// unusable after it, so callers' addresses are checked before anything is launched.
pub fn input_alignment(problem: &Problem, config: &Config) -> usize {
    let pieces = match config {
        Config::GpuGemm(c) => {
            c.stages > 1 || matches!(c.variant, GpuGemmVariant::Wgmma | GpuGemmVariant::Skinny)
        }
        Config::GpuFlash(c) => matches!(c.variant, GpuFlashVariant::Mma | GpuFlashVariant::Mfma),
        Config::GpuPaged(c) => c.lanes > 1 || c.mma || c.mfma,
        _ => false,
    };
    if pieces {
        16
    } else {
        problem.dtype().size()
    }
}

/// Bytes B's address must be a multiple of for its elements: an int4 GEMM's are 32-bit words
/// (1 otherwise: [`input_alignment`] covers the elements).
fn b_word_alignment(problem: &Problem) -> usize {
    match problem {
        Problem::Gemm(p) if p.int4.is_some() => 4,
        _ => 1,
    }
}

/// Whether the product kernel stores pairs of f32 results in one 8-byte store: the `mma`
/// and `wgmma` GEMMs with N even, into C, or split along k into the partial products.
fn stores_pairs(problem: &Problem, config: &Config) -> bool {
    matches!((problem, config), (Problem::Gemm(p), Config::GpuGemm(c))
        if p.n.is_multiple_of(2) && matches!(c.variant, GpuGemmVariant::Mma | GpuGemmVariant::Wgmma))
}

/// Bytes the output's device address must be a multiple of under `config`: 8 where the
/// kernel stores pairs of f32 results into C itself (`stores_pairs`, unsplit), else 4. As
/// for the inputs, a misaligned store would fault the device.
pub fn output_alignment(problem: &Problem, config: &Config) -> usize {
    let split = matches!(config, Config::GpuGemm(c) if c.split_k > 1);
    if stores_pairs(problem, config) && !split {
        8
    } else {
        4
    }
}

/// Bytes the first partial-results buffer's device address (a caller's scratch) must be a
/// multiple of under `config`: 8 where the kernel, split along k, stores pairs of partial
/// products (`stores_pairs`; each split's slice of m·n floats, N even, then starts
/// 8-aligned too), else 4.
pub fn partials_alignment(problem: &Problem, config: &Config) -> usize {
    let split = matches!(config, Config::GpuGemm(c) if c.split_k > 1);
    if stores_pairs(problem, config) && split {
        8
    } else {
        4
    }
}

/// The inputs' names, in [`DevicePtrs::inputs`] order.
fn input_names(problem: &Problem) -> &'static [&'static str] {
    match problem {
        Problem::Gemm(_) => &["A", "B"],
        Problem::Flash(_) => &["Q", "K", "V"],
        Problem::Paged(_) => &["query", "key cache", "value cache"],
    }
}

/// An fp8 GEMM's `len` scales at `address` must be there, 4-byte aligned.
fn aligned_scales(name: &'static str, address: u64, len: usize) -> Result<(), KernelError> {
    if address == 0 || !address.is_multiple_of(4) {
        return Err(KernelError::BadBuffer {
            name,
            reason: format!(
                "device address {address:#x}: an fp8 GEMM reads its {len} f32 scales from device memory, 4-byte aligned"
            ),
        });
    }
    Ok(())
}

/// The kernels index with 32-bit integers.
fn too_large(problem: &Problem, field: &'static str, v: usize) -> KernelError {
    KernelError::InvalidProblem {
        family: problem.family(),
        field,
        value: v.to_string(),
        reason: "too large for a GPU launch (32-bit indices)".into(),
    }
}

/// An fp8 GEMM's arguments after the sizes (gemm.hip's `KT_SCALE_PARAMS`): each scale
/// buffer and its step (0: one value, 1: one a row or column; block-scaled: the groups of k,
/// each scale row's length), then the product of the two operands' reading factors. Nothing
/// for other GEMMs, which take no scales.
fn gemm_scale_args(p: &GemmProblem, s: &GemmScalePtrs) -> Result<Vec<Arg>, KernelError> {
    if let Some(group) = p.int4 {
        return int4_scale_args(p, group, s);
    }
    if s.zeros_len > 0 {
        return Err(KernelError::BadArgument {
            name: "zeros",
            reason: format!(
                "holds {} values; zero points apply to int4 GEMMs, and this one's weights are {}: pass none",
                s.zeros_len, p.dtype
            ),
        });
    }
    let Some(format) = p.fp8() else {
        for (name, len) in [("a_scales", s.a_len), ("b_scales", s.b_len)] {
            if len > 0 {
                return Err(KernelError::BadArgument {
                    name,
                    reason: format!(
                        "holds {len} values; scales apply to fp8 GEMMs, and this one's dtype is {}: pass none",
                        p.dtype
                    ),
                });
            }
        }
        return Ok(Vec::new());
    };
    let mut args = Vec::with_capacity(5);
    if let (Some(block), Some((a_len, b_len))) = (p.block, p.block_scale_lens()) {
        for (name, address, len, want, per) in [
            ("a_scales", s.a, s.a_len, a_len, "row of A and group"),
            ("b_scales", s.b, s.b_len, b_len, "block of B"),
        ] {
            if len != want {
                return Err(KernelError::BadArgument {
                    name,
                    reason: format!(
                        "holds {len} values; this block-scaled fp8 GEMM (block = {block}) takes {want}, one per {per} of {block} along k"
                    ),
                });
            }
            aligned_scales(name, address, len)?;
            args.extend([Arg::Ptr(address), Arg::Int(p.k_groups() as i32)]);
        }
        args.push(Arg::Float(format.half_factor() * format.half_factor()));
        return Ok(args);
    }
    for (name, address, len, count, per) in [
        ("a_scales", s.a, s.a_len, p.m, "row of A (token)"),
        (
            "b_scales",
            s.b,
            s.b_len,
            p.n,
            "column of C (output channel)",
        ),
    ] {
        if len != 1 && len != count {
            return Err(KernelError::BadArgument {
                name,
                reason: format!(
                    "holds {len} values; an fp8 GEMM takes one (per tensor) or {count}, one per {per}"
                ),
            });
        }
        aligned_scales(name, address, len)?;
        args.extend([Arg::Ptr(address), Arg::Int(i32::from(len > 1))]);
    }
    args.push(Arg::Float(format.half_factor() * format.half_factor()));
    Ok(args)
}

/// An int4 GEMM's arguments after the sizes: its group scales and zero points, `[K / group,
/// N]` each (zero points absent: a null address, which the kernels read as 8 throughout).
fn int4_scale_args(
    p: &GemmProblem,
    group: usize,
    s: &GemmScalePtrs,
) -> Result<Vec<Arg>, KernelError> {
    let want = p.k / group * p.n;
    let shape = format!(
        "[{}, {}]: one per {group} values of k and column",
        p.k / group,
        p.n
    );
    if s.a_len > 0 {
        return Err(KernelError::BadArgument {
            name: "a_scales",
            reason: format!(
                "holds {} values; an int4 GEMM's activations take no scales: pass none",
                s.a_len
            ),
        });
    }
    if s.b_len != want {
        return Err(KernelError::BadArgument {
            name: "scales",
            reason: format!(
                "holds {} values; this int4 GEMM takes {want}, {shape}",
                s.b_len
            ),
        });
    }
    if s.zeros_len != 0 && s.zeros_len != want {
        return Err(KernelError::BadArgument {
            name: "zeros",
            reason: format!(
                "holds {} values; this int4 GEMM takes none (8 throughout) or {want}, {shape}",
                s.zeros_len
            ),
        });
    }
    for (name, address, len) in [("scales", s.b, s.b_len), ("zeros", s.zeros, s.zeros_len)] {
        if len > 0 && (address == 0 || !address.is_multiple_of(4)) {
            return Err(KernelError::BadBuffer {
                name,
                reason: format!(
                    "device address {address:#x}: an int4 GEMM reads its {len} f32 {name} from device memory, 4-byte aligned"
                ),
            });
        }
    }
    let zeros = if s.zeros_len > 0 { s.zeros } else { 0 };
    Ok(vec![Arg::Ptr(s.b), Arg::Ptr(zeros)])
}

/// The launches of `config` on `problem` over `ptrs`.
pub fn launches(
    problem: &Problem,
    config: &Config,
    ptrs: &DevicePtrs,
) -> Result<Vec<Launch>, KernelError> {
    for (i, (&name, &address)) in input_names(problem).iter().zip(&ptrs.inputs).enumerate() {
        let words = if i == 1 { b_word_alignment(problem) } else { 1 };
        let align = input_alignment(problem, config).max(words);
        if !address.is_multiple_of(align as u64) {
            return Err(KernelError::BadBuffer {
                name,
                reason: format!(
                    "device address {address:#x} is not a multiple of {align} bytes, which `{config}` needs (it reads its inputs in {align}-byte pieces); pass a buffer, or a view into one, that starts on a {align}-byte boundary"
                ),
            });
        }
    }
    let align = output_alignment(problem, config);
    if !ptrs.out.is_multiple_of(align as u64) {
        let out = ptrs.out;
        return Err(KernelError::BadBuffer {
            name: if matches!(problem, Problem::Gemm(_)) { "C" } else { "out" },
            reason: format!(
                "device address {out:#x} is not a multiple of {align} bytes, which `{config}` needs (it stores its f32 results {align} bytes at a time); pass a buffer, or a view into one, whose address is a multiple of {align}"
            ),
        });
    }
    // The kernels of a problem with sinks or ALiBi read their floats: a null address would
    // fault the device.
    for (name, address, len, has, floats) in [
        (
            "sinks",
            ptrs.sinks,
            problem.sinks_len(),
            "sinks",
            "sink logits",
        ),
        (
            "alibi_slopes",
            ptrs.slopes,
            problem.slopes_len(),
            "ALiBi",
            "slopes",
        ),
    ] {
        if len > 0 && (address == 0 || !address.is_multiple_of(4)) {
            return Err(KernelError::BadBuffer {
                name,
                reason: format!(
                    "device address {address:#x}: the problem has {has}, so the call passes its {len} f32 {floats} in device memory, 4-byte aligned"
                ),
            });
        }
    }
    let sinks = Arg::Ptr(ptrs.sinks);
    let slopes = Arg::Ptr(ptrs.slopes);
    // The soft-cap, 0 without one (its builds read it).
    let softcap = |cap: Option<crate::SoftCap>| Arg::Float(cap.map_or(0.0, |c| c.get()));
    // The partial results go to the caller's scratch, stored as the output is.
    let floats = partial_floats(problem, config);
    for (i, (&address, &n)) in ptrs.partials.iter().zip(&floats).enumerate() {
        let align = if i == 0 {
            partials_alignment(problem, config)
        } else {
            4
        };
        if n > 0 && !address.is_multiple_of(align as u64) {
            return Err(KernelError::BadBuffer {
                name: "scratch",
                reason: format!(
                    "device address {address:#x} is not a multiple of {align} bytes, which `{config}` needs (it stores its partial results {align} bytes at a time); pass scratch whose address is a multiple of {align}"
                ),
            });
        }
    }
    let int = |v: usize, field: &'static str| {
        i32::try_from(v)
            .map(Arg::Int)
            .map_err(|_| too_large(problem, field, v))
    };
    // CUDA and HIP both take at most 65535 blocks along y and z.
    let grid = |x: usize, y: usize, z: usize| {
        let dim = |v: usize| u32::try_from(v).map_err(|_| too_large(problem, "grid", v));
        let short = |v: usize, axis: &'static str| {
            if v > 65535 {
                return Err(KernelError::InvalidProblem {
                    family: problem.family(),
                    field: axis,
                    value: v.to_string(),
                    reason: "blocks along y or z of a GPU launch: at most 65535 (a smaller \
                             problem, or larger tiles)"
                        .into(),
                });
            }
            dim(v)
        };
        Ok::<_, KernelError>([dim(x)?, short(y, "grid y")?, short(z, "grid z")?])
    };
    if !config.is_gpu() || matches!(config, Config::Rocblas(_)) {
        return Err(KernelError::InvalidConfig {
            family: problem.family(),
            reason: format!("`{config}` is not a kernel of kernels/hip to launch"),
        });
    }
    // The block size the build was compiled for (KernelBuild::threads), without building the
    // build's macro list on every call.
    let block = config.threads() as u32;
    let [i0, i1, i2] = ptrs.inputs.map(Arg::Ptr);
    let out = Arg::Ptr(ptrs.out);
    Ok(match (problem, config) {
        (Problem::Gemm(p), Config::GpuGemm(c)) => {
            let sizes = [int(p.m, "m")?, int(p.n, "n")?, int(p.k, "k")?];
            let scales = gemm_scale_args(p, &ptrs.gemm_scales)?;
            let shared_bytes = crate::space::dynamic_lds_bytes(config, problem) as u32;
            let tiles = if c.variant == GpuGemmVariant::Wgmma {
                // One row of blocks, each taking `block_tiles` C tiles in the kernel's order
                // (kt_tile_origin); in clusters, each cluster `block_tiles` columns of
                // `cluster` tiles one above the other (a last one past m computes zeros it
                // does not store).
                let cluster = c.cluster.max(1);
                let c_tiles = p.m.div_ceil(c.bm * cluster) * p.n.div_ceil(c.bn);
                grid(
                    cluster * c_tiles.div_ceil(c.block_tiles.max(1)),
                    1,
                    c.split_k,
                )?
            } else {
                grid(p.n.div_ceil(c.bn), p.m.div_ceil(c.bm), c.split_k)?
            };
            // With TMA, A as [M, K] in boxes of bm rows, B as [N, K] in boxes of bn, 64 of k
            // each, after the sizes (and an fp8 GEMM's scales). k counts 16-bit words, as the
            // kernel's tiles do: fp8 bytes two to a word, a box row 128 values (the copy
            // engine moves bits; zeros past the edges are zeros in either format).
            let maps = if c.tma {
                let bf16 = p.dtype == DType::Bf16;
                let words = p.dtype.size().min(2);
                let (k, box_k) = (p.k * words / 2, (c.bk * words / 2) as u32);
                vec![
                    TensorMap::new(ptrs.inputs[0], p.m, k, (c.bm as u32, box_k), bf16),
                    // In a cluster each block copies its share of B's tile.
                    TensorMap::new(
                        ptrs.inputs[1],
                        p.n,
                        k,
                        ((c.bn / c.cluster.max(1)) as u32, box_k),
                        bf16,
                    ),
                ]
            } else {
                Vec::new()
            };
            let product = |dst: Arg| Launch {
                entry: 0,
                grid: tiles,
                cluster: c.cluster.max(1) as u32,
                block,
                shared_bytes,
                args: [
                    vec![i0, i1, dst],
                    sizes.to_vec(),
                    scales.clone(),
                    maps.iter().copied().map(Arg::TensorMap).collect(),
                ]
                .concat(),
            };
            if c.split_k <= 1 {
                vec![product(out)]
            } else {
                // Partial products into the workspace, then their sum into C.
                let ws = Arg::Ptr(ptrs.partials[0]);
                let mn = p.m * p.n;
                vec![
                    product(ws),
                    Launch {
                        entry: 1,
                        grid: grid(mn.div_ceil(block as usize), 1, 1)?,
                        cluster: 1,
                        block,
                        shared_bytes: 0,
                        args: vec![ws, out, int(mn, "m·n")?],
                    },
                ]
            }
        }
        (Problem::Flash(p), Config::GpuFlash(c)) => {
            let sizes = [
                int(p.q_len, "q_len")?,
                int(p.kv_len, "kv_len")?,
                int(p.q_heads, "q_heads")?,
                int(p.kv_heads, "kv_heads")?,
                Arg::Int(i32::from(p.causal)),
            ];
            // The sliding window, 0 without one.
            let window = int(p.window.unwrap_or(0), "window")?;
            // What every flash kernel takes after the sizes (and before any maps).
            let scalars = [
                Arg::Float(p.scale.get()),
                window,
                sinks,
                softcap(p.softcap),
                slopes,
            ];
            let shared_bytes = crate::space::dynamic_lds_bytes(config, problem) as u32;
            let tiles = p.q_len.div_ceil(c.br);
            // With TMA, K and V as [batch, kv_len, kv_heads, head_dim] in boxes of one
            // head's `bc` keys by 64 dims, after the scale.
            let maps: Vec<Arg> = if c.tma {
                let (d, kvh, kv) = (p.head_dim as u64, p.kv_heads as u64, p.kv_len as u64);
                let map = |addr| {
                    Arg::TensorMap(TensorMap::tiled(
                        addr,
                        4,
                        [d, kvh, kv, p.batch as u64],
                        [2 * d, 2 * d * kvh, 2 * d * kvh * kv],
                        [64, 1, c.bc as u32, 1],
                        p.dtype == DType::Bf16,
                    ))
                };
                vec![map(ptrs.inputs[1]), map(ptrs.inputs[2])]
            } else {
                Vec::new()
            };
            if c.split <= 1 {
                vec![Launch {
                    entry: 0,
                    // Heads then batches along x, query tiles along y, the last tile (the
                    // longest, causal) first: kernels/hip/flash.hip's kt_tile. Paired, each
                    // block takes a query tile and its mirror.
                    grid: grid(
                        p.q_heads * p.batch,
                        tiles.div_ceil(if c.paired { 2 } else { 1 }),
                        1,
                    )?,
                    cluster: 1,
                    block,
                    shared_bytes,
                    args: [
                        vec![i0, i1, i2, out],
                        sizes.to_vec(),
                        scalars.to_vec(),
                        maps,
                    ]
                    .concat(),
                }]
            } else {
                // Each tile's keys over `split` blocks (x = head + q_heads · (run + split ·
                // batch)), their partial results into the workspace, then combined into the
                // output (rows of one run written there by the first kernel).
                let [part_out, part_max, part_sum] = ptrs.partials.map(Arg::Ptr);
                let elements = p.out_len();
                vec![
                    Launch {
                        entry: 0,
                        grid: grid(p.q_heads * c.split * p.batch, tiles, 1)?,
                        cluster: 1,
                        block,
                        shared_bytes,
                        args: [
                            vec![i0, i1, i2, out, part_out, part_max, part_sum],
                            sizes.to_vec(),
                            scalars.to_vec(),
                            maps,
                        ]
                        .concat(),
                    },
                    Launch {
                        entry: 1,
                        grid: grid(elements.div_ceil(block as usize), 1, 1)?,
                        cluster: 1,
                        block,
                        shared_bytes: 0,
                        args: [
                            vec![part_out, part_max, part_sum, out],
                            sizes.to_vec(),
                            vec![int(p.batch, "batch")?, window, sinks],
                        ]
                        .concat(),
                    },
                ]
            }
        }
        (Problem::Paged(p), Config::GpuPaged(c)) => {
            // Partitions count from each sequence's first attended token (a window's start).
            let parts = p.span().div_ceil(c.partition.max(1));
            ptrs.kv_scales.check(p)?;
            let (k_factor, v_factor) = ptrs.kv_scales.for_kernels(p);
            let [part_out, part_max, part_sum] = ptrs.partials.map(Arg::Ptr);
            // A latent cache's values are its key rows (KT_DV of each).
            let values = if p.is_latent() { i1 } else { i2 };
            let shared_bytes = crate::space::dynamic_lds_bytes(config, problem) as u32;
            vec![
                Launch {
                    entry: 0,
                    grid: grid(parts, p.q_heads / c.heads, p.num_seqs)?,
                    cluster: 1,
                    block,
                    shared_bytes,
                    args: vec![
                        i0,
                        i1,
                        values,
                        Arg::Ptr(ptrs.block_tables),
                        Arg::Ptr(ptrs.context_lens),
                        part_out,
                        part_max,
                        part_sum,
                        int(p.q_heads, "q_heads")?,
                        int(p.kv_heads, "kv_heads")?,
                        int(ptrs.max_blocks_per_seq, "max_blocks_per_seq")?,
                        int(parts, "partitions")?,
                        Arg::Float(p.scale.get() * k_factor),
                        int(p.window.unwrap_or(0), "window")?,
                        softcap(p.softcap),
                        slopes,
                    ],
                },
                Launch {
                    entry: 1,
                    grid: grid(p.q_heads, p.num_seqs, 1)?,
                    cluster: 1,
                    block,
                    shared_bytes: 0,
                    args: vec![
                        part_out,
                        part_max,
                        part_sum,
                        out,
                        int(p.q_heads, "q_heads")?,
                        int(parts, "partitions")?,
                        sinks,
                        Arg::Float(v_factor),
                    ],
                },
            ]
        }
        _ => {
            return Err(KernelError::FamilyMismatch {
                problem: problem.family(),
                config: config.family(),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::KernelBuild;
    use crate::{Device, GpuFlashConfig, GpuGemmConfig, GpuSpace, Space};

    #[test]
    fn launches_follow_the_kernel_signatures() {
        let device = Device::lookup("mi250").unwrap();
        let ptrs = DevicePtrs {
            inputs: [0x100, 0x200, 0x300],
            out: 4,
            block_tables: 5,
            context_lens: 6,
            max_blocks_per_seq: 7,
            partials: [8, 12, 16],
            sinks: 20,
            slopes: 24,
            kv_scales: KvScales::ONE,
            gemm_scales: GemmScalePtrs::default(),
        };
        for (spec, args) in [
            ("gemm:m=3,n=130,k=5", vec![6]),
            ("flash:q_len=37,q_heads=8,kv_heads=1,head_dim=64", vec![14]),
            (
                "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128",
                vec![16, 8],
            ),
        ] {
            let p: Problem = spec.parse().unwrap();
            let c = GpuSpace.default_config(&p, &device);
            let l = launches(&p, &c, &ptrs).unwrap();
            let build = KernelBuild::new(&p, &c).unwrap();
            assert_eq!(l.len(), build.entries.len(), "{spec}");
            assert_eq!(l.iter().map(|l| l.args.len()).collect::<Vec<_>>(), args);
            for launch in &l {
                assert_eq!(launch.block as usize, build.threads);
                assert!(launch.grid.iter().all(|&g| g >= 1), "{spec}");
            }
            // The output is an argument of the last kernel.
            assert!(l.last().unwrap().args.contains(&Arg::Ptr(4)), "{spec}");
        }
        // A latent cache: the key cache is the values' too, partial rows are v_head_dim wide.
        let latent: Problem =
            "paged:num_seqs=3,context_len=1000,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512"
                .parse()
                .unwrap();
        let c = GpuSpace.default_config(&latent, &device);
        let l = launches(&latent, &c, &ptrs).unwrap();
        assert_eq!(
            &l[0].args[..3],
            &[Arg::Ptr(0x100), Arg::Ptr(0x200), Arg::Ptr(0x200)]
        );
        let slots = partial_slots(&latent, &c);
        assert_eq!(partial_floats(&latent, &c), [slots * 512, slots, slots]);
        let build = KernelBuild::new(&latent, &c).unwrap();
        assert!(
            build.defines.contains(&("KT_DV", 512)),
            "{:?}",
            build.defines
        );
        let p: Problem = "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128"
            .parse()
            .unwrap();
        let c = GpuSpace.default_config(&p, &device);
        let Config::GpuPaged(g) = c else { panic!() };
        assert_eq!(
            partial_slots(&p, &c),
            3 * 8 * 1000usize.div_ceil(g.partition)
        );
        // A window: partitions of the 300 tokens each sequence attends to, the window the
        // kernel's argument before the soft-cap and the slopes (0 without one).
        let windowed: Problem =
            "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128,window=300"
                .parse()
                .unwrap();
        assert_eq!(
            partial_slots(&windowed, &c),
            3 * 8 * 300usize.div_ceil(g.partition)
        );
        for (p, window) in [(&p, 0), (&windowed, 300)] {
            let l = launches(p, &c, &ptrs).unwrap();
            let n = l[0].args.len();
            assert_eq!(l[0].args[n - 3], Arg::Int(window), "{p}");
            assert_eq!(l[0].args[n - 2], Arg::Float(0.0), "{p}");
        }
        // A soft-cap: the argument before the slopes of the flash kernel and of the paged
        // first kernel.
        for spec in [
            "flash:q_len=37,q_heads=8,kv_heads=1,head_dim=64,softcap=30",
            "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128,softcap=30",
        ] {
            let capped: Problem = spec.parse().unwrap();
            let c = GpuSpace.default_config(&capped, &device);
            let l = launches(&capped, &c, &ptrs).unwrap();
            let n = l[0].args.len();
            assert_eq!(l[0].args[n - 2], Arg::Float(30.0), "{spec}");
        }
        // ALiBi: the slopes' address ends the flash kernel's and the paged first kernel's
        // arguments; a problem with ALiBi refuses a launch without them.
        for spec in [
            "flash:q_len=37,q_heads=8,kv_heads=1,head_dim=64,alibi=true",
            "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128,alibi=true",
        ] {
            let biased: Problem = spec.parse().unwrap();
            let c = GpuSpace.default_config(&biased, &device);
            let l = launches(&biased, &c, &ptrs).unwrap();
            assert_eq!(l[0].args.last(), Some(&Arg::Ptr(24)), "{spec}");
            let e = launches(&biased, &c, &DevicePtrs { slopes: 0, ..ptrs })
                .unwrap_err()
                .to_string();
            assert!(e.contains("alibi_slopes") && e.contains("8 f32"), "{e}");
        }
        // Sinks: the address follows the window in every flash kernel (the soft-cap and the
        // slopes after it) and in the paged reduction (the value factor after it); a problem
        // with sinks refuses a launch without them.
        for (spec, from_end) in [
            (
                "flash:q_len=37,q_heads=8,kv_heads=1,head_dim=64,sinks=true",
                3,
            ),
            (
                "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128,sinks=true",
                2,
            ),
        ] {
            let sunk: Problem = spec.parse().unwrap();
            let c = GpuSpace.default_config(&sunk, &device);
            let l = launches(&sunk, &c, &ptrs).unwrap();
            let args = &l.last().unwrap().args;
            assert_eq!(args[args.len() - from_end], Arg::Ptr(20), "{spec}");
            let e = launches(&sunk, &c, &DevicePtrs { sinks: 0, ..ptrs })
                .unwrap_err()
                .to_string();
            assert!(e.contains("sinks") && e.contains("8 f32"), "{e}");
        }
        // Fp8 caches: the key factor (scale times the format's factor from the f16 its
        // bytes are read as) joins the softmax scale, the value factor ends the reduction's
        // arguments; other caches take factors of one and refuse other scales.
        let scales = KvScales { k: 0.5, v: 0.25 };
        for (kv, factor) in [
            ("fp8_e4m3", 256.0),
            ("fp8_e4m3fnuz", 128.0),
            ("fp8_e5m2", 1.0),
        ] {
            let spec = format!(
                "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128,\
                 dtype=bf16,kv_dtype={kv}"
            );
            let fp8: Problem = spec.parse().unwrap();
            let c = GpuSpace.default_config(&fp8, &device);
            let l = launches(
                &fp8,
                &c,
                &DevicePtrs {
                    kv_scales: scales,
                    ..ptrs
                },
            )
            .unwrap();
            let Problem::Paged(pp) = fp8 else { panic!() };
            let first = &l[0].args;
            assert_eq!(
                first[first.len() - 4],
                Arg::Float(pp.scale.get() * 0.5 * factor),
                "{spec}"
            );
            assert_eq!(l[1].args.last(), Some(&Arg::Float(0.25 * factor)), "{spec}");
            let bad = KvScales { k: 0.0, v: 1.0 };
            let e = launches(
                &fp8,
                &c,
                &DevicePtrs {
                    kv_scales: bad,
                    ..ptrs
                },
            )
            .unwrap_err();
            assert!(e.to_string().contains("k_scale"), "{e}");
        }
        assert_eq!(
            launches(&p, &c, &ptrs).unwrap()[1].args.last(),
            Some(&Arg::Float(1.0))
        );
        let e = launches(
            &p,
            &c,
            &DevicePtrs {
                kv_scales: scales,
                ..ptrs
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("fp8"), "{e}");
        let cpu = crate::CpuSpace.default_config(&p, &Device::host());
        assert!(launches(&p, &cpu, &ptrs).is_err());
    }

    /// Flash blocks: heads and batches along x, query tiles along y (the kernel takes them
    /// last first); more tiles than a launch holds along y is an error naming the grid.
    #[test]
    fn flash_tiles_run_along_y_and_past_its_limit_are_refused() {
        let device = Device::lookup("h200").unwrap();
        let ptrs = DevicePtrs::default();
        let grid = |spec: &str, paired: bool| {
            let p: Problem = spec.parse().unwrap();
            let c = Config::GpuFlash(GpuFlashConfig {
                paired,
                ..GpuFlashConfig::new(GpuFlashVariant::Mma, 16, 16, 2)
            });
            GpuSpace.validate(&c, &p, &device).unwrap();
            launches(&p, &c, &ptrs).map(|l| l[0].grid)
        };
        let spec = |q_len: usize| {
            format!("flash:batch=3,q_len={q_len},q_heads=8,kv_heads=1,head_dim=64,dtype=bf16")
        };
        assert_eq!(grid(&spec(37), false).unwrap(), [24, 3, 1]);
        let most = spec(16 * 65535);
        assert_eq!(grid(&most, false).unwrap(), [24, 65535, 1]);
        let over = spec(16 * 65535 + 1);
        let e = grid(&over, false).unwrap_err().to_string();
        assert!(
            e.contains("grid y = 65536") && e.contains("at most 65535"),
            "{e}"
        );
        // Paired, half as many blocks along y: within the limit again.
        assert_eq!(grid(&over, true).unwrap(), [24, 32768, 1]);
    }

    /// Split-KV flash: its blocks heads · split · batch wide, writing the partial buffers, then the
    /// combining kernel over every output element; the workspace at its largest valid split.
    /// TMA GEMM: the two tensor maps after the sizes, describing A [m, k] and B [n, k].
    #[test]
    fn split_flash_and_tma_gemm_launches_carry_their_extra_arguments() {
        let h200 = Device::lookup("h200").unwrap();
        let ptrs = DevicePtrs {
            inputs: [0x1000, 0x2000, 0x3000],
            out: 0x40,
            partials: [8, 12, 16],
            ..DevicePtrs::default()
        };
        let p: Problem = "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16"
            .parse()
            .unwrap();
        let split = GpuSpace
            .candidates(&p, &h200)
            .into_iter()
            .find(|c| matches!(c, Config::GpuFlash(f) if f.split == 4 && f.br == 128))
            .unwrap();
        let l = launches(&p, &split, &ptrs).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].grid, [8 * 4, 16, 1]);
        assert_eq!(
            &l[0].args[3..7],
            &[Arg::Ptr(0x40), Arg::Ptr(8), Arg::Ptr(12), Arg::Ptr(16)]
        );
        assert_eq!(
            &l[1].args[..4],
            &[Arg::Ptr(8), Arg::Ptr(12), Arg::Ptr(16), Arg::Ptr(0x40)]
        );
        assert_eq!(l[1].grid[0] as usize * 256, 2048 * 8 * 128);
        assert_eq!(
            partial_floats(&p, &split),
            [4 * 2048 * 8 * 128, 4 * 2048 * 8, 4 * 2048 * 8]
        );
        // Narrow value heads: the reduction runs over output rows of v_head_dim, the
        // partial rows as wide, the build told the width.
        let narrow: Problem =
            "flash:q_len=2048,q_heads=8,kv_heads=8,head_dim=192,v_head_dim=128,dtype=bf16"
                .parse()
                .unwrap();
        let split_narrow = GpuSpace
            .candidates(&narrow, &h200)
            .into_iter()
            .find(|c| matches!(c, Config::GpuFlash(f) if f.split == 4 && f.br == 64))
            .unwrap();
        let l = launches(&narrow, &split_narrow, &ptrs).unwrap();
        assert_eq!(l[1].grid[0] as usize * 128, 2048 * 8 * 128);
        assert_eq!(
            partial_floats(&narrow, &split_narrow),
            [4 * 2048 * 8 * 128, 4 * 2048 * 8, 4 * 2048 * 8]
        );
        let build = KernelBuild::new(&narrow, &split_narrow).unwrap();
        assert!(
            build.defines.contains(&("KT_DV", 128)),
            "{:?}",
            build.defines
        );
        let Problem::Flash(f) = p else { unreachable!() };
        // Eight runs would need 68 MB: the workspace holds four.
        assert_eq!(flash_split_workspace(&f), flash_split_floats(&f, 4));
        // Flash by TMA: K's and V's 4D maps (dims, heads, keys, batches) after the scale,
        // a box one head's 128 keys by 64 dims.
        let Config::GpuFlash(s) = split else {
            unreachable!()
        };
        let by_tma = Config::GpuFlash(GpuFlashConfig {
            specialized: true,
            tma: true,
            ..s
        });
        GpuSpace.validate(&by_tma, &p, &h200).unwrap();
        let l = launches(&p, &by_tma, &ptrs).unwrap();
        // (Scale, window, sinks, soft-cap, slopes, then the maps.)
        let [.., Arg::Float(_), Arg::Int(0), Arg::Ptr(0), Arg::Float(_), Arg::Ptr(0), Arg::TensorMap(k), Arg::TensorMap(v)] =
            l[0].args[..]
        else {
            panic!("{:?}", l[0].args)
        };
        assert_eq!((k.addr, v.addr, k.rank), (0x2000, 0x3000, 4));
        assert_eq!(k.dims(), [128, 1, 2048, 1]);
        assert_eq!(k.strides(), [256, 256, 256 * 2048]);
        assert_eq!(k.boxes(), [64, 1, 128, 1]);
        assert_eq!(
            l[1].args.len(),
            4 + 5 + 3,
            "the combining kernel takes no maps"
        );

        let p: Problem = "gemm:m=2048,n=7168,k=8192,dtype=bf16".parse().unwrap();
        let tma = GpuSpace
            .candidates(&p, &h200)
            .into_iter()
            .find(|c| matches!(c, Config::GpuGemm(g) if g.tma))
            .unwrap();
        let Config::GpuGemm(g) = tma else {
            unreachable!()
        };
        let l = launches(&p, &tma, &ptrs).unwrap();
        let [.., Arg::TensorMap(a), Arg::TensorMap(b)] = l[0].args[..] else {
            panic!("{:?}", l[0].args)
        };
        assert_eq!((a.addr, a.rank, a.dims()), (0x1000, 2, [8192, 2048, 1, 1]));
        assert_eq!((b.addr, b.rank, b.dims()), (0x2000, 2, [8192, 7168, 1, 1]));
        assert_eq!(a.boxes(), [64, g.bm as u32, 1, 1]);
        assert_eq!(b.boxes(), [64, g.bn as u32, 1, 1]);
        assert_eq!(
            &a.words[..8],
            &[0x1000, 8192, 2048, 16384, 64, g.bm as u64, 128, 2]
        );
        // wgmma blocks in one row, each taking `block_tiles` of the 512 C tiles of 128×224.
        assert_eq!((g.bm, g.bn), (128, 224));
        assert_eq!(l[0].grid, [512, 1, 1]);
        let four = Config::GpuGemm(GpuGemmConfig {
            block_tiles: 4,
            cluster: 1,
            ..g
        });
        assert_eq!(launches(&p, &four, &ptrs).unwrap()[0].grid, [128, 1, 1]);
        let three = Config::GpuGemm(GpuGemmConfig {
            block_tiles: 3,
            cluster: 1,
            ..g
        });
        assert_eq!(launches(&p, &three, &ptrs).unwrap()[0].grid, [171, 1, 1]);
    }

    #[test]
    fn dynamic_shared_memory_goes_with_the_launch_up_to_the_models_limit() {
        let p: Problem = "gemm:m=2048,n=7168,k=8192,dtype=bf16".parse().unwrap();
        let h200 = Device::lookup("h200").unwrap();
        let config = GpuSpace.heuristic(&p, &h200);
        let Config::GpuGemm(c) = config else {
            unreachable!()
        };
        // 128×256, three stages of 32: 90 KiB, past the 48 KiB of static shared memory.
        assert_eq!((c.bm, c.bn, c.stages), (128, 256, 3));
        let build = KernelBuild::new(&p, &config).unwrap();
        assert_eq!(build.dynamic_lds, 2 * 3 * (128 + 256) * 40);
        assert!(build.key().contains("KT_DYN_LDS=92160"), "{}", build.key());
        GpuSpace.validate(&config, &p, &h200).unwrap();
        let l = launches(&p, &config, &DevicePtrs::default()).unwrap();
        assert_eq!(l[0].shared_bytes as usize, build.dynamic_lds);
        // Four stages of 64 on 256×128: 216 KiB, within an H200's 227 KiB a block, past an
        // A100's 163 KiB.
        let big = Config::GpuGemm(GpuGemmConfig {
            bm: 256,
            bn: 128,
            bk: 64,
            stages: 4,
            ..c
        });
        GpuSpace.validate(&big, &p, &h200).unwrap();
        let e = GpuSpace
            .validate(&big, &p, &Device::lookup("a100").unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("221184 bytes of shared memory per block"), "{e}");
        // Builds with static shared memory only launch with none.
        let tiled = GpuSpace.default_config(&p, &h200);
        assert_eq!(KernelBuild::new(&p, &tiled).unwrap().dynamic_lds, 0);
        assert_eq!(
            launches(&p, &tiled, &DevicePtrs::default()).unwrap()[0].shared_bytes,
            0
        );
    }

    #[test]
    fn misaligned_inputs_are_refused_before_any_launch() {
        let h200 = Device::lookup("h200").unwrap();
        let p: Problem = "gemm:m=1,n=1280,k=8192,dtype=bf16".parse().unwrap();
        let aligned = DevicePtrs {
            inputs: [0x1000, 0x2000, 0],
            ..DevicePtrs::default()
        };
        // B 8 bytes past a 16-byte boundary: fine for element loads, not for 16-byte ones.
        let off = DevicePtrs {
            inputs: [0x1000, 0x2008, 0],
            ..aligned
        };
        let candidates = GpuSpace.candidates(&p, &h200);
        let pieces = |c: &&Config| input_alignment(&p, c) == 16;
        let skinny = *candidates.iter().find(pieces).unwrap();
        assert!(matches!(skinny, Config::GpuGemm(g) if g.variant == GpuGemmVariant::Skinny));
        launches(&p, &skinny, &aligned).unwrap();
        let e = launches(&p, &skinny, &off).unwrap_err().to_string();
        assert!(
            e.contains("`B`") && e.contains("0x2008") && e.contains("16 bytes"),
            "{e}"
        );
        let tiled = GpuSpace.default_config(&p, &h200);
        assert_eq!(input_alignment(&p, &tiled), 2);
        launches(&p, &tiled, &off).unwrap();
        // An odd address is wrong for every 16-bit kernel; the name says which input.
        let odd = DevicePtrs {
            inputs: [0x1001, 0x2000, 0],
            ..aligned
        };
        let e = launches(&p, &tiled, &odd).unwrap_err().to_string();
        assert!(e.contains("`A`") && e.contains("2 bytes"), "{e}");
        // C 4 bytes past an 8-byte boundary: fine for single floats, not for the pairs the
        // mma GEMM stores into C (N even); split K stores C a float at a time.
        let c_off = DevicePtrs {
            out: 0x4004,
            ..aligned
        };
        let prefill: Problem = "gemm:m=2048,n=1280,k=8192,dtype=bf16".parse().unwrap();
        let mma = GpuSpace.heuristic(&prefill, &h200);
        assert!(
            matches!(mma, Config::GpuGemm(g) if g.variant == GpuGemmVariant::Mma && g.split_k == 1),
            "{mma}"
        );
        let e = launches(&prefill, &mma, &c_off).unwrap_err().to_string();
        assert!(
            e.contains("`C`") && e.contains("0x4004") && e.contains("8 bytes"),
            "{e}"
        );
        let c_even = DevicePtrs {
            out: 0x4008,
            ..aligned
        };
        launches(&prefill, &mma, &c_even).unwrap();
        launches(&p, &tiled, &c_off).unwrap();
        let odd_n: Problem = "gemm:m=2048,n=1279,k=8192,dtype=bf16".parse().unwrap();
        assert_eq!(output_alignment(&odd_n, &mma), 4);
        let split = candidates
            .iter()
            .find(|c| matches!(c, Config::GpuGemm(g) if g.variant == GpuGemmVariant::Mma && g.split_k > 1))
            .unwrap();
        assert_eq!(output_alignment(&p, split), 4);
        launches(&p, split, &c_off).unwrap();
        // Grouped paged attention reads the caches in 16-byte pieces too.
        let paged: Problem = "paged:num_seqs=2,context_len=100,q_heads=8,kv_heads=1,head_dim=128"
            .parse()
            .unwrap();
        let grouped = GpuSpace
            .candidates(&paged, &h200)
            .into_iter()
            .find(|c| matches!(c, Config::GpuPaged(g) if g.lanes > 1))
            .unwrap();
        let cache_off = DevicePtrs {
            inputs: [0x1000, 0x2000, 0x3004],
            ..aligned
        };
        let e = launches(&paged, &grouped, &cache_off)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`value cache`"), "{e}");
        launches(&paged, &GpuSpace.default_config(&paged, &h200), &cache_off).unwrap();
    }

    #[test]
    fn split_k_writes_partials_then_sums_them_into_c() {
        let h200 = Device::lookup("h200").unwrap();
        let p: Problem = "gemm:m=16,n=1280,k=8192,dtype=bf16".parse().unwrap();
        let Config::GpuGemm(mut c) = GpuSpace.heuristic(&p, &h200) else {
            unreachable!()
        };
        c.split_k = 4;
        let config = Config::GpuGemm(c);
        let ptrs = DevicePtrs {
            inputs: [0x100, 0x200, 0],
            out: 4,
            partials: [8, 0, 0],
            ..DevicePtrs::default()
        };
        let l = launches(&p, &config, &ptrs).unwrap();
        let build = KernelBuild::new(&p, &config).unwrap();
        assert_eq!(build.entries, ["kt_gemm", "kt_gemm_reduce"]);
        assert_eq!(l.len(), 2);
        assert_eq!((l[0].entry, l[0].grid), (0, [1280 / c.bn as u32, 1, 4]));
        assert_eq!(l[0].args[2], Arg::Ptr(8), "the partials, not C");
        assert_eq!(l[0].shared_bytes as usize, build.dynamic_lds);
        assert_eq!(l[1].shared_bytes, 0);
        assert_eq!(
            l[1].args,
            [Arg::Ptr(8), Arg::Ptr(4), Arg::Int(16 * 1280)].to_vec()
        );
        assert_eq!(
            l[1].grid[0] as usize,
            (16 * 1280usize).div_ceil(build.threads)
        );
        assert_eq!(partial_floats(&p, &config), [4 * 16 * 1280, 0, 0]);
        // Any valid split fits the workspace a device path allocates per problem.
        let Problem::Gemm(g) = p else { unreachable!() };
        assert!(split_k_workspace(&g) >= 16 * 16 * 1280);
    }

    /// The partial results are stored as the output is: a split `mma` GEMM writes pairs of
    /// partial products 8 bytes at a time, so scratch at an address 4 bytes off is refused by
    /// name instead of faulting the device; one that writes floats singly takes it; paged
    /// attention's three partial buffers need float alignment.
    #[test]
    fn misaligned_scratch_is_refused_by_name() {
        let h200 = Device::lookup("h200").unwrap();
        let p: Problem = "gemm:m=16,n=1280,k=8192,dtype=bf16".parse().unwrap();
        let mma = GpuSpace
            .candidates(&p, &h200)
            .into_iter()
            .find(|c| matches!(c, Config::GpuGemm(g) if g.variant == GpuGemmVariant::Mma && g.split_k == 4))
            .unwrap();
        assert_eq!(partials_alignment(&p, &mma), 8);
        let at = |scratch: u64| DevicePtrs {
            inputs: [0x100, 0x200, 0],
            out: 0x400,
            partials: [scratch, 0, 0],
            ..DevicePtrs::default()
        };
        launches(&p, &mma, &at(0x1008)).unwrap();
        let e = launches(&p, &mma, &at(0x1004)).unwrap_err();
        assert!(
            matches!(
                e,
                KernelError::BadBuffer {
                    name: "scratch",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("0x1004") && e.to_string().contains("multiple of 8"),
            "{e}"
        );
        // Unsplit, the scratch is not used: any address.
        let whole = GpuSpace.default_config(&p, &h200);
        launches(&p, &whole, &at(0x1001)).unwrap();
        let paged: Problem = "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128"
            .parse()
            .unwrap();
        let config = GpuSpace.default_config(&paged, &h200);
        let three = |maxima: u64| DevicePtrs {
            inputs: [0x100, 0x200, 0x300],
            out: 0x400,
            block_tables: 0x500,
            context_lens: 0x600,
            max_blocks_per_seq: 63,
            partials: [0x1000, maxima, 0x3000],
            sinks: 0,
            slopes: 0,
            kv_scales: KvScales::ONE,
            gemm_scales: GemmScalePtrs::default(),
        };
        launches(&paged, &config, &three(0x2000)).unwrap();
        let e = launches(&paged, &config, &three(0x2002)).unwrap_err();
        assert!(e.to_string().contains("0x2002"), "{e}");
    }

    /// An fp8 GEMM's scales go after the sizes with their steps and the readings' factor
    /// squared; scales missing, misaligned or of a wrong count are refused by name before
    /// anything launches, and scales given to a 16-bit GEMM too.
    #[test]
    fn fp8_gemm_scales_follow_the_sizes_and_are_checked_by_name() {
        let h200 = Device::lookup("h200").unwrap();
        let p: Problem = "gemm:m=4,n=1280,k=8192,dtype=fp8_e4m3".parse().unwrap();
        let scales = |a: u64, a_len: usize, b: u64, b_len: usize| DevicePtrs {
            inputs: [0x100, 0x200, 0],
            out: 0x400,
            partials: [0x1000, 0, 0],
            gemm_scales: GemmScalePtrs {
                a,
                a_len,
                b,
                b_len,
                ..GemmScalePtrs::default()
            },
            ..DevicePtrs::default()
        };
        for config in GpuSpace.candidates(&p, &h200) {
            let l = launches(&p, &config, &scales(0x700, 4, 0x800, 1280)).unwrap();
            let Config::GpuGemm(g) = config else {
                unreachable!("a GEMM config")
            };
            // The TMA wgmma tiles' maps after them: the bytes as 16-bit words, boxes of 128
            // bytes.
            if g.tma {
                let [.., Arg::TensorMap(a), Arg::TensorMap(b)] = l[0].args[..] else {
                    panic!("{config}: no tensor maps")
                };
                assert_eq!((a.dims(), a.boxes()[0]), ([4096, 4, 1, 1], 64));
                assert_eq!((b.dims(), b.strides()[0]), ([4096, 1280, 1, 1], 8192));
            }
            let args = &l[0].args[3..11];
            assert_eq!(
                args,
                [
                    Arg::Int(4),
                    Arg::Int(1280),
                    Arg::Int(8192),
                    Arg::Ptr(0x700),
                    Arg::Int(1),
                    Arg::Ptr(0x800),
                    Arg::Int(1),
                    Arg::Float(65536.0),
                ],
                "{config}"
            );
        }
        let config = GpuSpace.heuristic(&p, &h200);
        let tensor = launches(&p, &config, &scales(0x700, 1, 0x800, 1)).unwrap();
        assert_eq!(tensor[0].args[7], Arg::Int(0));
        assert_eq!(tensor[0].args[9], Arg::Int(0));
        for (bad, name, says) in [
            (scales(0, 0, 0x800, 1), "a_scales", "holds 0 values"),
            (
                scales(0x700, 3, 0x800, 1),
                "a_scales",
                "one (per tensor) or 4",
            ),
            (scales(0x700, 1, 0x800, 2), "b_scales", "or 1280"),
            (scales(0x700, 1, 0, 1), "b_scales", "device address 0x0"),
            (scales(0x702, 1, 0x800, 1), "a_scales", "4-byte aligned"),
        ] {
            let e = launches(&p, &config, &bad).unwrap_err();
            assert!(
                matches!(&e, KernelError::BadArgument { name: n, .. } | KernelError::BadBuffer { name: n, .. } if *n == name),
                "{e}"
            );
            assert!(e.to_string().contains(says), "{e}");
        }
        let bf16: Problem = "gemm:m=4,n=1280,k=8192,dtype=bf16".parse().unwrap();
        let config = GpuSpace.heuristic(&bf16, &h200);
        let e = launches(&bf16, &config, &scales(0x700, 1, 0x800, 1)).unwrap_err();
        assert!(e.to_string().contains("pass none"), "{e}");
        launches(&bf16, &config, &scales(0, 0, 0, 0)).unwrap();
    }

    /// An int4 GEMM's scales and zero points go after the sizes (no zero points: a null
    /// address, 8 in the kernels); counts other than `[K / group, N]`, A scales, misaligned
    /// scales and words at an address off 4 bytes are refused by name before any launch, and
    /// zero points given to a dense GEMM too.
    #[test]
    fn int4_scales_and_zero_points_follow_the_sizes_and_are_checked_by_name() {
        let h200 = Device::lookup("h200").unwrap();
        let p: Problem = "gemm:m=2048,n=1280,k=8192,dtype=f16,b=kn,int4=128"
            .parse()
            .unwrap();
        let tiled = GpuSpace.default_config(&p, &h200);
        let at = |b: u64, scales: (u64, usize), zeros: (u64, usize)| DevicePtrs {
            inputs: [0x100, b, 0],
            out: 0x400,
            gemm_scales: GemmScalePtrs {
                b: scales.0,
                b_len: scales.1,
                zeros: zeros.0,
                zeros_len: zeros.1,
                ..GemmScalePtrs::default()
            },
            ..DevicePtrs::default()
        };
        let groups = 64 * 1280;
        let args = |ptrs| launches(&p, &tiled, &ptrs).map(|l| l[0].args[6..].to_vec());
        assert_eq!(
            args(at(0x200, (0x800, groups), (0x900, groups))).unwrap(),
            [Arg::Ptr(0x800), Arg::Ptr(0x900)]
        );
        assert_eq!(
            args(at(0x200, (0x800, groups), (0, 0))).unwrap(),
            [Arg::Ptr(0x800), Arg::Ptr(0)]
        );
        for (ptrs, name, needle) in [
            (
                at(0x200, (0x800, 1280), (0, 0)),
                "scales",
                "takes 81920, [64, 1280]",
            ),
            (
                at(0x200, (0x800, groups), (0x900, 5)),
                "zeros",
                "none (8 throughout) or 81920",
            ),
            (
                at(0x200, (0x802, groups), (0, 0)),
                "scales",
                "4-byte aligned",
            ),
            (
                at(0x202, (0x800, groups), (0, 0)),
                "B",
                "multiple of 4 bytes",
            ),
        ] {
            let e = launches(&p, &tiled, &ptrs).unwrap_err();
            let named = match &e {
                KernelError::BadArgument { name, .. } | KernelError::BadBuffer { name, .. } => {
                    *name
                }
                _ => "",
            };
            assert_eq!(named, name, "{e}");
            assert!(e.to_string().contains(needle), "{e}");
        }
        let mut a_scaled = at(0x200, (0x800, groups), (0, 0));
        a_scaled.gemm_scales.a_len = 1;
        let e = launches(&p, &tiled, &a_scaled).unwrap_err();
        assert!(e.to_string().contains("take no scales"), "{e}");
        let dense: Problem = "gemm:m=2048,n=1280,k=8192,dtype=f16,b=kn".parse().unwrap();
        let e = launches(&dense, &tiled, &at(0x200, (0, 0), (0x900, groups))).unwrap_err();
        assert!(
            e.to_string().contains("zero points apply to int4 GEMMs"),
            "{e}"
        );
    }
}
