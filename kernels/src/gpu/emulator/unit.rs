//! The emulator's translation units and their cache. A unit is the SIMT runtime followed by
//! one or more builds, each its prelude and kernel in a namespace of its own with its macros
//! defined around it and its own launch function, `kt_host_launch_<key>`; the unit compiles
//! to one shared object, stored in the cache under every member's key (hard links to one
//! file, which the dynamic loader maps once).
//!
//! The runtime's scheduler is not in the units: it is compiled once for each set of the
//! macros units share ([`runtime_name`]), into an object of its own in the cache, which each
//! unit of that set links (found beside the unit, `$ORIGIN`). Compiled in every unit it was
//! 0.2 of the 0.25 s a unit of one build took with g++.
//!
//! Why several builds a unit all the same: starting the compiler, the runtime's header and
//! linking are the same for every build, so a caller about to run many builds
//! ([`Emulator::prepare`](super::Emulator::prepare)) pays them once per unit instead of once
//! per build.

use std::collections::{BTreeSet, HashMap};
use std::ffi::{c_char, c_void};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::gpu::source::PRELUDE;
use crate::gpu::KernelBuild;

pub(super) const SIMT: &str = include_str!("../../../emulator/simt.h");

/// Part of every key: a change to how units are laid out changes every build's object.
const LAYOUT: &str = "units of namespaced builds linking their runtime, kt_host_launch_<key>";

/// The file name of the runtime that units of these `-D` flags link (simt.h compiled with
/// `KT_HOST_RUNTIME`), in the cache beside them: a hash of the runtime's source, the
/// compiler and the flags, as a unit's key holds them too.
pub(super) fn runtime_name(flags: &[String], compiler: &str) -> String {
    let mut key: Vec<&str> = vec![LAYOUT, SIMT, compiler];
    key.extend(flags.iter().map(String::as_str));
    format!("kt-runtime-{}.so", fnv(&key))
}

/// The launch function of a build (`KT_HOST_ENTRIES` of kernels/emulator/simt.h); `grid`
/// is x, y, z and the blocks of a cluster along x.
pub(super) type LaunchFn = unsafe extern "C" fn(
    entry: i32,
    grid: *const u32,
    threads: u32,
    params: *mut *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> i32;

/// A compiled build, loaded for the life of the process: its code and thread-local shared
/// memory must outlive every launch, and a process loads each build once.
#[derive(Debug, Clone, Copy)]
pub(super) struct EmulatedBuild {
    pub(super) launch: LaunchFn,
}

pub(super) fn loaded() -> &'static Mutex<HashMap<PathBuf, EmulatedBuild>> {
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, EmulatedBuild>>> = OnceLock::new();
    LOADED.get_or_init(Default::default)
}

/// FNV-1a's step on 8-byte words over the parts of a cache key: stable across Rust versions
/// and runs. Every run hashes the runtime, the prelude and its kernel's source (about 170 KB),
/// and FNV-1a a byte at a time was 4.5% of an emulated sweep from a full cache (the int4 GEMM
/// test: 4.4-4.5 s, 4.1-4.3 s with words). Each step (an xor, an odd multiply, a rotation)
/// is a bijection of the state, so two keys that differ in one word never share a hash.
fn fnv(parts: &[&str]) -> String {
    const PRIME: u64 = 0x0100_0000_01b3;
    let step = |h: u64, word: u64| (h ^ word).wrapping_mul(PRIME).rotate_left(23);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        let words = part.as_bytes().chunks_exact(8);
        let tail = words.remainder();
        for w in words {
            h = step(h, u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        // The tail with its length, so "ab" + "c" and "a" + "bc" differ.
        let mut last = [0u8; 8];
        last[..tail.len()].copy_from_slice(tail);
        h = step(h, u64::from_le_bytes(last));
        h = step(h, part.len() as u64);
    }
    format!("{h:016x}")
}

/// Macros a whole unit shares, given on the compiler's command line: the emulator's own
/// (`KT_HOST*`) and the input type, which the runtime's conversions read. A build's other
/// macros are defined before its part of the unit and undefined after it.
fn unit_wide(name: &str) -> bool {
    name.starts_with("KT_HOST") || name == "KT_DTYPE"
}

/// Names that `text` defines with `#define`, in any branch: undefining them all after a
/// build's part leaves nothing of it to the next one.
fn defined_macros(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| {
        let rest = line.trim_start().strip_prefix('#')?.trim_start();
        let rest = rest.strip_prefix("define")?;
        if !rest.starts_with([' ', '\t']) {
            return None;
        }
        let rest = rest.trim_start();
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        (end > 0).then(|| &rest[..end])
    })
}

/// One build's part of a unit.
pub(super) struct Part<'a> {
    pub build: &'a KernelBuild,
    /// The kernel source compiled in place of the build's file.
    pub body: &'a str,
    /// `(name, value)` of every macro, the emulator's first.
    pub defines: Vec<(&'static str, usize)>,
    /// Hash of everything the object depends on: names its cache file and launch function.
    pub key: String,
}

impl<'a> Part<'a> {
    pub fn new(
        build: &'a KernelBuild,
        body: &'a str,
        defines: Vec<(&'static str, usize)>,
        compiler: &str,
    ) -> Part<'a> {
        let flags: Vec<String> = defines.iter().map(|(n, v)| format!("{n}={v}")).collect();
        let entries = build.entries.join(",");
        let mut key: Vec<&str> = vec![LAYOUT, SIMT, PRELUDE, build.file, body, &entries, compiler];
        key.extend(flags.iter().map(String::as_str));
        Part {
            build,
            body,
            defines,
            key: fnv(&key),
        }
    }

    pub fn path(&self, cache: &Path) -> PathBuf {
        cache.join(format!("{}.so", self.key))
    }

    /// The build's launch function.
    pub fn launcher(&self) -> String {
        format!("kt_host_launch_{}", self.key)
    }

    /// The `-D` flags of the unit this part belongs to.
    pub fn unit_flags(&self) -> Vec<String> {
        self.defines
            .iter()
            .filter(|(n, _)| unit_wide(n))
            .map(|(n, v)| format!("-D{n}={v}"))
            .collect()
    }
}

/// The unit's C++ text: the runtime, then each part (prelude and kernel with `#line` marks,
/// so compiler messages and barrier sites name the source files' lines) and its launch
/// function. Every part shares [`Part::unit_flags`].
pub(super) fn source(parts: &[Part<'_>]) -> String {
    let mut s = String::from(SIMT);
    for p in parts {
        let own: Vec<&(&str, usize)> = p.defines.iter().filter(|(n, _)| !unit_wide(n)).collect();
        for (name, value) in &own {
            let _ = writeln!(s, "#define {name} {value}");
        }
        let body = p.body.replacen("#include \"prelude.h\"", "", 1);
        let _ = writeln!(
            s,
            "namespace kt_build_{key} {{\n#line 1 \"prelude.h\"\n{PRELUDE}\n#line 1 \"{file}\"\n{body}\n}}",
            key = p.key,
            file = p.build.file,
        );
        let entries: Vec<String> = p
            .build
            .entries
            .iter()
            .map(|e| format!("kt_host::entry_of(&kt_build_{}::{e})", p.key))
            .collect();
        let _ = writeln!(
            s,
            "KT_HOST_ENTRIES({}, {})",
            p.launcher(),
            entries.join(", ")
        );
        let undefine: BTreeSet<&str> = own
            .iter()
            .map(|(n, _)| *n)
            .chain(defined_macros(PRELUDE))
            .chain(defined_macros(p.body))
            .filter(|n| !unit_wide(n))
            .collect();
        for name in undefine {
            let _ = writeln!(s, "#undef {name}");
        }
    }
    s
}

/// Stores the unit's object, compiled to `object`, under each part's key: hard links to the
/// one file (a copy where the file system has none), each written under a private name and
/// renamed, as concurrent tests and tuners share the cache. `object` is removed.
pub(super) fn store(object: &Path, parts: &[Part<'_>], cache: &Path) -> std::io::Result<()> {
    let result = parts.iter().try_for_each(|p| {
        let path = p.path(cache);
        let tmp = path.with_extension(format!(
            "{}.{:?}.link",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_file(&tmp);
        std::fs::hard_link(object, &tmp)
            .or_else(|_| std::fs::copy(object, &tmp).map(drop))
            .and_then(|()| std::fs::rename(&tmp, &path))
    });
    let _ = std::fs::remove_file(object);
    result
}

#[cfg(test)]
mod tests {
    use super::{defined_macros, fnv};

    /// A cache key changes with any byte of any part, at any place in its word, and with a
    /// byte moved from one part to the next; the same parts give the same key.
    #[test]
    fn every_byte_and_every_boundary_changes_the_key() {
        let body = "__global__ void kt_gemm(const float* a, float* c) { c[0] = a[0]; }";
        let key = fnv(&["runtime", body, "KT_BM=64"]);
        assert_eq!(key, fnv(&["runtime", body, "KT_BM=64"]));
        for at in 0..body.len() {
            let mut changed = body.as_bytes().to_vec();
            changed[at] ^= 0x20;
            let changed = String::from_utf8(changed).unwrap();
            assert_ne!(key, fnv(&["runtime", &changed, "KT_BM=64"]), "byte {at}");
        }
        assert_ne!(fnv(&["ab", "c"]), fnv(&["a", "bc"]));
        assert_ne!(fnv(&["KT_BM=64"]), fnv(&["KT_BM=64", ""]));
    }

    #[test]
    fn every_defined_name_is_found_once_per_definition() {
        let text = "#define A 1\n  #  define B_2(x) x\n#ifdef A\n#define\tC\n#endif\n#defined D\n// #define E\n";
        let names: Vec<&str> = defined_macros(text).collect();
        assert_eq!(names, ["A", "B_2", "C"]);
    }
}
