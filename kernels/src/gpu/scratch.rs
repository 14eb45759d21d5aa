//! The GPU compilers' temporary directories: each removed when dropped, and all those still
//! live by [`remove_temporary_dirs`], for a process about to exit without dropping them (a
//! second Ctrl-C exits at once; the precompiled HIP headers alone are 11 MB a target).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

fn live() -> MutexGuard<'static, BTreeSet<PathBuf>> {
    static LIVE: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A temporary directory that [`remove_temporary_dirs`] knows of while it lives.
#[derive(Debug)]
pub(crate) struct Scratch(tempfile::TempDir);

impl Scratch {
    /// A new directory in `parent`, named `prefix` and a random suffix.
    pub(crate) fn new(prefix: &str, parent: &Path) -> std::io::Result<Scratch> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir_in(parent)?;
        live().insert(dir.path().to_path_buf());
        Ok(Scratch(dir))
    }

    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // The TempDir removes the directory after this.
        live().remove(self.0.path());
    }
}

/// Removes every compiler's temporary directory still in use, for a process that exits
/// without dropping them. Compiles in flight in them fail (their process is exiting).
pub fn remove_temporary_dirs() {
    let dirs = std::mem::take(&mut *live());
    remove(dirs);
}

fn remove(dirs: impl IntoIterator<Item = PathBuf>) {
    for dir in dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_directories_are_removed_and_dropped_ones_forgotten() {
        let parent = tempfile::tempdir().unwrap();
        let kept = Scratch::new("kept-", parent.path()).unwrap();
        let dropped = Scratch::new("dropped-", parent.path()).unwrap();
        let dropped_path = dropped.path().to_path_buf();
        std::fs::write(kept.path().join("file"), b"x").unwrap();
        assert!(live().contains(kept.path()));
        drop(dropped);
        assert!(!dropped_path.exists());
        assert!(!live().contains(&dropped_path));
        // What remove_temporary_dirs does, for this test's directory alone: the other tests
        // of this process compile in theirs.
        let taken = live().take(kept.path()).unwrap();
        remove([taken]);
        assert!(!kept.path().exists(), "{}", kept.path().display());
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }
}
