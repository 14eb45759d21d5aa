//! GPU kernel configurations (`kernels/hip/` and vendor libraries). Kept out of `config.rs`,
//! which the CPU kernels' source hash covers, so GPU changes leave CPU results current.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The GPU GEMM kernels of `kernels/hip/gemm.hip`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuGemmVariant {
    /// LDS tiles of A and B, a `tm × tn` register tile per thread; every vendor and dtype.
    Tiled,
    /// AMD matrix cores (`v_mfma_f32_32x32x8`, CDNA2/3), f16 and bf16: each wave owns
    /// `tm × tn` tiles of 32×32.
    Mfma,
    /// NVIDIA tensor cores (`mma.sync.m16n8k16`, sm_80 and later), f16 and bf16: each warp
    /// owns `tm × tn` tiles of 16×8.
    Mma,
    /// NVIDIA Hopper's warpgroup tensor cores (`wgmma.mma_async.m64nNk16`, sm_90a), f16 and
    /// bf16, both operands read from shared memory: each warpgroup (4 warps) owns `tm` tiles
    /// of 64 rows by `tn` columns, `tn` the instruction's N.
    Wgmma,
    /// Decode GEMV-style kernel, every vendor and input type, B stored `[N, K]`: no shared
    /// memory; each group of 32 lanes owns `tn` weight rows and all `bm` rows of A, reading
    /// 16 bytes a lane per row and step, `bk / (32·16 bytes)` steps of weights in flight
    /// (`tm` is 1). Threads = 32 · `bn / tn`.
    Skinny,
}

impl GpuGemmVariant {
    /// Every variant, in the order of their `KT_VARIANT` numbers.
    pub const ALL: [GpuGemmVariant; 5] = [
        GpuGemmVariant::Tiled,
        GpuGemmVariant::Mfma,
        GpuGemmVariant::Mma,
        GpuGemmVariant::Wgmma,
        GpuGemmVariant::Skinny,
    ];
}

impl fmt::Display for GpuGemmVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuGemmVariant::Tiled => "tiled",
            GpuGemmVariant::Mfma => "mfma",
            GpuGemmVariant::Mma => "mma",
            GpuGemmVariant::Wgmma => "wgmma",
            GpuGemmVariant::Skinny => "skinny",
        })
    }
}

/// GEMM on a GPU: a `bm × bn` tile of C per block, `bk` deep per LDS stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuGemmConfig {
    pub variant: GpuGemmVariant,
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub tm: usize,
    pub tn: usize,
    /// Shared-memory stages of the mma variant: 1 stages each k tile with plain loads
    /// between two barriers; 2 to 4 keep that many tiles in flight with 16-byte `cp.async`
    /// copies and read fragments with `ldmatrix` (rows of 8 elements: k, and n for a
    /// `[K, N]` B, multiples of 8). The wgmma variant takes 3 or 4; the MFMA variant 1 or 2
    /// (16-byte loads of the next k tile into registers over this one's products, B
    /// `[N, K]`, k a multiple of 8). Absent in
    /// results stored before it existed, and left out when 1: 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub stages: usize,
    /// Blocks sharing the k range of one C tile (split-K), each writing its partial sums
    /// to a workspace that a second kernel adds in a fixed order: decode shapes, whose few
    /// rows give too few tiles to fill the device. Absent when 1: 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub split_k: usize,
    /// The wgmma variant's shared-memory layout: 0 stores each operand as 8×8 core matrices
    /// (16-byte rows, no swizzling); 32, 64 or 128 stores rows of that many bytes of k, the
    /// 16-byte pieces of each row permuted by the descriptors' swizzle mode of that width,
    /// so a quarter-warp copies whole 128-byte lines and writes distinct banks. Absent in
    /// results stored before it existed, and left out when 0: 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub swizzle: usize,
    /// The wgmma variant's warp specialization: one more warpgroup, the producer, copies
    /// the k tiles while the others only multiply, stages handed over by mbarriers rather
    /// than block-wide barriers (as cuBLAS's and CUTLASS's Hopper kernels do, there with
    /// the tensor-memory copy engine). Absent (false) in results stored before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub specialized: bool,
    /// The warp-specialized wgmma variant's producer copies by the tensor-memory copy
    /// engine (TMA, `cp.async.bulk.tensor`): one thread issues a box of A and one of B a
    /// stage, which land swizzled and count their bytes on the stage's mbarrier; elements
    /// past the matrix arrive as zeros. Absent (false) in results stored before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tma: bool,
    /// C tiles each block of the warp-specialized wgmma variant computes in turn (as a
    /// persistent kernel's blocks do): its producer copies the next tile's first k tiles
    /// while the multiplying warpgroups store the last tile's results, instead of a block
    /// ending and the next starting with empty stages. Absent when 1: 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub block_tiles: usize,
    /// Blocks of the TMA wgmma variant that run as one thread-block cluster (1 or 2): a
    /// pair takes two C tiles one above the other, which read the same tile of B, and each
    /// of the pair copies half of that tile once into both blocks' shared memory (TMA
    /// multicast), so B crosses from L2 to the SMs once for two blocks. Absent when 1: 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub cluster: usize,
}

impl GpuGemmConfig {
    /// A config from its parts as the space's tables list them: the block tile
    /// `(bm, bn, bk)`, the tiles of a thread, warp, wave or warpgroup `(tm, tn)`, the stages
    /// and the split of k; unswizzled, unspecialized, a tile a block, no cluster (struct
    /// update sets the rest).
    pub const fn tile(
        variant: GpuGemmVariant,
        (bm, bn, bk): (usize, usize, usize),
        (tm, tn): (usize, usize),
        stages: usize,
        split_k: usize,
    ) -> Self {
        GpuGemmConfig {
            variant,
            bm,
            bn,
            bk,
            tm,
            tn,
            stages,
            split_k,
            swizzle: 0,
            specialized: false,
            tma: false,
            block_tiles: 1,
            cluster: 1,
        }
    }

    /// Threads per block the kernel is compiled for (0 when the tile does not divide).
    pub fn threads(&self) -> usize {
        match self.variant {
            GpuGemmVariant::Tiled => {
                self.bm.checked_div(self.tm).unwrap_or(0)
                    * self.bn.checked_div(self.tn).unwrap_or(0)
            }
            GpuGemmVariant::Mfma => {
                64 * self.bm.checked_div(32 * self.tm).unwrap_or(0)
                    * self.bn.checked_div(32 * self.tn).unwrap_or(0)
            }
            GpuGemmVariant::Mma => {
                32 * self.bm.checked_div(16 * self.tm).unwrap_or(0)
                    * self.bn.checked_div(8 * self.tn).unwrap_or(0)
            }
            GpuGemmVariant::Wgmma => {
                let consumers = 128
                    * self.bm.checked_div(64 * self.tm).unwrap_or(0)
                    * self.bn.checked_div(self.tn).unwrap_or(0);
                consumers + if self.specialized { 128 } else { 0 }
            }
            GpuGemmVariant::Skinny => 32 * self.bn.checked_div(self.tn).unwrap_or(0),
        }
    }
}

/// Flash attention on a GPU: `br` query rows per block, key/value tiles of `bc` rows in LDS.
/// Rows variant: each query row held by `lanes` threads (each owning `head_dim / lanes` dims).
/// Mma variant: each warp owns 16 rows (`lanes` 2: two threads a row on average) or 32, two
/// row tiles sharing each K and V fragment (`lanes` 1); MFMA variant: each wave 32 (`lanes` 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFlashConfig {
    pub br: usize,
    pub bc: usize,
    pub lanes: usize,
    /// Absent in stored configs of the rows variant, which predate the others.
    #[serde(default, skip_serializing_if = "GpuFlashVariant::is_rows")]
    pub variant: GpuFlashVariant,
    /// Mma variant, causal problems: each block takes query tile x and then its mirror
    /// (tiles − 1 − x), so blocks see equal numbers of keys. Absent (false) in stored
    /// configs, which predate it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paired: bool,
    /// Mma variant: blocks sharing the keys of one query tile (split-KV), each taking an
    /// equal run of whole key tiles and writing its rows' unnormalized outputs, maxima and
    /// sums to a workspace that a second kernel combines in a fixed order. A causal tile's
    /// last rows see every key: split, the longest block's run is a fraction of it. Absent
    /// when 1: 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub split: usize,
    /// Mma variant on sm_90: both products by warpgroup MMA (`wgmma.mma_async`, A from
    /// registers, K and V read from 128-byte-swizzled shared memory) instead of `mma.sync`
    /// with `ldmatrix`. Absent (false) in stored configs, which predate it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wgmma: bool,
    /// Wgmma tiles of 128 rows: warp-specialized, a producer warpgroup copying the key and
    /// value tiles into two stages handed over by mbarriers, the two multiplying warpgroups
    /// free of block barriers (FlashAttention-3's structure). Absent (false) in stored
    /// configs, which predate it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub specialized: bool,
    /// Warp-specialized tiles: the two multiplying warpgroups take turns to issue their
    /// products (handed over by a pair of mbarriers), so one's softmax runs while the
    /// other's products have the tensor cores (FlashAttention-3's ping-pong). Absent (false)
    /// in stored configs, which predate it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pingpong: bool,
    /// Warp-specialized tiles: the producer copies K and V by the tensor-memory copy engine
    /// (one thread issuing boxes of a 4D tensor map), not by its 128 threads' `cp.async`.
    /// Absent (false) in stored configs, which predate it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tma: bool,
    /// MFMA variant: the next key tile's K and V loaded into registers while this one is
    /// multiplied, so the loads' latency passes under the products (a wave a SIMD hides
    /// none otherwise), at the cost of a thread's share of a tile in registers. Absent
    /// (false) in stored configs, which predate it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefetch: bool,
}

impl GpuFlashConfig {
    /// A tile of `variant`, `br` query rows by `bc` keys, `lanes` a row, in its plainest
    /// form: unpaired, unsplit, by `mma.sync`, unspecialized (struct update sets the rest).
    pub const fn new(variant: GpuFlashVariant, br: usize, bc: usize, lanes: usize) -> Self {
        GpuFlashConfig {
            br,
            bc,
            lanes,
            variant,
            paired: false,
            split: 1,
            wgmma: false,
            specialized: false,
            pingpong: false,
            tma: false,
            prefetch: false,
        }
    }

    /// Threads a block: `lanes` a query row, and the producer warpgroup where specialized.
    pub fn threads(&self) -> usize {
        self.br * self.lanes + if self.specialized { 128 } else { 0 }
    }
}

/// The GPU flash-attention kernels of `kernels/hip/flash.hip`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum GpuFlashVariant {
    /// Query rows split over lanes, dot products summed by shuffles; every vendor and dtype.
    #[default]
    Rows,
    /// NVIDIA tensor cores (`mma.sync.m16n8k16`, sm_80 and later), f16 and bf16: S = Q·Kᵀ and
    /// O += P·V on 16-row tiles per warp, P kept in registers between the two.
    Mma,
    /// AMD matrix cores (`v_mfma_f32_32x32x8`, CDNA2/3), f16 and bf16: Sᵀ = K·Qᵀ and
    /// Oᵀ += Vᵀ·Pᵀ on 32-query tiles per wave, P kept in registers between the two.
    Mfma,
}

impl GpuFlashVariant {
    fn is_rows(&self) -> bool {
        *self == GpuFlashVariant::Rows
    }
}

/// Paged attention decode on a GPU: `partition` context tokens per block, `threads` per block,
/// partitions combined by a second kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuPagedConfig {
    pub partition: usize,
    pub threads: usize,
    /// Threads sharing one cached token: 1, a thread per token reading its key row element by
    /// element (absent in configs stored before the others existed); 2 to 32, a group of
    /// that many lanes reading each key and value row in 16-byte pieces, interleaved so a
    /// group's loads are contiguous, its dot products summed by shuffles.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub lanes: usize,
    /// Query heads of one KV head a block takes, reading each cached row once for all of them
    /// (1, one head a block, in configs stored before the others existed; more with a thread
    /// a token only).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub heads: usize,
    /// NVIDIA's tensor cores (`mma.sync`, 16-bit query and cache): the block's `heads` are the
    /// rows of one 16-row tile, its tokens pass in tiles of 16 a warp copied into shared
    /// memory one ahead, both products on the tensor cores (FlashMLA's way: a latent decode
    /// multiplies 1,088 values a token and head, more than CUDA cores keep up with at the
    /// memory's speed). Absent (false) in stored configs, which predate it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mma: bool,
    /// AMD's matrix cores (`v_mfma_f32_16x16x16`, CDNA2 and CDNA3, 16-bit query): the
    /// block's `heads` are the columns of one 16-column tile; each wave multiplies tiles of
    /// 16 tokens loaded straight into registers (no LDS stages: CDNA's 64 KiB hold none of a
    /// latent decode's rows), keeping its own softmax, and the waves' outputs meet in LDS at
    /// the end. Absent (false) in stored configs, which predate it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mfma: bool,
}

impl GpuPagedConfig {
    /// Tokens of a partition a tensor-core block copies and multiplies at a time: 16 a warp.
    pub fn mma_tile(&self, wave: usize) -> usize {
        16 * (self.threads / wave.max(1))
    }
}

/// A rocBLAS GEMM solution (`rocblas_gemm_ex` with `rocblas_gemm_algo_solution_index`).
/// Solution indices are only meaningful for the rocBLAS release that listed them, so the
/// version (`major·10000 + minor·100 + patch`) is part of the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RocblasConfig {
    pub solution: i32,
    pub version: u32,
}

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl fmt::Display for GpuGemmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gpu {} {}x{}x{} tile {}x{}",
            self.variant, self.bm, self.bn, self.bk, self.tm, self.tn
        )?;
        if self.stages != 1 {
            write!(f, " stages={}", self.stages)?;
        }
        if self.split_k != 1 {
            write!(f, " split-k={}", self.split_k)?;
        }
        if self.swizzle != 0 {
            write!(f, " swizzle={}", self.swizzle)?;
        }
        if self.specialized {
            f.write_str(" specialized")?;
        }
        if self.tma {
            f.write_str(" tma")?;
        }
        if self.block_tiles != 1 {
            write!(f, " block-tiles={}", self.block_tiles)?;
        }
        if self.cluster != 1 {
            write!(f, " cluster={}", self.cluster)?;
        }
        Ok(())
    }
}

impl fmt::Display for GpuFlashConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.variant {
            GpuFlashVariant::Rows => {
                write!(f, "gpu br={} bc={} lanes={}", self.br, self.bc, self.lanes)
            }
            GpuFlashVariant::Mma => {
                write!(f, "gpu mma br={} bc={}", self.br, self.bc)?;
                if self.lanes != 2 {
                    write!(f, " lanes={}", self.lanes)?;
                }
                if self.paired {
                    f.write_str(" paired")?;
                }
                if self.split > 1 {
                    write!(f, " split={}", self.split)?;
                }
                if self.wgmma {
                    f.write_str(" wgmma")?;
                }
                if self.specialized {
                    f.write_str(" specialized")?;
                }
                if self.tma {
                    f.write_str(" tma")?;
                }
                if self.pingpong {
                    f.write_str(" pingpong")?;
                }
                Ok(())
            }
            GpuFlashVariant::Mfma => {
                write!(f, "gpu mfma br={} bc={}", self.br, self.bc)?;
                if self.prefetch {
                    f.write_str(" prefetch")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for GpuPagedConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gpu partition={} threads={}",
            self.partition, self.threads
        )?;
        if self.lanes != 1 {
            write!(f, " lanes={}", self.lanes)?;
        }
        if self.heads != 1 {
            write!(f, " heads={}", self.heads)?;
        }
        if self.mma {
            f.write_str(" mma")?;
        }
        if self.mfma {
            f.write_str(" mfma")?;
        }
        Ok(())
    }
}

impl fmt::Display for RocblasConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rocblas solution={} (rocBLAS {}.{}.{})",
            self.solution,
            self.version / 10_000,
            self.version / 100 % 100,
            self.version % 100
        )
    }
}
