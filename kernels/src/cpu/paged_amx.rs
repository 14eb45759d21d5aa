//! Paged attention decode on AMX tiles: bf16 caches whose head dimension is a multiple of 32,
//! both products as `tdpbf16ps`, the softmax between them in f32. [`super::paged`] owns the
//! tasks (sequence, head unit, partition), the softmax and the partitions; a task here:
//!
//! - scores `Sᵀ = K·Qᵀ`, 32 tokens a step: the rows of 16 keys are an A tile loaded straight
//!   from the cache (16 consecutive rows of one block, at the cache's row stride) or, where a
//!   block holds fewer or a partition starts inside one, gathered first; the query rows, laid
//!   out once per task as pair rows of up to 16 heads, are the B tiles. The accumulators
//!   (tokens × heads) are transposed into the scores' rows;
//! - the caller's softmax over each row, then the weights rounded to bf16 as the A tiles of
//!   `P·V`, zero past the task's tokens (GPU kernels and PyTorch's CPU flash attention round
//!   them the same way);
//! - `O += P·V`: the value rows of 16 tokens are a B tile loaded straight from the cache
//!   like the keys, 32 head-dim values a row (on a latent cache, the key rows' first
//!   `v_head_dim` values: the value blocks only). `tdpbf16ps` multiplies pairs, so each weight
//!   is paired with a zero: one A tile holds the tokens' weights in the even halves of their
//!   pairs, another in the odd halves, and the two products give the even and the odd
//!   columns. That doubles this product's multiplies against interleaving the values in key
//!   pairs first, but the interleaved copy cost more (its stores ran at L2 speed: 6.7 ns a
//!   token against 2 for the second product).
//!
//! Why tiles: on the Xeon this was written on, `vdpbf16ps` issues one every two cycles, half
//! the multiply-adds of f32 FMAs, and the AVX-512 kernel took about 230 cycles a token (8
//! query heads on one KV head, d = 128); one `tdpbf16ps` does 16 × 16 × 32 multiply-adds in
//! about 16 cycles whatever the rows, so a token's two products cost about 4.
//!
//! The passes between the products are plain Rust, compiled with AVX-512 for the hardware
//! (LLVM vectorises them) and portably for the software model of the tiles, which runs this
//! kernel against the reference on every machine.

use super::amx_tiles::{c_tile, TileConfig, Tiles, A_TILE, B_TILE, ROWS};
use super::leaf::prefetch;
use super::paged_tiles::{Rows, Task};

/// Tokens per scores step: two A tiles of 16 keys.
const STEP: usize = 2 * ROWS;
/// Query rows per block of the scores: two groups of 16 (their B tiles).
const BLOCK_ROWS: usize = 2 * ROWS;
/// Tokens whose `P·V` accumulators stay in the tiles, per pass over 64 head-dim columns.
const V_CHUNK: usize = 256;
/// The same where the heads of whole rows take turns a chunk each. Head 0's pass requests
/// every head's rows ahead, so the longer the chunk the burstier the reads: two threads, 8
/// sequences × 4096 tokens, 32 query heads on 8 KV heads, cold 7.9 ms at 64 tokens against
/// 8.5–8.8 at 256. (In an earlier build: 32 tokens as fast as 64, 128 as slow as 256, and
/// each head requesting its share of the pages a chunk ahead slower than head 0 alone.)
const V_CHUNK_ROWS: usize = 64;
/// Tokens ahead whose rows are prefetched into L2 (see [`Ahead`]).
const AHEAD: usize = 64;
/// Bytes requested at the head of a tile whose rows fill their memory back to back. Cold
/// (`tune bench`), two threads, builds alternating round by round: 32 × 4096 tokens, 8 query
/// heads on 1 KV head, 4.86–5.06 ms at 768 against 5.14–5.30 at 512 (eight rounds; 1024 about
/// as 768, 2048 as 512); 8 × 4096, 32 on 8 KV heads, 8.31–8.40 against 8.55–8.87. Warm no
/// slower (one thread 5.70–6.16 against 6.08–6.76).
const HEAD: usize = 768;
/// Words of one B tile of query pairs: 16 pair rows of 16 heads.
const QT_TILE: usize = ROWS * ROWS;

/// Where a task's buffers lie in its scratch, as offsets in 32-bit words. `Qᵀ` comes first:
/// per block of 32 query rows, per group of 16, per 32-value chunk of the head dimension, a B
/// tile of pair rows.
struct Parts {
    /// Rows gathered into tiles where the cache's are not 16 consecutive rows of one block
    /// (or a tile runs past the task's tokens): [`V_CHUNK`] rows of `d` bf16.
    gathered: usize,
    /// The accumulators of a scores step, 32 tokens × 32 heads f32.
    cst: usize,
    /// The weights as the even halves of pairs, `[rows][np]` words.
    p_even: usize,
    /// The same as the odd halves.
    p_odd: usize,
    /// Words in all.
    total: usize,
    /// Weights per row: the partition rounded up to a whole tile.
    np: usize,
}

impl Parts {
    fn new(d: usize, rows: usize, part_len: usize) -> Parts {
        let blocks = rows.div_ceil(BLOCK_ROWS);
        let np = part_len.next_multiple_of(ROWS);
        let gathered = blocks * 2 * (d / 32) * QT_TILE;
        let cst = gathered + V_CHUNK.max(STEP) * d / 2;
        let p_even = cst + STEP * BLOCK_ROWS;
        let p_odd = p_even + rows * np;
        Parts {
            gathered,
            cst,
            p_even,
            p_odd,
            total: p_odd + rows * np,
            np,
        }
    }
}

/// Scratch words one task needs (`rows` query rows, head dimension `d`, `part_len` tokens).
pub fn scratch_words(d: usize, rows: usize, part_len: usize) -> usize {
    Parts::new(d, rows, part_len).total
}

/// Tasks of several KV heads side by side, as one task of [`task`] covers them: head `j`'s
/// is `first` with its query rows `j · q` bytes on, its cache rows `j · cache` bytes on, and
/// its buffers (scores, scratch, accumulators) `j · buf` words on: the heads of a task differ
/// only in where their rows and buffers start.
#[derive(Clone, Copy)]
pub struct Heads {
    pub count: usize,
    pub first: Task,
    pub q: usize,
    pub cache: usize,
    pub buf: usize,
}

impl Heads {
    /// Head `j`'s task.
    #[inline(always)]
    fn task(&self, j: usize) -> Task {
        let t = self.first;
        let at = |r: Rows| Rows {
            base: r.base.wrapping_add(j * self.cache),
            ..r
        };
        Task {
            q: t.q.wrapping_add(j * self.q),
            key: at(t.key),
            value: at(t.value),
            scores: t.scores.wrapping_add(j * self.buf),
            scratch: t.scratch.wrapping_add(j * self.buf),
            acc: t.acc.wrapping_add(j * self.buf),
            ..t
        }
    }
}

/// One paged-attention task on bf16 caches over `heads.count` KV heads (every head has the
/// same rows, `d`, `n` and `ld`). Each head's `scores` get its scaled scores; `softmax(j, _)`
/// (handed the same pointer) turns them into weights; `P·V` is added to its `acc`.
///
/// With several heads, the heads take turns a scores step (32 tokens) or a value chunk at a
/// time, so the tokens' rows of all of them are read while they are in L2; where head 0's
/// rows start a run of `heads` rows (`key.stride` is `heads` rows of `d`), the prefetches
/// ahead cover that whole run and only head 0 issues them.
///
/// # Safety
/// The host has AMX-TILE and AMX-BF16 with the kernel's permission, and AVX-512F/BW/VL/DQ;
/// `d` is a multiple of 32; for every `j < heads.count`, head `j`'s task has a `q` that holds
/// bf16 rows, whose `key.at(i)` and `value.at(i)` point at `d` readable bf16 for `i < n`,
/// inside blocks of the cache that are wholly readable, and a `scratch` that holds
/// [`scratch_words`]`(d, rows, ld)` words of its own.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
pub unsafe fn task(heads: Heads, softmax: impl FnMut(usize, *mut f32)) {
    // SAFETY: the caller's contract.
    unsafe { task_on::<_, true>(&mut super::amx_tiles::Hardware, heads, softmax) }
}

/// [`task`] on any implementation of the tiles; `AVX512` moves the scores out of the
/// accumulators with in-register transposes (the host has AVX-512F) rather than one by one.
///
/// # Safety
/// As [`task`], with `T`'s requirements for the AMX ones.
#[inline(always)]
pub(super) unsafe fn task_on<T: Tiles, const AVX512: bool>(
    tiles: &mut T,
    all: Heads,
    mut softmax: impl FnMut(usize, *mut f32),
) {
    let heads = all.count;
    let task_of = |j: usize| all.task(j);
    let Task {
        rows,
        d,
        dv,
        n,
        value,
        ld,
        ..
    } = task_of(0);
    let parts = Parts::new(d, rows, ld);
    // Heads whose rows head 0's prefetches cover: all, where their rows are one run.
    let span = if heads > 1 && value.stride == heads * 2 * d {
        heads
    } else {
        1
    };
    let v_chunk = if heads > 1 { V_CHUNK_ROWS } else { V_CHUNK };
    // SAFETY: every pointer below stays inside the caller's buffers: the scratch parts by
    // `Parts`, the cache rows by `Rows::at` for tokens below `n` (or rows of a block that
    // holds one), the scores and `acc` by their row counts.
    unsafe {
        if n == 0 {
            for j in 0..heads {
                softmax(j, task_of(j).scores);
            }
            return;
        }
        for j in 0..heads {
            let t = task_of(j);
            lay_out_queries(t.q, rows, d, t.scratch);
        }
        scores::<T, AVX512>(tiles, &all, span, &parts);
        let (np, n_pad) = (parts.np, n.next_multiple_of(ROWS));
        for j in 0..heads {
            let t = task_of(j);
            softmax(j, t.scores);
            let (p_even, p_odd) = (t.scratch.add(parts.p_even), t.scratch.add(parts.p_odd));
            for r in 0..rows {
                let w = std::slice::from_raw_parts(t.scores.add(r * ld), n);
                let even = std::slice::from_raw_parts_mut(p_even.add(r * np), n_pad);
                let odd = std::slice::from_raw_parts_mut(p_odd.add(r * np), n_pad);
                for ((e, o), &x) in even.iter_mut().zip(odd.iter_mut()).zip(w) {
                    let bits = to_bf16_bits(x);
                    *e = bits;
                    *o = bits << 16;
                }
                even[n..].fill(0);
                odd[n..].fill(0);
            }
        }
        let mut shape = None;
        for c0 in (0..n).step_by(v_chunk) {
            let count = v_chunk.min(n - c0).div_ceil(ROWS);
            for j in 0..heads {
                let t = task_of(j);
                let gathered = t.scratch.add(parts.gathered).cast::<u8>();
                let mut sources = [(std::ptr::null(), 0); V_CHUNK / ROWS];
                for (i, s) in sources.iter_mut().enumerate().take(count) {
                    let staging = gathered.add(i * ROWS * 2 * d);
                    *s = tile_source(&t.value, c0 + i * ROWS, n, d, staging);
                }
                let (p_even, p_odd) = (t.scratch.add(parts.p_even), t.scratch.add(parts.p_odd));
                for g in 0..rows.div_ceil(ROWS) {
                    let g_rows = ROWS.min(rows - g * ROWS);
                    if shape != Some(g_rows) {
                        tiles.configure(&TileConfig::shaped(&[g_rows; 2], 2));
                        shape = Some(g_rows);
                    }
                    let (even, odd) = (p_even.add(g * ROWS * np), p_odd.add(g * ROWS * np));
                    let weights = (even.cast_const(), odd.cast_const(), np);
                    let acc = t.acc.add(g * ROWS * d);
                    let tokens = (c0, n, &sources[..count]);
                    let lead = (j == 0 && g == 0).then_some((&value, span));
                    values(tiles, weights, tokens, lead, (d, dv), acc);
                }
            }
        }
        if shape.is_some() {
            tiles.release();
        }
        // Each 32 columns of `acc` hold the even columns, then the odd ones.
        for j in 0..heads {
            let acc = task_of(j).acc;
            for r in 0..rows {
                for x0 in (0..dv).step_by(32) {
                    let at = acc.add(r * d + x0);
                    let held: [f32; 32] = std::ptr::read(at.cast());
                    for i in 0..16 {
                        *at.add(2 * i) = held[i];
                        *at.add(2 * i + 1) = held[16 + i];
                    }
                }
            }
        }
    }
}

/// `Qᵀ` as the scores' B tiles at the start of `scratch`: tile (block `b`, group `g`, chunk
/// `kb`) has pair row `k` = word `16·kb + k` of the group's 16 query rows, zero for rows past
/// `rows`.
///
/// # Safety
/// `q` holds `rows` rows of `d` bf16; `scratch` the tiles.
#[inline(always)]
unsafe fn lay_out_queries(q: *const u8, rows: usize, d: usize, scratch: *mut u32) {
    let chunks = d / 32;
    // SAFETY: the caller's contract.
    unsafe {
        for b in 0..rows.div_ceil(BLOCK_ROWS) {
            for g in 0..2 {
                for kb in 0..chunks {
                    let tile = scratch.add(((b * 2 + g) * chunks + kb) * QT_TILE);
                    for k in 0..ROWS {
                        for h in 0..ROWS {
                            let r = b * BLOCK_ROWS + g * ROWS + h;
                            let word = if r < rows {
                                q.add(r * 2 * d + 4 * (kb * ROWS + k))
                                    .cast::<u32>()
                                    .read_unaligned()
                            } else {
                                0
                            };
                            tile.add(k * ROWS + h).write(word);
                        }
                    }
                }
            }
        }
    }
}

/// The scaled scores of every head's `n` tokens into its `scores`, 32 tokens a step, the
/// heads in turn each step; head 0 prefetches the rows ahead, those of `span` heads.
///
/// # Safety
/// As [`task_on`]; every head's query tiles are laid out.
#[inline(always)]
unsafe fn scores<T: Tiles, const AVX512: bool>(
    tiles: &mut T,
    all: &Heads,
    span: usize,
    parts: &Parts,
) {
    let (heads, task_of) = (all.count, |j: usize| all.task(j));
    let Task {
        rows,
        d,
        n,
        key: lead_key,
        value: lead_value,
        scale,
        ld,
        ..
    } = task_of(0);
    let chunks = d / 32;
    // SAFETY: the caller's contract.
    unsafe {
        tiles.configure(&TileConfig::full(2, rows.div_ceil(ROWS).min(2)));
        for i0 in (0..n).step_by(STEP) {
            let live = STEP.min(n - i0);
            // The tiles AHEAD tokens on; past the keys, the first value rows.
            let ahead = [0, ROWS].map(|j| {
                let u = i0 + AHEAD + j;
                if u < n {
                    Ahead::of(&lead_key, u, n, d, span)
                } else if u - n < n {
                    Ahead::of(&lead_value, u - n, n, d, span)
                } else {
                    Ahead::NONE
                }
            });
            for h in 0..heads {
                let t = task_of(h);
                let gathered = t.scratch.add(parts.gathered).cast::<u8>();
                let cst = t.scratch.add(parts.cst).cast::<f32>();
                let first = tile_source(&t.key, i0, n, d, gathered);
                let sources = [
                    first,
                    if i0 + ROWS < n {
                        tile_source(&t.key, i0 + ROWS, n, d, gathered.add(ROWS * 2 * d))
                    } else {
                        // No live keys: any readable rows do, their scores are not stored.
                        first
                    },
                ];
                for b in 0..rows.div_ceil(BLOCK_ROWS) {
                    let groups = (rows - b * BLOCK_ROWS).div_ceil(ROWS).min(2);
                    for i in 0..2 {
                        for g in 0..groups {
                            tiles.zero(c_tile(i, g));
                        }
                    }
                    for kb in 0..chunks {
                        for (i, &(base, stride)) in sources.iter().enumerate() {
                            tiles.load(A_TILE + i, base.add(64 * kb), stride);
                            for g in 0..groups {
                                if i == 0 {
                                    let tile = t.scratch.add(((b * 2 + g) * chunks + kb) * QT_TILE);
                                    tiles.load(B_TILE + g, tile.cast(), 4 * ROWS);
                                }
                                tiles.dot(c_tile(i, g), A_TILE + i, B_TILE + g);
                            }
                        }
                        if h == 0 && b == 0 {
                            for tile in &ahead {
                                tile.prefetch(64 * kb, 64);
                            }
                        }
                    }
                    for i in 0..2 {
                        for g in 0..groups {
                            let at = cst.add(i * ROWS * BLOCK_ROWS + g * ROWS);
                            tiles.store(c_tile(i, g), at.cast(), 4 * BLOCK_ROWS);
                        }
                    }
                    let block_rows = (rows - b * BLOCK_ROWS).min(BLOCK_ROWS);
                    let dst = t.scores.add(b * BLOCK_ROWS * ld + i0);
                    spill_scores::<AVX512>(cst, block_rows, dst, ld, live, scale);
                }
            }
        }
        tiles.release();
    }
}

/// `acc += P·V` for one group of up to 16 query rows (`acc` at its first row, `d` apart)
/// over the tokens of a chunk, whose value tiles are `sources` (rows of `d`, of which the
/// first `dv` are the value: all but on a latent cache), 64 columns a pass: the even
/// and odd columns of two 32-column blocks in the four accumulators, loaded once and stored
/// once per pass. `weights` are the group's (even, odd, words a row). With `lead` (the
/// value rows of head 0 and how many heads' rows to request), the rows [`AHEAD`] tokens on
/// are prefetched, the pass's lines of each.
///
/// # Safety
/// As [`task_on`]; the tiles are configured for the group's rows, two A and two B tiles.
#[inline(always)]
#[allow(clippy::type_complexity)]
unsafe fn values<T: Tiles>(
    tiles: &mut T,
    (p_even, p_odd, np): (*const u32, *const u32, usize),
    (c0, n, sources): (usize, usize, &[(*const u8, usize)]),
    lead: Option<(&Rows, usize)>,
    (d, dv): (usize, usize),
    acc: *mut f32,
) {
    // SAFETY: the caller's contract.
    unsafe {
        for x0 in (0..dv).step_by(2 * 32) {
            let blocks = (dv - x0).min(64) / 32;
            // Accumulator (h, j): the even (h = 0) or odd columns of block j.
            let corner = |h: usize, j: usize| acc.add(x0 + 32 * j + 16 * h);
            for h in 0..2 {
                for j in 0..blocks {
                    tiles.load(c_tile(h, j), corner(h, j).cast(), 4 * d);
                }
            }
            for (i, &(base, stride)) in sources.iter().enumerate() {
                let t0 = c0 + i * ROWS;
                tiles.load(A_TILE, p_even.add(t0).cast(), 4 * np);
                tiles.load(A_TILE + 1, p_odd.add(t0).cast(), 4 * np);
                for j in 0..blocks {
                    tiles.load(B_TILE + j, base.add(2 * (x0 + 32 * j)), stride);
                    tiles.dot(c_tile(0, j), A_TILE, B_TILE + j);
                    tiles.dot(c_tile(1, j), A_TILE + 1, B_TILE + j);
                }
                if let Some((value, span)) = lead.filter(|_| t0 + AHEAD < n) {
                    Ahead::of(value, t0 + AHEAD, n, d, span).prefetch(2 * x0, 2 * 32 * blocks);
                }
            }
            for h in 0..2 {
                for j in 0..blocks {
                    tiles.store(c_tile(h, j), corner(h, j).cast(), 4 * d);
                }
            }
        }
    }
}

/// A tile [`AHEAD`] tokens on, to request as the current tiles are read. Where its rows fill their memory back to back (16 rows of one
/// block, every KV head of the cache's rows), the first [`HEAD`] bytes of each page,
/// once per task pass, from which the L2 streamer fetches the rest of the page in order:
/// alternating builds, 32 × 4096 tokens, two threads, cold 4.51–4.60 ms against 4.78–4.82 with
/// every line requested, warm 2.27–2.28 against 2.70–2.78. Otherwise each row's lines that the
/// current pass reads. (Looking each chunk's tiles up once for every row group and pass, rather
/// than per pass, measured 4–10% slower.)
struct Ahead {
    /// The tile's rows, null from the task's last token on.
    rows: [*const u8; ROWS],
    /// With packed rows, the tile's bytes (the streamer stops at each 4 KiB page, so each
    /// page the tile reaches into gets its head requested).
    packed: Option<usize>,
}

impl Ahead {
    const NONE: Ahead = Ahead {
        rows: [std::ptr::null(); ROWS],
        packed: None,
    };

    /// The tile of tokens `i0 .. i0 + 16`: one lookup where they are 16 consecutive rows of
    /// one block, else one each. Packed where the rows of `span` heads side by side fill
    /// their memory back to back; unpacked rows are requested a head's lines at a time
    /// whatever the span (whole rows on blocks of fewer than 16 tokens leave the other
    /// heads' lines to the streamer: scaling the requests to the span cost the one-head
    /// kernel 15%, 2.52 against 2.17 ms on 32 × 4096 tokens, though it never took that path).
    ///
    /// # Safety
    /// As [`task_on`]; `i0 < n`; each row's `span` heads are inside the cache.
    #[inline(always)]
    unsafe fn of(rows: &Rows, i0: usize, n: usize, d: usize, span: usize) -> Ahead {
        let mut out = Ahead::NONE;
        // SAFETY: the caller's contract; rows are looked up only for tokens below `n`.
        unsafe {
            if let Some(base) = contiguous(rows, i0) {
                for (u, row) in out.rows.iter_mut().enumerate().take(n - i0) {
                    *row = base.add(u * rows.stride);
                }
                out.packed = (rows.stride == span * 2 * d).then_some(ROWS * rows.stride);
            } else {
                for (u, row) in out.rows.iter_mut().enumerate().take(n - i0) {
                    *row = rows.at(i0 + u);
                }
            }
        }
        out
    }

    /// Requests bytes `at .. at + len` of every row, or the head of each page of a packed
    /// tile on a pass's first lines (`at` 0). A prefetch neither faults nor changes memory.
    #[inline(always)]
    fn prefetch(&self, at: usize, len: usize) {
        const PAGE: usize = 4096;
        if let Some(bytes) = self.packed {
            if at == 0 {
                let (start, end) = (self.rows[0] as usize, self.rows[0] as usize + bytes);
                let mut head = start;
                while head < end {
                    let len = HEAD.min(end - head);
                    prefetch::<_, true>(self.rows[0].wrapping_add(head - start), len);
                    head = (head / PAGE + 1) * PAGE;
                }
            }
            return;
        }
        for row in self.rows.iter().filter(|r| !r.is_null()) {
            prefetch::<_, true>(row.wrapping_add(at), len);
        }
    }
}

/// Token `i0`'s row when it starts 16 consecutive rows of one block: a block of 16 or more
/// tokens starting at a multiple of 16 holds all 16.
///
/// # Safety
/// As [`Rows::at`].
#[inline(always)]
unsafe fn contiguous(rows: &Rows, i0: usize) -> Option<*const u8> {
    // SAFETY: the caller's contract.
    (rows.shift >= 4 && (rows.first + i0).is_multiple_of(ROWS)).then(|| unsafe { rows.at(i0) })
}

/// Where the tile of tokens `i0 .. i0 + 16` lies, as (first row, row stride): in the cache
/// when they are 16 consecutive rows of one block, all below `n`; else gathered into
/// `staging` (16 rows of `d` bf16), zero from `n` on (a zero weight would not cancel a NaN
/// in the rows of a block past the context).
///
/// # Safety
/// As [`task_on`]; `i0 < n`; `staging` holds 16 rows of `d` bf16.
#[inline(always)]
unsafe fn tile_source(
    rows: &Rows,
    i0: usize,
    n: usize,
    d: usize,
    staging: *mut u8,
) -> (*const u8, usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if i0 + ROWS <= n {
            if let Some(base) = contiguous(rows, i0) {
                return (base, rows.stride);
            }
        }
        for u in 0..ROWS {
            let dst = staging.add(u * 2 * d);
            if i0 + u < n {
                std::ptr::copy_nonoverlapping(rows.at(i0 + u), dst, 2 * d);
            } else {
                std::ptr::write_bytes(dst, 0, 2 * d);
            }
        }
        (staging.cast_const(), 2 * d)
    }
}

/// Moves a scores step's accumulators (`cst`: 32 tokens × 32 heads f32) into the score rows
/// of its `block_rows` heads (`dst`, rows `ld` apart), `live` tokens each, times `scale`.
///
/// # Safety
/// `cst` holds the step's accumulators; `dst` is writable for `block_rows` rows of `live`;
/// with `AVX512` the host has AVX-512F.
#[inline(always)]
unsafe fn spill_scores<const AVX512: bool>(
    cst: *const f32,
    block_rows: usize,
    dst: *mut f32,
    ld: usize,
    live: usize,
    scale: f32,
) {
    // SAFETY: the caller's contract.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        if AVX512 {
            use std::arch::x86_64::*;
            let sv = _mm512_set1_ps(scale);
            for i in 0..2 {
                if live <= i * ROWS {
                    break;
                }
                let keep = super::paged_elems::lanes16(live - i * ROWS);
                for g in 0..block_rows.div_ceil(ROWS) {
                    let mut t = [_mm512_setzero_si512(); 16];
                    for (k, v) in t.iter_mut().enumerate() {
                        *v = _mm512_loadu_si512(
                            cst.add((i * ROWS + k) * BLOCK_ROWS + g * ROWS).cast(),
                        );
                    }
                    super::transpose::transpose16(&mut t);
                    for (h, v) in t.iter().enumerate().take((block_rows - g * ROWS).min(ROWS)) {
                        let row = dst.add((g * ROWS + h) * ld + i * ROWS);
                        _mm512_mask_storeu_ps(
                            row,
                            keep,
                            _mm512_mul_ps(_mm512_castsi512_ps(*v), sv),
                        );
                    }
                }
            }
            return;
        }
        for h in 0..block_rows {
            for t in 0..live {
                *dst.add(h * ld + t) = *cst.add(t * BLOCK_ROWS + h) * scale;
            }
        }
    }
}

/// bf16 bits of a finite f32 (in the low half of the word), rounded to nearest even, in
/// integer steps LLVM vectorises.
#[inline(always)]
fn to_bf16_bits(x: f32) -> u32 {
    let b = x.to_bits();
    (b + 0x7fff + ((b >> 16) & 1)) >> 16
}

/// [`task`] on the software model of the tiles; `AVX512` as in [`task_on`].
///
/// # Safety
/// As [`task`], but any host (with AVX-512F for `AVX512`).
#[cfg(test)]
pub(super) unsafe fn task_on_model<const AVX512: bool>(
    heads: Heads,
    softmax: impl FnMut(usize, *mut f32),
) {
    let mut tiles = super::amx_tiles::Model::default();
    // SAFETY: the caller's contract; the model runs anywhere.
    unsafe { task_on::<_, AVX512>(&mut tiles, heads, softmax) }
}

#[cfg(test)]
mod tests {
    use crate::config::PagedConfig;
    use crate::cpu::paged::{run_with, scratch_len, Engine};
    use crate::data::ProblemData;
    use crate::{Isa, Problem, TensorBuf};

    /// The kernel on the software model of the tiles, against the f64 reference: head
    /// dimensions 32 to 256, block sizes 8 (key and value tiles gathered), 16 and 32,
    /// contexts of 1 token, shorter than a tile and not a multiple of any, sequences of
    /// mixed lengths; 1, 5, 8, 20 (two row groups), 40 (two row blocks, the second short)
    /// and 64 query rows per task; partitions whose tasks start inside a 16-token tile (24
    /// tokens on blocks of 8), several per block, and the whole context; a KV head a task
    /// and (`whole_rows`) every KV head of a row in one, 2 or 3 heads on 16-token blocks
    /// (the rows' prefetch as one run) and 2 on blocks of 8 (row by row), grouped or one
    /// query head per KV head; one and two threads; the portable passes and, where the
    /// host has them, the AVX-512 ones; sliding windows starting inside a block and inside
    /// a 16-token tile, one shorter than a partition and one longer; latent caches (values the
    /// key rows' first `v_head_dim`, no value cache). The cache rows past each
    /// sequence's context are NaN, as stale or never-written rows of a block may be, and so
    /// are those before its window, as rows a server has since given to another sequence
    /// may be: no weight of zero may meet them.
    #[test]
    fn paged_matches_the_reference_on_the_tile_model() {
        let mut engines = vec![Engine::Model { avx512: false }];
        if std::arch::is_x86_feature_detected!("avx512f") {
            engines.push(Engine::Model { avx512: true });
        }
        let mut ran = 0;
        for (spec, lens) in [
            (
                "num_seqs=3,context_len=45,q_heads=8,kv_heads=1,head_dim=128,block_size=16",
                vec![45, 1, 17],
            ),
            (
                "num_seqs=2,context_len=70,q_heads=10,kv_heads=2,head_dim=64,block_size=8",
                vec![70, 33],
            ),
            (
                "num_seqs=1,context_len=100,q_heads=20,kv_heads=1,head_dim=96,block_size=32",
                vec![100],
            ),
            (
                "num_seqs=2,context_len=50,q_heads=40,kv_heads=1,head_dim=32,block_size=16",
                vec![50, 9],
            ),
            (
                "num_seqs=1,context_len=300,q_heads=64,kv_heads=1,head_dim=256,block_size=16",
                vec![300],
            ),
            (
                "num_seqs=3,context_len=130,q_heads=6,kv_heads=3,head_dim=64,block_size=16",
                vec![130, 1, 77],
            ),
            (
                "num_seqs=2,context_len=90,q_heads=2,kv_heads=2,head_dim=32,block_size=16",
                vec![90, 40],
            ),
            (
                "num_seqs=3,context_len=130,q_heads=8,kv_heads=2,head_dim=64,block_size=16,window=37,sinks=true",
                vec![130, 20, 41],
            ),
            (
                "num_seqs=2,context_len=100,q_heads=10,kv_heads=1,head_dim=32,block_size=8,window=70,softcap=0.5",
                vec![100, 75],
            ),
            // ALiBi, with short and windowed contexts: distances from each sequence's own end.
            (
                "num_seqs=3,context_len=130,q_heads=8,kv_heads=2,head_dim=64,block_size=16,window=37,alibi=true,softcap=0.5",
                vec![130, 20, 41],
            ),
            (
                "num_seqs=3,context_len=130,q_heads=6,kv_heads=3,head_dim=64,block_size=16,alibi=true",
                vec![130, 1, 77],
            ),
            // Blocks of one token (every tile gathered) and of 64 and 128 (whole tiles).
            (
                "num_seqs=2,context_len=50,q_heads=8,kv_heads=1,head_dim=64,block_size=1",
                vec![50, 17],
            ),
            (
                "num_seqs=2,context_len=300,q_heads=8,kv_heads=2,head_dim=64,block_size=64",
                vec![300, 100],
            ),
            (
                "num_seqs=2,context_len=300,q_heads=16,kv_heads=1,head_dim=128,block_size=128",
                vec![300, 129],
            ),
            // Latent caches, the values each key row's first v_head_dim: DeepSeek-V3's rows of
            // 576 and values of 512 (8 passes of 64 value columns), and two latent heads of
            // 128 with values of 96 (a last pass of one 32-column block).
            (
                "num_seqs=2,context_len=100,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=16",
                vec![100, 33],
            ),
            (
                "num_seqs=2,context_len=70,q_heads=4,kv_heads=2,head_dim=128,v_head_dim=96,block_size=8",
                vec![70, 17],
            ),
        ] {
            let problem: Problem = format!("paged:{spec},dtype=bf16").parse().unwrap();
            let Problem::Paged(p) = &problem else {
                unreachable!("{spec} is paged attention")
            };
            let mut data = ProblemData::random(&problem, 5).with_context_lens(lens);
            let reference = data.reference();
            let (mb, bs, width) = (
                data.max_blocks_per_seq,
                p.block_size,
                p.kv_heads * p.head_dim,
            );
            for (s, &len) in data.context_lens.clone().iter().enumerate() {
                let len = len as usize;
                let outside = (0..p.first_token(len)).chain(len..len.next_multiple_of(bs));
                for t in outside {
                    let row = data.block_tables[s * mb + t / bs] as usize * bs + t % bs;
                    // A latent problem's value cache is empty: its values are the keys'.
                    for cache in &mut data.inputs[1..] {
                        let TensorBuf::Bf16(c) = cache else {
                            unreachable!("bf16 problems have bf16 caches")
                        };
                        if !c.is_empty() {
                            c[row * width..(row + 1) * width].fill(half::bf16::NAN);
                        }
                    }
                }
            }
            let [TensorBuf::Bf16(q), TensorBuf::Bf16(k), TensorBuf::Bf16(v)] = &data.inputs[..]
            else {
                unreachable!("bf16 problems have bf16 inputs")
            };
            let v = if p.is_latent() { k } else { v };
            let (q, k, v) = (q.to_vec(), k.to_vec(), v.to_vec());
            let tables = (data.block_tables.clone(), data.context_lens.clone());
            for partition in [0, 24, 48, 64] {
                if partition % p.block_size != 0 {
                    continue;
                }
                for (group_heads, whole_rows) in
                    [(false, false), (true, false), (true, true), (false, true)]
                {
                    // Whole rows take each KV head with all its query heads.
                    if whole_rows && (p.kv_heads == 1 || (!group_heads && p.group() > 1)) {
                        continue;
                    }
                    for threads in [1, 2] {
                        let c = PagedConfig {
                            isa: Isa::Avx512Amx,
                            partition,
                            group_heads,
                            threads,
                            key_tiles: false,
                            amx: true,
                            whole_rows,
                            turn: 0,
                            widen: false,
                        };
                        for &engine in &engines {
                            let mut scratch = vec![0f32; scratch_len(p, &c)];
                            let mut out = std::mem::take(&mut data.out);
                            out.fill(f32::NAN);
                            let heads = data.heads();
                            run_with(
                                p,
                                &c,
                                (&q[..], &k[..], &v[..]),
                                (&tables.0, mb, &tables.1),
                                (heads, (1.0, 1.0)),
                                &mut out,
                                &mut scratch,
                                engine,
                            );
                            data.out = out;
                            let err = crate::reference::relative_error(&data.out, &reference);
                            assert!(
                                err <= problem.tolerance(),
                                "{problem} with {c:?} on {engine:?}: relative error {err:e}"
                            );
                            ran += 1;
                        }
                    }
                }
            }
        }
        // The partitions each block size divides (16 three, 8 four, 32 two, 1 four, 64 two,
        // 128 one) times the head splits: two on one KV head, three with grouped query heads,
        // four with one query head per KV head.
        assert_eq!(
            ran,
            (3 * 2
                + 4 * 3
                + 2 * 2
                + 3 * 2
                + 3 * 2
                + 3 * 3
                + 3 * 4
                + 3 * 3
                + 4 * 2
                + 3 * 3
                + 3 * 3
                + 4 * 2
                + 2 * 3
                + 2
                + 3 * 2
                + 4 * 3)
                * 2
                * engines.len()
        );
    }
}
