//! Running a kernel's independent tasks on exactly the number of threads its config asks for.
//!
//! The thread count is a tuned parameter, so it must be honoured exactly: the calling thread
//! and, per thread count, a team of helpers started on first use and kept for the life of the
//! process. Each worker owns the scratch slice of its index, so nothing is allocated per call.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use rayon::ThreadPool;

use super::team::Team;

/// Most threads a config may ask for.
pub const MAX_THREADS: usize = 256;

/// Lazily started threads per helper count (a [`Team`] or a rayon pool): `None` where threads
/// could not be started.
type PerCount<T> = OnceLock<Vec<OnceLock<Option<T>>>>;

/// The entry for `helpers` helper threads, started by `start` on first use.
fn per_count<T>(
    all: &'static PerCount<T>,
    helpers: usize,
    start: impl FnOnce() -> Option<T>,
) -> Option<&'static T> {
    let slots = all.get_or_init(|| (0..MAX_THREADS).map(|_| OnceLock::new()).collect());
    slots[helpers].get_or_init(start).as_ref()
}

/// The rayon pool of `helpers` threads that joins a caller whose [`Team`] is busy.
fn pool(helpers: usize) -> Option<&'static ThreadPool> {
    static POOLS: PerCount<ThreadPool> = OnceLock::new();
    per_count(&POOLS, helpers, || {
        rayon::ThreadPoolBuilder::new()
            .num_threads(helpers)
            .thread_name(move |i| format!("kerntune-{}t-spare-{}", helpers + 1, i + 1))
            .build()
            .ok()
    })
}

/// The team of `helpers` threads.
fn team(helpers: usize) -> Option<&'static Team> {
    static TEAMS: PerCount<Team> = OnceLock::new();
    per_count(&TEAMS, helpers, || Team::new(helpers).ok())
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
///
/// The calling thread is worker 0 and a [`Team`] of `threads - 1` spinning helpers the others
/// (see [`super::team`] for why not a rayon pool); where that team is busy (two callers at
/// once, or a task that itself runs a parallel call), a rayon pool of helpers joins the
/// caller instead. Each worker takes the tasks of its own contiguous range in order, then
/// helps with the others' ranges: one shared counter dealing tasks out in turn made paged
/// decode 3–7% slower (alternating builds, 32 sequences × 4096 tokens, two threads), where
/// contiguous ranges matched rayon's splitting.
pub fn for_each_task(threads: usize, tasks: usize, task: impl Fn(usize, usize) + Sync + Send) {
    let threads = threads.clamp(1, MAX_THREADS).min(tasks.max(1));
    if threads == 1 {
        // No counters on the single-thread path: it serves the smallest calls.
        return (0..tasks).for_each(|i| task(i, 0));
    }
    let ranges = Ranges::new(threads.min(RANGES), tasks);
    let run = |worker: usize| {
        let first = worker % ranges.count;
        for r in (first..ranges.count).chain(0..first) {
            while let Some(i) = ranges.take(r) {
                task(i, worker);
            }
        }
    };
    if let Some(team) = team(threads - 1) {
        if let Some(claim) = team.claim() {
            return team.run(&claim, &run);
        }
    }
    let Some(pool) = pool(threads - 1) else {
        // No threads could be started: every task on the caller, as worker 0.
        return run(0);
    };
    pool.in_place_scope(|scope| {
        let run = &run;
        for worker in 1..threads {
            scope.spawn(move |_| run(worker));
        }
        run(0);
    });
}

/// Most contiguous ranges a call's tasks are cut into (workers beyond share them).
const RANGES: usize = 64;

/// The next untaken task of each range, a cache line each so owners do not contend.
struct Ranges {
    next: [Line; RANGES],
    count: usize,
    tasks: usize,
}

#[repr(align(64))]
struct Line(AtomicUsize);

impl Ranges {
    fn new(count: usize, tasks: usize) -> Ranges {
        Ranges {
            next: std::array::from_fn(|r| Line(AtomicUsize::new(r * tasks / count))),
            count,
            tasks,
        }
    }

    /// Claims the next task of range `r`, if one is left.
    fn take(&self, r: usize) -> Option<usize> {
        let end = (r + 1) * self.tasks / self.count;
        // A claim past the end leaves the counter past it, which every later claim sees too.
        let i = self.next[r].0.fetch_add(1, Ordering::Relaxed);
        (i < end).then_some(i)
    }
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

    /// Runs `tasks` tasks on `threads` threads and checks that each ran exactly once, on a
    /// worker index below `threads` that no other running task held at the same moment.
    fn check_tasks(threads: usize, tasks: usize) {
        use std::sync::atomic::AtomicBool;
        let ran: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
        let busy: Vec<AtomicBool> = (0..threads.max(1))
            .map(|_| AtomicBool::new(false))
            .collect();
        for_each_task(threads, tasks, |i, worker| {
            assert!(worker < threads.max(1), "worker {worker} of {threads}");
            assert!(
                !busy[worker].swap(true, Ordering::SeqCst),
                "worker {worker} twice"
            );
            // Long enough for the other workers to overlap with this task.
            let spin = std::time::Instant::now();
            while spin.elapsed() < std::time::Duration::from_micros(20) {}
            ran[i].fetch_add(1, Ordering::Relaxed);
            busy[worker].store(false, Ordering::SeqCst);
        });
        for (i, r) in ran.iter().enumerate() {
            assert_eq!(
                r.load(Ordering::Relaxed),
                1,
                "task {i} of {tasks} on {threads} threads"
            );
        }
    }

    #[test]
    fn every_task_runs_once_on_a_worker_of_its_own() {
        for threads in [1, 2, 3, 5, 8, 70] {
            for tasks in [0, 1, 2, 3, 7, 64, 65, 200] {
                check_tasks(threads, tasks);
            }
        }
    }

    /// Callers on several threads at once share a team: one runs on it, the others on the
    /// spare pool, and all finish with every task run once.
    #[test]
    fn concurrent_callers_each_run_all_their_tasks() {
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for tasks in [2, 9, 33] {
                        check_tasks(2, tasks);
                        check_tasks(3, tasks);
                    }
                });
            }
        });
    }

    /// A task that itself runs a parallel call on the same thread count finds the team busy
    /// and uses the spare pool instead of waiting for itself.
    #[test]
    fn a_nested_call_does_not_deadlock() {
        let inner = AtomicUsize::new(0);
        for_each_task(2, 4, |_, _| {
            for_each_task(2, 5, |_, _| {
                inner.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(inner.load(Ordering::Relaxed), 20);
    }

    /// A panic in a task reaches the caller once every worker has stopped, and the team runs
    /// the next call as usual, after its helpers have parked.
    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_team_recovers() {
        for panicking in [0, 1, 5] {
            let caught = std::panic::catch_unwind(|| {
                for_each_task(4, 8, |i, _| {
                    if i == panicking {
                        panic!("task {i} failed");
                    }
                });
            });
            let payload = caught.expect_err("the panic propagates");
            let text = payload
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default();
            assert_eq!(text, format!("task {panicking} failed"));
            check_tasks(4, 8);
        }
        // Past the spin window the helpers park; a call must unpark them.
        std::thread::sleep(super::super::team::spin_window() + std::time::Duration::from_millis(5));
        check_tasks(4, 8);
    }
}
