//! How many measurements each search strategy needs to come within 3% of the exhaustive winner,
//! on Llama-3.1-8B problems on this CPU.
//!
//! Every candidate of each problem is measured once (the exhaustive sweep); the strategies are
//! then replayed against those recorded timings, so all of them see the same numbers and random
//! search can be averaged over many seeds. Run with
//! `cargo bench -p kerntune-tuner --bench strategies`.

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
        let mut w = Workload::new(p, &policy);
        let times: Vec<f64> = list
            .iter()
            .map(|c| {
                w.verify(&CpuBackend, c)
                    .and_then(|_| w.time(&CpuBackend, c, &policy))
                    .map(|s| s.median_ns)
                    .unwrap_or(f64::INFINITY)
            })
            .collect();
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
}
