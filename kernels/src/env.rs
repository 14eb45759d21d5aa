//! kerntune's environment variables that name a file, a folder or a program. An empty value
//! counts as unset, as it does for most tools: `KERNTUNE_DB= tune ...` or `export
//! KERNTUNE_HIP_CLANG=${CLANG:-}` leave a variable set to nothing, and a path of nothing
//! would name the current folder or no file at all.

use std::path::PathBuf;

/// The path in `$name`, unless it is unset or empty.
pub fn path_var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}
