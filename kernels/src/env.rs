//! kerntune's environment variables.
//!
//! Those naming a file, a folder or a program count as unset when empty, as they do for most
//! tools: `KERNTUNE_DB= tune ...` or `export KERNTUNE_HIP_CLANG=${CLANG:-}` leave a variable
//! set to nothing, and a path of nothing would name the current folder or no file at all.
//!
//! The CPU kernels' knobs (`KERNTUNE_ISA`, `KERNTUNE_AVX512_BF16`, `KERNTUNE_SPIN_US`) are
//! read where they apply, and a value that does not parse is ignored there: a library linked
//! into a server has no one to tell. [`check_knobs`] refuses such a value for a program that
//! can say so, as `tune` does before anything else.

use std::path::PathBuf;

use crate::device::Isa;

/// The path in `$name`, unless it is unset or empty.
pub fn path_var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `$name` unless unset or empty, parsed by `parse`; its error names the variable.
fn knob<T>(name: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Option<T>, String> {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(format!("{name}={}: not valid UTF-8", v.to_string_lossy()))
        }
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => parse(v.trim())
            .map(Some)
            .map_err(|e| format!("{name}={v}: {e}; correct or unset it")),
    }
}

/// `KERNTUNE_ISA`: the highest ISA level the CPU kernels may use.
pub fn isa_cap() -> Result<Option<Isa>, String> {
    knob("KERNTUNE_ISA", str::parse)
}

/// `KERNTUNE_AVX512_BF16`: 0 hides AVX-512-BF16 from the CPU kernels, 1 (the default) does not.
pub fn avx512_bf16_allowed() -> Result<bool, String> {
    let allowed = knob("KERNTUNE_AVX512_BF16", |v| match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err("expected 0 (hide AVX-512-BF16) or 1".to_string()),
    })?;
    Ok(allowed.unwrap_or(true))
}

/// `KERNTUNE_SPIN_US`: how long the CPU kernels' helper threads spin between calls.
pub fn spin_us() -> Result<Option<u64>, String> {
    knob("KERNTUNE_SPIN_US", |v| {
        v.parse::<u64>()
            .map_err(|_| "expected a whole number of microseconds".to_string())
    })
}

/// Every CPU knob of the environment parses.
pub fn check_knobs() -> Result<(), String> {
    isa_cap()?;
    avx512_bf16_allowed()?;
    spin_us()?;
    Ok(())
}
