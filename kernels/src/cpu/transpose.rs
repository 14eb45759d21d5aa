//! Packing a Linear layer's rows (k-contiguous) into k-major slivers is a transpose of 32-bit
//! words: f32 values, or bf16 pairs. Where a row's words are contiguous, 16×16 blocks are
//! loaded a row per instruction and transposed in registers (unpacks and lane shuffles); the
//! rest is read with AVX-512 gathers, 16 rows at once. Either writes one sliver row per
//! instruction, where scalar code wrote one word per cache line. AVX2 hosts transpose 8×8
//! blocks the same way.

/// `dst[q · width + j]` = the 32-bit word `q · step` bytes into row `j` for `j < live`, and 0
/// for `live <= j < width`, `q < count`; rows are `row_bytes` apart from `src`.
///
/// # Safety
/// The CPU has AVX-512F; each of rows `0..live` holds `count` words at those offsets; `dst`
/// holds `count · width` words; `live · row_bytes` fits in i32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn gather_words(
    src: *const u8,
    row_bytes: usize,
    step: usize,
    count: usize,
    live: usize,
    width: usize,
    dst: *mut u32,
) {
    use std::arch::x86_64::*;
    let lanes = |n: usize| -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            (1u16 << n) - 1
        }
    };
    let step_v = _mm512_set1_epi32(step as i32);
    for g in 0..width.div_ceil(16) {
        let first = g * 16;
        let read = lanes(live.saturating_sub(first));
        let write = lanes(width - first);
        // Whole 16×16 blocks of contiguous words: loads and an in-register transpose.
        let blocks = if step == 4 { count / 16 } else { 0 };
        for b in 0..blocks {
            let q0 = b * 16;
            let mut r: [__m512i; 16] = std::array::from_fn(|j| {
                if first + j < live {
                    // SAFETY: caller contract: row first + j holds words q0..q0 + 16.
                    unsafe { _mm512_loadu_si512(src.add((first + j) * row_bytes + q0 * 4).cast()) }
                } else {
                    _mm512_setzero_si512()
                }
            });
            // SAFETY: register operations only; AVX-512F is enabled for this function.
            unsafe { transpose16(&mut r) };
            for (c, v) in r.iter().enumerate() {
                // SAFETY: the masked store stays within row q0 + c of `dst`.
                unsafe {
                    _mm512_mask_storeu_epi32(dst.add((q0 + c) * width + first).cast(), write, *v)
                };
            }
        }
        let done = blocks * 16;
        // Byte offsets of each lane's row; lanes past `live` are masked off and never read.
        let rows: [i32; 16] = std::array::from_fn(|j| {
            if first + j < live {
                ((first + j) * row_bytes) as i32
            } else {
                0
            }
        });
        // SAFETY: reading 16 i32 from a stack array.
        let mut index = unsafe { _mm512_loadu_si512(rows.as_ptr().cast()) };
        index = _mm512_add_epi32(index, _mm512_set1_epi32((done * step) as i32));
        for q in done..count {
            // SAFETY: caller contract: each unmasked offset addresses word q of its row; the
            // masked store stays within row q of `dst`.
            unsafe {
                let v = _mm512_mask_i32gather_epi32::<1>(
                    _mm512_setzero_si512(),
                    read,
                    index,
                    src.cast(),
                );
                _mm512_mask_storeu_epi32(dst.add(q * width + first).cast(), write, v);
            }
            index = _mm512_add_epi32(index, step_v);
        }
    }
}

/// Transposes 16 rows of 16 words in place: afterwards `r[c]` holds word `c` of every row.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn transpose16(r: &mut [std::arch::x86_64::__m512i; 16]) {
    use std::arch::x86_64::*;
    // Within each 128-bit lane, 4×4 transposes of every group of four rows: t[4g + s] holds
    // word 4i + s of rows 4g..4g + 4 in lane i.
    let mut t = [_mm512_setzero_si512(); 16];
    for g in 0..4 {
        let (a, b, c, d) = (r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]);
        let (lo_ab, hi_ab) = (_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
        let (lo_cd, hi_cd) = (_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
        t[4 * g] = _mm512_unpacklo_epi64(lo_ab, lo_cd);
        t[4 * g + 1] = _mm512_unpackhi_epi64(lo_ab, lo_cd);
        t[4 * g + 2] = _mm512_unpacklo_epi64(hi_ab, hi_cd);
        t[4 * g + 3] = _mm512_unpackhi_epi64(hi_ab, hi_cd);
    }
    // Then the lanes: word 4i + s of all 16 rows is lane i of t[s], t[4 + s], t[8 + s],
    // t[12 + s], gathered by two rounds of 128-bit lane shuffles.
    for s in 0..4 {
        let v02 = _mm512_shuffle_i32x4::<0x88>(t[s], t[4 + s]);
        let v13 = _mm512_shuffle_i32x4::<0xDD>(t[s], t[4 + s]);
        let w02 = _mm512_shuffle_i32x4::<0x88>(t[8 + s], t[12 + s]);
        let w13 = _mm512_shuffle_i32x4::<0xDD>(t[8 + s], t[12 + s]);
        r[s] = _mm512_shuffle_i32x4::<0x88>(v02, w02);
        r[8 + s] = _mm512_shuffle_i32x4::<0xDD>(v02, w02);
        r[4 + s] = _mm512_shuffle_i32x4::<0x88>(v13, w13);
        r[12 + s] = _mm512_shuffle_i32x4::<0xDD>(v13, w13);
    }
}

/// [`gather_words`] for AVX2 hosts and contiguous words (`step` = 4): 8×8 blocks loaded a row
/// per instruction and transposed in registers, the last `count % 8` words copied one by one.
///
/// # Safety
/// The CPU has AVX2; each of rows `0..live` holds `count` words; `dst` holds `count · width`
/// words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn words_avx2(
    src: *const u8,
    row_bytes: usize,
    count: usize,
    live: usize,
    width: usize,
    dst: *mut u32,
) {
    use std::arch::x86_64::*;
    let word = |j: usize, q: usize| -> u32 {
        // SAFETY: caller contract: row j < live holds word q.
        unsafe {
            src.add(j * row_bytes + 4 * q)
                .cast::<u32>()
                .read_unaligned()
        }
    };
    for first in (0..width).step_by(8) {
        let cols = 8.min(width - first);
        for q0 in (0..count - count % 8).step_by(8) {
            let mut r: [__m256; 8] = std::array::from_fn(|j| {
                if first + j < live {
                    // SAFETY: caller contract: row first + j holds words q0..q0 + 8.
                    unsafe { _mm256_loadu_ps(src.add((first + j) * row_bytes + 4 * q0).cast()) }
                } else {
                    _mm256_setzero_ps()
                }
            });
            // SAFETY: register operations only; AVX2 is enabled for this function.
            unsafe { transpose8(&mut r) };
            for (c, v) in r.iter().enumerate() {
                let to = (q0 + c) * width + first;
                if cols == 8 {
                    // SAFETY: within row q0 + c of `dst`.
                    unsafe { _mm256_storeu_ps(dst.add(to).cast(), *v) };
                } else {
                    // Lanes past the sliver's width belong to the next row. AMD cores
                    // microcode `vpmaskmovd` stores (tens of cycles), so a partial group goes
                    // through the stack.
                    let mut words = [0u32; 8];
                    // SAFETY: `words` holds 8 words; `cols` words fit in row q0 + c.
                    unsafe {
                        _mm256_storeu_ps(words.as_mut_ptr().cast(), *v);
                        std::ptr::copy_nonoverlapping(words.as_ptr(), dst.add(to), cols);
                    }
                }
            }
        }
        for q in count - count % 8..count {
            for j in 0..cols {
                let v = if first + j < live {
                    word(first + j, q)
                } else {
                    0
                };
                // SAFETY: within row q of `dst`.
                unsafe { dst.add(q * width + first + j).write(v) };
            }
        }
    }
}

/// Transposes 8 × 8 f32: `r[i]` lane `j` becomes `r[j]` lane `i`.
///
/// # Safety
/// The CPU has AVX (inlined into callers compiled for it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn transpose8(r: &mut [std::arch::x86_64::__m256; 8]) {
    use std::arch::x86_64::*;
    // SAFETY: register shuffles only; callers run with AVX enabled.
    unsafe {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        r[0] = _mm256_permute2f128_ps::<0x20>(u0, u4);
        r[1] = _mm256_permute2f128_ps::<0x20>(u1, u5);
        r[2] = _mm256_permute2f128_ps::<0x20>(u2, u6);
        r[3] = _mm256_permute2f128_ps::<0x20>(u3, u7);
        r[4] = _mm256_permute2f128_ps::<0x31>(u0, u4);
        r[5] = _mm256_permute2f128_ps::<0x31>(u1, u5);
        r[6] = _mm256_permute2f128_ps::<0x31>(u2, u6);
        r[7] = _mm256_permute2f128_ps::<0x31>(u3, u7);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Blocks, the gather remainder, partial groups, rows past `live` and a non-contiguous
    /// step, against the definition, for the AVX-512 and the AVX2 transpose.
    #[test]
    fn transposed_words_match_the_definition() {
        let avx512 = std::arch::is_x86_feature_detected!("avx512f");
        if !avx512 {
            eprintln!("the AVX-512 half of transposed_words_match_the_definition did not run");
        }
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("transposed_words_match_the_definition did not run: no AVX2 here");
            return;
        }
        for (live, width, count, step_words) in [
            (16, 16, 16, 1),
            (16, 32, 37, 1),
            (13, 16, 40, 1),
            (30, 32, 5, 1),
            (1, 16, 17, 1),
            (20, 32, 33, 2),
            (6, 6, 1027, 1),
            (5, 12, 9, 1),
        ] {
            let row_words = count * step_words + 3;
            let src: Vec<u32> = (0..40 * row_words as u32).map(|v| v * 7 + 1).collect();
            if avx512 {
                let mut dst = vec![u32::MAX; count * width];
                // SAFETY: AVX-512F checked; every read row holds count words at step offsets.
                unsafe {
                    gather_words(
                        src.as_ptr().cast(),
                        4 * row_words,
                        4 * step_words,
                        count,
                        live,
                        width,
                        dst.as_mut_ptr(),
                    )
                };
                check(
                    &src, row_words, step_words, count, live, width, &dst, "gather",
                );
            }
            if step_words == 1 {
                let mut dst = vec![u32::MAX; count * width];
                // SAFETY: AVX2 checked; every read row holds count words.
                unsafe {
                    words_avx2(
                        src.as_ptr().cast(),
                        4 * row_words,
                        count,
                        live,
                        width,
                        dst.as_mut_ptr(),
                    )
                };
                check(
                    &src, row_words, step_words, count, live, width, &dst, "avx2",
                );
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check(
        src: &[u32],
        row_words: usize,
        step_words: usize,
        count: usize,
        live: usize,
        width: usize,
        dst: &[u32],
        what: &str,
    ) {
        for q in 0..count {
            for j in 0..width {
                let want = if j < live {
                    src[j * row_words + q * step_words]
                } else {
                    0
                };
                assert_eq!(
                    dst[q * width + j],
                    want,
                    "{what}: {live} {width} {count} q={q} j={j}"
                );
            }
        }
    }
}
