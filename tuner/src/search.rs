//! Search strategies: which candidate to measure next, within a budget.
//!
//! - `exhaustive`: every candidate, default first.
//! - `random`: candidates in a seeded random order until the budget ends.
//! - `local`: hill climbing over the parameter neighbourhood (configs that differ in one
//!   field), starting from the default and the heuristic, moving to the best neighbour while it
//!   improves, restarting from an unmeasured random candidate when stuck. It finds a near-best
//!   config in a fraction of the measurements when the space is smooth along each parameter,
//!   which tile-size spaces mostly are.

use std::collections::HashMap;

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
fn fields(c: &Config) -> Vec<(String, String)> {
    match serde_json::to_value(c) {
        Ok(serde_json::Value::Object(map)) => {
            map.into_iter().map(|(k, v)| (k, v.to_string())).collect()
        }
        _ => Vec::new(),
    }
}

fn local(candidates: &[Config], seed: u64, eval: &mut Eval<'_>) {
    let fs: Vec<Vec<(String, String)>> = candidates.iter().map(fields).collect();
    let neighbours = |i: usize| -> Vec<usize> {
        (0..candidates.len())
            .filter(|&j| {
                j != i
                    && fs[i].len() == fs[j].len()
                    && fs[i].iter().zip(&fs[j]).filter(|(a, b)| a != b).count() == 1
            })
            .collect()
    };
    let mut seen: HashMap<usize, Option<f64>> = HashMap::new();
    let mut measure =
        |i: usize, seen: &mut HashMap<usize, Option<f64>>| -> Result<Option<f64>, ()> {
            if let Some(&t) = seen.get(&i) {
                return Ok(t);
            }
            let t = eval(&candidates[i])?;
            seen.insert(i, t);
            Ok(t)
        };
    // The default and the heuristic are measured first; the climb starts from the faster,
    // since they may differ in many fields (a streaming and a packed GEMM are not neighbours).
    let mut first: Option<(usize, f64)> = None;
    for i in 0..candidates.len().min(2) {
        let Ok(t) = measure(i, &mut seen) else { return };
        let t = t.unwrap_or(f64::INFINITY);
        if first.is_none_or(|(_, b)| t < b) {
            first = Some((i, t));
        }
    }
    let order = shuffled(candidates.len(), seed);
    let mut starts = first.map(|f| f.0).into_iter().chain(order);
    let mut best_overall = f64::INFINITY;
    let mut stale_restarts = 0;
    let mut first_climb = true;
    while stale_restarts < 3 {
        let Some(start) = starts.find(|i| first_climb || !seen.contains_key(i)) else {
            return;
        };
        first_climb = false;
        let Ok(t) = measure(start, &mut seen) else {
            return;
        };
        let (mut at, mut t_at) = (start, t.unwrap_or(f64::INFINITY));
        loop {
            let mut best = (at, t_at);
            for j in neighbours(at) {
                match measure(j, &mut seen) {
                    Err(()) => return,
                    Ok(Some(t)) if t < best.1 => best = (j, t),
                    Ok(_) => {}
                }
            }
            if best.0 == at {
                break;
            }
            (at, t_at) = best;
        }
        if t_at < best_overall * 0.995 {
            best_overall = t_at;
            stale_restarts = 0;
        } else {
            stale_restarts += 1;
        }
    }
}
