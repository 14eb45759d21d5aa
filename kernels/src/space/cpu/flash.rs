//! Flash attention's CPU space: query tiles of `br` positions by key tiles of `bc`, heads
//! grouped on one KV head or not, split by heads or by tiles, and for bf16 the kernels whose
//! products take pairs: `vdpbf16ps` on AVX-512-BF16 hosts, AMX tiles on hosts with them.

use crate::config::{FlashConfig, FlashSplit};
use crate::cpu::table::table;
use crate::device::{CpuInfo, Isa};
use crate::problem::FlashProblem;
use crate::{DType, Family, KernelError};

use super::{amx_refusal, check_common, invalid, isa_levels, kernel_isa, thread_counts};

/// Whether the pair kernels (AMX tiles, `vdpbf16ps`) can take a problem (on a host with
/// them): both multiply bf16 pairs.
fn flash_on_pairs(p: &FlashProblem) -> bool {
    p.dtype == DType::Bf16 && p.head_dim.is_multiple_of(2)
}

pub(super) fn candidates(p: &FlashProblem, host: &CpuInfo) -> Vec<FlashConfig> {
    let mut out = Vec::new();
    // Every valid tiling of one grid: query tiles of `brs` positions (at most `max_rows`
    // rows with the group's heads) × key tiles of `bcs`, heads grouped or not, both splits.
    let mut grid =
        |isa: Isa, (amx, dpbf16): (bool, bool), brs: &[usize], bcs: &[usize], max_rows: usize| {
            for &threads in &thread_counts(host) {
                for &br in brs {
                    for &bc in bcs {
                        for group_heads in [false, true] {
                            if group_heads && p.group() == 1 {
                                continue;
                            }
                            if br * if group_heads { p.group() } else { 1 } > max_rows {
                                continue;
                            }
                            for split in [FlashSplit::Heads, FlashSplit::Blocks] {
                                let c = FlashConfig {
                                    isa,
                                    br,
                                    bc,
                                    group_heads,
                                    split,
                                    threads,
                                    amx,
                                    dpbf16,
                                };
                                if validate(&c, p, host).is_ok() {
                                    out.push(c);
                                }
                            }
                        }
                    }
                }
            }
        };
    for isa in isa_levels(host.isa) {
        grid(
            isa,
            (false, false),
            &[16, 32, 64],
            &[64, 128, 256],
            usize::MAX,
        );
    }
    // On pairs (bf16): query tiles of up to 512 rows, key tiles of 128 to 512, as the tiles'
    // blocks of 32 want them.
    let pair_grid = (&[16, 32, 64, 128, 256][..], &[128, 256, 512][..], 512);
    if host.avx512_bf16 && host.isa >= Isa::Avx512 {
        let (brs, bcs, rows) = pair_grid;
        grid(Isa::Avx512, (false, true), brs, bcs, rows);
    }
    if host.isa == Isa::Avx512Amx {
        let (brs, bcs, rows) = pair_grid;
        grid(Isa::Avx512Amx, (true, false), brs, bcs, rows);
    }
    out
}

pub(super) fn validate(
    c: &FlashConfig,
    p: &FlashProblem,
    host: &CpuInfo,
) -> Result<(), KernelError> {
    let f = Family::Flash;
    // An amx config names the tiles before its ISA level, so a host without them (an AVX2
    // or NEON one) is told what it lacks.
    if c.amx && (host.isa != Isa::Avx512Amx || c.isa != Isa::Avx512Amx) {
        return Err(invalid(f, amx_refusal("flash attention", c.isa, host)));
    }
    if c.amx && c.dpbf16 {
        return Err(invalid(
            f,
            "amx and dpbf16 are two kernels: a config names at most one",
        ));
    }
    // Named before its ISA level for the same reason: AVX-512 alone is not enough.
    if c.dpbf16 && (!host.avx512_bf16 || c.isa < Isa::Avx512) {
        return Err(invalid(
            f,
            format!(
                "dpbf16 flash attention runs at isa avx512 or avx512-amx on a host with \
                 AVX-512-BF16 (Zen 4 or later, Cooper Lake, Sapphire Rapids); this config asks \
                 for {} on {} ({}{})",
                c.isa,
                host.model,
                host.isa,
                if host.avx512_bf16 {
                    ""
                } else {
                    ", no AVX-512-BF16"
                }
            ),
        ));
    }
    check_common(f, c.isa, c.threads, host)?;
    if c.br == 0 || c.br > 1024 {
        return Err(invalid(
            f,
            format!("br = {} must be between 1 and 1024", c.br),
        ));
    }
    let lanes = table(kernel_isa(c.isa)).lanes;
    if c.bc == 0 || c.bc > 4096 || !c.bc.is_multiple_of(lanes) {
        return Err(invalid(
            f,
            format!("bc = {} must be a multiple of {lanes} up to 4096", c.bc),
        ));
    }
    let rows = c.br * if c.group_heads { p.group() } else { 1 };
    if rows > 4096 {
        return Err(invalid(
            f,
            format!("br x group = {rows} query rows per tile exceeds 4096"),
        ));
    }
    if (c.amx || c.dpbf16) && !flash_on_pairs(p) {
        return Err(invalid(
            f,
            format!(
                "{} flash attention needs bf16 inputs and an even head_dim (it multiplies \
                 pairs of values), not {} with head_dim = {}",
                if c.amx { "amx" } else { "dpbf16" },
                p.dtype,
                p.head_dim
            ),
        ));
    }
    Ok(())
}

/// Grouped heads and 256-key tiles: on two Zen 4 cores 52.6 ms against 59.7 ms for 32×64 tiles
/// per head (causal prefill of 2048 tokens, 8 query heads on 1 KV head, f32); grouping is a
/// no-op where every KV head has one query head.
pub(super) fn default(host: &CpuInfo) -> FlashConfig {
    FlashConfig {
        isa: host.isa,
        br: 32,
        bc: 256,
        group_heads: true,
        split: FlashSplit::Blocks,
        threads: host.threads.max(1),
        amx: false,
        dpbf16: false,
    }
}

pub(super) fn heuristic(p: &FlashProblem, host: &CpuInfo) -> FlashConfig {
    let threads = host.threads.max(1);
    // The pair kernels take query tiles of about 256 rows (the group's heads × positions),
    // fewer positions where a short prompt would leave a thread without a tile, and their own
    // key tiles:
    //
    // - AMX tiles, 512 keys. Two threads of a Xeon with AMX, causal prefill of 2048 tokens, d
    //   = 128: 8 query heads on 1 KV head br = 32, bc = 512 6.2-6.4 ms against 6.4 at bc = 256,
    //   7.2 at 128, 7.8 at 1024 and 27.8 for the AVX-512 kernel's default; 8 on 8 KV heads br =
    //   256 8.1-8.2 ms against 16.6 at 32.
    // - `vdpbf16ps` where it issues at the f32 FMA's rate (Zen 4; not Intel's cores), 256
    //   keys: both products in half the instructions. Two Zen 4 threads, the same prefill, ms:
    //   8 on 1 (br 32) 23.5-27.3 against 44.5-49.3 for the f32 kernel, flat within 26-29 from
    //   16 to 64 positions and 128 to 512 keys; 8 on 8 (br 256) 31.5-32.5 against 67.4-71.0,
    //   34.6-37.7 at br 32; 32 on 8 (br 64) 100 against 194, 104-111 at br 32.
    let pairs = if host.isa == Isa::Avx512Amx {
        Some((true, 512))
    } else if host.avx512_bf16 && host.isa >= Isa::Avx512 && !host.intel() {
        Some((false, 256))
    } else {
        None
    };
    if let Some((amx, bc)) = pairs.filter(|_| flash_on_pairs(p)) {
        let blocks = threads.div_ceil(p.batch * p.kv_heads);
        return FlashConfig {
            isa: host.isa,
            br: (256 / p.group()).max(1).min(p.q_len.div_ceil(blocks)),
            bc,
            group_heads: p.group() > 1,
            split: FlashSplit::Blocks,
            threads,
            amx,
            dpbf16: !amx,
        };
    }
    FlashConfig {
        isa: host.isa,
        br: 32,
        bc: 128,
        group_heads: p.group() > 1,
        split: FlashSplit::Blocks,
        threads,
        amx: false,
        dpbf16: false,
    }
}
