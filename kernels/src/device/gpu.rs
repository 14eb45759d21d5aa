//! GPU models and their published figures.
//!
//! "Device" means one ROCm/CUDA device as a program sees it: an MI250 or MI250X card is two
//! devices (two GCDs), each with half the card's compute units, memory and bandwidth, so the
//! figures below are per GCD.
//!
//! Sources, per model:
//! - MI210, MI250, MI250X: AMD Instinct MI200 series datasheets and the CDNA2 ISA guide (64 KiB
//!   LDS per CU, 512 VGPR+AGPR per lane per SIMD, 4 SIMDs per CU, up to 8 waves per SIMD).
//! - MI300X, MI325X: AMD Instinct MI300X / MI325X datasheets, CDNA3 white paper.
//! - Radeon RX 7900 XTX: AMD product page and the RDNA3 ISA guide (wave32 native, 64 KiB LDS per
//!   CU, 128 KiB per WGP, 1536 VGPRs per SIMD in wave32).
//! - A100 SXM 80GB: NVIDIA A100 datasheet and the Ampere tuning guide (164 KiB shared memory per
//!   SM, 65,536 registers per SM, 64 warps per SM).
//! - H100 SXM, H200 SXM: NVIDIA H100 / H200 datasheets and the Hopper tuning guide (228 KiB shared
//!   memory per SM, 227 KiB per block).
//! - B200 (HGX B200, sm_100): NVIDIA's HGX B200 specifications per GPU (180 GB HBM3e, 7.7 TB/s,
//!   2.25 PFLOP/s dense FP16/BF16 tensor, 75 TFLOP/s FP32; 148 SMs of 128 FP32 cores), the
//!   Blackwell tuning guide and the CUDA programming guide's limits for compute capability
//!   10.0 (as Hopper's: 228 KiB shared memory per SM, 227 KiB per block, 65,536 registers and
//!   64 warps per SM). Its own tensor-core instructions (tcgen05) are not used: kerntune's
//!   NVIDIA kernels run `mma.sync` there, and Hopper's `wgmma` does not exist on it.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Amd,
    Nvidia,
}

/// One GPU model as a program sees one device of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuModel {
    pub name: &'static str,
    #[serde(skip)]
    pub aliases: &'static [&'static str],
    pub vendor: Vendor,
    /// Compiler target: `gfx90a`, `gfx942`, `gfx1100`, `sm_80`, `sm_90`, `sm_100`.
    pub arch: &'static str,
    /// Compute units (AMD) or streaming multiprocessors (NVIDIA).
    pub compute_units: u32,
    /// Wave (AMD) or warp (NVIDIA) width.
    pub wave_size: u32,
    /// LDS / shared memory per CU or SM.
    pub lds_per_cu: u32,
    /// The most LDS / shared memory one workgroup or block may allocate.
    pub lds_per_block: u32,
    /// 32-bit registers per SIMD lane (AMD: VGPR+AGPR file per lane) or per SM (NVIDIA).
    pub registers: u32,
    /// Waves per SIMD (AMD) or warps per SM (NVIDIA) at most.
    pub max_waves: u32,
    /// SIMDs per CU (AMD); 4 sub-partitions per SM on NVIDIA.
    pub simds_per_cu: u32,
    pub max_threads_per_block: u32,
    pub memory_bytes: u64,
    pub bandwidth_gbs: f64,
    pub peak_f16_tflops: f64,
    pub peak_f32_tflops: f64,
}

const GB: u64 = 1_000_000_000;

#[allow(clippy::too_many_arguments)]
const fn cdna(
    name: &'static str,
    aliases: &'static [&'static str],
    arch: &'static str,
    cus: u32,
    memory_gb: u64,
    bandwidth_gbs: f64,
    f16: f64,
    f32: f64,
) -> GpuModel {
    GpuModel {
        name,
        aliases,
        vendor: Vendor::Amd,
        arch,
        compute_units: cus,
        wave_size: 64,
        lds_per_cu: 64 * 1024,
        lds_per_block: 64 * 1024,
        registers: 512,
        max_waves: 8,
        simds_per_cu: 4,
        max_threads_per_block: 1024,
        memory_bytes: memory_gb * GB,
        bandwidth_gbs,
        peak_f16_tflops: f16,
        peak_f32_tflops: f32,
    }
}

/// An NVIDIA data-centre model (Ampere, Hopper, Blackwell): 32-wide warps, 65,536 registers
/// and 64 warps per SM, a block's shared memory 1 KiB short of the SM's.
#[allow(clippy::too_many_arguments)]
const fn nvidia(
    name: &'static str,
    aliases: &'static [&'static str],
    arch: &'static str,
    sms: u32,
    shared_kib: u32,
    memory_gb: u64,
    bandwidth_gbs: f64,
    f16: f64,
    f32: f64,
) -> GpuModel {
    GpuModel {
        name,
        aliases,
        vendor: Vendor::Nvidia,
        arch,
        compute_units: sms,
        wave_size: 32,
        lds_per_cu: shared_kib * 1024,
        lds_per_block: (shared_kib - 1) * 1024,
        registers: 65536,
        max_waves: 64,
        simds_per_cu: 4,
        max_threads_per_block: 1024,
        memory_bytes: memory_gb * GB,
        bandwidth_gbs,
        peak_f16_tflops: f16,
        peak_f32_tflops: f32,
    }
}

/// Every GPU model kerntune knows. The first model of an architecture is what its arch name
/// (`gfx90a`, `gfx942`, `sm_90`) resolves to.
pub static GPU_CATALOG: [GpuModel; 10] = [
    cdna(
        "mi250",
        &["mi250", "gfx90a"],
        "gfx90a",
        104,
        64,
        1600.0,
        181.0,
        22.6,
    ),
    cdna(
        "mi250x",
        &["mi250x"],
        "gfx90a",
        110,
        64,
        1600.0,
        191.5,
        23.9,
    ),
    cdna("mi210", &["mi210"], "gfx90a", 104, 64, 1600.0, 181.0, 22.6),
    cdna(
        "mi300x",
        &["mi300x", "mi300", "gfx942"],
        "gfx942",
        304,
        192,
        5300.0,
        1307.0,
        163.4,
    ),
    cdna(
        "mi325x",
        &["mi325x", "mi325"],
        "gfx942",
        304,
        256,
        6000.0,
        1307.0,
        163.4,
    ),
    GpuModel {
        name: "rx7900xtx",
        aliases: &["rx7900xtx", "7900xtx", "radeon rx 7900 xtx", "gfx1100"],
        vendor: Vendor::Amd,
        arch: "gfx1100",
        compute_units: 96,
        wave_size: 32,
        lds_per_cu: 64 * 1024,
        lds_per_block: 64 * 1024,
        registers: 1536,
        max_waves: 16,
        simds_per_cu: 2,
        max_threads_per_block: 1024,
        memory_bytes: 24 * GB,
        bandwidth_gbs: 960.0,
        peak_f16_tflops: 123.0,
        peak_f32_tflops: 61.0,
    },
    nvidia(
        "a100",
        &["a100", "a100-sxm", "sm_80"],
        "sm_80",
        108,
        164,
        80,
        2039.0,
        312.0,
        19.5,
    ),
    nvidia(
        "h100",
        &["h100", "h100-sxm", "sm_90"],
        "sm_90",
        132,
        228,
        80,
        3350.0,
        989.0,
        67.0,
    ),
    nvidia(
        "h200",
        &["h200", "h200-sxm"],
        "sm_90",
        132,
        228,
        141,
        4800.0,
        989.0,
        67.0,
    ),
    nvidia(
        "b200",
        &["b200", "b200-sxm", "hgx-b200", "sm_100"],
        "sm_100",
        148,
        228,
        180,
        7700.0,
        2250.0,
        75.0,
    ),
];

impl GpuModel {
    /// Finds a model by name or alias; `name` must already be lower case.
    pub fn lookup(name: &str) -> Option<&'static GpuModel> {
        let squashed: String = name.chars().filter(|c| !c.is_whitespace()).collect();
        GPU_CATALOG.iter().find(|g| {
            g.name == name
                || g.aliases
                    .iter()
                    .any(|a| *a == name || a.replace(' ', "") == squashed)
        })
    }
}
