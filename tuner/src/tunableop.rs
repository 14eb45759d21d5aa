//! PyTorch TunableOp's GEMM files as `--shapes tunableop:PATH`: the untuned file a PyTorch
//! server writes with `PYTORCH_TUNABLEOP_RECORD_UNTUNED=1` (`tunableop_untuned0.csv`, one GEMM
//! per line) and the results file (`tunableop_results0.csv`: the same two fields, then the
//! solution chosen and its time). vLLM and TGI on ROCm use TunableOp, so these files list the
//! GEMMs a real server ran, which kerntune can then tune too.
//!
//! A line's first field is the op with its types and BLAS layout (`GemmTunableOp_BFloat16_TN`),
//! the second the BLAS sizes (`tn_{N}_{M}_{K}_ld_{lda}_{ldb}_{ldc}`). BLAS is column-major, so
//! its first size is N, the output's columns, and its second M, the tokens. Layout `TN` is a
//! Linear layer (weights `[N, K]`, kerntune's `b=nk`), `NN` weights stored `[K, N]` (`b=kn`);
//! `NT` and `TT` read the activations transposed, which kerntune's GEMM does not. FP8 GEMMs
//! (`ScaledGemmTunableOp_Float8_e4m3fnuz_Float8_e4m3fnuz_BFloat16_TN`: A's type, B's, the
//! output's, the layout) are kerntune's fp8 problems where A and B share a format kerntune
//! has. Batched GEMMs (`GemmStridedBatchedTunableOp`) are not kerntune problems: they are
//! counted and named, not tuned, as are other entries kerntune does not take.

use std::collections::BTreeMap;
use std::path::Path;

use kerntune_kernels::problem::{BLayout, GemmProblem};
use kerntune_kernels::{DType, Fp8, Problem};

use crate::error::{usage, Result};
use crate::shapes::Derived;

/// The GEMMs of a TunableOp file, and a note on the entries left out, if any.
pub fn read(path: &Path) -> Result<(Vec<Derived>, Option<String>)> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        usage(format!(
            "cannot read TunableOp file {}: {e}",
            path.display()
        ))
    })?;
    let origin = format!("tunableop {}", path.display());
    let mut problems = Vec::new();
    let mut left_out: BTreeMap<String, usize> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with("Validator") {
            continue;
        }
        let at = |why: String| usage(format!("{}:{}: {why}", path.display(), n + 1));
        let mut fields = line.split(',');
        let (Some(op), Some(sizes)) = (fields.next(), fields.next()) else {
            return Err(at(format!(
                "`{line}` is not a TunableOp GEMM line (`GemmTunableOp_BFloat16_TN,tn_N_M_K_ld_...`)"
            )));
        };
        match entry(op.trim(), sizes.trim()).map_err(at)? {
            Entry::Gemm(problem) => problems.push(Derived {
                problem: Problem::Gemm(problem),
                origin: origin.clone(),
            }),
            Entry::LeftOut(why) => *left_out.entry(why).or_default() += 1,
        }
    }
    if problems.is_empty() && left_out.is_empty() {
        return Err(usage(format!(
            "{} holds no TunableOp GEMM lines: record them with PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_RECORD_UNTUNED=1",
            path.display()
        )));
    }
    let note = (!left_out.is_empty()).then(|| {
        let entries: Vec<String> = left_out
            .iter()
            .map(|(why, count)| format!("{count} {why}"))
            .collect();
        format!(
            "{}: left out {} (not problems kerntune's GEMM takes)",
            path.display(),
            entries.join(", ")
        )
    });
    Ok((problems, note))
}

enum Entry {
    Gemm(GemmProblem),
    /// Why the entry is not a kerntune problem, as counted in the note.
    LeftOut(String),
}

/// One line's op and sizes fields.
fn entry(op: &str, sizes: &str) -> std::result::Result<Entry, String> {
    let mut parts = op.split('_');
    let name = parts.next().unwrap_or_default();
    let (dtype, layout) = match name {
        "GemmTunableOp" | "GemmAndBiasTunableOp" => {
            let (Some(dtype), Some(layout), None) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(format!(
                    "`{op}`: expected the op, its type and its layout, as GemmTunableOp_BFloat16_TN"
                ));
            };
            let dtype = match dtype {
                "float" | "tf32" => DType::F32,
                "Half" => DType::F16,
                "BFloat16" => DType::Bf16,
                other => return Ok(Entry::LeftOut(format!("{name} on {other}"))),
            };
            (dtype, layout)
        }
        "ScaledGemmTunableOp" => match scaled(&parts.collect::<Vec<_>>()) {
            Ok(found) => found,
            Err(Some(why)) => return Ok(Entry::LeftOut(format!("{name} {why}"))),
            Err(None) => {
                return Err(format!(
                    "`{op}`: expected the op, A's, B's and the output's types and the layout, as ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN"
                ))
            }
        },
        "GemmStridedBatchedTunableOp" => return Ok(Entry::LeftOut(format!("{name} (batched)"))),
        _ => return Ok(Entry::LeftOut(name.to_string())),
    };
    let b = match layout {
        "TN" => BLayout::Nk,
        "NN" => BLayout::Kn,
        "NT" | "TT" => {
            return Ok(Entry::LeftOut(format!(
                "{name} {layout} (activations transposed)"
            )))
        }
        other => {
            return Err(format!(
                "`{op}`: unknown layout `{other}` (TN, NN, NT or TT)"
            ))
        }
    };
    let dims: Vec<&str> = sizes.split('_').collect();
    let size = |i: usize| dims.get(i).and_then(|d| d.parse::<usize>().ok());
    let (Some(n), Some(m), Some(k), Some(&"ld")) = (size(1), size(2), size(3), dims.get(4)) else {
        return Err(format!(
            "`{sizes}`: expected the BLAS sizes, as tn_N_M_K_ld_LDA_LDB_LDC"
        ));
    };
    GemmProblem::new(m, n, k, dtype, b)
        .map(Entry::Gemm)
        .map_err(|e| format!("`{sizes}`: {e}"))
}

/// A scaled GEMM's fields after its name, `Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN`: the
/// fp8 format A and B share and the layout; `Err(Some(why))` for a GEMM kerntune does not take
/// (its operands of two formats, or of one kerntune lacks), `Err(None)` for fields that are
/// not such a GEMM's.
fn scaled<'a>(fields: &[&'a str]) -> std::result::Result<(DType, &'a str), Option<String>> {
    // Each fp8 type is two fields (`Float8`, its format); the output's type is one.
    let [_, a, _, b, _, layout] = fields else {
        return Err(None);
    };
    let format = |f: &str| match f {
        "e4m3fn" => Some(Fp8::E4m3),
        "e4m3fnuz" => Some(Fp8::E4m3Fnuz),
        "e5m2" => Some(Fp8::E5m2),
        _ => None,
    };
    match (format(a), format(b)) {
        (Some(fa), Some(fb)) if fa == fb => Ok((DType::Fp8(fa), layout)),
        (Some(_), Some(_)) => Err(Some(format!("(A in {a}, B in {b})"))),
        _ => Err(Some(format!("on {a} and {b}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm(op: &str, sizes: &str) -> String {
        match entry(op, sizes).unwrap() {
            Entry::Gemm(p) => Problem::Gemm(p).key(),
            Entry::LeftOut(why) => format!("left out: {why}"),
        }
    }

    #[test]
    fn blas_sizes_become_tokens_by_outputs() {
        // Llama-3.1-70B TP8's down projection at one token, as a Linear layer records it.
        assert_eq!(
            gemm(
                "GemmTunableOp_BFloat16_TN",
                "tn_8192_1_3584_ld_3584_3584_8192"
            ),
            "gemm:m=1,n=8192,k=3584,dtype=bf16,b=nk"
        );
        assert_eq!(
            gemm(
                "GemmAndBiasTunableOp_Half_TN",
                "tn_1280_37_8192_ld_8192_8192_1280"
            ),
            "gemm:m=37,n=1280,k=8192,dtype=f16,b=nk"
        );
        assert_eq!(
            gemm("GemmTunableOp_float_NN", "nn_64_128_32_ld_64_32_64"),
            "gemm:m=128,n=64,k=32,dtype=f32,b=kn"
        );
        // An FP8 Linear layer on MI300X (`torch._scaled_mm`, as vLLM's fp8 layers run it).
        assert_eq!(
            gemm(
                "ScaledGemmTunableOp_Float8_e4m3fnuz_Float8_e4m3fnuz_BFloat16_TN",
                "tn_7168_4_8192_ld_8192_8192_7168"
            ),
            "gemm:m=4,n=7168,k=8192,dtype=fp8_e4m3fnuz,b=nk"
        );
        assert_eq!(
            gemm(
                "ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_Half_TN",
                "tn_1280_512_8192_ld_8192_8192_1280"
            ),
            "gemm:m=512,n=1280,k=8192,dtype=fp8_e4m3,b=nk"
        );
    }

    #[test]
    fn what_kerntune_does_not_take_is_named() {
        for (op, why) in [
            ("GemmStridedBatchedTunableOp_BFloat16_TN", "(batched)"),
            (
                "ScaledGemmTunableOp_Float8_e4m3fn_Float8_e5m2_BFloat16_TN",
                "(A in e4m3fn, B in e5m2)",
            ),
            (
                "ScaledGemmTunableOp_Float8_e5m2fnuz_Float8_e5m2fnuz_BFloat16_TN",
                "on e5m2fnuz and e5m2fnuz",
            ),
            ("GemmTunableOp_double_TN", "on double"),
            ("GemmTunableOp_BFloat16_NT", "(activations transposed)"),
        ] {
            let got = gemm(op, "tn_8_8_8_ld_8_8_8");
            assert!(
                got.starts_with("left out") && got.contains(why),
                "{op}: {got}"
            );
        }
        for (op, sizes, needle) in [
            ("GemmTunableOp_BFloat16", "tn_8_8_8_ld_8_8_8", "its layout"),
            (
                "GemmTunableOp_BFloat16_XY",
                "tn_8_8_8_ld_8_8_8",
                "unknown layout `XY`",
            ),
            ("GemmTunableOp_BFloat16_TN", "tn_8_8", "tn_N_M_K_ld"),
            ("GemmTunableOp_BFloat16_TN", "tn_0_8_8_ld_8_8_8", "n = 0"),
            (
                "ScaledGemmTunableOp_Float8_e4m3fn_BFloat16_TN",
                "tn_8_8_8_ld_8_8_8",
                "A's, B's and the output's types",
            ),
        ] {
            let err = entry(op, sizes).err().unwrap();
            assert!(err.contains(needle), "{op},{sizes}: {err}");
        }
    }
}
