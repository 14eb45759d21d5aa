//! The untuned-shapes file (`key<TAB>calls` a line, what `tune --shapes untuned:PATH` reads),
//! merged rather than replaced: a tensor-parallel server runs a dispatcher in each worker
//! process, all of them told the same `KERNTUNE_RECORD_UNTUNED` path, and each server run
//! ends by writing it again. Replacing the file would keep the last writer's shapes only.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

const HEADER: &str = "# problems dispatched without an exact winner: key, calls\n";

/// Adds `rows` (problem key, calls) to the file at `path`, most called first. Writers take
/// turns under a lock on `PATH.lock` (the file itself is replaced by a rename, which a lock
/// on it would not survive), and a writer that dies mid-write leaves the previous file whole.
pub fn merge_into(path: &Path, rows: &[(String, u64)]) -> io::Result<()> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(sibling(path, ".lock"))?;
    lock.lock()?;
    let mut calls: HashMap<String, u64> = HashMap::new();
    match std::fs::read_to_string(path) {
        Ok(text) => {
            for (key, n) in text.lines().filter_map(parse_line) {
                *calls.entry(key.to_string()).or_default() += n;
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    for (key, n) in rows {
        *calls.entry(key.clone()).or_default() += n;
    }
    let mut merged: Vec<(String, u64)> = calls.into_iter().collect();
    merged.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut text = String::from(HEADER);
    for (key, n) in &merged {
        text.push_str(&format!("{key}\t{n}\n"));
    }
    let staged = sibling(path, ".partial");
    std::fs::write(&staged, text)?;
    File::open(&staged)?.sync_all()?;
    std::fs::rename(&staged, path)
}

/// A line's key and calls; a key without a count (written by hand) counts once. Keys are kept
/// as written, so that a file shared with another kerntune version loses none of them.
fn parse_line(line: &str) -> Option<(&str, u64)> {
    let line = line.split('#').next().unwrap_or("");
    let mut fields = line.split_whitespace();
    let key = fields.next()?;
    let calls = fields.next().and_then(|n| n.parse().ok()).unwrap_or(1);
    Some((key, calls))
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path) -> Vec<(String, u64)> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter_map(parse_line)
            .map(|(k, n)| (k.to_string(), n))
            .collect()
    }

    #[test]
    fn writers_add_their_counts_to_what_the_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("untuned.txt");
        std::fs::write(&path, "# by hand\ngemm:m=3,n=8,k=8\ngemm:m=1,n=8,k=8\t4\n").unwrap();
        merge_into(&path, &[("gemm:m=1,n=8,k=8".into(), 2)]).unwrap();
        merge_into(&path, &[("gemm:m=5,n=8,k=8".into(), 1)]).unwrap();
        assert_eq!(
            read(&path),
            [
                ("gemm:m=1,n=8,k=8".to_string(), 6),
                ("gemm:m=3,n=8,k=8".to_string(), 1),
                ("gemm:m=5,n=8,k=8".to_string(), 1),
            ]
        );
        assert!(std::fs::read_to_string(&path).unwrap().starts_with(HEADER));
        assert!(!sibling(&path, ".partial").exists());
    }

    #[test]
    fn writers_at_once_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("untuned.txt");
        std::thread::scope(|s| {
            for worker in 0..8u64 {
                let path = &path;
                s.spawn(move || {
                    for round in 0..10 {
                        let rows = [
                            ("gemm:m=1,n=8,k=8".to_string(), 1),
                            (format!("gemm:m={},n=8,k=8", 2 + worker), round + 1),
                        ];
                        merge_into(path, &rows).unwrap();
                    }
                });
            }
        });
        let rows = read(&path);
        assert_eq!(rows[0], ("gemm:m=1,n=8,k=8".to_string(), 80));
        assert_eq!(rows.len(), 9);
        assert!(rows[1..].iter().all(|(_, n)| *n == 55), "{rows:?}");
    }
}
