//! Kernel configurations: the tunable parameters of one kernel family on one backend.
//!
//! A config is plain data (serde, `Eq + Hash`) so the database can store it as JSON and the
//! runtime can read it back; whether it may run is decided by [`crate::Space::validate`] alone.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::device::Isa;
use crate::Family;

// The GPU configs live apart: this file is part of the CPU kernels' source hash, so a change
// to a GPU config must not mark CPU results stale.
mod gpu;
pub use gpu::{
    GpuFlashConfig, GpuFlashVariant, GpuGemmConfig, GpuGemmVariant, GpuPagedConfig, RocblasConfig,
};

/// A configuration of any family. `Copy`, so the runtime hands configs out without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "lowercase")]
pub enum Config {
    Gemm(GemmConfig),
    Flash(FlashConfig),
    Paged(PagedConfig),
    #[serde(rename = "gpu-gemm")]
    GpuGemm(GpuGemmConfig),
    #[serde(rename = "gpu-flash")]
    GpuFlash(GpuFlashConfig),
    #[serde(rename = "gpu-paged")]
    GpuPaged(GpuPagedConfig),
    /// A rocBLAS GEMM solution, measured on an AMD device beside our own kernels.
    #[serde(rename = "rocblas-gemm")]
    Rocblas(RocblasConfig),
}

impl Config {
    pub fn family(&self) -> Family {
        match self {
            Config::Gemm(_) => Family::Gemm,
            Config::Flash(_) => Family::Flash,
            Config::Paged(_) => Family::Paged,
            Config::GpuGemm(_) => Family::Gemm,
            Config::GpuFlash(_) => Family::Flash,
            Config::GpuPaged(_) => Family::Paged,
            Config::Rocblas(_) => Family::Gemm,
        }
    }

    /// Whether this config is for a GPU backend (and so never runs on the CPU).
    pub fn is_gpu(&self) -> bool {
        matches!(
            self,
            Config::GpuGemm(_) | Config::GpuFlash(_) | Config::GpuPaged(_) | Config::Rocblas(_)
        )
    }

    /// Compact JSON, the form stored in the database and accepted by `tune bench --config`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("configs always serialise")
    }

    pub fn from_json(s: &str) -> Result<Config, serde_json::Error> {
        serde_json::from_str(s)
    }

    /// CPU threads, or threads per block on a GPU.
    pub fn threads(&self) -> usize {
        match self {
            Config::Gemm(c) => c.threads,
            Config::Flash(c) => c.threads,
            Config::Paged(c) => c.threads,
            Config::GpuGemm(c) => c.threads(),
            Config::GpuFlash(c) => c.threads(),
            Config::GpuPaged(c) => c.threads,
            // rocBLAS picks its own launch.
            Config::Rocblas(_) => 0,
        }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Config::Gemm(c) => match c.variant {
                GemmVariant::Packed => write!(f, "packed {} {}", c.isa, Blocked(c)),
                GemmVariant::Stream => write!(
                    f,
                    "stream {} rows={} nc={} t={}{}",
                    c.isa,
                    c.mr,
                    c.nc,
                    c.threads,
                    if c.prefetch { "" } else { " no-prefetch" }
                ),
                GemmVariant::Dpbf16 => write!(f, "dpbf16 {}", Blocked(c)),
                GemmVariant::StreamDpbf16 => write!(
                    f,
                    "stream-dpbf16 rows={} nc={} t={}{}",
                    c.mr,
                    c.nc,
                    c.threads,
                    if c.prefetch { "" } else { " no-prefetch" }
                ),
                GemmVariant::Amx => write!(f, "amx {}", Blocked(c)),
                GemmVariant::Direct => write!(f, "direct {} {}", c.isa, Blocked(c)),
                GemmVariant::AmxDirect => write!(f, "amx-direct {}", Blocked(c)),
            },
            Config::Flash(c) => write!(
                f,
                "{}{}{} br={} bc={} group={} split={} t={}",
                c.isa,
                if c.amx { " amx" } else { "" },
                if c.dpbf16 { " dpbf16" } else { "" },
                c.br,
                c.bc,
                c.group_heads,
                c.split,
                c.threads
            ),
            Config::Paged(c) => {
                write!(
                    f,
                    "{}{}{}{} partition={} group={} t={}",
                    c.isa,
                    if c.key_tiles { " key-tiles" } else { "" },
                    if c.amx { " amx" } else { "" },
                    if c.whole_rows { " whole-rows" } else { "" },
                    c.partition,
                    c.group_heads,
                    c.threads
                )?;
                if c.turn != 0 {
                    write!(f, " turn={}", c.turn)?;
                }
                if c.widen {
                    f.write_str(" widen")?;
                }
                Ok(())
            }
            Config::GpuGemm(c) => c.fmt(f),
            Config::GpuFlash(c) => c.fmt(f),
            Config::GpuPaged(c) => c.fmt(f),
            Config::Rocblas(c) => c.fmt(f),
        }
    }
}

/// The GEMM algorithms of the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmVariant {
    /// Packed, cache-blocked, register-blocked (BLIS loop nest): compute-bound shapes.
    Packed,
    /// Streams B once without packing: decode shapes (M of 1 to 16 rows), bound by reading the
    /// weights at memory bandwidth.
    Stream,
    /// The packed loop nest on bf16 pairs with AVX-512-BF16 `vdpbf16ps`: two multiply-adds per
    /// f32 lane and instruction. bf16 inputs on hosts that have it.
    Dpbf16,
    /// The streaming path on bf16 pairs with `vdpbf16ps`: decode shapes with bf16 inputs on
    /// hosts that have AVX-512-BF16, the weights multiplied as loaded instead of widened.
    #[serde(rename = "stream-dpbf16")]
    StreamDpbf16,
    /// The packed loop nest on AMX tiles (`tdpbf16ps`): bf16 inputs on hosts with AMX-BF16
    /// (Sapphire Rapids and later), 16 × 16 × 32 multiply-adds per instruction.
    Amx,
    /// B stored `[N, K]` read in place, A packed, the product computed transposed: few rows
    /// of f32, or of bf16 on hosts with AVX-512-BF16, where packing B would be a second pass
    /// over the weights.
    Direct,
    /// The direct scheme on AMX tiles: B stored `[N, K]` loaded into the tiles where it lies,
    /// A packed, `Cᵀ` accumulated in tiles (bf16 on hosts with AMX-BF16).
    #[serde(rename = "amx-direct")]
    AmxDirect,
}

impl GemmVariant {
    /// Whether it reads B `[N, K]` where it lies (`direct`, `amx-direct`): an int4 problem's
    /// weights are dequantized that way for it.
    pub fn reads_b_in_place(self) -> bool {
        matches!(self, GemmVariant::Direct | GemmVariant::AmxDirect)
    }

    /// The layout an int4 problem's weights are dequantized to for this variant.
    pub fn int4_pass_layout(self) -> crate::BLayout {
        if self.reads_b_in_place() {
            crate::BLayout::Nk
        } else {
            crate::BLayout::Kn
        }
    }

    /// The name configs spell it with.
    pub fn name(self) -> &'static str {
        match self {
            GemmVariant::Packed => "packed",
            GemmVariant::Stream => "stream",
            GemmVariant::Dpbf16 => "dpbf16",
            GemmVariant::StreamDpbf16 => "stream-dpbf16",
            GemmVariant::Amx => "amx",
            GemmVariant::Direct => "direct",
            GemmVariant::AmxDirect => "amx-direct",
        }
    }
}

/// Which dimension threads divide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    M,
    N,
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Split::M => "m",
            Split::N => "n",
        })
    }
}

/// GEMM on the CPU.
///
/// `Packed`, `Dpbf16`, `Amx` and `Direct` read every field: an `mr × nr` microkernel, A blocks of `mc × kc`, B
/// panels of `kc × nc`, threads dividing `split`. `Stream` and `StreamDpbf16` read `mr` (rows of
/// A per pass over B), `nc` (columns per task) and `threads`; their other fields are fixed by
/// the space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmConfig {
    pub variant: GemmVariant,
    pub isa: Isa,
    pub mr: usize,
    pub nr: usize,
    pub mc: usize,
    pub kc: usize,
    pub nc: usize,
    pub split: Split,
    pub threads: usize,
    /// Stream variants: each weight row's line 1 KiB ahead of the loads is requested into L2
    /// (four rows stream at once, and the hardware prefetcher stops at every 4 KiB page). It
    /// paid on a Zen 4 (cold down at M = 1, 7%) and cost on an AMX Xeon (cold down 3–4%, warm
    /// `o` 4%), so it is tuned. The other variants take only `true`. Stored configs from before
    /// the field read as `true`, and `true` is not written, so their text stays the same.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub prefetch: bool,
    /// Packed loop nest (`Packed`, `Dpbf16`, `Amx`): which dimension the innermost loop walks.
    /// Stored configs from before the field read as `m`, which is not written.
    #[serde(default, skip_serializing_if = "Inner::is_m")]
    pub inner: Inner,
}

/// The innermost loop of the packed loop nest, around the microkernel.
///
/// `M`: one B sliver (`kc × nr`) meets every A sliver of the block in turn, so the A block
/// (`mc × kc`) should sit in L2. `N`: one A sliver (`mr × kc`) meets every B sliver of the
/// panel, so the B panel (`kc × nc`) should sit in L2 and the small A sliver stays in L1
/// (BLIS keeps its broadcast operand's sliver there the same way). With a shallow `kc` the
/// second reads less from L2 per multiply-add; which wins depends on the shape and the host,
/// so it is tuned.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Inner {
    #[default]
    M,
    N,
}

impl Inner {
    fn is_m(&self) -> bool {
        *self == Inner::M
    }
}

/// A blocked GEMM config's text after its variant and ISA: tile, blocks, split, threads, and
/// the tile order where it is not the default.
struct Blocked<'a>(&'a GemmConfig);

impl fmt::Display for Blocked<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        write!(
            f,
            "{}x{} mc={} kc={} nc={} split={} t={}{}",
            c.mr,
            c.nr,
            c.mc,
            c.kc,
            c.nc,
            c.split,
            c.threads,
            match c.inner {
                Inner::M => "",
                Inner::N => " inner=n",
            }
        )
    }
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// How flash attention divides work among threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlashSplit {
    /// One task per (batch, head): fewest tasks, each streams its K/V once.
    Heads,
    /// One task per (batch, head, query block): balances causal work across threads.
    Blocks,
}

impl fmt::Display for FlashSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlashSplit::Heads => "heads",
            FlashSplit::Blocks => "blocks",
        })
    }
}

/// Flash attention on the CPU: tiles of `br` query positions × `bc` keys with online softmax.
/// With `group_heads` the query heads sharing a KV head form one tile of `br × group` rows, so
/// each K/V tile is read once for the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashConfig {
    pub isa: Isa,
    pub br: usize,
    pub bc: usize,
    pub group_heads: bool,
    pub split: FlashSplit,
    pub threads: usize,
    /// Both products on AMX tiles (bf16 with an even head dimension, isa `avx512-amx`), the
    /// softmax weights rounded to bf16 for `P·V`. Absent in results stored before it existed,
    /// and left out when false, so those configs keep their text: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub amx: bool,
    /// Both products as `vdpbf16ps` on bf16 pairs (bf16 with an even head dimension, on a host
    /// with AVX-512-BF16), the softmax weights rounded to bf16 for `P·V` as on the tiles: twice
    /// the multiply-adds of an f32 FMA an instruction. At most one of `amx` and `dpbf16`. Absent
    /// in results stored before it existed, and left out when false: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dpbf16: bool,
}

/// Paged attention decode on the CPU. `partition` is the number of context tokens one task
/// covers (0: the whole context in one task); partitions are combined by a log-sum-exp
/// reduction. With `group_heads` the query heads of one KV head share each K/V read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PagedConfig {
    pub isa: Isa,
    pub partition: usize,
    pub group_heads: bool,
    pub threads: usize,
    /// Scores in tiles of 16 keys with the query rows sharing each vector's lanes, and `P·V`
    /// with register-held sums (AVX2+FMA, 8 lanes, every type widened to f32; AVX-512, f16
    /// widened, bf16 through `vdpbf16ps` on AVX-512-BF16 hosts with the `P·V` weights rounded
    /// to bf16, widened on others and with `widen`).
    /// Absent in results stored before it existed: false.
    #[serde(default)]
    pub key_tiles: bool,
    /// Both products on AMX tiles (bf16 with a head dimension that is a multiple of 32, isa
    /// `avx512-amx`, `key_tiles` false), the weights rounded to bf16 for `P·V`. Absent in
    /// results stored before it existed, and left out when false, so those configs keep their
    /// text: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub amx: bool,
    /// One task covers every KV head of its sequence (and partition), the heads taken in
    /// turn a few tiles of tokens at a time, so the cache is read in whole token rows: a
    /// block of all KV heads is one contiguous run (32 KiB at 8 KV heads of 128 bf16, 16
    /// tokens) instead of one head's 256 bytes of each row. Every paged kernel, with
    /// `group_heads` (or one query head per KV head). Absent in results stored before it
    /// existed, and left out when false: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole_rows: bool,
    /// Tokens a head of a `whole_rows` task on key tiles takes before the next head's turn,
    /// a multiple of 16 from 16 to 256; 0 for the kernel's rule (256 where a token row holds
    /// at most 512 values, else 8 KiB of a head's rows), which stays the untuned choice.
    /// Absent in results stored before it existed, and left out when 0: 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub turn: usize,
    /// bf16 caches on AVX-512 key tiles widened to f32 and multiplied by f32 FMAs (the weights
    /// kept in f32) rather than in pairs by `vdpbf16ps` (the weights rounded to bf16) on hosts
    /// with AVX-512-BF16; hosts without it, and the avx2-fma kernels, always widen. Which is
    /// faster is the host's: `vdpbf16ps` issues at the full FMA rate on Zen 4 and at under
    /// half of it on the Intel cores measured here, where widening pays for its conversions.
    /// Absent in results stored before it existed, and left out when false: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub widen: bool,
}
