//! Innermost loops, written once over [`Simd`] and instantiated per ISA by [`super::table`].
//!
//! Everything here is `#[inline(always)]` so the body lands inside a `#[target_feature]`
//! function; a call that was not inlined would compile without the ISA's instructions.

use super::simd::{Elem, Simd};

/// Register-blocked product of an `MR × k` block of A and a `k × (NV·LANES)` block of B into C.
///
/// A element `(i, p)` is at `a + i·rsa + p·csa` (packed A: `rsa = 1, csa = MR`; a row-major tile:
/// `rsa = lda, csa = 1`). B row `p` starts at `b + p·ldb` and must hold `NV·LANES` readable values
/// (callers pad). Only the `mr × nr` corner of C is touched; `accumulate` adds to C instead of
/// overwriting it.
///
/// # Safety
/// A must be readable for `MR` rows (callers pad short edges), B as above, C writable for the
/// `mr × nr` corner with row stride `ldc`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn ukr<S: Simd, const MR: usize, const NV: usize>(
    k: usize,
    a: *const f32,
    rsa: usize,
    csa: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    accumulate: bool,
) {
    let l = S::LANES;
    // The C corner is read (or written) only after the k loop, rows a whole C row apart and
    // mostly out in L3; asked for now, it arrives while the loop runs. Repeated calls, 2048³
    // f32, session 13: 1-2% faster on one and two threads, alternating builds.
    for i in 0..mr {
        prefetch::<_, false>(c.wrapping_add(i * ldc), NV * l * 4);
    }
    let mut acc = [[S::zero(); NV]; MR];
    let mut ap = a;
    let mut bp = b;
    // One k step: NV loads of B, MR broadcasts of A, MR × NV FMAs. A macro, not a closure:
    // a closure is a function of its own that need not inherit the ISA this body is
    // instantiated for, and would be called without it.
    macro_rules! step {
        ($ap:expr, $bp:expr) => {{
            let (ap, bp) = ($ap, $bp);
            // SAFETY: caller contract: B row readable for NV·LANES, A readable for MR rows.
            unsafe {
                let bv: [S::V; NV] = std::array::from_fn(|v| S::load(bp.add(v * l)));
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = S::splat(*ap.add(i * rsa));
                    for (accv, bvv) in row.iter_mut().zip(bv.iter()) {
                        *accv = S::fma(av, *bvv, *accv);
                    }
                }
            }
        }};
    }
    // Unrolled by four: the loop's own three instructions were a tenth of an 8×48 step's. Not
    // past 24 accumulators: unrolled, 14×32's 28 left LLVM too few registers and it kept
    // accumulators on the stack (2048³ f32, one thread, 243 ms against 95-100 one step at a
    // time, session 13).
    let unrolled = if MR * NV > 24 { 0 } else { k / 4 };
    for _ in 0..unrolled {
        for u in 0..4 {
            // SAFETY: caller contract: k steps of A and B.
            step!(unsafe { ap.add(u * csa) }, unsafe { bp.add(u * ldb) });
        }
        // SAFETY: as above.
        unsafe {
            ap = ap.add(4 * csa);
            bp = bp.add(4 * ldb);
        }
    }
    for _ in 0..k - 4 * unrolled {
        step!(ap, bp);
        // SAFETY: as above.
        unsafe {
            ap = ap.add(csa);
            bp = bp.add(ldb);
        }
    }
    // SAFETY: caller contract on C.
    unsafe {
        if mr == MR && nr == NV * l {
            for (i, row) in acc.iter().enumerate() {
                let cp = c.add(i * ldc);
                for (v, accv) in row.iter().enumerate() {
                    let out = if accumulate {
                        S::add(S::load(cp.add(v * l)), *accv)
                    } else {
                        *accv
                    };
                    S::store(cp.add(v * l), out);
                }
            }
        } else {
            store_edge::<S, MR, NV>(&acc, c, ldc, mr, nr, accumulate);
        }
    }
}

/// Writes the `mr × nr` corner of a tile through a stack buffer.
#[inline(always)]
unsafe fn store_edge<S: Simd, const MR: usize, const NV: usize>(
    acc: &[[S::V; NV]; MR],
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    accumulate: bool,
) {
    let l = S::LANES;
    let mut tmp = [0f32; 64];
    for (i, row) in acc.iter().enumerate().take(mr) {
        for (v, accv) in row.iter().enumerate() {
            // SAFETY: `tmp` holds 64 values and NV·LANES <= 64 for every instantiated shape.
            unsafe { S::store(tmp.as_mut_ptr().add(v * l), *accv) };
        }
        for (j, t) in tmp.iter().enumerate().take(nr) {
            // SAFETY: caller contract on C.
            unsafe {
                let cp = c.add(i * ldc + j);
                *cp = if accumulate { *cp + t } else { *t };
            }
        }
    }
}

/// Asks for the cache lines of `bytes` bytes at `p` (a hint: never faults), into L1 or, with
/// `L2`, into L2 only. Kernels that read rows faster than memory delivers them run out of L1
/// miss buffers when every line is requested into L1; L2 has more.
#[inline(always)]
pub fn prefetch<T, const L2: bool>(p: *const T, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes).step_by(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let a = p.cast::<i8>().wrapping_add(line);
        // SAFETY: a prefetch hint on any address neither faults nor changes memory.
        unsafe {
            if L2 {
                _mm_prefetch::<_MM_HINT_T1>(a)
            } else {
                _mm_prefetch::<_MM_HINT_T0>(a)
            }
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// Decode-shaped GEMM with B stored `[N, K]`: `C[i, j] = A_i · B_j` for `R` rows of A (f32,
/// row stride `lda`) against 4 rows of B (row stride `ldb`), streaming B once; with `prefetching`
/// each B row's line 1 KiB ahead is requested into L2 (the config's `prefetch`).
///
/// # Safety
/// A readable for `R` rows of `k`, B for `cols <= 4` rows of `k`, C writable for `R × cols`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn stream_nk<S: Simd, T: Elem, const R: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const T,
    ldb: usize,
    cols: usize,
    c: *mut f32,
    ldc: usize,
    prefetching: bool,
) {
    let l = S::LANES;
    let full = k / l * l;
    let mut acc = [[S::zero(); 4]; R];
    // Unused columns read row 0 again; their sums are never stored.
    let rows: [*const T; 4] = std::array::from_fn(|j| {
        if j < cols {
            unsafe { b.add(j * ldb) }
        } else {
            b
        }
    });
    let ahead = 1024 / std::mem::size_of::<T>();
    let mut p = 0;
    while p < full {
        if prefetching {
            for r in rows {
                prefetch::<_, true>(r.wrapping_add(p + ahead), 1);
            }
        }
        // SAFETY: p + LANES <= k within each row.
        unsafe {
            let bv: [S::V; 4] = std::array::from_fn(|j| T::load::<S>(rows[j].add(p)));
            for (i, acc_row) in acc.iter_mut().enumerate() {
                let av = S::load(a.add(i * lda + p));
                for (accv, bvv) in acc_row.iter_mut().zip(bv.iter()) {
                    *accv = S::fma(av, *bvv, *accv);
                }
            }
        }
        p += l;
    }
    for (i, acc_row) in acc.iter().enumerate() {
        for j in 0..cols {
            let mut s = S::hsum(acc_row[j]);
            for q in full..k {
                // SAFETY: q < k.
                unsafe { s += *a.add(i * lda + q) * (*rows[j].add(q)).to_f32() };
            }
            // SAFETY: caller contract on C.
            unsafe { *c.add(i * ldc + j) = s };
        }
    }
}

/// Decode-shaped GEMM with B stored `[K, N]`: `R` rows of C over a `width`-column strip,
/// streaming the strip of B row by row. `width <= NV·LANES`; a short strip is finished in
/// scalar code so no read runs past the row.
///
/// # Safety
/// A readable for `R` rows of `k`, B for `k` rows of `width` with stride `ldb`, C writable.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn stream_kn<S: Simd, T: Elem, const R: usize, const NV: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const T,
    ldb: usize,
    width: usize,
    c: *mut f32,
    ldc: usize,
) {
    let l = S::LANES;
    let nv = (width / l).min(NV);
    let mut acc = [[S::zero(); NV]; R];
    if nv == NV {
        for p in 0..k {
            // SAFETY: NV·LANES <= width columns readable in row p.
            unsafe {
                let bv: [S::V; NV] = std::array::from_fn(|v| T::load::<S>(b.add(p * ldb + v * l)));
                for (i, acc_row) in acc.iter_mut().enumerate() {
                    let av = S::splat(*a.add(i * lda + p));
                    for (accv, bvv) in acc_row.iter_mut().zip(bv.iter()) {
                        *accv = S::fma(av, *bvv, *accv);
                    }
                }
            }
        }
        for (i, acc_row) in acc.iter().enumerate() {
            for (v, accv) in acc_row.iter().enumerate() {
                // SAFETY: caller contract on C.
                unsafe { S::store(c.add(i * ldc + v * l), *accv) };
            }
        }
    } else {
        for i in 0..R {
            for j in 0..width {
                let mut s = 0f32;
                for p in 0..k {
                    // SAFETY: caller contract.
                    unsafe { s += *a.add(i * lda + p) * (*b.add(p * ldb + j)).to_f32() };
                }
                // SAFETY: caller contract on C.
                unsafe { *c.add(i * ldc + j) = s };
            }
        }
    }
}

/// Rows of words ahead of the int4 kernel's reads that it prefetches.
const INT4_AHEAD: usize = 16;

/// One strip of an int4 GEMM (see [`stream_int4`]): pointers at the strip's first row of A
/// and of its group sums, and at its first column of the words, scales, zero points and C.
#[derive(Debug, Clone, Copy)]
pub struct Int4Strip {
    pub k: usize,
    pub group: usize,
    /// Rows of A widened to f32, `lda` apart.
    pub a: *const f32,
    pub lda: usize,
    /// Each row's sum of A over each group of k, `lds` apart.
    pub asum: *const f32,
    pub lds: usize,
    /// `[K / 8, N]` words; the scales and zero points are `[K / group, N]`: all `n` apart.
    pub words: *const u32,
    pub n: usize,
    pub scales: *const f32,
    /// Null for a zero point of 8 throughout.
    pub zeros: *const f32,
    /// Columns of the strip.
    pub width: usize,
    pub c: *mut f32,
    pub ldc: usize,
}

/// Int4 weights: `R` rows of C over a strip of `width <= NV·LANES` columns, streaming the
/// strip's words a row of eight values of k at a time. Each group's products of A with the
/// 4-bit values are summed apart, then its zero point times the group's sum of A taken off
/// and the rest scaled: `C += s · (Σ a·q − z · Σ a)`, one subtraction and one multiply a
/// group instead of one a weight. A short strip is finished in scalar code, so no read runs
/// past the row.
///
/// # Safety
/// Every pointer valid for its rows as [`Int4Strip`] lays them out, `k` a multiple of
/// `group`, itself a multiple of 8.
#[inline(always)]
pub unsafe fn stream_int4<S: Simd, const R: usize, const NV: usize>(s: Int4Strip) {
    let l = S::LANES;
    let groups = s.k / s.group;
    // SAFETY (whole body): the caller's contract on every pointer.
    unsafe {
        if s.width / l >= NV {
            let mut acc = [[S::zero(); NV]; R];
            for g in 0..groups {
                // Even and odd values of k summed apart: twice the independent multiply-add
                // chains (one row of two vectors had two, each waiting on the last).
                let mut part = [[[S::zero(); NV]; R]; 2];
                for r in g * s.group / 8..(g + 1) * s.group / 8 {
                    let row = s.words.add(r * s.n);
                    // Rows of a strip lie `n` words apart, a page or more on a model's
                    // layers, where the hardware prefetchers do not follow: each row's lines
                    // are asked for `INT4_AHEAD` rows before they are read.
                    prefetch::<_, false>(
                        row.wrapping_add(INT4_AHEAD * s.n),
                        NV * l * std::mem::size_of::<u32>(),
                    );
                    // The word's eight values in turn, each its own instance (its shift an
                    // immediate).
                    macro_rules! value {
                        ($i:literal) => {
                            let q: [S::V; NV] =
                                std::array::from_fn(|v| S::load_u4::<$i>(row.add(v * l)));
                            for (x, part_row) in part[$i % 2].iter_mut().enumerate() {
                                let av = S::splat(*s.a.add(x * s.lda + 8 * r + $i));
                                for (pv, qv) in part_row.iter_mut().zip(&q) {
                                    *pv = S::fma(av, *qv, *pv);
                                }
                            }
                        };
                    }
                    value!(0);
                    value!(1);
                    value!(2);
                    value!(3);
                    value!(4);
                    value!(5);
                    value!(6);
                    value!(7);
                }
                for v in 0..NV {
                    let at = g * s.n + v * l;
                    let scale = S::load(s.scales.add(at));
                    let zero = if s.zeros.is_null() {
                        S::splat(8.0)
                    } else {
                        S::load(s.zeros.add(at))
                    };
                    for (x, acc_row) in acc.iter_mut().enumerate() {
                        let minus_sum = S::splat(-*s.asum.add(x * s.lds + g));
                        let t = S::fma(zero, minus_sum, S::add(part[0][x][v], part[1][x][v]));
                        acc_row[v] = S::fma(scale, t, acc_row[v]);
                    }
                }
            }
            for (x, acc_row) in acc.iter().enumerate() {
                for (v, accv) in acc_row.iter().enumerate() {
                    S::store(s.c.add(x * s.ldc + v * l), *accv);
                }
            }
        } else {
            for x in 0..R {
                for j in 0..s.width {
                    let mut sum = 0f32;
                    for g in 0..groups {
                        let mut part = 0f32;
                        for q in g * s.group..(g + 1) * s.group {
                            let w = *s.words.add(q / 8 * s.n + j);
                            let v = ((w >> (4 * (q % 8))) & 15) as f32;
                            part += *s.a.add(x * s.lda + q) * v;
                        }
                        let at = g * s.n + j;
                        let zero = if s.zeros.is_null() {
                            8.0
                        } else {
                            *s.zeros.add(at)
                        };
                        sum += *s.scales.add(at) * (part - zero * *s.asum.add(x * s.lds + g));
                    }
                    *s.c.add(x * s.ldc + j) = sum;
                }
            }
        }
    }
}

/// `x · y` over `n` values, y widened from its element type.
///
/// # Safety
/// Both readable for `n` values.
#[inline(always)]
pub unsafe fn dot<S: Simd, T: Elem>(x: *const f32, y: *const T, n: usize) -> f32 {
    let l = S::LANES;
    let full = n / (2 * l) * (2 * l);
    let (mut a0, mut a1) = (S::zero(), S::zero());
    let mut p = 0;
    while p < full {
        // SAFETY: p + 2·LANES <= n.
        unsafe {
            a0 = S::fma(S::load(x.add(p)), T::load::<S>(y.add(p)), a0);
            a1 = S::fma(S::load(x.add(p + l)), T::load::<S>(y.add(p + l)), a1);
        }
        p += 2 * l;
    }
    let mut s = S::hsum(S::add(a0, a1));
    while p < n {
        // SAFETY: p < n.
        unsafe { s += *x.add(p) * (*y.add(p)).to_f32() };
        p += 1;
    }
    s
}

/// `out[i] += alpha · x[i]` over `n` values, x widened from its element type.
///
/// # Safety
/// `out` writable and `x` readable for `n` values.
#[inline(always)]
pub unsafe fn axpy<S: Simd, T: Elem>(out: *mut f32, alpha: f32, x: *const T, n: usize) {
    let l = S::LANES;
    let full = n / l * l;
    let av = S::splat(alpha);
    let mut p = 0;
    while p < full {
        // SAFETY: p + LANES <= n.
        unsafe {
            S::store(
                out.add(p),
                S::fma(av, T::load::<S>(x.add(p)), S::load(out.add(p))),
            )
        };
        p += l;
    }
    while p < n {
        // SAFETY: p < n.
        unsafe { *out.add(p) += alpha * (*x.add(p)).to_f32() };
        p += 1;
    }
}

/// Widens `n` values of `src` into `dst` scaled by `scale`.
///
/// # Safety
/// `src` readable and `dst` writable for `n` values.
#[inline(always)]
pub unsafe fn widen<S: Simd, T: Elem>(src: *const T, dst: *mut f32, n: usize, scale: f32) {
    let l = S::LANES;
    let full = n / l * l;
    let sv = S::splat(scale);
    let mut p = 0;
    while p < full {
        // SAFETY: p + LANES <= n.
        unsafe { S::store(dst.add(p), S::mul(sv, T::load::<S>(src.add(p)))) };
        p += l;
    }
    while p < n {
        // SAFETY: p < n.
        unsafe { *dst.add(p) = scale * (*src.add(p)).to_f32() };
        p += 1;
    }
}

/// Largest value of a row (`-inf` for an empty row).
#[inline(always)]
pub fn row_max<S: Simd>(row: &[f32]) -> f32 {
    let l = S::LANES;
    let chunks = row.chunks_exact(l);
    let rest = chunks.remainder();
    let mut m = S::splat(f32::NEG_INFINITY);
    for c in chunks {
        // SAFETY: each chunk holds LANES values.
        m = S::max(m, unsafe { S::load(c.as_ptr()) });
    }
    let mut tmp = [f32::NEG_INFINITY; 64];
    // SAFETY: LANES <= 64.
    unsafe { S::store(tmp.as_mut_ptr(), m) };
    tmp[..l]
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// Replaces each value `x` by `2^(x - sub)` and returns their sum. Inputs are scores already
/// multiplied by `log2(e)`, so this is the softmax numerator.
#[inline(always)]
pub fn exp2_sum(row: &mut [f32], sub: f32) -> f32 {
    // Sixteen partial sums: one running sum is a serial chain LLVM may not reorder, and it
    // kept the whole loop, exp2 included, scalar.
    let mut part = [0f32; 16];
    let mut chunks = row.chunks_exact_mut(16);
    for c in &mut chunks {
        for (x, s) in c.iter_mut().zip(part.iter_mut()) {
            *x = exp2_approx(*x - sub);
            *s += *x;
        }
    }
    let mut sum: f32 = part.iter().sum();
    for x in chunks.into_remainder() {
        *x = exp2_approx(*x - sub);
        sum += *x;
    }
    sum
}

/// One online-softmax step over a tile of transposed scores (flash attention): `s` holds `w`
/// keys of `rows` query rows each, key-major with stride `ld`, already scaled by `log2(e)`.
/// Updates each row's running max `mx` and sum `sum`, rescales the first `d` values of each
/// row of the accumulator `o` (stride `ldo`) by `2^(m_old − m_new)`, and replaces the scores
/// by the softmax numerators. `tmp` holds `2 · rows` values. Every loop runs along the rows,
/// contiguous in `s`, so LLVM vectorises it, exp2 included.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn softmax_cols(
    s: &mut [f32],
    w: usize,
    rows: usize,
    ld: usize,
    mx: &mut [f32],
    sum: &mut [f32],
    tmp: &mut [f32],
    o: &mut [f32],
    ldo: usize,
    d: usize,
) {
    let (m_new, part) = tmp[..2 * rows].split_at_mut(rows);
    m_new.copy_from_slice(&mx[..rows]);
    for j in 0..w {
        for (m, &x) in m_new.iter_mut().zip(&s[j * ld..j * ld + rows]) {
            *m = m.max(x);
        }
    }
    part.fill(0.0);
    for j in 0..w {
        for ((x, &m), acc) in s[j * ld..j * ld + rows]
            .iter_mut()
            .zip(m_new.iter())
            .zip(part.iter_mut())
        {
            *x = exp2_approx(*x - m);
            *acc += *x;
        }
    }
    for r in 0..rows {
        let alpha = exp2_approx(mx[r] - m_new[r]);
        sum[r] = sum[r] * alpha + part[r];
        mx[r] = m_new[r];
        if alpha != 1.0 {
            for v in &mut o[r * ldo..r * ldo + d] {
                *v *= alpha;
            }
        }
    }
}

/// `2^x` for `x <= 0` within 6e-6 of the value (a degree-6 polynomial on the fraction, whose
/// error grows toward the fraction's end: 5.6e-6 as it nears 1, where the polynomial gives
/// 1.999989; exponent built by integer add); flushes to 0 below 2^-126. Enough for softmax
/// weights (1e-4 is f32 attention's tolerance), not for a tanh (`problem::tanh` has its own).
/// Written in scalar code that LLVM vectorises with the surrounding loop, so every ISA gets a
/// branch-free vector exp.
#[inline(always)]
pub fn exp2_approx(x_in: f32) -> f32 {
    let x = x_in.max(-126.0);
    let xi = x.floor();
    let f = x - xi;
    // Minimax coefficients of 2^f on [0, 1).
    let p = 1.535_336_2e-4f32;
    let p = p * f + 1.339_887_4e-3;
    let p = p * f + 9.618_437e-3;
    let p = p * f + 5.550_332_8e-2;
    let p = p * f + 2.402_264_7e-1;
    let p = p * f + 6.931_472e-1;
    let p = p * f + 1.0;
    // `xi` is a whole number in [-126, 0]: adding 1.5 · 2^23 leaves it in the low mantissa
    // bits, a conversion LLVM vectorises; `xi as i32` (saturating, NaN to 0) it left scalar,
    // one conversion per value.
    let xi_bits = (xi + 12_582_912.0).to_bits().wrapping_sub(0x4B40_0000);
    let r = f32::from_bits(p.to_bits().wrapping_add(xi_bits << 23));
    if x_in < -126.0 {
        0.0
    } else {
        r
    }
}
