//! Hashes the CPU kernel sources into `KERNTUNE_CPU_SOURCE_HASH`: tuning results are bound to
//! the hash, so results measured with other kernel code are recognised as stale.

use std::path::Path;

fn main() {
    let mut files = Vec::new();
    collect(Path::new("src/cpu"), &mut files);
    files.push(Path::new("src/config.rs").to_path_buf());
    files.sort();
    // FNV-1a, 64 bit: stable across Rust versions, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let bytes = std::fs::read(f).expect("kernel sources are readable");
        for b in f.to_string_lossy().bytes().chain(bytes) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=KERNTUNE_CPU_SOURCE_HASH={h:016x}");
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/cpu exists") {
        let path = entry.expect("readable directory").path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
