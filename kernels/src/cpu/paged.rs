//! Paged attention decode on the CPU.
//!
//! Work is divided into tasks of (sequence, head unit, partition): a head unit is one KV head
//! with all its query heads (`group_heads`), a single query head, or (`whole_rows`) every KV
//! head of the sequence with their query heads. A task reads its partition's keys and values
//! through the block table once, keeps the scores in scratch, and leaves an unnormalised
//! partial output with its row max and sum. A second pass combines the partitions of each
//! head by log-sum-exp; with a single partition the first pass writes the output directly.
//! A head's sink joins only that last division, as one more term of the sum. A soft-cap and
//! ALiBi's bias apply where a run of scores becomes weights ([`Adjust`]), whichever way the
//! scores were computed.
//!
//! The heads of a `whole_rows` task take turns so that each token row, all KV heads side by
//! side, is read by all of them while it is in L2: on AMX tiles inside the kernel (a scores
//! step, a value chunk), on key tiles a turn of tokens at a time ([`turn_tokens`], or the
//! config's `turn`), each added to its head's sums by an online softmax; the per-token kernel
//! takes every head's row of a token before the next token.

use super::leaf::prefetch;
use super::parallel::{for_each_task, SharedMut};
use super::table::{table, CacheElem, TableElem};
use crate::config::PagedConfig;
use crate::kernel::HeadValues;
use crate::problem::PagedProblem;
#[cfg(target_arch = "x86_64")]
use crate::DType;

/// Tokens ahead whose key or value row is prefetched: two blocks of 16, enough to cover the
/// memory latency at the rate a task consumes rows.
const PREFETCH: usize = 32;

/// Bytes of its rows a head of a `whole_rows` task on key tiles reads before the next head's
/// turn where a token row is wide (more than [`NARROW_ROW`] values): 16 tokens of f32 at d =
/// 128 and 8 KV heads, 32 of bf16 or f16. Two threads, cold, 8 sequences × 4096 tokens, 32
/// query heads on 8 KV heads, d = 128: f32 12.5–12.8 ms at 16 tokens against 16.0–17.0 at 32
/// and 18.4–18.7 at 64 (a KV head a task: 19.6–19.7); f16 11.1–12.3 at 32 against 12.2–13.1
/// at 16 and 13.3–13.5 at 64, bf16 12.8–13.6 at 32 against 13.6–13.8 at 16 and 21.3–21.6 at
/// 64; at d = 256 (4 sequences) bf16 7.8–8.3 at 16 against 12.0–13.2 at 32. Those turns
/// prefetched nothing (a turn is shorter than the tile kernels' prefetch distance); since
/// they prefetch the turns after theirs (`Task::ahead`), on two Zen 4 cores, same shape,
/// bf16 7.1–8.4 ms at 32 against 8.5–9.6 at 128, 9.0–9.8 at 256 and 7.7–11.2 a KV head a
/// task; f32 11.8–14.6 at 16 against 12.2–14.7 at 128, 12.6–15.5 at 256 and 14.9–16.1.
const TURN_BYTES: usize = 8192;

/// Values in a token row (every KV head) up to which a turn is [`LONG_TURN`] tokens. The same
/// 16 sequences × 4096 tokens at d = 128, 32 query heads on 4 KV heads: bf16 13.9–14.6 ms in
/// turns of 256 against 21.2–21.7 at 32 (the 8 KiB rule), f32 19.5–20.1 against 26.1–27.3 at
/// 16; on 2 KV heads bf16 14.2–14.4 against 22.5–24.1, f32 9.2–9.3 against 14.8–15.3; d = 64
/// on 8 KV heads (8 sequences), bf16 6.1–6.4 against 8.9–9.6 at 64, f16 6.1–6.4 against
/// 7.5–8.2, f32 even (9.9–10.3 at 256 and at 32; 16 sequences of 24 query heads 18.6–18.8
/// against 18.9–19.3). Measured on one host (an AMX Xeon running the AVX-512 kernels): other
/// hosts take the same rule untuned, and `tune` tries the other turns (`turn` in the config).
const NARROW_ROW: usize = 512;

/// A turn's tokens where a row is narrow.
const LONG_TURN: usize = 256;

/// Tokens of one head's turn where the config leaves it to the kernel (`turn` 0):
/// [`LONG_TURN`] where a row holds at most [`NARROW_ROW`] values, else [`TURN_BYTES`] of its
/// rows, whole tiles of 16, 16 to 256.
pub(crate) fn turn_tokens(p: &PagedProblem) -> usize {
    if p.kv_heads * p.head_dim <= NARROW_ROW {
        return LONG_TURN;
    }
    (TURN_BYTES / (p.head_dim * p.kv_dtype.size())).clamp(16, 256) / 16 * 16
}

/// Context tokens one task covers: a partition's, or all a sequence attends to (`partition`
/// 0). Partitions count from a sequence's first attended token: a window's start, which
/// need not begin a block.
pub(crate) fn part_len(p: &PagedProblem, partition: usize) -> usize {
    if partition == 0 {
        p.span()
    } else {
        partition.min(p.span())
    }
}

struct Layout {
    /// Query rows per KV head of a task.
    rows: usize,
    /// KV heads per task: the cache's all with `whole_rows`, else one.
    heads: usize,
    /// Head units per sequence.
    units: usize,
    /// Context tokens per partition.
    part_len: usize,
    /// Scores a query row's buffer holds: the partition's, or with key tiles over whole rows
    /// a turn's.
    ld: usize,
    parts: usize,
    /// Words of a tile kernel's own scratch: the laid-out query and key tile of `key_tiles`,
    /// the tiles' parts of `amx`.
    tile: usize,
}

impl Layout {
    fn new(p: &PagedProblem, c: &PagedConfig) -> Self {
        let (rows, heads, units) = if c.whole_rows {
            (p.group(), p.kv_heads, 1)
        } else if c.group_heads {
            (p.group(), 1, p.kv_heads)
        } else {
            (1, 1, p.q_heads)
        };
        let part_len = part_len(p, c.partition);
        #[cfg(target_arch = "x86_64")]
        let tile = {
            use super::paged_elems::{Bf16Bits, F16Bits, F32Words, Widened};
            use super::paged_tiles::q_words;
            match (c.key_tiles, p.kv_dtype) {
                _ if c.amx => super::paged_amx::scratch_words(p.head_dim, rows, part_len),
                (false, _) => 0,
                (true, _) if c.isa < crate::Isa::Avx512 => {
                    super::paged_tiles_avx2::q_words(p.head_dim, rows)
                }
                // The widened layout is the larger: either bf16 path fits.
                (true, DType::Bf16) => q_words::<Widened<Bf16Bits>>(p.head_dim, rows),
                // Fp8 keys are staged as f32, as f16 keys are.
                (true, DType::F16 | DType::Fp8(_)) => q_words::<Widened<F16Bits>>(p.head_dim, rows),
                (true, DType::F32) => q_words::<F32Words>(p.head_dim, rows),
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        let tile = 0;
        let ld = if heads > 1 && c.key_tiles {
            let turn = if c.turn == 0 { turn_tokens(p) } else { c.turn };
            turn.min(part_len)
        } else {
            part_len
        };
        Layout {
            rows,
            heads,
            units,
            part_len,
            ld,
            parts: p.span().div_ceil(part_len),
            tile,
        }
    }
    /// Query rows, scores, each row's max and sum, and the key tile, of one KV head of a task.
    fn per_head(&self, d: usize) -> usize {
        self.rows * (d + self.ld + 2) + self.tile
    }
    /// A task's buffers: [`Layout::per_head`] for each of its KV heads.
    fn per_worker(&self, d: usize) -> usize {
        self.heads * self.per_head(d)
    }
    /// Partial results of every (sequence, query head, partition): output row, max, sum.
    fn partials(&self, p: &PagedProblem) -> usize {
        if self.parts == 1 {
            0
        } else {
            p.num_seqs * p.q_heads * self.parts * (p.v_head_dim + 2)
        }
    }
}

pub fn scratch_len(p: &PagedProblem, c: &PagedConfig) -> usize {
    let lay = Layout::new(p, c);
    lay.partials(p) + c.threads * lay.per_worker(p.head_dim)
}

/// One call on queries of `Q` and caches of `C` (the same type, or fp8 bytes); `kv` are the
/// factors ([`crate::kernel::KvScales::for_kernels`]) on the keys' and values' cached values.
#[allow(clippy::too_many_arguments)]
pub fn run<Q: TableElem, C: CacheElem>(
    p: &PagedProblem,
    c: &PagedConfig,
    query: &[Q],
    key_cache: &[C],
    value_cache: &[C],
    block_tables: &[u32],
    max_blocks: usize,
    context_lens: &[u32],
    (heads, kv): (HeadValues<'_>, (f32, f32)),
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let caches = (query, key_cache, value_cache);
    let tables = (block_tables, max_blocks, context_lens);
    run_with(
        p,
        c,
        caches,
        tables,
        (heads, kv),
        out,
        scratch,
        Engine::Hardware,
    );
}

/// What the tasks of `amx` configs run on: the tiles, or in tests their software model (which
/// lets every host check the kernel against the reference).
#[derive(Debug, Clone, Copy)]
pub(super) enum Engine {
    Hardware,
    /// With the AVX-512 passes (the host has AVX-512F) or the portable ones.
    #[cfg(all(test, target_arch = "x86_64"))]
    Model {
        avx512: bool,
    },
}

/// [`run`], with the tasks of `amx` configs on `engine`.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_with<Q: TableElem, C: CacheElem>(
    p: &PagedProblem,
    c: &PagedConfig,
    (query, key_cache, value_cache): (&[Q], &[C], &[C]),
    (block_tables, max_blocks, context_lens): (&[u32], usize, &[u32]),
    (heads, (k_factor, v_factor)): (HeadValues<'_>, (f32, f32)),
    out: &mut [f32],
    scratch: &mut [f32],
    engine: Engine,
) {
    let sinks = heads.sinks;
    // The AMX and key-tile kernels are x86-64's; elsewhere every config runs per token.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = engine;
    let t = table(c.isa);
    let (widen, dot, axpy) = (Q::fns(t).widen, C::dot(t), C::axpy(t));
    let csize = std::mem::size_of::<C>();
    let lay = Layout::new(p, c);
    // Output rows take the first `dv` of each value row (all of it but on a latent cache);
    // the accumulators keep the query rows' stride `d`.
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let (partials, workers) = scratch.split_at_mut(lay.partials(p));
    let (per_head, per_worker) = (lay.per_head(d), lay.per_worker(d));
    let partials = SharedMut(partials.as_mut_ptr());
    let workers = SharedMut(workers.as_mut_ptr());
    let out_ptr = SharedMut(out.as_mut_ptr());
    // An fp8 cache's key factor moves out of each dot product, into the query's scale.
    let qscale = p.scale.get() * std::f32::consts::LOG2_E * k_factor;
    // Scores carry scale · log2(e) (folded into the query rows): a soft-cap in those units.
    let cap = p.softcap.map(|c| c.get() * std::f32::consts::LOG2_E);
    let tasks = p.num_seqs * lay.units * lay.parts;
    // bf16 key tiles multiply pairs where the host has AVX-512-BF16, head_dim is even and the
    // config does not widen.
    #[cfg(target_arch = "x86_64")]
    let pairs = d.is_multiple_of(2) && crate::CpuInfo::detect().avx512_bf16 && !c.widen;
    for_each_task(c.threads, tasks, |task, worker| {
        let part = task % lay.parts;
        let unit = task / lay.parts % lay.units;
        let seq = task / lay.parts / lay.units;
        let (h0, kvh) = if c.group_heads {
            (unit * p.group(), unit)
        } else {
            (unit, unit / p.group())
        };
        let ctx = context_lens[seq] as usize;
        let t0 = p.first_token(ctx) + part * lay.part_len;
        let t1 = (t0 + lay.part_len).min(ctx);
        let n = t1.saturating_sub(t0);
        // What makes the scores of head unit j's rows from token `first` on the softmax's.
        let adjust = |j: usize, first: usize| Adjust {
            cap,
            slopes: match heads.slopes {
                [] => &[],
                all => &all[h0 + j * lay.rows..][..lay.rows],
            },
            // The new token is the context's last: distances count back from it.
            first: first as f32 - (ctx - 1) as f32,
        };
        // Block sizes are powers of two (validated): shifts, where a division by the run-time
        // size cost more than the token's arithmetic.
        let shift = p.block_size.trailing_zeros();
        let kv_offset = |tok: usize| {
            let block = block_tables[seq * max_blocks + (tok >> shift)] as usize;
            (((block << shift) + (tok & (p.block_size - 1))) * p.kv_heads + kvh) * d
        };
        // Normalises a finished task's rows into the output, or leaves them as a partition's
        // partial result with its max and sum.
        let finish = |j: usize, acc: &[f32], stats: &[f32]| {
            for r in 0..lay.rows {
                let (m, l) = (stats[2 * r], stats[2 * r + 1]);
                let head = h0 + j * lay.rows + r;
                if lay.parts == 1 {
                    let total = l + super::sink_weight(sinks, head, m);
                    // The value factor joins the division: every term of a row carries it.
                    let inv = if total > 0.0 { v_factor / total } else { 0.0 };
                    for x in 0..dv {
                        // SAFETY: each (seq, head) output row is written by exactly one task.
                        unsafe {
                            *out_ptr.get().add((seq * p.q_heads + head) * dv + x) =
                                acc[r * d + x] * inv
                        };
                    }
                } else {
                    let base = ((seq * p.q_heads + head) * lay.parts + part) * (dv + 2);
                    // SAFETY: each (seq, head, part) partial slot is written by exactly one task.
                    unsafe {
                        let dst = partials.get().add(base);
                        std::ptr::copy_nonoverlapping(acc.as_ptr().add(r * d), dst, dv);
                        *dst.add(dv) = m;
                        *dst.add(dv + 1) = l;
                    }
                }
            }
        };
        if c.amx {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: validation admits `amx` for bf16 queries and caches (Q and C) with
            // head_dim a multiple of 32 on hosts with usable AMX tiles (every one has
            // AVX-512); block indices were checked against the cache size by the caller, so
            // every block a token lies in is wholly inside the cache; head `j`'s buffers are the `j`-th `per_head` words of
            // this worker's, each part reached through one pointer at a time.
            unsafe {
                use super::paged_tiles::{Rows, Task};
                let base = workers.get().add(worker * per_worker);
                let rows = |cache: &[C]| Rows {
                    base: cache.as_ptr().add(kvh * d).cast::<u8>(),
                    table: block_tables.as_ptr().add(seq * max_blocks),
                    first: t0,
                    shift,
                    stride: p.kv_heads * d * csize,
                };
                // Head j's buffers: accumulators (the query rows' place in the other
                // kernels), scores, max and sum per row, the tile kernel's scratch.
                let scores_at = |j: usize| base.add(j * per_head + lay.rows * d);
                let stats_at = |j: usize| scores_at(j).add(lay.rows * lay.ld);
                let heads = super::paged_amx::Heads {
                    count: lay.heads,
                    first: Task {
                        q: query.as_ptr().add((seq * p.q_heads + h0) * d).cast::<u8>(),
                        rows: lay.rows,
                        d,
                        dv,
                        n,
                        key: rows(key_cache),
                        value: rows(value_cache),
                        scale: qscale,
                        scores: scores_at(0),
                        ld: lay.ld,
                        scratch: stats_at(0).add(2 * lay.rows).cast::<u32>(),
                        acc: base,
                        q_ready: false,
                        ahead: 0,
                    },
                    q: lay.rows * d * std::mem::size_of::<Q>(),
                    cache: d * csize,
                    buf: per_head,
                };
                let normalise = |j: usize, s: *mut f32| {
                    softmax(
                        t,
                        std::slice::from_raw_parts_mut(s, lay.rows * lay.ld),
                        std::slice::from_raw_parts_mut(stats_at(j), 2 * lay.rows),
                        (lay.rows, lay.ld, n),
                        adjust(j, t0),
                    )
                };
                for j in 0..lay.heads {
                    std::slice::from_raw_parts_mut(base.add(j * per_head), lay.rows * d).fill(0.0);
                }
                match engine {
                    Engine::Hardware => super::paged_amx::task(heads, normalise),
                    #[cfg(test)]
                    Engine::Model { avx512: false } => {
                        super::paged_amx::task_on_model::<false>(heads, normalise)
                    }
                    #[cfg(test)]
                    Engine::Model { avx512: true } => {
                        super::paged_amx::task_on_model::<true>(heads, normalise)
                    }
                }
                for j in 0..lay.heads {
                    let acc = std::slice::from_raw_parts(base.add(j * per_head), lay.rows * d);
                    let stats = std::slice::from_raw_parts(stats_at(j), 2 * lay.rows);
                    finish(j, acc, stats);
                }
            }
            return;
        }
        if c.key_tiles {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: validation admits `key_tiles` at ISA avx2-fma and above on hosts that
            // run it (Q and C are the query and cache types, read as raw bytes; the AVX-512
            // kernels at avx512 and above, bf16 pairs only where the host has AVX-512-BF16 and
            // head_dim is even);
            // block indices were checked against the cache size by the caller, so every block
            // a token lies in is wholly inside the cache; head `j`'s buffers are the `j`-th
            // `per_head` words of this worker's, each reached through one pointer at a time.
            unsafe {
                use super::paged_tiles::{Rows, Task};
                let base = workers.get().add(worker * per_worker);
                let rows = |cache: &[C], j: usize, first: usize| Rows {
                    base: cache.as_ptr().add((kvh + j) * d).cast::<u8>(),
                    table: block_tables.as_ptr().add(seq * max_blocks),
                    first,
                    shift,
                    stride: p.kv_heads * d * csize,
                };
                use super::paged_tiles as t512;
                use super::paged_tiles_avx2 as avx2;
                use crate::Fp8::E5m2;
                // Fp8 caches go with 16-bit queries (validated): bf16 where not f16.
                let run = match (p.dtype, p.kv_dtype) {
                    _ if c.isa < crate::Isa::Avx512 => match (p.dtype, p.kv_dtype) {
                        (_, DType::Bf16) => avx2::task::<avx2::Bf16>,
                        (_, DType::F16) => avx2::task::<avx2::F16>,
                        (_, DType::F32) => avx2::task::<avx2::F32>,
                        (DType::F16, DType::Fp8(E5m2)) => avx2::task::<avx2::Fp8<avx2::F16, true>>,
                        (DType::F16, DType::Fp8(_)) => avx2::task::<avx2::Fp8<avx2::F16, false>>,
                        (_, DType::Fp8(E5m2)) => avx2::task::<avx2::Fp8<avx2::Bf16, true>>,
                        (_, DType::Fp8(_)) => avx2::task::<avx2::Fp8<avx2::Bf16, false>>,
                    },
                    (_, DType::Bf16) if pairs => t512::task_bf16,
                    (_, DType::Bf16) => t512::task_bf16_widened,
                    (_, DType::F16) => t512::task_f16,
                    (_, DType::F32) => t512::task_f32,
                    (DType::F16, DType::Fp8(E5m2)) => t512::task_f16_e5m2,
                    (DType::F16, DType::Fp8(_)) => t512::task_f16_e4m3,
                    (_, DType::Fp8(E5m2)) => t512::task_bf16_e5m2,
                    (_, DType::Fp8(_)) => t512::task_bf16_e4m3,
                };
                let (rd, ld) = (lay.rows * d, lay.ld);
                // Head j: accumulators, scores, each row's max and sum, the kernel's scratch.
                let acc_at = |j: usize| base.add(j * per_head);
                let stats_at = |j: usize| acc_at(j).add(rd + lay.rows * ld);
                for j in 0..lay.heads {
                    std::slice::from_raw_parts_mut(acc_at(j), rd).fill(0.0);
                    let stats = std::slice::from_raw_parts_mut(stats_at(j), 2 * lay.rows);
                    for r in 0..lay.rows {
                        stats[2 * r] = f32::NEG_INFINITY;
                        stats[2 * r + 1] = 0.0;
                    }
                }
                // With several heads they take turns, `lay.ld` tokens each, so every
                // row is read by all of them while it is in L2: each turn adds its tokens to
                // the head's sums by an online softmax (see `online_softmax`).
                let chunk = if lay.heads > 1 { lay.ld } else { n.max(1) };
                for c0 in (0..n).step_by(chunk) {
                    let len = chunk.min(n - c0);
                    for j in 0..lay.heads {
                        let (acc, stats) = (acc_at(j), stats_at(j));
                        let adjust = adjust(j, t0 + c0);
                        let task = Task {
                            q: query
                                .as_ptr()
                                .add((seq * p.q_heads + h0 + j * lay.rows) * d)
                                .cast::<u8>(),
                            rows: lay.rows,
                            d,
                            dv,
                            n: len,
                            key: rows(key_cache, j, t0 + c0),
                            value: rows(value_cache, j, t0 + c0),
                            scale: qscale,
                            scores: acc.add(rd),
                            ld,
                            scratch: stats.add(2 * lay.rows).cast::<u32>(),
                            acc,
                            q_ready: c0 > 0,
                            ahead: n - c0 - len,
                        };
                        run(task, move |s: *mut f32| {
                            online_softmax(
                                t,
                                std::slice::from_raw_parts_mut(s, lay.rows * ld),
                                std::slice::from_raw_parts_mut(stats, 2 * lay.rows),
                                std::slice::from_raw_parts_mut(acc, rd),
                                (lay.rows, ld, len, d),
                                adjust,
                            )
                        });
                    }
                }
                for j in 0..lay.heads {
                    let acc = std::slice::from_raw_parts(acc_at(j), rd);
                    let stats = std::slice::from_raw_parts(stats_at(j), 2 * lay.rows);
                    finish(j, acc, stats);
                }
            }
            return;
        }
        // SAFETY: one task per worker at a time, its heads' buffers `per_head` words each.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(workers.get().add(worker * per_worker), per_worker)
        };
        let sizes = (lay.rows * d, lay.rows * lay.ld, lay.rows);
        for (j, head) in buf.chunks_exact_mut(per_head).enumerate() {
            let (qbuf, _, _) = split_head(head, sizes);
            for r in 0..lay.rows {
                // SAFETY: the query row lies inside `query`; qbuf holds rows·d values.
                unsafe {
                    widen(
                        query
                            .as_ptr()
                            .add((seq * p.q_heads + h0 + j * lay.rows + r) * d),
                        qbuf.as_mut_ptr().add(r * d),
                        d,
                        qscale,
                    )
                };
            }
        }
        // Blocks lie anywhere in the cache: each is a short sequential run the hardware
        // prefetcher sees too late, so the rows PREFETCH tokens ahead are requested early.
        // With whole rows, every head's (they lie side by side), as many bytes ahead as for
        // one head, since a token takes that many times longer: 8 sequences × 4096 tokens,
        // 32 query heads on 8 KV heads, two threads, cold, f32 18.7–19.4 ms against 19.3 at
        // 32 tokens, bf16 13.8–14.2 against 14.0–15.5.
        let row_bytes = lay.heads * d * csize;
        let ahead = (PREFETCH / lay.heads).max(2);
        for i in 0..n {
            if i + ahead < n {
                prefetch::<_, false>(key_cache[kv_offset(t0 + i + ahead)..].as_ptr(), row_bytes);
            }
            let at = kv_offset(t0 + i);
            for (j, head) in buf.chunks_exact_mut(per_head).enumerate() {
                let (qbuf, scores, _) = split_head(head, sizes);
                let kp = key_cache[at + j * d..].as_ptr();
                for r in 0..lay.rows {
                    // SAFETY: block indices were checked against the cache size by the
                    // caller, and a row holds every KV head.
                    scores[r * lay.ld + i] = unsafe { dot(qbuf.as_ptr().add(r * d), kp, d) };
                }
            }
        }
        // The query rows are no longer needed: reuse them as the output accumulators.
        for (j, head) in buf.chunks_exact_mut(per_head).enumerate() {
            let (acc, scores, stats) = split_head(head, sizes);
            acc.fill(0.0);
            softmax(t, scores, stats, (lay.rows, lay.ld, n), adjust(j, t0));
        }
        for i in 0..n {
            if i + ahead < n {
                prefetch::<_, false>(value_cache[kv_offset(t0 + i + ahead)..].as_ptr(), row_bytes);
            }
            let at = kv_offset(t0 + i);
            for (j, head) in buf.chunks_exact_mut(per_head).enumerate() {
                let (acc, scores, _) = split_head(head, sizes);
                let vp = value_cache[at + j * d..].as_ptr();
                for r in 0..lay.rows {
                    let w = scores[r * lay.ld + i];
                    // SAFETY: acc rows hold d values; vp reads dv <= d values of the cache.
                    unsafe { axpy(acc.as_mut_ptr().add(r * d), w, vp, dv) };
                }
            }
        }
        for (j, head) in buf.chunks_exact_mut(per_head).enumerate() {
            let (acc, _, stats) = split_head(head, sizes);
            finish(j, acc, stats);
        }
    });
    if lay.parts > 1 {
        let partials = &scratch[..lay.partials(p)];
        combine(p, &lay, partials, (sinks, v_factor), out, c.threads);
    }
}

/// A per-token task's buffers of one KV head: query rows (then its accumulators, `qd` words),
/// scores (`scores` words), each of the `rows` query rows' max and sum.
fn split_head(
    head: &mut [f32],
    (qd, scores, rows): (usize, usize, usize),
) -> (&mut [f32], &mut [f32], &mut [f32]) {
    let (qbuf, rest) = head.split_at_mut(qd);
    let (scores, rest) = rest.split_at_mut(scores);
    (qbuf, scores, &mut rest[..2 * rows])
}

/// [`softmax`] for a run of tokens that continues earlier ones: each row's max and sum in
/// `stats` cover the earlier tokens and `acc` holds their unnormalised output. The new
/// scores become weights against the larger max, and the earlier sum and output are scaled
/// down to it where it grew.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn online_softmax(
    t: &super::table::Table,
    scores: &mut [f32],
    stats: &mut [f32],
    acc: &mut [f32],
    (rows, ld, n, d): (usize, usize, usize, usize),
    adjust: Adjust<'_>,
) {
    for r in 0..rows {
        let row = &mut scores[r * ld..r * ld + n];
        adjust.apply(t, r, row);
        let (m_old, l_old) = (stats[2 * r], stats[2 * r + 1]);
        let m = m_old.max((t.row_max)(row));
        let sum = if n == 0 { 0.0 } else { (t.exp2_sum)(row, m) };
        let mut l = l_old;
        if m > m_old && l_old > 0.0 {
            let a = super::leaf::exp2_approx(m_old - m);
            acc[r * d..(r + 1) * d].iter_mut().for_each(|x| *x *= a);
            l *= a;
        }
        stats[2 * r] = m;
        stats[2 * r + 1] = l + sum;
    }
}

/// Each query row's max score and the sum of `exp2(score - max)`, the scores replaced by
/// those weights; adjusted first (capped, biased).
fn softmax(
    t: &super::table::Table,
    scores: &mut [f32],
    stats: &mut [f32],
    (rows, ld, n): (usize, usize, usize),
    adjust: Adjust<'_>,
) {
    for r in 0..rows {
        let row = &mut scores[r * ld..r * ld + n];
        adjust.apply(t, r, row);
        let m = (t.row_max)(row);
        stats[2 * r] = m;
        stats[2 * r + 1] = if n == 0 { 0.0 } else { (t.exp2_sum)(row, m) };
    }
}

/// What turns a run of a head unit's scores (in units of `scale · log2(e)`) into the
/// softmax's: the soft-cap, then ALiBi's bias.
#[derive(Clone, Copy)]
struct Adjust<'a> {
    /// The cap in the scores' units.
    cap: Option<f32>,
    /// Each row's ALiBi slope (empty without ALiBi).
    slopes: &'a [f32],
    /// The distance of the run's first token from the query's position (0 or less; a whole
    /// number, exact in f32, as is each distance after it).
    first: f32,
}

impl Adjust<'_> {
    fn apply(&self, t: &super::table::Table, r: usize, row: &mut [f32]) {
        if let Some(unit) = self.cap {
            (t.softcap)(row, unit);
        }
        if let Some(&slope) = self.slopes.get(r) {
            (t.alibi_row)(row, slope * std::f32::consts::LOG2_E, self.first);
        }
    }
}

/// Log-sum-exp reduction of each head's partitions (and its sink) into the output, times
/// the cached values' factor `v_factor`.
fn combine(
    p: &PagedProblem,
    lay: &Layout,
    partials: &[f32],
    (sinks, v_factor): (&[f32], f32),
    out: &mut [f32],
    threads: usize,
) {
    let d = p.v_head_dim;
    let out_ptr = SharedMut(out.as_mut_ptr());
    for_each_task(threads, p.num_seqs * p.q_heads, |row, _| {
        let slots = &partials[row * lay.parts * (d + 2)..(row + 1) * lay.parts * (d + 2)];
        let m = slots
            .chunks_exact(d + 2)
            .map(|s| s[d])
            .fold(f32::NEG_INFINITY, f32::max);
        let mut l = super::sink_weight(sinks, row % p.q_heads, m);
        // SAFETY: each output row is written by exactly one task.
        let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(row * d), d) };
        o.fill(0.0);
        for s in slots.chunks_exact(d + 2) {
            if s[d + 1] == 0.0 {
                continue;
            }
            let w = super::leaf::exp2_approx(s[d] - m);
            l += s[d + 1] * w;
            for (ov, sv) in o.iter_mut().zip(&s[..d]) {
                *ov += sv * w;
            }
        }
        let inv = if l > 0.0 { v_factor / l } else { 0.0 };
        for ov in o.iter_mut() {
            *ov *= inv;
        }
    });
}
