//! Search strategies: which candidate to measure next, within a budget.
//!
//! - `exhaustive`: every candidate, default first.
//! - `random`: candidates in a seeded random order until the budget ends.
//! - `local`: best-first search over the parameter neighbourhood (configs that differ in one
//!   field), starting from the default and the heuristic: the fastest measured config within
//!   a few percent of the best has its neighbours measured next; with none left, a random
//!   unmeasured candidate starts a new region. It finds a near-best config in a fraction of
//!   the measurements when the space is smooth along each parameter, which tile-size spaces
//!   mostly are.

use std::collections::{BTreeMap, HashMap};

use kerntune_kernels::Config;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    Exhaustive,
    Random,
    Local,
}

/// Measures a config and returns its median time (None if it failed), or `Err(())` to stop
/// the search (budget spent or interrupted).
pub type Eval<'a> = dyn FnMut(&Config) -> Result<Option<f64>, ()> + 'a;

/// Runs `strategy` over `candidates` (the default and heuristic first among them).
pub fn search(strategy: Strategy, candidates: &[Config], seed: u64, eval: &mut Eval<'_>) {
    match strategy {
        Strategy::Exhaustive => {
            for c in candidates {
                if eval(c).is_err() {
                    return;
                }
            }
        }
        Strategy::Random => {
            for &i in &shuffled(candidates.len(), seed) {
                if eval(&candidates[i]).is_err() {
                    return;
                }
            }
        }
        Strategy::Local => local(candidates, seed, eval),
    }
}

fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = seed | 1;
    for i in (1..n).rev() {
        // xorshift64: a seeded shuffle needs nothing more.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

/// Field values of a config, for finding neighbours.
fn fields(c: &Config) -> BTreeMap<String, String> {
    match serde_json::to_value(c) {
        Ok(serde_json::Value::Object(map)) => {
            map.into_iter().map(|(k, v)| (k, v.to_string())).collect()
        }
        _ => BTreeMap::new(),
    }
}

/// Fields in which two configs differ, a field one of them omits counting once: a config
/// writes some fields only where they are not their default (`"prefetch": false`, `"amx":
/// true`), and such a config is still a neighbour of its twin without it.
fn differing(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> usize {
    let changed = a.iter().filter(|(k, v)| b.get(*k) != Some(*v)).count();
    changed + b.keys().filter(|k| !a.contains_key(*k)).count()
}

/// Candidates that differ from candidate `i` in exactly one field, or, where none does, the
/// nearest ones: a default or heuristic config need not lie on the space's grid (the untuned
/// stream kernel on an AMX host is labelled with the host's ISA and four rows' blocking, the
/// swept ones with the kernel's level and their own rows), and must still lead somewhere.
fn neighbours(fs: &[BTreeMap<String, String>], i: usize) -> Vec<usize> {
    let distance: Vec<usize> = fs.iter().map(|f| differing(&fs[i], f)).collect();
    let nearest = (0..fs.len())
        .filter(|&j| j != i)
        .map(|j| distance[j])
        .min()
        .unwrap_or(1)
        .max(1);
    (0..fs.len())
        .filter(|&j| j != i && distance[j] == nearest)
        .collect()
}

/// Measured configs within this fraction of the best so far are expanded too: timings a few
/// percent apart are often the same speed measured twice, and a climb that followed only the
/// single fastest stopped on such a plateau short of the winner one step off it.
const NEAR: f64 = 0.03;
/// Expansions (and restarts) in a row that do not beat the best by more than this end the
/// search.
const GAIN: f64 = 0.005;
const PATIENCE: usize = 8;

/// Best-first local search: the fastest measured config whose neighbours are not all measured
/// yet is expanded (its neighbours measured), as long as it is within [`NEAR`] of the best;
/// with none left, a hill climb starts from an unmeasured random candidate. It ends after
/// [`PATIENCE`] expansions and climbs in a row without a gain of [`GAIN`], or when every
/// candidate is measured. On a smooth space this is hill climbing from the default and the
/// heuristic; on a plateau it walks the plateau's near-equal configs instead of stopping.
fn local(candidates: &[Config], seed: u64, eval: &mut Eval<'_>) {
    let mut s = Local {
        candidates,
        fs: candidates.iter().map(fields).collect(),
        seen: HashMap::new(),
        expanded: vec![false; candidates.len()],
        best: f64::INFINITY,
        eval,
    };
    // The default and the heuristic first: they may differ in many fields (a streaming and a
    // packed GEMM are not neighbours), so both start the search.
    for i in 0..candidates.len().min(2) {
        if s.measure(i).is_err() {
            return;
        }
    }
    let mut restarts = shuffled(candidates.len(), seed).into_iter();
    let mut stale = 0;
    while stale < PATIENCE && s.seen.len() < candidates.len() {
        let before = s.best;
        let step = match s.nearest_unexpanded() {
            Some(at) => s.expand(at).map(|_| ()),
            None => match restarts.find(|i| !s.seen.contains_key(i)) {
                Some(start) => s.climb(start),
                None => return,
            },
        };
        if step.is_err() {
            return;
        }
        if s.best < before * (1.0 - GAIN) {
            stale = 0;
        } else {
            stale += 1;
        }
    }
}

/// The state of one local search.
struct Local<'a, 'e> {
    candidates: &'a [Config],
    fs: Vec<BTreeMap<String, String>>,
    /// Measured candidates and their times (infinite where one failed).
    seen: HashMap<usize, f64>,
    /// Candidates whose neighbours have all been measured.
    expanded: Vec<bool>,
    best: f64,
    eval: &'a mut Eval<'e>,
}

impl Local<'_, '_> {
    fn measure(&mut self, i: usize) -> Result<f64, ()> {
        if let Some(&t) = self.seen.get(&i) {
            return Ok(t);
        }
        let t = (self.eval)(&self.candidates[i])?.unwrap_or(f64::INFINITY);
        self.seen.insert(i, t);
        self.best = self.best.min(t);
        Ok(t)
    }

    /// Measures the neighbours of `at`; returns the fastest of them.
    fn expand(&mut self, at: usize) -> Result<Option<(usize, f64)>, ()> {
        self.expanded[at] = true;
        let mut fastest: Option<(usize, f64)> = None;
        for j in neighbours(&self.fs, at) {
            let t = self.measure(j)?;
            if fastest.is_none_or(|(_, f)| t < f) {
                fastest = Some((j, t));
            }
        }
        Ok(fastest)
    }

    /// The fastest measured, unexpanded candidate within [`NEAR`] of the best (ties to the
    /// lower index, so one seed always searches the same way).
    fn nearest_unexpanded(&self) -> Option<usize> {
        let limit = self.best * (1.0 + NEAR);
        self.seen
            .iter()
            .filter(|&(&i, &t)| !self.expanded[i] && t.is_finite() && t <= limit)
            .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(b.0)))
            .map(|(&i, _)| i)
    }

    /// Hill climbing from `start` to a local optimum, each step to the fastest neighbour.
    fn climb(&mut self, start: usize) -> Result<(), ()> {
        let mut at = (start, self.measure(start)?);
        while at.1.is_finite() {
            match self.expand(at.0)? {
                Some(next) if next.1 < at.1 => at = next,
                _ => break,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Config {
        serde_json::from_str(json).unwrap()
    }

    /// A field written only when it is not its default still makes one step: the stream
    /// kernel with and without its prefetch are neighbours, as are the paged kernels with and
    /// without AMX tiles; configs two fields apart are not.
    #[test]
    fn a_field_omitted_at_its_default_is_one_step() {
        let stream = r#"{"family":"gemm","variant":"stream","isa":"avx512","mr":1,"nr":16,"mc":1,"kc":1024,"nc":64,"split":"n","threads":2"#;
        let on = config(&format!("{stream}}}"));
        let off = config(&format!(r#"{stream},"prefetch":false}}"#));
        let off_wider =
            config(&format!(r#"{stream},"prefetch":false}}"#).replace(r#""nc":64"#, r#""nc":256"#));
        let paged =
            r#"{"family":"paged","isa":"avx512-amx","partition":0,"group_heads":true,"threads":2"#;
        let plain = config(&format!("{paged}}}"));
        let amx = config(&format!(r#"{paged},"amx":true}}"#));
        let fs: Vec<_> = [&on, &off, &off_wider, &plain, &amx]
            .into_iter()
            .map(fields)
            .collect();
        assert_eq!(neighbours(&fs, 0), vec![1]);
        assert_eq!(neighbours(&fs, 1), vec![0, 2]);
        assert_eq!(neighbours(&fs, 2), vec![1]);
        assert_eq!(neighbours(&fs, 3), vec![4]);
        assert_eq!(neighbours(&fs, 4), vec![3]);
    }

    /// Local search climbs onto a winner that differs from its neighbour only in such a
    /// field, without waiting for a random restart to land on it.
    #[test]
    fn local_search_steps_onto_an_omitted_field() {
        let stream = r#"{"family":"gemm","variant":"stream","isa":"avx512","mr":1,"nr":16,"mc":1,"kc":1024,"split":"n","threads":2"#;
        let mut candidates: Vec<Config> = [64, 256, 1024]
            .iter()
            .map(|nc| config(&format!(r#"{stream},"nc":{nc}}}"#)))
            .collect();
        for nc in [64, 256, 1024] {
            candidates.push(config(&format!(r#"{stream},"nc":{nc},"prefetch":false}}"#)));
        }
        // Wider is faster, no prefetch faster still: the climb from the faster of the first
        // two (nc 256) goes to nc 1024, whose one-step neighbour without the prefetch wins.
        let time = |c: &Config| match c {
            Config::Gemm(g) => 10.0 - g.nc as f64 / 512.0 - if g.prefetch { 0.0 } else { 1.0 },
            _ => unreachable!(),
        };
        let mut order = Vec::new();
        search(Strategy::Local, &candidates, 7, &mut |c: &Config| {
            order.push(*c);
            Ok(Some(time(c)))
        });
        let winner = order.iter().position(|c| c == &candidates[5]);
        assert_eq!(winner, Some(4), "measured in order: {order:?}");
    }

    /// A heuristic off the space's grid (the host's ISA label and a blocking no swept config
    /// has, two fields from its twin) still leads to its nearest configs: the winner, one
    /// step from the twin, is measured within the first few on every seed.
    #[test]
    fn an_off_grid_start_moves_to_its_nearest_configs() {
        let stream = r#"{"family":"gemm","variant":"stream-dpbf16","nr":32,"kc":2048,"split":"n","threads":2"#;
        let mut candidates = vec![config(&format!(
            r#"{stream},"isa":"avx512","mr":4,"mc":4,"nc":2048}}"#
        ))];
        // The heuristic: the host's label, four rows' blocking on one row.
        candidates.push(config(&format!(
            r#"{stream},"isa":"avx512-amx","mr":1,"mc":4,"nc":256}}"#
        )));
        for rows in [1, 2, 4] {
            for nc in [64, 256, 1024, 2048] {
                candidates.push(config(&format!(
                    r#"{stream},"isa":"avx512","mr":{rows},"mc":{rows},"nc":{nc}}}"#
                )));
            }
        }
        // Narrower is faster for one row, and everything else is slow.
        let time = |c: &Config| match c {
            Config::Gemm(g) if g.mr == 1 && g.mc == 1 => 5.0 + g.nc as f64 / 1024.0,
            Config::Gemm(g) if g.mr == 1 => 6.0,
            _ => 9.0,
        };
        let winner = config(&format!(
            r#"{stream},"isa":"avx512","mr":1,"mc":1,"nc":64}}"#
        ));
        for seed in 0..20 {
            let mut order = Vec::new();
            search(Strategy::Local, &candidates, seed, &mut |c: &Config| {
                order.push(*c);
                Ok(Some(time(c)))
            });
            let at = order.iter().position(|c| c == &winner);
            assert!(
                at.is_some_and(|at| at < 8),
                "seed {seed}: the winner measured at {at:?} of {}",
                order.len()
            );
        }
    }

    /// A winner two steps from the start, behind a plateau of configs a fraction of a percent
    /// slower than the start (the same speed, measured with noise): the search walks the
    /// plateau instead of stopping at the start, and measures the winner within the first
    /// half of the space, on every seed.
    #[test]
    fn local_search_walks_a_plateau_to_a_winner_behind_it() {
        let stream = r#"{"family":"gemm","variant":"packed","isa":"avx512","mr":8,"nr":32,"mc":64,"split":"n","threads":2"#;
        let depths = [64, 128, 256, 512, 768, 1024];
        let widths = [32, 64, 128, 256, 512, 1024];
        let mut candidates = Vec::new();
        for kc in depths {
            for nc in widths {
                candidates.push(config(&format!(r#"{stream},"kc":{kc},"nc":{nc}}}"#)));
            }
        }
        // kc 64, nc 32 is the start (the default, index 0); the column nc = 32 is the
        // plateau, kc = 1024 in it the fastest of the plateau, and kc = 1024, nc = 1024 the
        // winner; everything else is slow.
        let time = |c: &Config| match c {
            Config::Gemm(g) => match (g.kc, g.nc) {
                (64, 32) => 10.0,
                (1024, 32) => 10.02,
                (kc, 32) => 10.05 + kc as f64 * 1e-5,
                (1024, 1024) => 7.0,
                _ => 12.0,
            },
            _ => unreachable!(),
        };
        let winner = &candidates[candidates.len() - 1];
        for seed in 0..20 {
            let mut order = Vec::new();
            search(Strategy::Local, &candidates, seed, &mut |c: &Config| {
                order.push(*c);
                Ok(Some(time(c)))
            });
            let at = order.iter().position(|c| c == winner);
            assert!(
                at.is_some_and(|at| at < candidates.len() / 2),
                "seed {seed}: the winner measured at {at:?} of {}",
                order.len()
            );
        }
    }
}
