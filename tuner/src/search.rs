//! Search strategies: which candidate to measure next, within a budget.
//!
//! - `exhaustive`: every candidate, default first.
//! - `random`: candidates in a seeded random order until the budget ends.
//! - `local`: hill climbing over the parameter neighbourhood (configs that differ in one
//!   field), starting from the default and the heuristic, moving to the best neighbour while it
//!   improves, restarting from an unmeasured random candidate when stuck. It finds a near-best
//!   config in a fraction of the measurements when the space is smooth along each parameter,
//!   which tile-size spaces mostly are.

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

/// Candidates that differ from candidate `i` in exactly one field.
fn neighbours(fs: &[BTreeMap<String, String>], i: usize) -> Vec<usize> {
    (0..fs.len())
        .filter(|&j| j != i && differing(&fs[i], &fs[j]) == 1)
        .collect()
}

fn local(candidates: &[Config], seed: u64, eval: &mut Eval<'_>) {
    let fs: Vec<BTreeMap<String, String>> = candidates.iter().map(fields).collect();
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
            for j in neighbours(&fs, at) {
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
}
