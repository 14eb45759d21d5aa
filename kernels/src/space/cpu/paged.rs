//! Paged attention's CPU space: which kernel (per token, key tiles or AMX tiles), partitions
//! of long contexts, query heads grouped on their KV head, whole token rows a task, and the
//! turn each head takes over them.

use crate::config::PagedConfig;
use crate::device::{CpuInfo, Isa};
use crate::problem::PagedProblem;
use crate::{DType, Family, KernelError};

use super::{amx_refusal, check_common, invalid, isa_levels, thread_counts};

/// The longest turn a `whole_rows` task on key tiles takes (`turn` in paged configs).
const MAX_TURN: usize = 256;

/// Whether paged attention on AMX tiles can take a problem (on a host with them): the key
/// rows are A tiles of 32 values a row, of bf16 (AMX has no fp8 products on the hosts that
/// have it), and the value rows B tiles of 32 values a row (a latent cache's values, the key
/// rows' first `v_head_dim`, in whole tiles too).
fn paged_on_tiles(p: &PagedProblem) -> bool {
    p.dtype == DType::Bf16
        && p.kv_dtype == DType::Bf16
        && p.head_dim.is_multiple_of(32)
        && p.v_head_dim.is_multiple_of(32)
}

/// Why paged attention's `key_tiles` kernels cannot run at an ISA level, if they cannot.
/// Every cache type runs at avx2-fma (widened to f32; fp8 read as f16 bits) and avx512: there
/// bf16 multiplies pairs
/// where the host has AVX-512-BF16 and the head dimension is even, and is widened elsewhere
/// (decided as it runs, so a stored config stays valid on every AVX-512 host).
fn key_tiles_refusal(isa: Isa) -> Option<String> {
    (isa < Isa::Avx2Fma).then(|| format!("key_tiles = true needs isa avx2-fma or above, not {isa}"))
}

/// Why `widen` cannot go with a config, if it cannot: it chooses how the AVX-512 key tiles
/// multiply a bf16 cache, the only kernels and cache that have a choice.
fn widen_refusal(c: &PagedConfig, p: &PagedProblem) -> Option<String> {
    if !c.key_tiles || c.isa < Isa::Avx512 {
        Some(format!(
            "widen = true chooses how the AVX-512 key tiles multiply a bf16 cache (this \
             config has isa {} and key_tiles = {}): set key_tiles with isa avx512 or above, \
             or widen = false",
            c.isa, c.key_tiles
        ))
    } else if p.kv_dtype != DType::Bf16 {
        Some(format!(
            "widen = true chooses how a bf16 cache is multiplied, and this cache is {}: set \
             widen = false",
            p.kv_dtype
        ))
    } else {
        None
    }
}

/// Whether both ways of multiplying a bf16 cache run on this host, so tuning measures both.
fn widen_is_a_choice(c: &PagedConfig, p: &PagedProblem, host: &CpuInfo) -> bool {
    host.avx512_bf16 && p.head_dim.is_multiple_of(2) && widen_refusal(c, p).is_none()
}

pub(super) fn candidates(p: &PagedProblem, host: &CpuInfo) -> Vec<PagedConfig> {
    // The turns offered besides the rule's. Where the best turn lies was not one rule's
    // reach: on one AMX Xeon's AVX-512 kernels, 8 KV heads at d = 128 ran best in turns
    // of 16 (f32) or 32 (bf16) tokens and 1.5 times slower at 64, while 4 KV heads at d
    // = 128 and 8 at d = 64 ran best at 256 (README, session 16).
    const TURNS: [usize; 5] = [16, 32, 64, 128, MAX_TURN];
    let mut out = Vec::new();
    // The per-token and key-tile kernels at the host's top two levels below avx512-amx
    // (AMX hosts run them at avx512), and on AMX hosts the tile kernel at avx512-amx:
    // each level's kernels side by side in the innermost loop.
    let mut levels: Vec<Vec<(Isa, bool, bool)>> = isa_levels(host.isa)
        .into_iter()
        .map(|isa| vec![(isa, false, false), (isa, true, false)])
        .collect();
    if host.isa == Isa::Avx512Amx {
        levels.push(vec![(Isa::Avx512Amx, false, true)]);
    }
    // Whole rows only where a row holds more than one KV head.
    let row_splits: &[bool] = if p.kv_heads > 1 {
        &[false, true]
    } else {
        &[false]
    };
    for kernels in &levels {
        for &threads in &thread_counts(host) {
            for partition in [0, 256, 512, 1024, 2048] {
                for group_heads in [false, true] {
                    if (group_heads && p.group() == 1) || (partition >= p.span() && partition != 0)
                    {
                        continue;
                    }
                    for &(isa, key_tiles, amx) in kernels {
                        for &whole_rows in row_splits {
                            let c = PagedConfig {
                                isa,
                                partition,
                                group_heads,
                                threads,
                                key_tiles,
                                amx,
                                whole_rows,
                                turn: 0,
                                widen: false,
                            };
                            if validate(&c, p, host).is_err() {
                                continue;
                            }
                            let mut these = vec![c];
                            // Turns other than the kernel's rule, where heads take turns.
                            if key_tiles && whole_rows {
                                let rule = crate::cpu::paged_turn_tokens(p);
                                // Turns as long as the partition are all the same.
                                let part_len = crate::cpu::paged_part_len(p, partition);
                                let differs = |&t: &usize| t != rule && t < part_len;
                                for turn in TURNS.into_iter().filter(differs) {
                                    these.push(PagedConfig { turn, ..c });
                                }
                            }
                            if widen_is_a_choice(&c, p, host) {
                                let widened =
                                    these.iter().map(|&c| PagedConfig { widen: true, ..c });
                                these.extend(widened.collect::<Vec<_>>());
                            }
                            out.extend(these);
                        }
                    }
                }
            }
        }
    }
    out
}

pub(super) fn validate(
    c: &PagedConfig,
    p: &PagedProblem,
    host: &CpuInfo,
) -> Result<(), KernelError> {
    let f = Family::Paged;
    // An amx config names the tiles before its ISA level, so a host without them (an AVX2
    // or NEON one) is told what it lacks.
    if c.amx && (host.isa != Isa::Avx512Amx || c.isa != Isa::Avx512Amx) {
        return Err(invalid(f, amx_refusal("paged attention", c.isa, host)));
    }
    check_common(f, c.isa, c.threads, host)?;
    if c.key_tiles {
        if let Some(why) = key_tiles_refusal(c.isa) {
            return Err(invalid(f, why));
        }
    }
    if c.amx {
        if c.key_tiles {
            return Err(invalid(
                f,
                "amx and key_tiles name two different kernels: set one of them",
            ));
        }
        if !paged_on_tiles(p) {
            return Err(invalid(
                f,
                format!(
                    "amx paged attention needs bf16 caches and a head_dim and v_head_dim \
                     that are multiples of 32 (key and value rows are tiles of 32 values), \
                     not {} with head_dim = {} and v_head_dim = {}",
                    p.kv_dtype, p.head_dim, p.v_head_dim
                ),
            ));
        }
    }
    if c.turn != 0 {
        if !(c.key_tiles && c.whole_rows) {
            return Err(invalid(
                f,
                format!(
                    "turn = {} is how many tokens a head of a whole_rows task on key tiles \
                     takes at a time: set key_tiles and whole_rows, or turn = 0",
                    c.turn
                ),
            ));
        }
        if !c.turn.is_multiple_of(16) || !(16..=MAX_TURN).contains(&c.turn) {
            return Err(invalid(
                f,
                format!(
                    "turn = {} must be 0 (the kernel's rule) or a multiple of 16 from 16 to \
                     {MAX_TURN}",
                    c.turn
                ),
            ));
        }
    }
    if c.widen {
        if let Some(why) = widen_refusal(c, p) {
            return Err(invalid(f, why));
        }
    }
    if c.whole_rows && !c.group_heads && p.group() > 1 {
        return Err(invalid(
            f,
            format!(
                "whole_rows takes each KV head with all {} of its query heads: set \
                 group_heads",
                p.group()
            ),
        ));
    }
    if c.partition != 0 && (!c.partition.is_multiple_of(p.block_size) || c.partition > 1 << 20) {
        return Err(invalid(
            f,
            format!(
                "partition = {} must be 0 (whole context) or a multiple of block_size = {} up to {}",
                c.partition,
                p.block_size,
                1 << 20
            ),
        ));
    }
    Ok(())
}

/// Key tiles wherever the host runs them: on two Zen 4 cores 2.74 ms against 10.9 ms for the
/// per-token kernel (bf16 decode, 32 sequences × 4096 tokens, 8 query heads on 1 KV head; 5.17
/// against 11.2 ms on f32).
pub(super) fn default(host: &CpuInfo) -> PagedConfig {
    PagedConfig {
        isa: host.isa,
        partition: 0,
        group_heads: true,
        threads: host.threads.max(1),
        key_tiles: key_tiles_refusal(host.isa).is_none(),
        amx: false,
        whole_rows: false,
        turn: 0,
        widen: false,
    }
}

pub(super) fn heuristic(p: &PagedProblem, host: &CpuInfo) -> PagedConfig {
    let threads = host.threads.max(1);
    // AMX tiles where the head dimension allows: two threads of a Xeon with AMX, bf16, 32 sequences
    // × 4096 tokens, d = 128, 8 query heads on 1 KV head 2.5 ms against 4.6 for the key tiles, 64
    // on 8 38.9 against 69.1, 8 on 8 35.1 against 43.5.
    // Latent caches on tiles are offered to tuning but not guessed: they are checked on the
    // tiles' software model only (session 50's host had no AMX), unmeasured against the key
    // tiles, which take DeepSeek-V3's TP8 decode (8 × 4096 tokens, 16 heads on rows of 576)
    // in 8.6 and 8.8 ms on two AVX-512 cores (a third run 11.0), cold.
    let amx = host.isa == Isa::Avx512Amx && paged_on_tiles(p) && !p.is_latent();
    // On tiles (AMX or key tiles), every KV head of a row in one task where a row holds several.
    // Two threads, cold (`tune bench`), 8 sequences × 4096 tokens, 32 query heads on 8 KV heads:
    // AMX 7.9–8.3 ms against 9.1–9.6 a KV head a task (one thread 15.4–15.6 against 18.2–18.7); 32
    // on 4 4.3 against 4.8–5.1; 64 on 8 (4 sequences) 4.2–4.3 against 5.0–5.2; 32 on 32 (4 × 2048)
    // 8.3 against 9.8–9.9; one sequence of 32768 in partitions of 512 7.7–7.8 against 10.3–10.5.
    // Key tiles on the same 8 × 4096: f32 12.8–12.9 against 19.6–19.7 (one thread 25.4 against
    // 39.0; AVX2 15.3–15.7 against 34.1–34.2), bf16 pairs 13.0–13.2 against 16.1, f16 12.1–12.4
    // against 13.5–13.6 in turns of 16 tokens (the 32-token turns they now take: 12.8–13.6 and
    // 11.8–12.3). Warm (the cache in L3) f16 is slower, 11.7 against 9.7; a server reads from DRAM.
    // The per-token kernel (what hosts without AVX2 run) at avx512 on the same shape: f32 18.7–19.4
    // against 24.2–24.4, bf16 13.8–14.2 against 15.6–16.4; portable, whose arithmetic sets its
    // pace, f32 66.1–68.6 against 60.1–69.5 (median 66.9 against 64.1), so it keeps a KV head a
    // task. NEON, vectorised like the avx512 kernel, takes whole rows (not measured).
    let key_tiles = !amx && key_tiles_refusal(host.isa).is_none();
    let whole_rows = p.kv_heads > 1 && host.isa != Isa::Portable;
    // Split long contexts so every thread has work even with few sequences.
    let units = p.num_seqs * if whole_rows { 1 } else { p.kv_heads };
    let partition = if units >= 4 * threads || p.span() <= 512 {
        0
    } else {
        512usize.max(p.block_size)
    };
    let c = PagedConfig {
        isa: host.isa,
        partition,
        group_heads: p.group() > 1,
        threads,
        key_tiles,
        amx,
        whole_rows,
        turn: 0,
        widen: false,
    };
    // bf16 caches widened on Intel cores, whose `vdpbf16ps` issues at under half the FMA
    // rate: DeepSeek-V3's TP8 latent decode (8 × 4096 tokens, 16 heads on rows of 576) on two
    // cores of a model-207 Xeon 7.09–7.22 ms widened against 8.51–8.64 in pairs, cold, taken
    // in turns; the product loop there measured 2.2 clocks a `vdpbf16ps` against 0.5 an FMA.
    // Zen 4 multiplies pairs at the full rate and keeps them.
    PagedConfig {
        widen: host.intel() && widen_refusal(&c, p).is_none(),
        ..c
    }
}
