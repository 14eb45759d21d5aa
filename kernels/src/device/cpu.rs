//! Host CPU detection: model, threads, SIMD level and cache sizes.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// The SIMD level a CPU kernel is compiled for. Ordered: a CPU that supports a level supports
/// every lower one on the same architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isa {
    /// Plain Rust, whatever the compiler vectorises for the baseline target.
    Portable,
    /// AArch64 Advanced SIMD (baseline on aarch64), with kernels of its own (`fmla`).
    Neon,
    /// x86-64 with AVX2 and FMA.
    Avx2Fma,
    /// x86-64 with AVX-512 F/BW/VL/DQ.
    Avx512,
    /// AVX-512 plus AMX tiles (Sapphire Rapids and later) that this process may use: the OS
    /// saves tile state and granted the permission for tile data.
    Avx512Amx,
}

impl Isa {
    pub fn as_str(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Neon => "neon",
            Isa::Avx2Fma => "avx2-fma",
            Isa::Avx512 => "avx512",
            Isa::Avx512Amx => "avx512-amx",
        }
    }

    /// f32 lanes of this level's widest vector register, the unit tile widths come in.
    pub fn f32_lanes(self) -> usize {
        match self {
            Isa::Portable | Isa::Neon => 4,
            Isa::Avx2Fma => 8,
            Isa::Avx512 | Isa::Avx512Amx => 16,
        }
    }

    /// Whether kernels built for `self` may run on a CPU detected as `host`.
    pub fn runs_on(self, host: Isa) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Neon => host == Isa::Neon,
            _ => host != Isa::Neon && self <= host,
        }
    }

    /// Every level a CPU detected as `host` can run, lowest first.
    pub fn supported_by(host: Isa) -> Vec<Isa> {
        [
            Isa::Portable,
            Isa::Neon,
            Isa::Avx2Fma,
            Isa::Avx512,
            Isa::Avx512Amx,
        ]
        .into_iter()
        .filter(|i| i.runs_on(host))
        .collect()
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Isa {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "portable" => Ok(Isa::Portable),
            "neon" => Ok(Isa::Neon),
            "avx2" | "avx2-fma" => Ok(Isa::Avx2Fma),
            "avx512" => Ok(Isa::Avx512),
            "avx512-amx" | "amx" => Ok(Isa::Avx512Amx),
            _ => Err(format!(
                "unknown ISA level `{s}` (expected portable, neon, avx2-fma, avx512 or avx512-amx)"
            )),
        }
    }
}

/// What a kernel needs to know about the host CPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuInfo {
    pub model: String,
    /// Threads rayon will use (the worker pool size).
    pub threads: usize,
    pub isa: Isa,
    /// AVX-512-BF16 (`vdpbf16ps`), a bf16 dot product with f32 accumulation.
    pub avx512_bf16: bool,
    pub l1d_bytes: usize,
    pub l2_bytes: usize,
    pub l3_bytes: usize,
}

impl CpuInfo {
    /// Intel cores, with or without AMX granted: heuristics key on the core, not only on the
    /// ISA level, where the two part (`vdpbf16ps` issues at half the f32 FMA rate on Intel
    /// cores and at the full rate on Zen 4). Read off the model name because that is what a
    /// database record keeps of a CPU device; an AMX host is Intel whatever its name says.
    pub fn intel(&self) -> bool {
        self.isa == Isa::Avx512Amx || self.model.contains("Intel")
    }

    /// Detects the host once per process. `KERNTUNE_ISA` caps the level (to compare or debug
    /// the lower paths); it can lower the detected level, never raise it.
    /// `KERNTUNE_AVX512_BF16=0` hides AVX-512-BF16 the same way (the kernels of AVX-512 hosts
    /// without it).
    pub fn detect() -> &'static CpuInfo {
        static INFO: OnceLock<CpuInfo> = OnceLock::new();
        INFO.get_or_init(|| {
            let mut isa = detect_isa();
            if let Some(cap) = crate::env::isa_cap().ok().flatten() {
                if cap.runs_on(isa) {
                    isa = cap;
                }
            }
            let (l1d, l2, l3) = cache_sizes();
            CpuInfo {
                model: cpu_model(),
                threads: rayon::current_num_threads(),
                isa,
                avx512_bf16: isa >= Isa::Avx512
                    && has_avx512_bf16()
                    && crate::env::avx512_bf16_allowed().unwrap_or(true),
                l1d_bytes: l1d,
                l2_bytes: l2,
                l3_bytes: l3,
            }
        })
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_isa() -> Isa {
    use std::arch::is_x86_feature_detected as has;
    if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq") {
        if has_amx() {
            Isa::Avx512Amx
        } else {
            Isa::Avx512
        }
    } else if has!("avx2") && has!("fma") && has!("f16c") {
        Isa::Avx2Fma
    } else {
        Isa::Portable
    }
}

#[cfg(target_arch = "aarch64")]
fn detect_isa() -> Isa {
    Isa::Neon
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect_isa() -> Isa {
    Isa::Portable
}

/// Whether AMX tiles can run in this process: the CPU has them, the OS saves their state, and
/// Linux granted the process permission to use tile data (without it the first tile load
/// faults).
///
/// Detection goes through CPUID because `is_x86_feature_detected!("amx-tile")` is still
/// unstable: leaf 7, EDX bit 24 (amx-tile) and bit 22 (amx-bf16); XCR0 bits 17 and 18 (tile
/// configuration and tile data enabled by the OS).
#[cfg(target_arch = "x86_64")]
fn has_amx() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let leaf7 = __cpuid_count(7, 0);
    let cpu = leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 22) != 0;
    // CPUID leaf 1, ECX bit 27: the OS enabled XSAVE, so XGETBV may run.
    let osxsave = __cpuid(1).ecx & (1 << 27) != 0;
    if !cpu || !osxsave {
        return false;
    }
    // SAFETY: XGETBV exists where OSXSAVE is set (checked above).
    let xcr0 = unsafe { xcr0() };
    let tiles = 0b11 << 17;
    xcr0 & tiles == tiles && request_tile_permission()
}

/// XCR0, the state components the OS saves.
///
/// # Safety
/// CPUID must report OSXSAVE.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller's contract.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

/// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`),
/// once for the whole process, as every AMX user must since Linux 5.16.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes the process's permission bitmap.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// Other systems are not known to kerntune to grant tile data: the AVX-512 kernels run there.
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_permission() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn has_avx512_bf16() -> bool {
    std::arch::is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx512_bf16() -> bool {
    false
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{} cpu", std::env::consts::ARCH))
}

/// Per-core L1d and L2, and the total L3, from sysfs; conservative defaults elsewhere.
fn cache_sizes() -> (usize, usize, usize) {
    let mut sizes = (32 << 10, 1 << 20, 16 << 20);
    for index in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        let size = size.trim();
        let bytes = if let Some(k) = size.strip_suffix('K') {
            k.parse::<usize>().ok().map(|v| v << 10)
        } else if let Some(m) = size.strip_suffix('M') {
            m.parse::<usize>().ok().map(|v| v << 20)
        } else {
            size.parse().ok()
        };
        let Some(bytes) = bytes else { continue };
        match (level.trim(), kind.trim()) {
            ("1", "Data") => sizes.0 = bytes,
            ("2", _) => sizes.1 = bytes,
            ("3", _) => sizes.2 = bytes,
            _ => {}
        }
    }
    sizes
}
