//! The kernels of AVX-512 hosts without AVX-512-BF16 (Skylake to Ice Lake servers), run here
//! by hiding the instructions: `KERNTUNE_AVX512_BF16=0` before the host is first detected.
//! One test in its own binary, so nothing detects the host earlier in this process.

mod common;

use common::check_all;
use kerntune_kernels::config::FlashConfig;
use kerntune_kernels::{Config, CpuInfo, CpuSpace, Device, Isa, PagedConfig, Problem, Space};

fn problem(spec: &str) -> Problem {
    spec.parse().unwrap()
}

#[test]
fn bf16_without_avx512_bf16_widens_or_refuses() {
    // SAFETY: the only test of this binary sets the variable before any thread reads it.
    unsafe { std::env::set_var("KERNTUNE_AVX512_BF16", "0") };
    let host = CpuInfo::detect();
    assert!(
        !host.avx512_bf16,
        "KERNTUNE_AVX512_BF16=0 must hide AVX-512-BF16"
    );
    if host.isa < Isa::Avx512 {
        eprintln!(
            "bf16 key tiles without AVX-512-BF16 not run: {} ({}) lacks AVX-512",
            host.model, host.isa
        );
        return;
    }
    let device = Device::host();
    // bf16 GEMM variants built on `vdpbf16ps` are refused...
    let gemm = problem("gemm:m=16,n=1280,k=8192,dtype=bf16,b=nk");
    let candidates = CpuSpace.candidates(&gemm, &device);
    assert!(!candidates.is_empty());
    for c in &candidates {
        let text = c.to_string();
        assert!(
            !text.contains("dpbf16"),
            "{text} offered without AVX-512-BF16"
        );
    }
    // ...flash attention on them too, a tuned one carried here refused by name...
    let flash = problem(
        "flash:batch=1,q_len=64,kv_len=64,q_heads=8,kv_heads=1,head_dim=128,causal=true,dtype=bf16",
    );
    let candidates = CpuSpace.candidates(&flash, &device);
    assert!(!candidates.is_empty());
    assert!(
        !candidates
            .iter()
            .any(|c| matches!(c, Config::Flash(f) if f.dpbf16)),
        "dpbf16 flash offered without AVX-512-BF16"
    );
    let Config::Flash(untuned) = CpuSpace.heuristic(&flash, &device) else {
        unreachable!("a flash heuristic")
    };
    assert!(!untuned.dpbf16, "{untuned:?}");
    let carried = Config::Flash(FlashConfig {
        isa: Isa::Avx512,
        dpbf16: true,
        amx: false,
        ..untuned
    });
    let err = CpuSpace.validate(&carried, &flash, &device).unwrap_err();
    assert!(err.to_string().contains("no AVX-512-BF16"), "{err}");
    // ...while paged key tiles widen bf16 to f32 and match the reference.
    let mut ran = 0;
    for (ctx, hq, d, bs) in [
        (1, 8, 128, 16),
        (17, 9, 80, 8),
        (100, 64, 2, 32),
        (70, 8, 63, 16),
    ] {
        let p = problem(&format!(
            "paged:num_seqs=2,context_len={ctx},q_heads={hq},kv_heads=1,head_dim={d},block_size={bs},dtype=bf16"
        ));
        let configs: Vec<Config> = [0, bs, 64]
            .into_iter()
            .map(|partition| {
                Config::Paged(PagedConfig {
                    isa: host.isa,
                    partition,
                    group_heads: true,
                    threads: host.threads,
                    key_tiles: true,
                    amx: false,
                    whole_rows: false,
                    turn: 0,
                    widen: false,
                })
            })
            .collect();
        for c in &configs {
            CpuSpace.validate(c, &p, &device).unwrap();
        }
        ran += check_all(&p, &configs);
        // The key tiles, or the AMX kernel where the host has tiles and the head dimension
        // suits them (it rounds its weights without AVX-512-BF16, so it runs here too).
        let heuristic = CpuSpace.heuristic(&p, &device);
        let amx = host.isa == Isa::Avx512Amx && d % 32 == 0;
        assert!(
            matches!(heuristic, Config::Paged(c) if c.key_tiles != amx && c.amx == amx),
            "{p}: {heuristic}"
        );
        ran += check_all(&p, &[heuristic]);
    }
    eprintln!("verified {ran} bf16 paged configs without AVX-512-BF16");
}
