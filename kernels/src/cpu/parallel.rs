//! Running a kernel's independent tasks on exactly the number of threads its config asks for.
//!
//! The thread count is a tuned parameter, so it must be honoured exactly: one rayon pool per
//! thread count, built on first use and kept for the life of the process. Each worker owns the
//! scratch slice of its pool index, so nothing is allocated per call.

use std::sync::OnceLock;

use rayon::prelude::*;
use rayon::ThreadPool;

/// Most threads a config may ask for; pools are built lazily up to this count.
pub const MAX_THREADS: usize = 256;

fn pool(threads: usize) -> &'static ThreadPool {
    static POOLS: OnceLock<Vec<OnceLock<ThreadPool>>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| (0..=MAX_THREADS).map(|_| OnceLock::new()).collect());
    pools[threads].get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("kerntune-{threads}t-{i}"))
            .build()
            .expect("building a rayon pool only fails when threads cannot be spawned")
    })
}

/// 32-bit words in a 64-byte cache line.
pub const LINE_WORDS: usize = 16;

/// Words of each thread's share of a scratch buffer of `len` words over `threads` threads:
/// whole cache lines, so every share of a line-aligned buffer starts on a line.
pub fn share_len(len: usize, threads: usize) -> usize {
    len / threads / LINE_WORDS * LINE_WORDS
}

/// Scratch words for `threads` shares that each need `need` words laid out by parts that start
/// on whole lines (each part rounds up to a line: two lines of slack per share).
pub fn shares_len(threads: usize, need: usize) -> usize {
    threads * (need.next_multiple_of(LINE_WORDS) + 2 * LINE_WORDS)
}

/// A raw pointer that tasks writing disjoint parts of one buffer may share.
#[derive(Debug, Clone, Copy)]
pub struct SharedMut<T>(pub *mut T);

impl<T> SharedMut<T> {
    /// The pointer; a method so closures capture the whole `Sync` wrapper, not the field.
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: users only write disjoint ranges from different tasks (documented at each use).
unsafe impl<T> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SharedMut<T> {}

/// Runs `task(i, worker)` for `i in 0..tasks` on `threads` threads; `worker < threads` is unique
/// among tasks running at the same moment, so it can index per-thread scratch.
pub fn for_each_task(threads: usize, tasks: usize, task: impl Fn(usize, usize) + Sync + Send) {
    if threads <= 1 || tasks <= 1 {
        for i in 0..tasks {
            task(i, 0);
        }
        return;
    }
    let threads = threads.min(MAX_THREADS);
    pool(threads).install(|| {
        (0..tasks).into_par_iter().for_each(|i| {
            task(i, rayon::current_thread_index().unwrap_or(0));
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shares of a buffer sized by `shares_len` are whole lines that hold what each thread
    /// needs plus the slack its parts round up into, after up to a line skipped at the start.
    #[test]
    fn shares_are_whole_lines_with_room_for_their_parts() {
        for threads in 1..=5 {
            for need in [0, 1, 15, 16, 17, 1000, 4099] {
                for skip in 0..LINE_WORDS {
                    let len = shares_len(threads, need) + LINE_WORDS - skip;
                    let share = share_len(len, threads);
                    assert_eq!(share % LINE_WORDS, 0);
                    assert!(threads * share <= len);
                    assert!(
                        share >= need + LINE_WORDS,
                        "{threads} {need} {skip}: {share}"
                    );
                }
            }
        }
    }
}
