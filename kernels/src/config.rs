//! Kernel configurations: the tunable parameters of one kernel family on one backend.
//!
//! A config is plain data (serde, `Eq + Hash`) so the database can store it as JSON and the
//! runtime can read it back; whether it may run is decided by [`crate::Space::validate`] alone.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::device::Isa;
use crate::Family;

/// A configuration of any family. `Copy`, so the runtime hands configs out without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "lowercase")]
pub enum Config {
    Gemm(GemmConfig),
    Flash(FlashConfig),
    Paged(PagedConfig),
}

impl Config {
    pub fn family(&self) -> Family {
        match self {
            Config::Gemm(_) => Family::Gemm,
            Config::Flash(_) => Family::Flash,
            Config::Paged(_) => Family::Paged,
        }
    }

    /// Compact JSON, the form stored in the database and accepted by `tune bench --config`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("configs always serialise")
    }

    pub fn from_json(s: &str) -> Result<Config, serde_json::Error> {
        serde_json::from_str(s)
    }

    pub fn threads(&self) -> usize {
        match self {
            Config::Gemm(c) => c.threads,
            Config::Flash(c) => c.threads,
            Config::Paged(c) => c.threads,
        }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Config::Gemm(c) => match c.variant {
                GemmVariant::Packed => write!(
                    f,
                    "packed {} {}x{} mc={} kc={} nc={} split={} t={}",
                    c.isa, c.mr, c.nr, c.mc, c.kc, c.nc, c.split, c.threads
                ),
                GemmVariant::Stream => write!(
                    f,
                    "stream {} rows={} nc={} t={}",
                    c.isa, c.mr, c.nc, c.threads
                ),
            },
            Config::Flash(c) => write!(
                f,
                "{} br={} bc={} group={} split={} t={}",
                c.isa, c.br, c.bc, c.group_heads, c.split, c.threads
            ),
            Config::Paged(c) => write!(
                f,
                "{} partition={} group={} t={}",
                c.isa, c.partition, c.group_heads, c.threads
            ),
        }
    }
}

/// The two GEMM algorithms of the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmVariant {
    /// Packed, cache-blocked, register-blocked (BLIS loop nest): compute-bound shapes.
    Packed,
    /// Streams B once without packing: decode shapes (M of 1 to 16 rows), bound by reading the
    /// weights at memory bandwidth.
    Stream,
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
/// `Packed` reads every field: an `mr × nr` microkernel, A blocks of `mc × kc`, B panels of
/// `kc × nc`, threads dividing `split`. `Stream` reads `mr` (rows of A per pass over B), `nc`
/// (columns per task) and `threads`; its other fields are fixed by the space.
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
}
