//! The GPU kernel sources, compiled into the binary, and the `-D` macros a config turns into.

use serde::Serialize;

use super::metadata::KernelResources;
use crate::config::{GpuFlashVariant, GpuGemmVariant};
use crate::{BLayout, Config, DType, Family, KernelError, Problem};

/// Hash of `kernels/hip/`: GPU results are bound to it as CPU results are to theirs.
pub const GPU_SOURCE_HASH: &str = env!("KERNTUNE_GPU_SOURCE_HASH");

pub(crate) const PRELUDE: &str = include_str!("../../hip/prelude.h");
const GEMM: &str = include_str!("../../hip/gemm.hip");
const FLASH: &str = include_str!("../../hip/flash.hip");
const PAGED: &str = include_str!("../../hip/paged.hip");

/// A family's kernel source, as written (it includes the prelude).
pub(crate) fn body_of(family: Family) -> &'static str {
    match family {
        Family::Gemm => GEMM,
        Family::Flash => FLASH,
        Family::Paged => PAGED,
    }
}

/// One compile: a family's source with the macros of a config and the static parts of a
/// problem (dtype, layout, head size). Problems that differ only in sizes passed at launch
/// share it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct KernelBuild {
    pub family: Family,
    /// The source file under `kernels/hip/`.
    pub file: &'static str,
    /// `-D` macros, in a fixed order.
    pub defines: Vec<(&'static str, usize)>,
    /// Entry points the code object must contain.
    pub entries: &'static [&'static str],
    /// Threads per block it is compiled and launched with.
    pub threads: usize,
    /// Bytes of dynamic shared memory its main kernel takes at launch (0: static only);
    /// also the `KT_DYN_LDS` macro, which sizes the emulator's copy.
    pub dynamic_lds: usize,
    /// Uses instructions of one architecture only (wgmma: NVIDIA's `sm_90a` target, whose
    /// code runs on sm_90 and no later architecture), so compiles for that target.
    pub arch_specific: bool,
    /// Registers a thread its main kernel must launch with (0: any). A warp-specialized
    /// build's warpgroups trade registers through the block's pool (`setmaxnreg`), which
    /// holds what the block launched with: launched with fewer than its split shares out,
    /// the warpgroups asking for more would wait forever. The compiler's report of each
    /// build is checked against it.
    pub launch_registers: u32,
}

fn dtype_code(d: DType) -> usize {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Bf16 => 2,
        // GEMM operands only (attention refuses them as its dtype); the E4M3 formats read
        // alike, their factors are the host's (launch.rs).
        DType::Fp8(crate::Fp8::E4m3 | crate::Fp8::E4m3Fnuz) => 3,
        DType::Fp8(crate::Fp8::E5m2) => 4,
    }
}

/// The prelude's `KT_KV_FP8`: the E4M3 formats read alike (their factor is the host's).
fn kv_fp8_code(f: crate::Fp8) -> usize {
    match f {
        crate::Fp8::E4m3 | crate::Fp8::E4m3Fnuz => 1,
        crate::Fp8::E5m2 => 2,
    }
}

impl KernelBuild {
    /// The build of `config` for `problem`; an error for CPU configs and family mismatches.
    pub fn new(problem: &Problem, config: &Config) -> Result<KernelBuild, KernelError> {
        // Block-scaled fp8 only on the variants that read its scales: every GPU backend (and
        // the plan) builds through here, so none runs one as a per-channel GEMM.
        if let (Problem::Gemm(p), Config::GpuGemm(c)) = (problem, config) {
            crate::space::gemm_kernel_for(c, p)?;
        }
        let dynamic_lds = crate::space::dynamic_lds_bytes(config, problem);
        let mut build = match (problem, config) {
            (Problem::Gemm(p), Config::GpuGemm(c)) => KernelBuild {
                family: Family::Gemm,
                file: "gemm.hip",
                defines: vec![
                    ("KT_DTYPE", dtype_code(p.dtype)),
                    (
                        "KT_VARIANT",
                        match c.variant {
                            GpuGemmVariant::Tiled => 0,
                            GpuGemmVariant::Mfma => 1,
                            GpuGemmVariant::Mma => 2,
                            GpuGemmVariant::Wgmma => 3,
                            GpuGemmVariant::Skinny => 4,
                        },
                    ),
                    ("KT_BM", c.bm),
                    ("KT_BN", c.bn),
                    ("KT_BK", c.bk),
                    ("KT_TM", c.tm),
                    ("KT_TN", c.tn),
                    ("KT_B_NK", usize::from(p.b_layout == BLayout::Nk)),
                    ("KT_STAGES", c.stages),
                    ("KT_SPLIT", c.split_k),
                ]
                .into_iter()
                // Only when set, so the builds of unswizzled configs keep their cache keys.
                .chain((c.swizzle > 0).then_some(("KT_SWIZZLE", c.swizzle)))
                .chain(c.specialized.then_some(("KT_SPECIALIZED", 1)))
                .chain(c.tma.then_some(("KT_TMA", 1)))
                .chain((c.block_tiles > 1).then_some(("KT_BLOCK_TILES", c.block_tiles)))
                .chain((c.cluster > 1).then_some(("KT_CLUSTER", c.cluster)))
                .chain(p.block.map(|b| ("KT_BLOCK", b)))
                .chain(p.int4.map(|g| ("KT_INT4", g)))
                .collect(),
                entries: if c.split_k > 1 {
                    &["kt_gemm", "kt_gemm_reduce"]
                } else {
                    &["kt_gemm"]
                },
                threads: c.threads(),
                dynamic_lds,
                arch_specific: c.variant == GpuGemmVariant::Wgmma,
                launch_registers: 0,
            },
            (Problem::Flash(p), Config::GpuFlash(c)) => {
                // Warp-specialized tiles whose multiplying warpgroups need more than an even
                // share of the registers (a 128-key tile or head size 128) take them from the
                // producer (flash.hip): each thread's share of the 65536 at launch, in the
                // allocation's steps of 8. At 64 by 64 every thread fits in its share.
                let split_registers = c.specialized && (p.head_dim == 128 || c.bc == 128);
                KernelBuild {
                    family: Family::Flash,
                    file: "flash.hip",
                    defines: vec![
                        ("KT_DTYPE", dtype_code(p.dtype)),
                        (
                            "KT_VARIANT",
                            match c.variant {
                                GpuFlashVariant::Rows => 0,
                                GpuFlashVariant::Mma => 1,
                                GpuFlashVariant::Mfma => 2,
                            },
                        ),
                        ("KT_BR", c.br),
                        ("KT_BC", c.bc),
                        ("KT_LANES", c.lanes),
                        ("KT_D", p.head_dim),
                    ]
                    .into_iter()
                    // Only when set, so the builds of unpaired, unsplit configs keep their cache
                    // keys.
                    .chain(c.paired.then_some(("KT_PAIRED", 1)))
                    .chain((c.split > 1).then_some(("KT_SPLIT", c.split)))
                    .chain(c.wgmma.then_some(("KT_WG", 1)))
                    .chain(c.specialized.then_some(("KT_SPEC", 1)))
                    .chain(c.pingpong.then_some(("KT_PINGPONG", 1)))
                    .chain(c.tma.then_some(("KT_TMA", 1)))
                    .chain(c.prefetch.then_some(("KT_PREFETCH", 1)))
                    .chain(split_registers.then_some(("KT_SPLIT_REGS", 1)))
                    // The window's masks only where the problem has one (flash.hip).
                    .chain(p.window.is_some().then_some(("KT_WINDOW", 1)))
                    .chain(p.sinks.then_some(("KT_SINKS", 1)))
                    .chain(p.softcap.is_some().then_some(("KT_SOFTCAP", 1)))
                    .chain(p.alibi.then_some(("KT_ALIBI", 1)))
                    .chain(p.narrow_values().then_some(("KT_DV", p.v_head_dim)))
                    .collect(),
                    entries: if c.split > 1 {
                        &["kt_flash", "kt_flash_reduce"]
                    } else {
                        &["kt_flash"]
                    },
                    threads: c.threads(),
                    dynamic_lds,
                    arch_specific: c.wgmma,
                    launch_registers: if split_registers {
                        (65536 / c.threads() as u32) & !7
                    } else {
                        0
                    },
                }
            }
            (Problem::Paged(p), Config::GpuPaged(c)) => KernelBuild {
                family: Family::Paged,
                file: "paged.hip",
                defines: vec![
                    ("KT_DTYPE", dtype_code(p.dtype)),
                    ("KT_PART", c.partition),
                    ("KT_THREADS", c.threads),
                    ("KT_LANES", c.lanes),
                    ("KT_D", p.head_dim),
                    ("KT_BLOCK", p.block_size),
                ]
                .into_iter()
                .chain(p.is_latent().then_some(("KT_DV", p.v_head_dim)))
                .chain((c.heads > 1 || c.mma || c.mfma).then_some(("KT_HEADS", c.heads)))
                .chain(c.mma.then_some(("KT_PAGED_MMA", 1)))
                .chain(c.mfma.then_some(("KT_PAGED_MFMA", 1)))
                .chain(p.sinks.then_some(("KT_SINKS", 1)))
                .chain(p.softcap.is_some().then_some(("KT_SOFTCAP", 1)))
                .chain(p.alibi.then_some(("KT_ALIBI", 1)))
                .chain(p.fp8().map(|f| ("KT_KV_FP8", kv_fp8_code(f))))
                .collect(),
                entries: &["kt_paged", "kt_paged_reduce"],
                threads: c.threads,
                dynamic_lds,
                arch_specific: false,
                launch_registers: 0,
            },
            (p, c) if !c.is_gpu() => {
                return Err(KernelError::InvalidConfig {
                    family: p.family(),
                    reason: format!("`{c}` is a CPU config; GPU kernels build from GPU configs"),
                })
            }
            (p, Config::Rocblas(_)) => {
                return Err(KernelError::InvalidConfig {
                    family: p.family(),
                    reason: "a rocBLAS solution is rocBLAS's own code, not built from kernels/hip"
                        .into(),
                })
            }
            (p, c) => {
                return Err(KernelError::FamilyMismatch {
                    problem: p.family(),
                    config: c.family(),
                })
            }
        };
        if dynamic_lds > 0 {
            build.defines.push(("KT_DYN_LDS", dynamic_lds));
        }
        Ok(build)
    }

    /// A stable text naming the build, e.g. `gemm.hip KT_DTYPE=2 KT_VARIANT=1 ...`: with the
    /// target, compiler and source hash it keys the compile cache.
    pub fn key(&self) -> String {
        let mut s = self.file.to_string();
        for (name, value) in &self.defines {
            s.push_str(&format!(" {name}={value}"));
        }
        s
    }

    /// `k`, one of this build's compiled kernels, as launched: the code object counts static
    /// LDS only, and the main kernel (the first entry) takes [`dynamic_lds`](Self::dynamic_lds)
    /// more at launch.
    pub fn at_launch(&self, k: &KernelResources) -> KernelResources {
        let mut k = k.clone();
        if k.name == self.entries[0] {
            k.lds += self.dynamic_lds as u32;
        }
        k
    }

    /// The translation unit, with the prelude inlined so it compiles from standard input.
    pub fn source(&self) -> String {
        body_of(self.family).replacen("#include \"prelude.h\"", PRELUDE, 1)
    }
}
