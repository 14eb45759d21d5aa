//! Sharing a run's total budget among its problems.
//!
//! `--budget` is what one problem's search may take and `--total-budget` what the run may.
//! When the problems left cannot all have their full search in the time left, a run that
//! spends the full search on each until the total is gone leaves the last problems with no
//! winner at all, and a server falls back to its heuristic for those shapes: the main job on
//! a 2-core host left 8 of 73 that way. Instead each search gets an equal share of the time
//! left, less what a problem costs besides its search (drawing operands, the reference, the
//! final round), as the problems just finished measured it: problems run cheapest first, so
//! the recent ones tell best what the next will cost.
//!
//! A paced search gets at least a quarter of `--budget`, and within `--budget` it goes on
//! past its share until it has measured [`MIN_MEASURED`] candidates: a search that measured
//! the default alone would still be stored as tuned, with the default as its winner, and
//! every later run would skip it (on a 2-core host a prefill GEMM's call takes 0.2-0.5 s, and
//! a share under a second measured nothing else). Where even that does not fit, the total
//! budget stops the run and the rest waits for the next, as without pacing.

use std::time::Duration;

/// The smallest share of `--budget` a paced search gets.
const FLOOR: u32 = 4;

/// Candidates a paced search measures, the default among them, before its share of the time
/// may stop it (`--budget` still does).
pub const MIN_MEASURED: usize = 4;

/// Whether a search `elapsed` into it, with `measured` candidates measured, is over: past
/// `budget`, or past its `paced` share with [`MIN_MEASURED`] candidates.
pub fn search_over(elapsed: Duration, measured: usize, paced: Duration, budget: Duration) -> bool {
    elapsed >= budget || (elapsed >= paced && measured >= MIN_MEASURED)
}

/// The budgets of a run: what is left of them and what problems have cost besides their
/// searches.
#[derive(Debug, Clone)]
pub struct Pace {
    total: Duration,
    search: Duration,
    /// Problems still to tune, the next one included.
    left: usize,
    /// What finished problems took beyond their search budget, the recent ones weighted
    /// most (halved with each problem after).
    overhead: Option<Duration>,
}

impl Pace {
    /// A run of `total`, with searches of up to `search`, over `pending` problems to tune.
    pub fn new(total: Duration, search: Duration, pending: usize) -> Pace {
        Pace {
            total,
            search,
            left: pending,
            overhead: None,
        }
    }

    /// The search budget of the next problem, `elapsed` into the run.
    pub fn search_budget(&self, elapsed: Duration) -> Duration {
        let share = self.total.saturating_sub(elapsed) / self.left.max(1) as u32;
        share
            .saturating_sub(self.overhead.unwrap_or_default())
            .clamp(self.search / FLOOR, self.search)
    }

    /// A problem finished: it took `took`, its search `searched` of the `budget` it had.
    /// What a search took beyond its budget (the candidate in flight when the time ran out,
    /// the candidates up to [`MIN_MEASURED`]) counts as overhead: it is what the next problem
    /// will cost beyond its share too.
    pub fn finished(&mut self, took: Duration, searched: Duration, budget: Duration) {
        self.left = self.left.saturating_sub(1);
        let overhead = took.saturating_sub(searched.min(budget));
        self.overhead = Some(self.overhead.map_or(overhead, |o| (o + overhead) / 2));
    }

    /// A problem counted as pending was found tuned when its turn came (another run tuned it
    /// meanwhile): the others share its time.
    pub fn skipped(&mut self) {
        self.left = self.left.saturating_sub(1);
    }

    /// A problem counted out by [`skipped`](Self::skipped) is this run's to tune after all
    /// (another run that held it stopped without it).
    pub fn resumed(&mut self) {
        self.left += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn a_total_budget_with_room_leaves_the_search_budget_alone() {
        let pace = Pace::new(s(240.0), s(2.0), 73);
        assert_eq!(pace.search_budget(Duration::ZERO), s(2.0));
        assert_eq!(pace.search_budget(s(90.0)), s(2.0));
    }

    #[test]
    fn the_time_left_is_shared_less_the_recent_overhead() {
        let mut pace = Pace::new(s(100.0), s(5.0), 21);
        // 100 s for 21 problems: 4.76 s each, nothing known of the overhead yet.
        assert_eq!(pace.search_budget(Duration::ZERO), s(100.0) / 21);
        // A problem took 6 s of which its search 4 s: 2 s overhead.
        pace.finished(s(6.0), s(4.0), s(4.5));
        assert_eq!(pace.search_budget(s(6.0)), s(94.0) / 20 - s(2.0));
        // A search that overran its 3 s budget by a candidate: the overrun is overhead too
        // (4 s), weighted as much as all the problems before it.
        pace.finished(s(7.0), s(3.5), s(3.0));
        assert_eq!(pace.search_budget(s(13.0)), s(87.0) / 19 - s(3.0));
        pace.finished(s(1.5), s(1.0), s(3.0));
        assert_eq!(pace.search_budget(s(14.5)), s(85.5) / 18 - s(1.75));
    }

    #[test]
    fn a_paced_search_goes_on_to_its_fourth_candidate_within_the_full_budget() {
        let (paced, budget) = (s(0.5), s(2.0));
        assert!(!search_over(s(0.4), 1, paced, budget));
        // Past its share with the default alone measured: on.
        assert!(!search_over(s(0.6), 1, paced, budget));
        assert!(!search_over(s(1.9), MIN_MEASURED - 1, paced, budget));
        assert!(search_over(s(0.6), MIN_MEASURED, paced, budget));
        // --budget stops it, however few it measured.
        assert!(search_over(s(2.0), 1, paced, budget));
        // Not paced: the budget alone.
        assert!(!search_over(s(1.9), 10, budget, budget));
        assert!(search_over(s(2.0), 10, budget, budget));
    }

    #[test]
    fn a_search_never_shrinks_below_a_quarter_of_its_budget() {
        let mut pace = Pace::new(s(10.0), s(2.0), 40);
        assert_eq!(pace.search_budget(Duration::ZERO), s(0.5));
        pace.finished(s(5.0), s(0.5), s(0.5));
        assert_eq!(pace.search_budget(s(5.0)), s(0.5));
        // Past the total budget (the run stops there; the floor still holds).
        assert_eq!(pace.search_budget(s(11.0)), s(0.5));
    }

    #[test]
    fn problems_tuned_meanwhile_by_another_run_leave_their_time_to_the_rest() {
        let mut pace = Pace::new(s(12.0), s(5.0), 6);
        assert_eq!(pace.search_budget(Duration::ZERO), s(2.0));
        pace.skipped();
        pace.skipped();
        pace.skipped();
        assert_eq!(pace.search_budget(Duration::ZERO), s(4.0));
        // More skips than pending never divides by zero.
        for _ in 0..5 {
            pace.skipped();
        }
        assert_eq!(pace.search_budget(Duration::ZERO), s(5.0));
    }
}
