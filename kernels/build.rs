//! Hashes the kernel sources: the CPU kernels into `KERNTUNE_CPU_SOURCE_HASH`, the GPU sources
//! of `hip/` into `KERNTUNE_GPU_SOURCE_HASH`. Tuning results are bound to the hash, so results
//! measured with other kernel code are recognised as stale.

use std::path::{Path, PathBuf};

fn main() {
    let mut cpu = Vec::new();
    collect(Path::new("src/cpu"), &["rs"], &mut cpu);
    cpu.push(Path::new("src/config.rs").to_path_buf());
    println!("cargo:rustc-env=KERNTUNE_CPU_SOURCE_HASH={}", hash(cpu));
    let mut gpu = Vec::new();
    collect(Path::new("hip"), &["h", "hip"], &mut gpu);
    println!("cargo:rustc-env=KERNTUNE_GPU_SOURCE_HASH={}", hash(gpu));
}

fn hash(mut files: Vec<PathBuf>) -> String {
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
    format!("{h:016x}")
}

fn collect(dir: &Path, extensions: &[&str], out: &mut Vec<PathBuf>) {
    println!("cargo:rerun-if-changed={}", dir.display());
    for entry in std::fs::read_dir(dir).expect("kernel source folder exists") {
        let path = entry.expect("readable directory").path();
        if path.is_dir() {
            collect(&path, extensions, out);
        } else if path
            .extension()
            .is_some_and(|e| extensions.iter().any(|x| e == *x))
        {
            out.push(path);
        }
    }
}
