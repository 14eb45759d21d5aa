//! What a kernel call costs right after other kernels: times `after` when the two calls
//! before it ran `before`, against `after` following itself, every call on its own copy of
//! the operands (copies rotating through twice the L3, so every call reads from DRAM as
//! `tune` times it). `tune` times a candidate's calls one after another; a server calls each
//! kernel between others, and on an AMX Xeon a paged-decode kernel without tiles, called after
//! two AMX calls, took 1.5 times as long as after itself (README, session 14).
//!
//! ```text
//! cargo run --release -p kerntune-kernels --example call_after -- PROBLEM BEFORE AFTER [CALLS]
//! ```
//!
//! `BEFORE` and `AFTER` are configs as JSON, or `default` / `heuristic`.

use std::time::Instant;

use kerntune_kernels::data::ProblemData;
use kerntune_kernels::kernel::Scratch;
use kerntune_kernels::{Backend, Config, CpuBackend, CpuInfo, CpuSpace, Device, Problem, Space};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: call_after PROBLEM BEFORE AFTER [CALLS]  (configs as JSON, or default / heuristic)");
        std::process::exit(2);
    }
    let problem: Problem = args[0].parse().unwrap_or_else(|e| {
        eprintln!("call_after: problem {:?}: {e}", args[0]);
        std::process::exit(2);
    });
    let device = Device::host();
    let config = |text: &str| -> Config {
        let c = match text {
            "default" => CpuSpace.default_config(&problem, &device),
            "heuristic" => CpuSpace.heuristic(&problem, &device),
            json => Config::from_json(json).unwrap_or_else(|e| {
                eprintln!("call_after: config {json:?}: {e}");
                std::process::exit(2);
            }),
        };
        if let Err(e) = CpuSpace.validate(&c, &problem, &device) {
            eprintln!("call_after: {c} does not run here: {e}");
            std::process::exit(2);
        }
        c
    };
    let (before, after) = (config(&args[1]), config(&args[2]));
    let calls: usize = args
        .get(3)
        .map_or(150, |n| n.parse().expect("CALLS, a count"));
    let first = ProblemData::random(&problem, 1);
    let copies = (2 * CpuInfo::detect().l3_bytes)
        .div_ceil(first.bytes().max(1))
        .clamp(2, 4096);
    let mut data: Vec<ProblemData> = (0..copies).map(|_| first.clone()).collect();
    let mut scratch = Scratch::new();
    let mut next = 0;
    let mut call = |c: &Config| -> f64 {
        let len = CpuBackend.scratch_len(&problem, c);
        let d = &mut data[next % copies];
        next += 1;
        let t = Instant::now();
        CpuBackend
            .run(&problem, c, d.args(), scratch.get(len))
            .expect("a validated config runs");
        t.elapsed().as_secs_f64() * 1e6
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut switched, mut same) = (Vec::new(), Vec::new());
    for _ in 0..calls {
        call(&before);
        call(&before);
        switched.push(call(&after));
        call(&after);
        call(&after);
        same.push(call(&after));
    }
    println!("{problem}, {copies} copies of the operands, {calls} calls each");
    println!(
        "  after two calls of {before}: median {:.1} us",
        median(switched)
    );
    println!("  after two calls of itself: median {:.1} us", median(same));
}
