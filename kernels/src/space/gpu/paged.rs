//! Paged attention's GPU space: a thread per cached token, or groups of lanes per token
//! reading its rows in 16-byte pieces; a block's query heads (one, or several of one KV head
//! sharing each row it reads); partitions of long contexts and threads per block.

use crate::config::GpuPagedConfig;
use crate::device::GpuModel;
use crate::problem::PagedProblem;
use crate::{Family, KernelError};

use super::{check_threads, invalid, vec_of};

/// Dims of the query and of the P·V sums a lane of grouped paged attention holds.
const PAGED_MAX_DIMS_PER_LANE: usize = 16;

/// The most query heads a block takes: each thread keeps a score and then a P·V sum per head
/// in registers.
const PAGED_MAX_HEADS: usize = 16;

pub(super) fn validate(
    c: &GpuPagedConfig,
    p: &PagedProblem,
    g: &GpuModel,
) -> Result<(), KernelError> {
    let f = Family::Paged;
    if c.partition == 0 || !c.partition.is_multiple_of(p.block_size) || c.partition > 8192 {
        return Err(invalid(
            f,
            format!(
                "partition = {} must be a positive multiple of block_size {} up to 8192",
                c.partition, p.block_size
            ),
        ));
    }
    if c.lanes > 1 {
        let vec = vec_of(p.dtype);
        if !c.lanes.is_power_of_two()
            || c.lanes > 32
            || !p.head_dim.is_multiple_of(c.lanes * vec)
            || !p.v_head_dim.is_multiple_of(c.lanes * vec)
            || p.head_dim / c.lanes > PAGED_MAX_DIMS_PER_LANE
        {
            return Err(invalid(
                f,
                format!(
                    "lanes = {}: a power of two up to 32 whose lanes each take whole 16-byte pieces ({vec} values) of head_dim {} and of v_head_dim {}, at most {PAGED_MAX_DIMS_PER_LANE} dims a lane",
                    c.lanes, p.head_dim, p.v_head_dim
                ),
            ));
        }
    } else if c.lanes != 1 {
        return Err(invalid(f, "lanes = 0: a token takes at least one thread"));
    }
    if !c.heads.is_power_of_two() || c.heads > PAGED_MAX_HEADS || !p.group().is_multiple_of(c.heads)
    {
        return Err(invalid(
            f,
            format!(
                "heads = {}: a power of two up to {PAGED_MAX_HEADS} that divides the {} query heads of a KV head",
                c.heads,
                p.group()
            ),
        ));
    }
    if c.heads > 1 && c.lanes != 1 {
        return Err(invalid(
            f,
            format!(
                "heads = {} takes a thread a token: set lanes = 1 (not {})",
                c.heads, c.lanes
            ),
        ));
    }
    check_threads(f, c.threads, g)
}

/// Groups of lanes per token first (16-byte loads of whole rows), then a thread per token,
/// then blocks of several query heads (shorter partitions: their scores are a row per head).
pub(super) fn candidates() -> Vec<GpuPagedConfig> {
    let mut out = Vec::new();
    for lanes in [16, 8, 4, 32, 1] {
        for partition in [256, 512, 1024] {
            for threads in [64, 128, 256, 512] {
                out.push(GpuPagedConfig {
                    partition,
                    threads,
                    lanes,
                    heads: 1,
                });
            }
        }
    }
    for heads in [2, 4, 8, 16] {
        for partition in [128, 256, 512] {
            for threads in [64, 128, 256] {
                out.push(GpuPagedConfig {
                    partition,
                    threads,
                    lanes: 1,
                    heads,
                });
            }
        }
    }
    out
}

/// What runs untuned, and the guess for untuned shapes alike: a thread per token, 512-token
/// partitions.
pub(super) fn default(p: &PagedProblem) -> GpuPagedConfig {
    GpuPagedConfig {
        partition: 512usize.next_multiple_of(p.block_size),
        // 256 makes ptxas spill a word on sm_90; 128 spills nowhere.
        threads: 128,
        lanes: 1,
        heads: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::launch::{launches, DevicePtrs};
    use crate::{Config, Device, Problem};

    fn on(model: &str, spec: &str) -> (&'static GpuModel, PagedProblem) {
        let Device::Gpu(g) = Device::lookup(model).unwrap() else {
            unreachable!("{model} is a GPU")
        };
        let Problem::Paged(p) = spec.parse().unwrap() else {
            unreachable!("{spec} is paged")
        };
        (g, p)
    }

    /// Blocks of several heads: stored without `heads`, a config is one head a block; with
    /// it, the field reads back, the launch's grid has a block per group of heads, and heads
    /// that do not divide a KV head's group, too many of them, or lanes beside them are
    /// refused by name.
    #[test]
    fn blocks_of_several_heads_are_stored_launched_and_checked() {
        let (g, p) = on(
            "h200",
            "paged:num_seqs=3,context_len=1000,q_heads=16,kv_heads=2,head_dim=128,dtype=bf16",
        );
        let old: GpuPagedConfig =
            serde_json::from_str(r#"{"partition":256,"threads":128}"#).unwrap();
        assert_eq!((old.lanes, old.heads), (1, 1));
        assert!(!serde_json::to_string(&old).unwrap().contains("heads"));
        let c = GpuPagedConfig { heads: 8, ..old };
        validate(&c, &p, g).unwrap();
        assert_eq!(c.to_string(), "gpu partition=256 threads=128 heads=8");
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<GpuPagedConfig>(&json).unwrap(), c);
        let l = launches(
            &Problem::Paged(p),
            &Config::GpuPaged(c),
            &DevicePtrs::default(),
        )
        .unwrap();
        assert_eq!(l[0].grid, [4, 2, 3]);
        // The reduction still takes one head a block.
        assert_eq!(l[1].grid, [16, 3, 1]);
        for (bad, named) in [
            (GpuPagedConfig { heads: 3, ..c }, "heads = 3"),
            (
                GpuPagedConfig { heads: 16, ..c },
                "divides the 8 query heads",
            ),
            (GpuPagedConfig { heads: 32, ..c }, "up to 16"),
            (GpuPagedConfig { lanes: 16, ..c }, "set lanes = 1"),
        ] {
            let e = validate(&bad, &p, g).unwrap_err().to_string();
            assert!(e.contains(named), "{bad}: {e}");
        }
        // Every candidate of several heads for this problem is valid or refused, and some are
        // offered.
        let offered = candidates()
            .into_iter()
            .filter(|c| c.heads > 1 && validate(c, &p, g).is_ok())
            .count();
        assert_eq!(offered, 3 * 3 * 3);
    }
}
