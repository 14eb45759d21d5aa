//! The C ABI's conversions of 4-bit checkpoints' tensors into what kt_gemm_int4() and
//! kt_gpu_gemm_int4() take ([`kerntune_kernels::checkpoint`]): a server calls them once per
//! layer as it loads a GPTQ or AWQ model, then passes the words and zero points on every call.

use kerntune_kernels::checkpoint::{int4_words, int4_zeros, Int4Format};

use crate::capi::{guard, invalid, values, KtStatus};

/// Which quantizer wrote a 4-bit checkpoint (its `quantization_config`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KtInt4Format {
    /// `quant_method = "gptq"`, `checkpoint_format = "gptq"` (the default): `qweight` is
    /// already kerntune's words; `qzeros` hold each zero point minus one.
    Gptq = 0,
    /// `checkpoint_format = "gptq_v2"`: zero points as they are.
    GptqV2 = 1,
    /// `quant_method = "awq"`: `qweight` `[k, n / 8]`, `qzeros` `[k / group, n / 8]`, eight
    /// columns a word in the order 0, 2, 4, 6, 1, 3, 5, 7.
    Awq = 2,
}

impl From<KtInt4Format> for Int4Format {
    fn from(f: KtInt4Format) -> Self {
        match f {
            KtInt4Format::Gptq => Int4Format::Gptq,
            KtInt4Format::GptqV2 => Int4Format::GptqV2,
            KtInt4Format::Awq => Int4Format::Awq,
        }
    }
}

/// Copies `converted` to `out`, which must hold exactly as many.
///
/// # Safety
/// `out` holds `out_len` elements.
unsafe fn write_out<T: Copy>(
    name: &str,
    converted: &[T],
    out: *mut T,
    out_len: usize,
) -> Result<(), (KtStatus, String)> {
    if out.is_null() || out_len != converted.len() {
        return Err(invalid(format!(
            "`{name}` holds {out_len} values{}; this conversion writes {}",
            if out.is_null() { " at NULL" } else { "" },
            converted.len()
        )));
    }
    // SAFETY: caller contract; `out` holds `converted.len()` elements.
    unsafe { std::ptr::copy_nonoverlapping(converted.as_ptr(), out, converted.len()) };
    Ok(())
}

/// B's words for kt_gemm_int4() (GPTQ's `[k / 8, n]`) from a checkpoint's `qweight` of
/// `qweight_len` words: GPTQ's copied as they are (checked), AWQ's (`[k, n / 8]`) repacked.
/// `out` receives k / 8 · n words (`out_len`).
///
/// # Safety
/// `qweight` holds `qweight_len` words, `out` `out_len`.
#[no_mangle]
pub unsafe extern "C" fn kt_int4_words(
    format: KtInt4Format,
    qweight: *const u32,
    qweight_len: usize,
    k: usize,
    n: usize,
    out: *mut u32,
    out_len: usize,
) -> KtStatus {
    guard(|| {
        // SAFETY: caller contract.
        let qweight = unsafe { values("qweight", qweight, qweight_len)? };
        let converted =
            int4_words(format.into(), qweight, k, n).map_err(|e| invalid(e.to_string()))?;
        // SAFETY: caller contract.
        unsafe { write_out("out", &converted, out, out_len) }
    })
}

/// The zero points for kt_gemm_int4() (`[groups, n]` floats, `groups` = k / group) from a
/// checkpoint's `qzeros` of `qzeros_len` words (`[groups, n / 8]`): GPTQ's plus one, GPTQ
/// v2's and AWQ's as they are. `out` receives groups · n floats (`out_len`).
///
/// # Safety
/// `qzeros` holds `qzeros_len` words, `out` `out_len` floats.
#[no_mangle]
pub unsafe extern "C" fn kt_int4_zeros(
    format: KtInt4Format,
    qzeros: *const u32,
    qzeros_len: usize,
    groups: usize,
    n: usize,
    out: *mut f32,
    out_len: usize,
) -> KtStatus {
    guard(|| {
        // SAFETY: caller contract.
        let qzeros = unsafe { values("qzeros", qzeros, qzeros_len)? };
        let zeros =
            int4_zeros(format.into(), qzeros, groups, n).map_err(|e| invalid(e.to_string()))?;
        // SAFETY: caller contract.
        unsafe { write_out("out", &zeros, out, out_len) }
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;
    use crate::capi::kt_last_error;

    fn last_error() -> String {
        // SAFETY: the library's own NUL-terminated message.
        unsafe { CStr::from_ptr(kt_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    /// GPTQ's stored zero points minus one come back plus one; an output of the wrong length,
    /// a NULL input with a length and a width of no whole words are refused by name, the
    /// output untouched.
    #[test]
    fn conversions_check_their_buffers_and_say_why() {
        // Zero points 1..=8 of 8 columns, stored minus one.
        let qzeros = [0x7654_3210u32];
        let mut zeros = [0.0f32; 8];
        // SAFETY: the buffers hold their lengths.
        let st = unsafe {
            kt_int4_zeros(
                KtInt4Format::Gptq,
                qzeros.as_ptr(),
                1,
                1,
                8,
                zeros.as_mut_ptr(),
                8,
            )
        };
        assert_eq!(st, KtStatus::Ok);
        assert_eq!(zeros, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let mut short = [-1.0f32; 7];
        // SAFETY: as above.
        let st = unsafe {
            kt_int4_zeros(
                KtInt4Format::GptqV2,
                qzeros.as_ptr(),
                1,
                1,
                8,
                short.as_mut_ptr(),
                7,
            )
        };
        assert_eq!(st, KtStatus::InvalidArgument);
        assert!(
            last_error().contains("`out` holds 7 values; this conversion writes 8"),
            "{}",
            last_error()
        );
        assert_eq!(short, [-1.0; 7]);
        let mut words = [0u32; 8];
        // SAFETY: a NULL input is refused before it is read.
        let st = unsafe {
            kt_int4_words(
                KtInt4Format::Awq,
                std::ptr::null(),
                8,
                8,
                8,
                words.as_mut_ptr(),
                8,
            )
        };
        assert_eq!(st, KtStatus::InvalidArgument);
        assert!(
            last_error().contains("`qweight` is NULL"),
            "{}",
            last_error()
        );
        let qweight = [0u32; 8];
        // SAFETY: the buffers hold their lengths.
        let st = unsafe {
            kt_int4_words(
                KtInt4Format::Awq,
                qweight.as_ptr(),
                8,
                16,
                4,
                words.as_mut_ptr(),
                8,
            )
        };
        assert_eq!(st, KtStatus::InvalidArgument);
        assert!(last_error().contains("n = 4"), "{}", last_error());
    }
}
