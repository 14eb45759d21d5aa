//! Helper threads that join the calling thread for one parallel call at a time and spin, for
//! a while, between calls.
//!
//! Written here rather than taken from rayon: rayon parks an idle worker within microseconds
//! and blocks a caller from outside the pool on a condition variable, and it offers no knob
//! for either. On the 2-core Xeon guest this was measured on, a thread woken from a futex
//! starts 50–70 µs later, so a two-thread call paid that once for the helper to start and
//! again for the caller to learn it was done: about 10% of a 0.6 ms decode GEMV, and the whole
//! gap to OpenBLAS, whose threads spin between calls (as OpenMP runtimes do by default).
//! Here helpers spin for [`spin_window`] after each call before they park, and the caller
//! spins until its helpers finish.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long a helper spins for the next call before it parks: `KERNTUNE_SPIN_US`
/// microseconds, else 1 ms. A server that shares its cores with other work may set it to 0
/// (park at once, as rayon does); spinning never delays a call, it only burns idle time.
pub fn spin_window() -> Duration {
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| {
        let us = crate::env::spin_us().ok().flatten().unwrap_or(1000);
        Duration::from_micros(us)
    })
}

/// The job of the current call, as helpers see it: `run(worker)` for workers `1..=helpers`.
type Job = *const (dyn Fn(usize) + Sync);

/// What the caller and its helpers share.
struct Shared {
    /// Bumped once per call, after `job` is written; helpers wait for it to move.
    generation: AtomicUsize,
    /// Written by the caller before each bump, read by helpers after seeing it.
    job: UnsafeCell<Option<Job>>,
    /// Helpers finished with the current call.
    done: AtomicUsize,
    /// The first panic a helper caught in the current call.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// How long helpers spin between calls before they park.
    window: Duration,
}

// SAFETY: `job` is written only by the caller holding the team's lock while every helper is
// between calls (`done` counted them all in), and read by helpers only after the `generation`
// bump that publishes it (release/acquire); the closure it points to is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// One helper thread: its handle for unparking, and whether it is parked (or about to be).
struct Helper {
    thread: Thread,
    sleeping: Arc<AtomicBool>,
}

/// A caller's helpers; one team per thread count, used by one call at a time.
pub struct Team {
    shared: Arc<Shared>,
    helpers: Vec<Helper>,
    lock: Mutex<()>,
}

impl Team {
    /// Starts `helpers` threads, named after the thread count they serve.
    pub fn new(helpers: usize) -> std::io::Result<Team> {
        Team::spinning_for(helpers, spin_window())
    }

    /// A team whose helpers spin for `window` between calls.
    fn spinning_for(helpers: usize, window: Duration) -> std::io::Result<Team> {
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            window,
        });
        let mut started = Vec::with_capacity(helpers);
        for worker in 1..=helpers {
            let sleeping = Arc::new(AtomicBool::new(false));
            let (s, z) = (shared.clone(), sleeping.clone());
            let handle = thread::Builder::new()
                .name(format!("kerntune-{}t-{worker}", helpers + 1))
                .spawn(move || helper_loop(&s, &z, worker))?;
            started.push(Helper {
                thread: handle.thread().clone(),
                sleeping,
            });
        }
        Ok(Team {
            shared,
            helpers: started,
            lock: Mutex::new(()),
        })
    }

    /// The team for this call, or `None` while another call holds it (a task that itself runs
    /// a parallel call, or two threads calling at once): the caller then takes another way.
    pub fn claim(&self) -> Option<MutexGuard<'_, ()>> {
        match self.lock.try_lock() {
            Ok(guard) => Some(guard),
            // A poisoned lock only means an earlier call panicked; `run` left the team idle.
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Runs `job(0)` on the calling thread and `job(w)` on helper `w` for `w in 1..=helpers`,
    /// and returns when all have returned; a panic in any of them is resumed here after all
    /// have finished, so no helper outlives the borrow of `job`.
    pub fn run(&self, _claim: &MutexGuard<'_, ()>, job: &(dyn Fn(usize) + Sync)) {
        let shared = &*self.shared;
        // SAFETY: the claim excludes other callers and every helper finished the previous
        // call (the wait below), so nothing reads `job` now. The lifetime is erased because
        // helpers are `'static`; this function does not return (or unwind) before they are
        // done with it.
        unsafe {
            let erased: Job = std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Job>(job);
            *shared.job.get() = Some(erased);
        }
        shared.done.store(0, Ordering::Relaxed);
        shared.generation.fetch_add(1, Ordering::SeqCst);
        for h in &self.helpers {
            if h.sleeping.swap(false, Ordering::SeqCst) {
                h.thread.unpark();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| job(0)));
        let mut spins = 0u32;
        while shared.done.load(Ordering::Acquire) < self.helpers.len() {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                // Where helpers outnumber the cores, they need this one.
                thread::yield_now();
            }
            std::hint::spin_loop();
        }
        let theirs = shared
            .panic
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        if let Some(payload) = theirs {
            resume_unwind(payload);
        }
    }
}

/// A helper's life: wait for a call, run its share, count itself done, again.
fn helper_loop(shared: &Shared, sleeping: &AtomicBool, worker: usize) {
    let mut seen = 0;
    loop {
        seen = wait_for_call(shared, sleeping, seen);
        // SAFETY: the generation bump just seen published `job`, which stays valid until this
        // helper counts itself done (the caller waits for that).
        let job = unsafe { (*shared.job.get()).expect("a call publishes its job") };
        // SAFETY: as above.
        let result = catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(worker) }));
        if let Err(payload) = result {
            let mut slot = shared.panic.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(payload);
        }
        shared.done.fetch_add(1, Ordering::Release);
    }
}

/// Spins until the generation moves past `seen` or the spin window closes, then parks until
/// it does; returns the new generation.
fn wait_for_call(shared: &Shared, sleeping: &AtomicBool, seen: usize) -> usize {
    let start = Instant::now();
    let window = shared.window;
    let mut spins = 0u32;
    loop {
        let generation = shared.generation.load(Ordering::Acquire);
        if generation != seen {
            return generation;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) {
            if start.elapsed() >= window {
                break;
            }
            // Lets a thread waiting for this core run (a test harness's other threads).
            thread::yield_now();
        }
        std::hint::spin_loop();
    }
    // Parking: announce it, then look once more, so a caller that bumped the generation
    // before seeing the announcement is not missed (both sides use SeqCst). The announcement
    // is renewed after every wake: the caller of the call this helper just finished may still
    // be going through its helpers, clearing each announcement it finds and unparking, and
    // one it clears now belongs to the next call's wait. That wake returns here with the
    // generation unchanged; without a new announcement the helper would sleep through the
    // next call, its caller spinning for it forever (seen under qemu's aarch64 emulation,
    // where a caller falls that far behind its helpers; a descheduled caller can anywhere).
    //
    // The announcement is a swap, not a store: the look after it must not be answered before
    // the announcement is visible, and a read-modify-write orders the two on every host. A
    // SeqCst store then load does too on real hardware, but qemu's aarch64 emulation on x86-64
    // runs `stlr` then `ldar` as a plain store and load with no fence between, which x86 may
    // reorder: the helper then read the old generation while its caller missed the
    // announcement, and slept through the call (a kernel test hung in CI; a litmus test of the
    // two orders under qemu lost both writes 62 times in a million rounds with the store, none
    // with the swap). On x86-64 a SeqCst store already compiles to this `xchg`.
    loop {
        sleeping.swap(true, Ordering::SeqCst);
        let generation = shared.generation.load(Ordering::SeqCst);
        if generation != seen {
            sleeping.store(false, Ordering::Relaxed);
            return generation;
        }
        thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Helpers that park after every call (a spin window of zero, as `KERNTUNE_SPIN_US=0` sets)
    /// race each call's caller between their announcement and its look at the generation:
    /// every call must still be answered. A lost wakeup would leave the caller spinning, so
    /// the calls run on a thread of their own and a stall fails the test instead of hanging it.
    /// Under qemu's aarch64 emulation a store for the announcement lost a wakeup within 15,000
    /// to 300,000 calls in each of five runs; the calls go on for 4 s (about 700,000 there,
    /// fewer natively, where each call parks and wakes through real system calls).
    #[test]
    fn helpers_that_park_after_every_call_wake_for_the_next() {
        const CALLS: usize = 1_000_000;
        let (sent, answered) = mpsc::channel();
        thread::spawn(move || {
            let team = Team::spinning_for(1, Duration::ZERO).expect("a helper thread starts");
            let ran = AtomicUsize::new(0);
            let start = Instant::now();
            for call in 1..=CALLS {
                // Calls that start at every moment of the helper's way to parking.
                for _ in 0..call % 2048 {
                    std::hint::spin_loop();
                }
                let claim = team.claim().expect("nothing else holds the team");
                team.run(&claim, &|_| {
                    ran.fetch_add(1, Ordering::Relaxed);
                });
                assert_eq!(ran.load(Ordering::Relaxed), 2 * call);
                let last = call == CALLS || start.elapsed() > Duration::from_secs(4);
                if sent.send((call, last)).is_err() || last {
                    return;
                }
            }
        });
        let mut last = 0;
        loop {
            match answered.recv_timeout(Duration::from_secs(30)) {
                Ok((_, true)) => break,
                Ok((call, false)) => last = call,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "call {} was not answered in 30 s: a helper slept through it",
                    last + 1
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("the calls stopped after call {last} (their panic is above)")
                }
            }
        }
    }
}
