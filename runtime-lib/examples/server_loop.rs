//! A server-like loop: mixed decode and prefill steps of a small GQA model dispatched through
//! one `Dispatcher`, then the dispatch statistics and the untuned shapes for the next tuning job.
//!
//! `cargo run --release -p kerntune-runtime --example server_loop -- [kerntune.db] [untuned.txt]`

use kerntune::Dispatcher;
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::kernel::Args;
use kerntune_kernels::Problem;

fn main() {
    let mut args = std::env::args().skip(1);
    let db = args.next().unwrap_or_else(|| "kerntune.db".into());
    let untuned = args.next().unwrap_or_else(|| "untuned.txt".into());
    let d = Dispatcher::open(&db);
    if let Some(note) = d.note() {
        eprintln!("{note}");
    }
    // Hidden 1024, 8 query heads and 2 KV heads of 128: a small model so the loop runs anywhere.
    let (hidden, qkv, inter) = (1024, (8 + 2 * 2) * 128, 2816);
    let mut steps = Vec::new();
    for step in 0..24usize {
        if step % 8 == 0 {
            // A prefill chunk of 256 tokens.
            steps.push(format!("gemm:m=256,n={qkv},k={hidden},dtype=bf16"));
            steps.push("flash:q_len=256,q_heads=8,kv_heads=2,head_dim=128,dtype=bf16".to_string());
            steps.push(format!("gemm:m=256,n={},k={hidden},dtype=bf16", 2 * inter));
        } else {
            // A decode step: the batch grows as requests arrive.
            let batch = 1 + step % 8;
            steps.push(format!("gemm:m={batch},n={qkv},k={hidden},dtype=bf16"));
            steps.push(format!(
                "paged:num_seqs={batch},context_len={},q_heads=8,kv_heads=2,head_dim=128,dtype=bf16",
                256 + 16 * step
            ));
            steps.push(format!("gemm:m={batch},n={hidden},k={inter},dtype=bf16"));
        }
    }
    let start = std::time::Instant::now();
    for spec in &steps {
        let problem: Problem = spec.parse().expect("valid spec");
        let mut data = ProblemData::random(&problem, 1);
        let how = match data.args() {
            Args::Gemm(a) => d.gemm(&problem, a),
            Args::Flash(a) => d.flash_attention(&problem, a),
            Args::Paged(a) => d.paged_attention(&problem, a),
        }
        .expect("kernel ran");
        println!("{how:?}\t{spec}");
    }
    println!(
        "{} calls in {:.1} ms",
        steps.len(),
        start.elapsed().as_secs_f64() * 1e3
    );
    println!("{:?}", d.stats());
    let n = d.write_untuned(&untuned).expect("untuned shapes written");
    println!("{n} untuned problems written to {untuned}; tune them with: tune --shapes untuned:{untuned}");
}
