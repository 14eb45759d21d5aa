//! Flash attention forward on the CPU.
//!
//! A task owns a tile of query rows (with `group_heads`, the positions × query heads that share
//! one KV head) and walks the key/value tiles in order with the online softmax: scores, running
//! row max `m` and sum `l`, accumulator `O ← O·2^(m_old − m_new) + P·V`. Both products run on
//! the GEMM microkernels. Scores carry a factor `log2(e)` folded into Q so the softmax uses
//! `exp2`. Causal tiles entirely above the diagonal are never visited; only tiles crossing it
//! are masked. With a sliding window, likewise below it: a query tile's keys start at its
//! first row's window, and tiles its later rows' windows have passed are masked for those.
//! A head's sink joins the softmax only in the last division, `O / (l + 2^(sink − m))`: a
//! key of value zero changes the sum and nothing else. ALiBi's bias joins each score after the
//! cap, from each row's slope and position, the distance `j − pos` exact in f32 (positions
//! stay below 2^24; the two products subtracted would lose the difference at long contexts).
//!
//! Scores are computed transposed, `Sᵀ = K·Qᵀ`: K rows are contiguous in memory as the
//! microkernel's A operand wants them, and `Qᵀ` is built once per query tile instead of a `Kᵀ`
//! per key tile per query tile. The softmax then runs along the query rows of each key
//! (contiguous, vectorised), and `P·V` reads `P = (Sᵀ)ᵀ` through the microkernel's A strides.

use super::parallel::{for_each_task, SharedMut};
use super::table::{table, Table, TableElem, UkrFn};
use crate::config::{FlashConfig, FlashSplit};
use crate::kernel::HeadValues;
use crate::problem::FlashProblem;

/// The microkernel shape both products use: rows up to 8, two vectors wide.
fn shape(t: &Table) -> (usize, usize) {
    t.shapes
        .iter()
        .copied()
        .filter(|&(mr, nr)| nr == 2 * t.lanes && mr <= 8)
        .max_by_key(|&(mr, _)| mr)
        .unwrap_or(t.shapes[0])
}

/// Sizes of one worker's buffers, in f32 values.
struct Layout {
    /// Query rows, padded to both microkernel dimensions (rows are N of `Sᵀ = K·Qᵀ` and M of
    /// `P·V`).
    rows_pad: usize,
    dp: usize,
    bcp: usize,
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    a / gcd(a, b) * b
}

impl Layout {
    fn new(p: &FlashProblem, c: &FlashConfig) -> Self {
        let (mr, nr) = shape(table(c.isa));
        let rows = c.br * if c.group_heads { p.group() } else { 1 };
        Layout {
            rows_pad: rows.next_multiple_of(lcm(mr, nr)),
            dp: p.head_dim.next_multiple_of(nr),
            bcp: c.bc.next_multiple_of(mr),
        }
    }
    /// Qᵀ tile, O tile, Sᵀ tile, K tile, V tile, row max, row sum, softmax temporaries, the
    /// rows' ALiBi slopes and positions.
    fn per_worker(&self) -> usize {
        2 * self.rows_pad * self.dp
            + self.rows_pad * self.bcp
            + 2 * self.bcp * self.dp
            + 6 * self.rows_pad
    }
}

pub fn scratch_len(p: &FlashProblem, c: &FlashConfig) -> usize {
    c.threads * Layout::new(p, c).per_worker()
}

#[allow(clippy::too_many_arguments)]
pub fn run<T: TableElem>(
    p: &FlashProblem,
    c: &FlashConfig,
    q: &[T],
    k: &[T],
    v: &[T],
    heads: HeadValues<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let t = table(c.isa);
    let (mr, nr) = shape(t);
    let ukr = t.ukr(mr, nr).expect("flash shapes come from the table");
    let lay = Layout::new(p, c);
    let per_worker = lay.per_worker();
    let scratch = SharedMut(scratch.as_mut_ptr());
    let out = SharedMut(out.as_mut_ptr());
    for_each_task(c.threads, task_count(p, c), |task, worker| {
        // SAFETY: one task per worker at a time, so worker slices are disjoint.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(scratch.get().add(worker * per_worker), per_worker)
        };
        let span = Span::of(p, c, task);
        let tile = Tile {
            p,
            c,
            t,
            ukr,
            mr,
            nr,
            lay: &lay,
            span: &span,
            heads,
        };
        for blk in span.blocks.clone() {
            // SAFETY: query blocks of distinct tasks write disjoint rows of `out`.
            unsafe { tile.run(q, k, v, out.get(), blk, buf) };
        }
    });
}

/// Tasks of a call: one per head unit (a KV head's group with `group_heads`, else a query
/// head) of each batch entry, times its query blocks when split by blocks.
pub(super) fn task_count(p: &FlashProblem, c: &FlashConfig) -> usize {
    let units = p.batch * if c.group_heads { p.kv_heads } else { p.q_heads };
    match c.split {
        FlashSplit::Heads => units,
        FlashSplit::Blocks => units * p.q_len.div_ceil(c.br),
    }
}

/// What one task covers, and where its rows lie in Q, K, V and the output.
#[derive(Debug)]
pub(super) struct Span {
    pub batch: usize,
    /// The first query head of the task's rows.
    pub h0: usize,
    /// The KV head they read.
    pub kvh: usize,
    /// Query rows per position: the group's heads with `group_heads`, else one.
    pub rows_per_pos: usize,
    /// Query blocks of `br` positions.
    pub blocks: std::ops::Range<usize>,
}

impl Span {
    pub(super) fn of(p: &FlashProblem, c: &FlashConfig, task: usize) -> Span {
        let per_batch = if c.group_heads { p.kv_heads } else { p.q_heads };
        let q_blocks = p.q_len.div_ceil(c.br);
        let (unit, blocks) = match c.split {
            FlashSplit::Heads => (task, 0..q_blocks),
            FlashSplit::Blocks => (task / q_blocks, task % q_blocks..task % q_blocks + 1),
        };
        let (batch, head) = (unit / per_batch, unit % per_batch);
        let (h0, kvh, rows_per_pos) = if c.group_heads {
            (head * p.group(), head, p.group())
        } else {
            (head, head / p.group(), 1)
        };
        Span {
            batch,
            h0,
            kvh,
            rows_per_pos,
            blocks,
        }
    }

    /// Offset in Q of row `r` of the tile whose first position is `i0`.
    pub(super) fn q_at(&self, p: &FlashProblem, i0: usize, r: usize) -> usize {
        self.row(p, i0, r) * p.head_dim
    }

    /// Offset in the output (rows of `v_head_dim`) of row `r` of the tile starting at `i0`.
    pub(super) fn out_at(&self, p: &FlashProblem, i0: usize, r: usize) -> usize {
        self.row(p, i0, r) * p.v_head_dim
    }

    fn row(&self, p: &FlashProblem, i0: usize, r: usize) -> usize {
        let (pos, g) = (i0 + r / self.rows_per_pos, r % self.rows_per_pos);
        (self.batch * p.q_len + pos) * p.q_heads + self.h0 + g
    }

    /// The weight `2^(sink − m)` row `r`'s sink adds to its softmax sum, `m` the row's maximum
    /// (base 2, as the scores are); 0 without sinks.
    pub(super) fn sink_weight(&self, sinks: &[f32], r: usize, m: f32) -> f32 {
        super::sink_weight(sinks, self.h0 + r % self.rows_per_pos, m)
    }

    /// Row `r`'s ALiBi slope in the scores' units (times log2(e)) and its query's position,
    /// in the tile whose first position is `i0`; `None` without ALiBi.
    pub(super) fn alibi(
        &self,
        p: &FlashProblem,
        slopes: &[f32],
        i0: usize,
        r: usize,
    ) -> Option<(f32, f32)> {
        let slope = slopes.get(self.h0 + r % self.rows_per_pos)?;
        let pos = p.query_pos(i0 + r / self.rows_per_pos);
        Some((slope * std::f32::consts::LOG2_E, pos as f32))
    }

    /// Offset in K of key 0 of this task's KV head; keys are `kv_heads · head_dim` apart.
    pub(super) fn kv_base(&self, p: &FlashProblem) -> usize {
        self.kv_row(p) * p.head_dim
    }

    /// Offset in V of value 0 of this task's KV head; values are `kv_heads · v_head_dim`
    /// apart.
    pub(super) fn v_base(&self, p: &FlashProblem) -> usize {
        self.kv_row(p) * p.v_head_dim
    }

    fn kv_row(&self, p: &FlashProblem) -> usize {
        self.batch * p.kv_len * p.kv_heads + self.kvh
    }
}

/// How far the causal diagonal is shifted: query `i` sees keys `0..=i + offset` (queries
/// aligned to the end of the keys, as in chunked prefill). Zero without the mask, where
/// `q_len` may exceed `kv_len`.
pub(super) fn causal_offset(p: &FlashProblem) -> usize {
    if p.causal {
        p.kv_len - p.q_len
    } else {
        0
    }
}

/// The keys positions `i0..i1` read.
pub(super) fn kv_end(p: &FlashProblem, i1: usize) -> usize {
    if p.causal {
        (i1 + causal_offset(p)).min(p.kv_len)
    } else {
        p.kv_len
    }
}

/// One task's fixed context.
struct Tile<'a> {
    p: &'a FlashProblem,
    c: &'a FlashConfig,
    t: &'static Table,
    ukr: UkrFn,
    mr: usize,
    nr: usize,
    lay: &'a Layout,
    span: &'a Span,
    /// Each query head's sink logit and ALiBi slope, or empty.
    heads: HeadValues<'a>,
}

impl Tile<'_> {
    /// Computes query block `blk` of this task's heads into `out`.
    ///
    /// # Safety
    /// `out` is the full output buffer; no other task writes these rows concurrently.
    unsafe fn run<T: TableElem>(
        &self,
        q: &[T],
        k: &[T],
        v: &[T],
        out: *mut f32,
        blk: usize,
        buf: &mut [f32],
    ) {
        let (p, c, lay) = (self.p, self.c, self.lay);
        let (d, dv) = (p.head_dim, p.v_head_dim);
        let fns = T::fns(self.t);
        let i0 = blk * c.br;
        let i1 = (i0 + c.br).min(p.q_len);
        let span = self.span;
        let rows = (i1 - i0) * span.rows_per_pos;
        let rp = lay.rows_pad;
        let (qt, rest) = buf.split_at_mut(rp * lay.dp);
        let (ot, rest) = rest.split_at_mut(rp * lay.dp);
        let (st, rest) = rest.split_at_mut(lay.bcp * rp);
        let (kt, rest) = rest.split_at_mut(lay.bcp * lay.dp);
        let (vt, rest) = rest.split_at_mut(lay.bcp * lay.dp);
        let (mx, rest) = rest.split_at_mut(rp);
        let (sum, rest) = rest.split_at_mut(rp);
        let (tmp, rest) = rest.split_at_mut(2 * rp);
        let (slope, pos) = rest[..2 * rp].split_at_mut(rp);
        let alibi = p.alibi;
        if alibi {
            for r in 0..rows {
                (slope[r], pos[r]) = span
                    .alibi(p, self.heads.slopes, i0, r)
                    .expect("validated: a slope per query head");
            }
        }

        // Qᵀ [d][rows_pad], pre-scaled by scale·log2(e), zero past the live rows: each Q row
        // is widened into O's buffer (free until the accumulators are reset) and scattered.
        let qscale = p.scale.get() * std::f32::consts::LOG2_E;
        for r in 0..rows {
            let src = span.q_at(p, i0, r);
            // SAFETY: row `src..src + d` lies in q; the destination row holds dp >= d values.
            unsafe {
                (fns.widen)(
                    q.as_ptr().add(src),
                    ot.as_mut_ptr().add(r * lay.dp),
                    d,
                    qscale,
                )
            };
        }
        for x in 0..d {
            let col = &mut qt[x * rp..(x + 1) * rp];
            for (r, v) in col[..rows].iter_mut().enumerate() {
                *v = ot[r * lay.dp + x];
            }
            col[rows..].fill(0.0);
        }
        ot[..rows * lay.dp].fill(0.0);
        mx[..rows].fill(f32::NEG_INFINITY);
        sum[..rows].fill(0.0);

        let off = causal_offset(p);
        let kv_end = kv_end(p, i1);
        let (kv_stride, v_stride) = (p.kv_heads * d, p.kv_heads * dv);
        let (kv_base, v_base) = (span.kv_base(p), span.v_base(p));
        // The last position's window start: keys below it are hidden from some rows.
        let last_first = p.first_key(i1 - 1);
        for j0 in (p.first_key(i0)..kv_end).step_by(c.bc) {
            let w = c.bc.min(kv_end - j0);
            // K and V tiles [w][dp], widened; V zero-padded where the microkernel reads past
            // the live columns (K rows past `w` are never read).
            for j in 0..w {
                let at = kv_base + (j0 + j) * kv_stride;
                let v_at = v_base + (j0 + j) * v_stride;
                // SAFETY: K rows of d values, V rows of dv <= d; destination rows hold dp.
                unsafe {
                    (fns.widen)(k.as_ptr().add(at), kt.as_mut_ptr().add(j * lay.dp), d, 1.0);
                    (fns.widen)(
                        v.as_ptr().add(v_at),
                        vt.as_mut_ptr().add(j * lay.dp),
                        dv,
                        1.0,
                    );
                }
                vt[j * lay.dp + dv..(j + 1) * lay.dp].fill(0.0);
            }

            // Sᵀ = K·Qᵀ, [w][rows_pad].
            for jr in (0..w).step_by(self.mr) {
                for ir in (0..rows).step_by(self.nr) {
                    // SAFETY: K rows hold dp >= d values; Qᵀ columns are padded to rows_pad, a
                    // multiple of nr; Sᵀ holds bcp >= w rows of rows_pad.
                    unsafe {
                        (self.ukr)(
                            d,
                            kt.as_ptr().add(jr * lay.dp),
                            lay.dp,
                            1,
                            qt.as_ptr().add(ir),
                            rp,
                            st.as_mut_ptr().add(jr * rp + ir),
                            rp,
                            self.mr.min(w - jr),
                            self.nr.min(rows - ir),
                            false,
                        )
                    };
                }
            }

            // Soft-capped scores: C in the scores' units (scale · log2(e) folded into Q).
            if let Some(cap) = p.softcap {
                let unit = cap.get() * std::f32::consts::LOG2_E;
                for j in 0..w {
                    (self.t.softcap)(&mut st[j * rp..j * rp + rows], unit);
                }
            }
            // ALiBi's bias, `slope · (j − pos)`, on the capped scores.
            if alibi {
                for j in 0..w {
                    let row = &mut st[j * rp..j * rp + rows];
                    (self.t.alibi_col)(row, &slope[..rows], &pos[..rows], (j0 + j) as f32);
                }
            }
            // Mask what lies above the diagonal in a tile crossing it: key j0 + j is hidden
            // from the rows of positions below j0 + j − off, a prefix of each key's row.
            if p.causal && j0 + w > i0 + off + 1 {
                for j in 0..w {
                    let hidden = (j0 + j).saturating_sub(off + i0);
                    let upto = (hidden * span.rows_per_pos).min(rows);
                    st[j * rp..j * rp + upto].fill(f32::NEG_INFINITY);
                }
            }
            // And what the window has passed, in a tile below the last row's window start:
            // key j0 + j is hidden from positions from j0 + j + window − off on, a suffix.
            if let (Some(window), true) = (p.window, j0 < last_first) {
                for j in 0..w {
                    let from = (j0 + j + window).saturating_sub(off + i0);
                    let from = (from * span.rows_per_pos).min(rows);
                    st[j * rp + from..j * rp + rows].fill(f32::NEG_INFINITY);
                }
            }
            (self.t.softmax_cols)(st, w, rows, rp, mx, sum, tmp, ot, lay.dp, dv);

            // O += P·V, P[r][j] = Sᵀ[j][r].
            for ir in (0..rows).step_by(self.mr) {
                for jr in (0..dv).step_by(self.nr) {
                    // SAFETY: P is read at rows < rows and keys < w of Sᵀ; V columns are
                    // padded to dp; O sized rows_pad×dp.
                    unsafe {
                        (self.ukr)(
                            w,
                            st.as_ptr().add(ir),
                            1,
                            rp,
                            vt.as_ptr().add(jr),
                            lay.dp,
                            ot.as_mut_ptr().add(ir * lay.dp + jr),
                            lay.dp,
                            self.mr.min(rows - ir),
                            self.nr.min(dv - jr),
                            true,
                        )
                    };
                }
            }
        }

        for r in 0..rows {
            let dst = span.out_at(p, i0, r);
            let inv = 1.0 / (sum[r] + span.sink_weight(self.heads.sinks, r, mx[r]));
            for x in 0..dv {
                // SAFETY: caller contract: this row of out belongs to this task.
                unsafe { *out.add(dst + x) = ot[r * lay.dp + x] * inv };
            }
        }
    }
}
