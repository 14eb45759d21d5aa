//! Packing a Linear layer's rows (k-contiguous) into k-major slivers is a transpose of 32-bit
//! words: f32 values, or bf16 pairs. Where a row's words are contiguous, 16×16 blocks are
//! loaded a row per instruction and transposed in registers (unpacks and lane shuffles); the
//! rest is read with AVX-512 gathers, 16 rows at once. Either writes one sliver row per
//! instruction, where scalar code wrote one word per cache line.

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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Blocks, the gather remainder, partial groups, rows past `live` and a non-contiguous
    /// step, against the definition.
    #[test]
    fn gathered_words_match_the_definition() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("gathered_words_match_the_definition did not run: no AVX-512 here");
            return;
        }
        for (live, width, count, step_words) in [
            (16, 16, 16, 1),
            (16, 32, 37, 1),
            (13, 16, 40, 1),
            (30, 32, 5, 1),
            (1, 16, 17, 1),
            (20, 32, 33, 2),
        ] {
            let row_words = count * step_words + 3;
            let src: Vec<u32> = (0..40 * row_words as u32).map(|v| v * 7 + 1).collect();
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
                        "{live} {width} {count} q={q} j={j}"
                    );
                }
            }
        }
    }
}
