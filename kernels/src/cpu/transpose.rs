//! Packing a Linear layer's rows (k-contiguous) into k-major slivers is a transpose of 32-bit
//! words: f32 values, or bf16 pairs. AVX-512 gathers read 16 rows at once and write one
//! sliver row per instruction, where scalar code wrote one word per cache line.

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
        for q in 0..count {
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
