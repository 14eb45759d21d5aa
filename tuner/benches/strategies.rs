//! How many measurements each search strategy needs to come within 3% of the exhaustive winner,
//! on Llama-3.1-8B problems on this CPU.
//!
//! Every candidate of each problem is measured once (the exhaustive sweep); the strategies are
//! then replayed against those recorded timings, so all of them see the same numbers and random
//! search can be averaged over many seeds. Run with
//! `cargo bench -p kerntune-tuner --bench strategies`.
//!
//! With `KERNTUNE_STRATEGY_TIMINGS=FILE` the sweep's timings are written to FILE (JSON), or,
//! where FILE exists, read from it instead of measured: a change to a strategy is then compared
//! with the one before on the very same numbers, in seconds instead of the sweep's half hour.
//! A FILE from another space (configs not among this build's candidates) is refused.

use std::time::Duration;

use kerntune_kernels::{Config, CpuBackend, CpuSpace, Device, Space};
use kerntune_tuner::measure::{Policy, Workload};
use kerntune_tuner::models::Model;
use kerntune_tuner::search::{search, Strategy};
use kerntune_tuner::shapes::{derive, Buckets};

fn main() {
    let device = Device::host();
    let model = Model::preset("llama8b").expect("preset exists");
    let buckets = Buckets {
        batch_sizes: vec![1, 16],
        prefill_lens: vec![128],
        context_lens: vec![1024],
        ..Buckets::default()
    };
    // Decode-sized problems: an exhaustive sweep of prefill GEMMs would take hours here.
    let problems: Vec<_> = derive(&model, 2, &buckets)
        .expect("llama8b derives at tp 2")
        .into_iter()
        .filter(|d| d.problem.flops() < 2e9)
        .collect();
    let policy = Policy {
        min_reps: 3,
        max_reps: 9,
        max_time: Duration::from_millis(20),
        target_ci: 0.02,
        ..Policy::default()
    };
    println!("device: {device}");
    println!(
        "{:<70} {:>6} {:>8} {:>8} {:>8}",
        "problem", "space", "local", "random", "ratio"
    );
    let file = std::env::var_os("KERNTUNE_STRATEGY_TIMINGS").map(std::path::PathBuf::from);
    let recorded: Option<Recorded> = file.as_ref().filter(|f| f.exists()).map(|f| {
        let text = std::fs::read_to_string(f)
            .unwrap_or_else(|e| panic!("reading timings {}: {e}", f.display()));
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("timings {}: not a timings file: {e}", f.display()))
    });
    if let (Some(r), Some(f)) = (&recorded, &file) {
        println!(
            "timings replayed from {} (measured on {})",
            f.display(),
            r.device
        );
    }
    let mut record = Recorded {
        device: device.to_string(),
        problems: Vec::new(),
    };
    let (mut sum_ex, mut sum_local, mut sum_random) = (0usize, 0usize, 0.0f64);
    for d in &problems {
        let p = &d.problem;
        let mut list = vec![
            CpuSpace.default_config(p, &device),
            CpuSpace.heuristic(p, &device),
        ];
        for c in CpuSpace.candidates(p, &device) {
            if !list.contains(&c) {
                list.push(c);
            }
        }
        let times: Vec<f64> = match &recorded {
            Some(r) => match replayed(r, &p.key(), &list) {
                Some(times) => times,
                None => {
                    println!("{:<70} not in the timings file: skipped", p.key());
                    continue;
                }
            },
            None => {
                let mut w = Workload::new(p, &policy);
                list.iter()
                    .map(|c| {
                        w.verify(&CpuBackend, c)
                            .and_then(|_| w.time(&CpuBackend, c, &policy, None))
                            .map(|s| s.median_ns)
                            .unwrap_or(f64::INFINITY)
                    })
                    .collect()
            }
        };
        record.problems.push(Timings {
            key: p.key(),
            configs: list.iter().map(Config::to_json).collect(),
            // JSON has no infinity: a failed candidate is written as null.
            times_ns: times.iter().map(|t| t.is_finite().then_some(*t)).collect(),
        });
        // Written after every problem, so a sweep stopped early still leaves what it measured.
        if let (None, Some(f)) = (&recorded, &file) {
            let text = serde_json::to_string(&record).expect("timings serialise");
            std::fs::write(f, text).unwrap_or_else(|e| panic!("writing {}: {e}", f.display()));
        }
        let best = times.iter().copied().fold(f64::INFINITY, f64::min);
        let evals_to_reach = |strategy: Strategy, seed: u64| -> usize {
            let mut n = 0;
            let mut reached = None;
            let mut eval = |c: &Config| -> Result<Option<f64>, ()> {
                let i = list
                    .iter()
                    .position(|x| x == c)
                    .expect("candidate of this list");
                n += 1;
                if times[i] <= best * 1.03 && reached.is_none() {
                    reached = Some(n);
                }
                Ok(Some(times[i]))
            };
            search(strategy, &list, seed, &mut eval);
            reached.unwrap_or(list.len())
        };
        let local = evals_to_reach(Strategy::Local, 0x5eed);
        let random = (0..50)
            .map(|s| evals_to_reach(Strategy::Random, s * 7919 + 1))
            .sum::<usize>() as f64
            / 50.0;
        sum_ex += list.len();
        sum_local += local;
        sum_random += random;
        println!(
            "{:<70} {:>6} {:>8} {:>8.1} {:>7.0}%",
            p.key(),
            list.len(),
            local,
            random,
            100.0 * local as f64 / list.len() as f64
        );
    }
    println!(
        "total: exhaustive {sum_ex}, local {sum_local} ({:.0}%), random {sum_random:.0} ({:.0}%)",
        100.0 * sum_local as f64 / sum_ex as f64,
        100.0 * sum_random / sum_ex as f64
    );
    if let (None, Some(f)) = (&recorded, &file) {
        println!("timings written to {}", f.display());
    }
}

/// One sweep's timings, as `KERNTUNE_STRATEGY_TIMINGS` stores them.
#[derive(serde::Serialize, serde::Deserialize)]
struct Recorded {
    device: String,
    problems: Vec<Timings>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Timings {
    key: String,
    configs: Vec<String>,
    times_ns: Vec<Option<f64>>,
}

/// The recorded time of every config of `list`, in its order; None where the problem was not
/// recorded (a sweep stopped before it).
fn replayed(r: &Recorded, key: &str, list: &[Config]) -> Option<Vec<f64>> {
    let t = r.problems.iter().find(|t| t.key == key)?;
    let by_config: std::collections::HashMap<&str, Option<f64>> = t
        .configs
        .iter()
        .map(String::as_str)
        .zip(t.times_ns.iter().copied())
        .collect();
    let times = list
        .iter()
        .map(|c| {
            let json = c.to_json();
            by_config
                .get(json.as_str())
                .unwrap_or_else(|| {
                    panic!("{key}: {json} was not recorded (another space): record it again")
                })
                .unwrap_or(f64::INFINITY)
        })
        .collect();
    Some(times)
}
