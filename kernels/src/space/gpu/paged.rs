//! Paged attention's GPU space: a thread per cached token, or groups of lanes per token
//! reading its rows in 16-byte pieces; partitions of long contexts and threads per block.

use crate::config::GpuPagedConfig;
use crate::device::GpuModel;
use crate::problem::PagedProblem;
use crate::{Family, KernelError};

use super::{check_threads, invalid, vec_of};

/// Dims of the query and of the P·V sums a lane of grouped paged attention holds.
const PAGED_MAX_DIMS_PER_LANE: usize = 16;

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
    check_threads(f, c.threads, g)
}

/// Groups of lanes per token first (16-byte loads of whole rows), then a thread per token.
pub(super) fn candidates() -> Vec<GpuPagedConfig> {
    let mut out = Vec::new();
    for lanes in [16, 8, 4, 32, 1] {
        for partition in [256, 512, 1024] {
            for threads in [64, 128, 256, 512] {
                out.push(GpuPagedConfig {
                    partition,
                    threads,
                    lanes,
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
    }
}
