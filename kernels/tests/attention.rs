//! Every flash- and paged-attention config against the f64 reference on awkward shapes.

mod common;

use common::{check_all, described_amx_host, described_avx512_host, error_of};
use kerntune_kernels::config::{FlashConfig, FlashSplit, PagedConfig};
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::kernel::Scratch;
use kerntune_kernels::{
    Backend, Config, CpuBackend, CpuSpace, DType, Device, Isa, PagedProblem, Problem, Space,
    TensorBuf,
};
use proptest::prelude::*;

fn problem(spec: &str) -> Problem {
    spec.parse().unwrap()
}

/// head_dim 64 and 128 and odd ones, GQA ratios 1, 8 and 64, causal with q_len < kv_len,
/// more queries than keys without the mask, lengths that are no multiple of any tile, q_len 1.
fn flash_problems() -> Vec<Problem> {
    let mut out = Vec::new();
    for (q, kv, hq, hkv, d, causal) in [
        (37, 37, 2, 2, 64, true),
        (19, 70, 8, 1, 128, true),
        (1, 29, 64, 1, 64, true),
        (23, 23, 8, 8, 80, false),
        (5, 131, 16, 2, 96, true),
        (33, 50, 3, 1, 7, false),
        (70, 9, 4, 2, 64, false),
    ] {
        for dtype in DType::ALL {
            out.push(problem(&format!(
                "flash:batch=2,q_len={q},kv_len={kv},q_heads={hq},kv_heads={hkv},head_dim={d},causal={causal},dtype={dtype}"
            )));
        }
    }
    out
}

/// Context 1, contexts that are no multiple of the block size, every block size, GQA 1/8/64.
fn paged_problems() -> Vec<Problem> {
    let mut out = Vec::new();
    for (seqs, ctx, hq, hkv, d, bs) in [
        (3, 1, 4, 4, 64, 16),
        (2, 77, 8, 1, 128, 8),
        (5, 300, 64, 1, 64, 32),
        (1, 1100, 8, 8, 128, 16),
        (4, 45, 6, 2, 80, 16),
        (2, 70, 8, 2, 64, 1),
        (3, 300, 8, 1, 128, 64),
        (2, 600, 16, 2, 64, 128),
    ] {
        for dtype in DType::ALL {
            out.push(problem(&format!(
                "paged:num_seqs={seqs},context_len={ctx},q_heads={hq},kv_heads={hkv},head_dim={d},block_size={bs},dtype={dtype}"
            )));
        }
    }
    out
}

#[test]
fn every_flash_candidate_matches_reference() {
    let device = Device::host();
    let mut ran = 0;
    for p in flash_problems() {
        let configs = CpuSpace.candidates(&p, &device);
        assert!(!configs.is_empty(), "{p}: no candidates");
        ran += check_all(&p, &configs);
    }
    eprintln!("verified {ran} flash configs");
}

/// Sliding windows (causal): a window of one key, windows shorter than a tile and longer,
/// starting inside tiles, with queries aligned to the end of more keys (chunked prefill),
/// GQA 1, 8 and 64, every input type.
#[test]
fn every_flash_candidate_matches_reference_within_a_window() {
    let device = Device::host();
    let mut ran = 0;
    for (q, kv, hq, hkv, d, window) in [
        (37, 37, 2, 2, 64, 5),
        (19, 70, 8, 1, 128, 40),
        (70, 100, 4, 2, 64, 1),
        (9, 45, 64, 1, 64, 7),
        (5, 131, 16, 2, 96, 3),
    ] {
        for dtype in DType::ALL {
            let p = problem(&format!(
                "flash:q_len={q},kv_len={kv},q_heads={hq},kv_heads={hkv},head_dim={d},dtype={dtype},window={window}"
            ));
            assert!(
                matches!(p, Problem::Flash(f) if f.window == Some(window)),
                "{p}"
            );
            let configs = CpuSpace.candidates(&p, &device);
            assert!(!configs.is_empty(), "{p}: no candidates");
            ran += check_all(&p, &configs);
        }
    }
    eprintln!("verified {ran} windowed flash configs");
}

/// Sinks (gpt-oss): every candidate against the reference on grouped heads (a task's rows
/// span several heads, each with its own sink), one head per KV head, without the causal
/// mask, one query, within a window, and every input type.
#[test]
fn every_flash_candidate_matches_reference_with_sinks() {
    let ran = every_flash_candidate_in_each_type(&[
        "q_len=19,kv_len=70,q_heads=8,kv_heads=1,head_dim=128,sinks=true",
        "q_len=37,kv_len=37,q_heads=2,kv_heads=2,head_dim=64,sinks=true",
        "q_len=23,kv_len=23,q_heads=4,kv_heads=2,head_dim=80,causal=false,sinks=true",
        "q_len=1,kv_len=29,q_heads=64,kv_heads=1,head_dim=64,sinks=true",
        "q_len=33,kv_len=60,q_heads=6,kv_heads=3,head_dim=64,window=9,sinks=true",
    ]);
    eprintln!("verified {ran} flash configs with sinks");
}

/// Value heads narrower than the keys (latent attention's prefill: DeepSeek's keys of 192 and
/// values of 128 at its scale): every candidate against the reference on DeepSeek's heads,
/// chunked (fewer queries than keys) and one query, and on awkward widths (7 and 5, 80 and
/// 47) with grouped heads, no mask, a window, sinks and a cap, every input type.
#[test]
fn every_flash_candidate_matches_reference_with_narrow_values() {
    let ran = every_flash_candidate_in_each_type(&[
        "q_len=45,kv_len=45,q_heads=4,kv_heads=4,head_dim=192,v_head_dim=128,scale=0.1352",
        "q_len=17,kv_len=70,q_heads=2,kv_heads=2,head_dim=192,v_head_dim=128,scale=0.1352",
        "q_len=1,kv_len=29,q_heads=4,kv_heads=4,head_dim=192,v_head_dim=128",
        "q_len=23,kv_len=31,q_heads=6,kv_heads=2,head_dim=7,v_head_dim=5,causal=false",
        "q_len=33,kv_len=60,q_heads=4,kv_heads=2,head_dim=80,v_head_dim=47,window=9,sinks=true,softcap=30",
    ]);
    eprintln!("verified {ran} flash configs with narrow value heads");
}

/// A problem with narrow value heads is keyed by its `v_head_dim` and reads back (as wide as
/// the keys, it is the plain problem); wider values are refused by name; its V and output
/// hold `v_head_dim` values a row, and a call passing V at the keys' width is refused.
#[test]
fn a_narrow_value_problem_is_keyed_and_its_calls_checked() {
    let spec = "flash:q_len=20,kv_len=30,q_heads=4,kv_heads=2,head_dim=192,dtype=bf16";
    let p = problem(&format!("{spec},v_head_dim=128"));
    assert!(p.key().contains(",v_head_dim=128"), "{}", p.key());
    assert_eq!(p.key().parse::<Problem>().unwrap(), p);
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<Problem>(&json).unwrap(), p);
    // Problems stored before the field read as the plain ones.
    let plain = serde_json::to_string(&problem(spec)).unwrap();
    let old = plain.replace(",\"v_head_dim\":192", "");
    assert_ne!(old, plain);
    assert_eq!(
        serde_json::from_str::<Problem>(&old).unwrap(),
        problem(spec)
    );
    assert_eq!(problem(&format!("{spec},v_head_dim=192")), problem(spec));
    assert!(!problem(spec).key().contains("v_head_dim"));
    for bad in [
        format!("{spec},v_head_dim=193"),
        format!("{spec},v_head_dim=0"),
    ] {
        let e = bad.parse::<Problem>().unwrap_err().to_string();
        assert!(e.contains("v_head_dim"), "{bad}: {e}");
    }
    let mut data = ProblemData::random(&p, 7);
    assert_eq!(data.out.len(), 20 * 4 * 128);
    assert_eq!(data.inputs[2].len(), 30 * 2 * 128);
    let e = runs_then_refuses_keys_as_values(&p, &mut data);
    assert!(e.contains("`v`"), "{e}");
}

/// The heuristic config of `p` on `data` against the reference; then the error of a call
/// passing the keys (input 1) where the values go (input 2).
fn runs_then_refuses_keys_as_values(p: &Problem, data: &mut ProblemData) -> String {
    let c = CpuSpace.heuristic(p, &Device::host());
    let mut scratch = Scratch::new();
    let reference = data.reference();
    assert!(error_of(data, &c, &reference, &mut scratch) <= p.tolerance());
    data.inputs[2] = data.inputs[1].clone();
    CpuBackend
        .run(p, &c, data.args(), scratch.get(1 << 22))
        .unwrap_err()
        .to_string()
}

/// Every CPU candidate of `flash:{tail},dtype=...` in each input type against the reference;
/// how many ran.
fn every_flash_candidate_in_each_type(tails: &[&str]) -> usize {
    let device = Device::host();
    let mut ran = 0;
    for tail in tails {
        for dtype in DType::ALL {
            let p = problem(&format!("flash:{tail},dtype={dtype}"));
            let configs = CpuSpace.candidates(&p, &device);
            assert!(!configs.is_empty(), "{p}: no candidates");
            ran += check_all(&p, &configs);
        }
    }
    ran
}

/// Every CPU candidate of `paged:{tail},dtype=...` in each input type, on sequences of
/// `lens`, against the reference; how many ran.
fn every_paged_candidate_in_each_type(cases: &[(&str, Vec<u32>)]) -> usize {
    let mut ran = 0;
    for (tail, lens) in cases {
        for dtype in DType::ALL {
            let p = problem(&format!("paged:{tail},dtype={dtype}"));
            ran += every_paged_candidate_on(&p, lens, |_| {});
        }
    }
    ran
}

/// Every CPU candidate of `p` on sequences of `lens` against the reference, the data
/// `spoiled` after the reference is taken (cache rows no kernel may read); how many ran.
fn every_paged_candidate_on(p: &Problem, lens: &[u32], spoil: impl Fn(&mut ProblemData)) -> usize {
    let mut data = ProblemData::random(p, 5).with_context_lens(lens.to_vec());
    let reference = data.reference();
    spoil(&mut data);
    let configs = CpuSpace.candidates(p, &Device::host());
    assert!(!configs.is_empty(), "{p}: no candidates");
    let mut scratch = Scratch::new();
    for c in &configs {
        let err = error_of(&mut data, c, &reference, &mut scratch);
        assert!(err <= p.tolerance(), "{p} {c}: {err:e}");
    }
    configs.len()
}

/// Soft-capped scores (Gemma 2's 50, and caps of 1 and 0.3, below most scores, where the
/// tanh bends every one): every candidate against the reference, with and without the mask,
/// grouped heads, a window and sinks beside, every input type.
#[test]
fn every_flash_candidate_matches_reference_with_a_softcap() {
    let ran = every_flash_candidate_in_each_type(&[
        "q_len=19,kv_len=70,q_heads=8,kv_heads=1,head_dim=128,softcap=50",
        "q_len=23,kv_len=23,q_heads=4,kv_heads=2,head_dim=80,causal=false,softcap=1",
        "q_len=33,kv_len=60,q_heads=6,kv_heads=3,head_dim=64,window=9,sinks=true,softcap=0.3",
    ]);
    eprintln!("verified {ran} soft-capped flash configs");
}

/// Soft-capped decode: one partition and several, a window, sinks, every block size and type.
#[test]
fn every_paged_candidate_matches_reference_with_a_softcap() {
    let ran = every_paged_candidate_in_each_type(&[
        (
            "num_seqs=2,context_len=1100,q_heads=8,kv_heads=1,head_dim=128,block_size=16,softcap=50",
            vec![1100, 333],
        ),
        (
            "num_seqs=4,context_len=300,q_heads=8,kv_heads=2,head_dim=64,block_size=8,window=37,sinks=true,softcap=0.3",
            vec![300, 1, 40, 299],
        ),
        (
            "num_seqs=2,context_len=45,q_heads=6,kv_heads=2,head_dim=80,block_size=32,softcap=1",
            vec![45, 17],
        ),
    ]);
    eprintln!("verified {ran} soft-capped paged configs");
}

/// A soft-cap changes what is computed where it is below the scores, its key spells it in
/// the shortest form that reads back, and a cap that is not a positive number is refused.
#[test]
fn a_softcap_bends_the_reference_and_must_be_positive() {
    for spec in [
        "flash:q_len=20,kv_len=30,q_heads=4,kv_heads=2,head_dim=32",
        "paged:num_seqs=3,context_len=40,q_heads=4,kv_heads=2,head_dim=32",
    ] {
        assert_moves_most_values(spec, "softcap=0.2");
        let p = problem(&format!("{spec},softcap=50.0"));
        assert!(p.key().ends_with(",softcap=50"), "{}", p.key());
        assert_eq!(p.key().parse::<Problem>().unwrap(), p);
        for bad in ["0", "-3", "inf", "nan"] {
            let err = format!("{spec},softcap={bad}")
                .parse::<Problem>()
                .unwrap_err();
            assert!(err.to_string().contains("softcap"), "{err}");
        }
    }
}

/// ALiBi in prefill: every candidate against the reference in every input type, chunked
/// (queries after cached keys, their positions past their indices), one query, grouped heads
/// (rows of one tile on several slopes), a key tile's worth of heads with the model's slopes
/// down to 2^-8, and a window with sinks and a cap beside.
#[test]
fn every_flash_candidate_matches_reference_with_alibi() {
    let ran = every_flash_candidate_in_each_type(&[
        "q_len=19,kv_len=70,q_heads=8,kv_heads=1,head_dim=128,alibi=true",
        "q_len=37,kv_len=37,q_heads=2,kv_heads=2,head_dim=64,alibi=true",
        "q_len=1,kv_len=29,q_heads=12,kv_heads=4,head_dim=64,alibi=true",
        "q_len=33,kv_len=60,q_heads=6,kv_heads=3,head_dim=64,window=9,sinks=true,softcap=0.3,alibi=true",
    ]);
    eprintln!("verified {ran} flash configs with ALiBi");
}

/// ALiBi in decode: one partition and several (each partition's distances from the
/// sequence's own last token), a context of one token, mixed lengths, grouped heads, a
/// window with sinks and a cap, every block size and input type, and fp8 caches.
#[test]
fn every_paged_candidate_matches_reference_with_alibi() {
    let ran = every_paged_candidate_in_each_type(&[
        (
            "num_seqs=3,context_len=1,q_heads=4,kv_heads=4,head_dim=64,block_size=16,alibi=true",
            vec![1, 1, 1],
        ),
        (
            "num_seqs=2,context_len=1100,q_heads=8,kv_heads=1,head_dim=128,block_size=16,alibi=true",
            vec![1100, 333],
        ),
        (
            "num_seqs=4,context_len=300,q_heads=8,kv_heads=2,head_dim=64,block_size=8,window=37,sinks=true,softcap=0.3,alibi=true",
            vec![300, 1, 40, 299],
        ),
        (
            "num_seqs=2,context_len=45,q_heads=6,kv_heads=2,head_dim=80,block_size=32,alibi=true",
            vec![45, 17],
        ),
    ]);
    let mut fp8 = 0;
    for kv in ["fp8_e4m3", "fp8_e5m2"] {
        let p = problem(&format!(
            "paged:num_seqs=3,context_len=300,q_heads=8,kv_heads=2,head_dim=64,block_size=16,dtype=bf16,kv_dtype={kv},alibi=true"
        ));
        fp8 += every_paged_candidate_on(&p, &[300, 1, 170], |_| {});
    }
    eprintln!("verified {ran} paged configs with ALiBi, {fp8} on fp8 caches");
}

/// ALiBi's slopes are the model's: 2^(-8h/n) for n heads a power of two, and past one the
/// odd slopes of twice as many heads.
#[test]
fn alibi_slopes_are_the_models() {
    let eight: Vec<f32> = (1..=8).map(|h| (-(h as f32)).exp2()).collect();
    assert_eq!(kerntune_kernels::problem::alibi_slopes(8), eight);
    // Bloom's 112 heads, a TP8 rank's 14: 64 of 2^(-h/8), then 48 of 2^(-(2x+1)/16).
    let bloom = kerntune_kernels::problem::alibi_slopes(112);
    assert_eq!(bloom.len(), 112);
    assert!((bloom[0] - (-1f32 / 8.0).exp2()).abs() < 1e-7);
    assert!((bloom[63] - (-8f32).exp2()).abs() < 1e-9);
    assert!((bloom[64] - (-1f32 / 16.0).exp2()).abs() < 1e-7);
    assert!((bloom[111] - (-95f32 / 16.0).exp2()).abs() < 1e-7);
    assert!(kerntune_kernels::problem::alibi_slopes(0).is_empty());
    assert_eq!(
        kerntune_kernels::problem::alibi_slopes(1),
        vec![2f32.powi(-8)]
    );
}

/// What ALiBi computes, against a hand computation: with a zero query every score is its
/// bias alone, so each output is the values weighted by `e^(m·(j − pos))`, the keys nearest
/// the query (its own last) weighing most, for prefill (queries after cached keys) and
/// decode (sequences of their own lengths); every CPU kernel agrees.
#[test]
fn alibi_weighs_keys_by_their_distance() {
    for spec in [
        "flash:q_len=5,kv_len=12,q_heads=4,kv_heads=2,head_dim=16,dtype=f32,alibi=true",
        "paged:num_seqs=2,context_len=12,q_heads=4,kv_heads=2,head_dim=16,block_size=8,dtype=f32,alibi=true",
    ] {
        let p = problem(spec);
        let mut data = ProblemData::random(&p, 3);
        if let Problem::Paged(_) = p {
            data = data.with_context_lens(vec![12, 7]);
        }
        let TensorBuf::F32(q) = &mut data.inputs[0] else {
            unreachable!("f32 problems have f32 inputs")
        };
        q.fill(0.0);
        let slopes = kerntune_kernels::problem::alibi_slopes(4);
        assert_eq!(data.slopes, slopes);
        let got = data.reference();
        let TensorBuf::F32(v) = &data.inputs[2] else {
            unreachable!()
        };
        let d = 16;
        for row in 0..data.rows() {
            let h = row % 4;
            // The query's position, and where the value row of each key it sees starts.
            let (pos, value): (usize, Box<dyn Fn(usize) -> usize>) = match &p {
                Problem::Flash(f) => {
                    let i = row / 4 % f.q_len;
                    (i + 7, Box::new(move |j| (j * 2 + h / 2) * d))
                }
                Problem::Paged(pg) => {
                    let s = row / 4;
                    let len = data.context_lens[s] as usize;
                    let table = &data.block_tables[s * data.max_blocks_per_seq..];
                    let bs = pg.block_size;
                    (
                        len - 1,
                        Box::new(move |t| (table[t / bs] as usize * bs + t % bs) * 2 * d + h / 2 * d),
                    )
                }
                Problem::Gemm(_) => unreachable!(),
            };
            let w: Vec<f64> = (0..=pos)
                .map(|j| (slopes[h] as f64 * (j as f64 - pos as f64)).exp())
                .collect();
            let total: f64 = w.iter().sum();
            for x in 0..d {
                let want: f64 =
                    (0..=pos).map(|j| w[j] * v[value(j) + x] as f64).sum::<f64>() / total;
                let at = got[row * d + x];
                assert!((at - want).abs() < 1e-12, "{spec} row {row} value {x}: {at} against {want}");
            }
        }
        let configs = CpuSpace.candidates(&p, &Device::host());
        let mut scratch = Scratch::new();
        for c in &configs {
            let err = error_of(&mut data, c, &got, &mut scratch);
            assert!(err <= p.tolerance(), "{p} {c}: {err:e}");
        }
    }
}

/// ALiBi changes what is computed in both families, its key says `alibi=true`, it needs the
/// causal mask in prefill and refuses a latent cache, and a call without the slopes (or
/// with too few) is refused by name rather than read past its buffer.
#[test]
fn alibi_biases_the_reference_and_a_call_must_pass_slopes() {
    let flash = "flash:q_len=20,kv_len=30,q_heads=4,kv_heads=2,head_dim=32";
    let paged = "paged:num_seqs=3,context_len=40,q_heads=4,kv_heads=2,head_dim=32";
    for spec in [flash, paged] {
        assert_moves_most_values(spec, "alibi=true");
        let p = problem(&format!("{spec},alibi=true"));
        assert!(p.key().ends_with(",alibi=true"), "{}", p.key());
        assert_eq!(p.key().parse::<Problem>().unwrap(), p);
        assert!(!problem(spec).key().contains("alibi"));
        assert_eq!(p.slopes_len(), 4);
        let config = CpuSpace.default_config(&p, &Device::host());
        let mut data = ProblemData::random(&p, 1);
        let mut scratch = Scratch::new();
        for len in [0, 3] {
            data.slopes.truncate(len);
            let buf = scratch.get(CpuBackend.scratch_len(&p, &config));
            let err = CpuBackend.run(&p, &config, data.args(), buf).unwrap_err();
            assert!(err.to_string().contains("slopes"), "{err}");
        }
    }
    for bad in [
        format!("{flash},causal=false,alibi=true"),
        "paged:num_seqs=1,context_len=40,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,alibi=true"
            .to_string(),
    ] {
        let err = bad.parse::<Problem>().unwrap_err().to_string();
        assert!(err.contains("alibi"), "{bad}: {err}");
    }
}

/// The reference of `spec` with `extra` differs from the plain one in most output values.
fn assert_moves_most_values(spec: &str, extra: &str) {
    let full = ProblemData::random(&problem(spec), 9).reference();
    let changed = ProblemData::random(&problem(&format!("{spec},{extra}")), 9).reference();
    assert_eq!(full.len(), changed.len());
    let moved = full
        .iter()
        .zip(&changed)
        .filter(|(a, b)| (*a - *b).abs() > 1e-3)
        .count();
    assert!(
        moved > full.len() / 2,
        "{spec} with {extra}: {moved} of {} values moved",
        full.len()
    );
}

fn assert_window_moves_most_values(spec: &str, window: usize) {
    assert_moves_most_values(spec, &format!("window={window}"));
}

/// Sinks change what is computed, in both families: a head's output is scaled by the share
/// its keys keep beside the sink, the problem's key says `sinks=true`, and a call without
/// the logits (or with too few) is refused by name rather than read past its buffer.
#[test]
fn sinks_weigh_the_reference_and_a_call_must_pass_them() {
    let flash = "flash:q_len=20,kv_len=30,q_heads=4,kv_heads=2,head_dim=32";
    let paged = "paged:num_seqs=3,context_len=40,q_heads=4,kv_heads=2,head_dim=32";
    for spec in [flash, paged] {
        assert_moves_most_values(spec, "sinks=true");
        let p = problem(&format!("{spec},sinks=true"));
        assert!(p.key().contains(",sinks=true"), "{}", p.key());
        assert_eq!(p.key().parse::<Problem>().unwrap(), p);
        assert!(!problem(spec).key().contains("sinks"));
        assert_eq!(p.sinks_len(), 4);

        // Each row is the plain row times l / (l + e^sink), l its softmax sum.
        let plain = ProblemData::random(&problem(spec), 9);
        let sunk = ProblemData::random(&p, 9);
        assert_eq!(plain.inputs, sunk.inputs);
        let (want, got) = (plain.reference(), sunk.reference());
        let d = 32;
        for r in 0..plain.rows() {
            let ratio = got[r * d] / want[r * d];
            assert!(ratio > 0.0 && ratio < 1.0, "{p} row {r}: ratio {ratio}");
            for x in 1..d {
                let at = r * d + x;
                assert!(
                    (got[at] - want[at] * ratio).abs() <= 1e-9 * want[at].abs().max(1.0),
                    "{p} row {r} value {x}"
                );
            }
        }

        let device = Device::host();
        let config = CpuSpace.default_config(&p, &device);
        let mut data = ProblemData::random(&p, 1);
        let mut scratch = Scratch::new();
        for len in [0, 3] {
            data.sinks.truncate(len);
            let buf = scratch.get(CpuBackend.scratch_len(&p, &config));
            let err = CpuBackend.run(&p, &config, data.args(), buf).unwrap_err();
            assert!(err.to_string().contains("sinks"), "{err}");
        }
    }
}

/// A flash window: what the reference computes changes, a window of `kv_len` keys or more is
/// dropped from the problem, and one without the causal mask is refused by name.
#[test]
fn a_flash_window_bounds_the_reference_and_needs_the_causal_mask() {
    let spec = "flash:q_len=50,kv_len=80,q_heads=2,head_dim=32";
    assert_window_moves_most_values(spec, 8);
    for long in [80, 1000] {
        assert_eq!(problem(&format!("{spec},window={long}")), problem(spec));
    }
    let p = problem(&format!("{spec},window=79"));
    assert!(p.key().ends_with(",window=79"), "{}", p.key());
    assert_eq!(p.key().parse::<Problem>().unwrap(), p);
    // Query i at position i + 30 sees keys i + 23 ..= i + 30: 50 queries of 8 keys each.
    let Problem::Flash(f) = problem(&format!("{spec},window=8")) else {
        unreachable!("a flash spec")
    };
    assert_eq!(f.visible_pairs(), 400.0);
    assert_eq!(f.first_key(0), 23);
    let err = format!("{spec},causal=false,window=8")
        .parse::<Problem>()
        .unwrap_err();
    assert!(err.to_string().contains("causal=true"), "{err}");
}

#[test]
fn every_paged_candidate_matches_reference() {
    let device = Device::host();
    let mut ran = 0;
    for p in paged_problems() {
        let configs = CpuSpace.candidates(&p, &device);
        assert!(!configs.is_empty(), "{p}: no candidates");
        ran += check_all(&p, &configs);
    }
    eprintln!("verified {ran} paged configs");
}

#[test]
fn every_isa_runs_attention_correctly() {
    let host = kerntune_kernels::CpuInfo::detect();
    let f = problem(
        "flash:batch=1,q_len=21,kv_len=40,q_heads=4,kv_heads=2,head_dim=72,causal=true,dtype=bf16",
    );
    let g = problem(
        "paged:num_seqs=3,context_len=90,q_heads=4,kv_heads=2,head_dim=72,block_size=8,dtype=f16",
    );
    let g_fp8 = problem(
        "paged:num_seqs=3,context_len=90,q_heads=4,kv_heads=2,head_dim=72,block_size=8,dtype=bf16,kv_dtype=fp8_e4m3",
    );
    for isa in Isa::supported_by(host.isa) {
        let lanes = isa.f32_lanes().max(8);
        let mut flash = Vec::new();
        for (br, bc) in [(1, lanes), (7, 2 * lanes), (32, 4 * lanes)] {
            for group_heads in [false, true] {
                for split in [FlashSplit::Heads, FlashSplit::Blocks] {
                    let c = FlashConfig {
                        isa,
                        br,
                        bc,
                        group_heads,
                        split,
                        threads: host.threads,
                        amx: false,
                        dpbf16: false,
                    };
                    flash.push(Config::Flash(c));
                    if isa == Isa::Avx512Amx {
                        flash.push(Config::Flash(FlashConfig { amx: true, ..c }));
                    }
                    if isa >= Isa::Avx512 && host.avx512_bf16 {
                        flash.push(Config::Flash(FlashConfig { dpbf16: true, ..c }));
                    }
                }
            }
        }
        check_all(&f, &flash);
        // The per-token kernel: a KV head a task, one query head a task, and whole rows
        // (both KV heads of a row in one task).
        let paged: Vec<Config> = [0, 8, 24, 64]
            .into_iter()
            .flat_map(|partition| {
                [(false, false), (true, false), (true, true)].map(|(group_heads, whole_rows)| {
                    Config::Paged(PagedConfig {
                        isa,
                        partition,
                        group_heads,
                        threads: host.threads,
                        key_tiles: false,
                        amx: false,
                        whole_rows,
                        turn: 0,
                        widen: false,
                    })
                })
            })
            .collect();
        check_all(&g, &paged);
        check_all(&g_fp8, &paged);
    }
}

/// The key-tile kernels, f32, f16 (widened) and bf16 (pairs on AVX-512-BF16 hosts, widened
/// at the odd head dim 63 and on other hosts; tests/without_bf16.rs hides the instructions):
/// tiles of 16 tokens cut short (contexts 1, 15, 17, 100), head dims whose words fill a
/// vector, fall short of one (80, 96: a partial step; 2: one bf16 pair) or span several
/// (256), query-row groups of 1, 3 (padded to 4 lanes' rows), 8, 9 (two register groups in
/// P·V, 16 lanes in scores) and 64 (four score groups), every block size, partitions from one
/// block to the whole context, sequences of mixed lengths, a KV head a task and whole rows
/// (1 or 2 KV heads, the heads taking turns of the rule's, 16 and 48 tokens), value chunks of
/// 16 tokens where rows lie 1 KiB or more apart (2 KV heads of 256); at the host's ISA level
/// and at avx2-fma (the 8-lane kernels). Levels below avx2-fma must refuse them.
#[test]
fn paged_key_tiles_match_reference_or_are_refused() {
    let host = kerntune_kernels::CpuInfo::detect();
    let device = Device::host();
    // The host's level and, below AVX-512, the AVX2 kernels of the same configs.
    let isas: Vec<Isa> = [host.isa, Isa::Avx2Fma]
        .into_iter()
        .filter(|&i| i >= Isa::Avx2Fma && i <= host.isa)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let configs = |bs: usize| -> Vec<Config> {
        let mut out = Vec::new();
        for &isa in &isas {
            // Partitions are whole blocks.
            for partition in [0, bs, 2 * bs, 64].into_iter().filter(|p| p % bs == 0) {
                for (group_heads, whole_rows, turn) in [
                    (false, false, 0),
                    (true, false, 0),
                    (true, true, 0),
                    (true, true, 16),
                    (true, true, 48),
                ] {
                    out.push(Config::Paged(PagedConfig {
                        isa,
                        partition,
                        group_heads,
                        threads: host.threads,
                        key_tiles: true,
                        amx: false,
                        whole_rows,
                        turn,
                        widen: false,
                    }));
                }
            }
        }
        out
    };
    let portable = Config::Paged(PagedConfig {
        isa: Isa::Portable,
        partition: 0,
        group_heads: true,
        threads: 1,
        key_tiles: true,
        amx: false,
        whole_rows: false,
        turn: 0,
        widen: false,
    });
    let p = "paged:num_seqs=1,context_len=20,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16";
    let err = CpuSpace
        .validate(&portable, &problem(p), &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("avx2-fma"), "{p}: {err}");
    // A turn is a length for the heads of whole rows on key tiles, 16 to 256 in tiles of 16.
    if let Some(&isa) = isas.first() {
        let two =
            problem("paged:num_seqs=1,context_len=300,q_heads=8,kv_heads=2,head_dim=64,dtype=f32");
        let whole = PagedConfig {
            isa,
            partition: 0,
            group_heads: true,
            threads: 1,
            key_tiles: true,
            amx: false,
            whole_rows: true,
            turn: 64,
            widen: false,
        };
        CpuSpace
            .validate(&Config::Paged(whole), &two, &device)
            .unwrap_or_else(|e| panic!("{whole:?}: {e}"));
        for (c, why) in [
            (
                PagedConfig {
                    whole_rows: false,
                    ..whole
                },
                "set key_tiles and whole_rows",
            ),
            (
                PagedConfig {
                    key_tiles: false,
                    ..whole
                },
                "set key_tiles and whole_rows",
            ),
            (
                PagedConfig { turn: 40, ..whole },
                "multiple of 16 from 16 to 256",
            ),
            (
                PagedConfig { turn: 272, ..whole },
                "multiple of 16 from 16 to 256",
            ),
        ] {
            let err = CpuSpace
                .validate(&Config::Paged(c), &two, &device)
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{c:?}: {err}");
        }
        // Candidates offer the rule's turn (0) and the others shorter than the context.
        let turns: std::collections::BTreeSet<usize> = CpuSpace
            .candidates(&two, &device)
            .iter()
            .filter_map(|c| match c {
                Config::Paged(c) if c.key_tiles && c.whole_rows => Some(c.turn),
                _ => None,
            })
            .collect();
        assert!(
            turns.contains(&0) && turns.contains(&16) && turns.len() >= 4,
            "{turns:?}"
        );
        assert!(turns.iter().all(|&t| t < 300), "{turns:?}");
    }
    let mut ran = 0;
    // Every cache type: the three the queries come in, and each fp8 format (read as f16
    // bits and widened, AVX-512 and AVX2 alike) under a 16-bit query.
    for (dtype, kv) in [
        ("f32", "f32"),
        ("f16", "f16"),
        ("bf16", "bf16"),
        ("bf16", "fp8_e4m3"),
        ("f16", "fp8_e4m3fnuz"),
        ("bf16", "fp8_e5m2"),
    ] {
        let mut problems = Vec::new();
        for (seqs, ctx, hq, hkv, d, bs) in [
            (2, 1, 3, 1, 128, 16),
            (3, 15, 8, 1, 64, 8),
            (2, 17, 9, 1, 80, 16),
            (2, 100, 16, 2, 96, 32),
            (1, 100, 64, 1, 2, 8),
            (2, 70, 2, 2, 256, 16),
            (1, 333, 8, 1, 128, 32),
            (2, 17, 8, 1, 63, 16),
            (2, 40, 8, 1, 64, 1),
            (2, 300, 8, 2, 64, 128),
        ] {
            problems.push(problem(&format!(
                "paged:num_seqs={seqs},context_len={ctx},q_heads={hq},kv_heads={hkv},head_dim={d},block_size={bs},dtype={dtype},kv_dtype={kv}"
            )));
        }
        if isas.is_empty() {
            eprintln!(
                "paged key-tile kernels on {kv} not run: {} ({}) lacks AVX2 (refusal checked)",
                host.model, host.isa
            );
            continue;
        }
        for p in &problems {
            let Problem::Paged(pp) = p else {
                unreachable!()
            };
            ran += check_all(p, &configs(pp.block_size));
            // bf16 caches on AVX-512 key tiles also widened where the host has pairs.
            if kv == "bf16" {
                let widened: Vec<Config> = configs(pp.block_size)
                    .into_iter()
                    .filter_map(|c| match c {
                        Config::Paged(c) if c.isa >= Isa::Avx512 => {
                            Some(Config::Paged(PagedConfig { widen: true, ..c }))
                        }
                        _ => None,
                    })
                    .collect();
                for c in &widened {
                    CpuSpace
                        .validate(c, p, &device)
                        .unwrap_or_else(|e| panic!("{c} on {p}: {e}"));
                }
                ran += check_all(p, &widened);
            }
            assert!(CpuSpace
                .candidates(p, &device)
                .iter()
                .any(|c| matches!(c, Config::Paged(c) if c.key_tiles)));
        }
        let mut data = ProblemData::random(&problems[1], 5).with_context_lens(vec![1, 15, 9]);
        let reference = data.reference();
        let mut scratch = Scratch::new();
        for c in configs(8) {
            let err = error_of(&mut data, &c, &reference, &mut scratch);
            assert!(err <= problems[1].tolerance(), "{c}: {err:e}");
        }
    }
    eprintln!("verified {ran} key-tile configs");
}

/// A bf16 cache on AVX-512 key tiles is multiplied in pairs by `vdpbf16ps` or widened to
/// f32: both are tuned where the host has pairs, and the untuned guess widens on Intel
/// cores (pairs issue at under half the FMA rate there) and multiplies pairs on Zen 4.
/// `widen` is refused, by name, where there is no choice to make; it keeps stored configs'
/// text and names itself.
#[test]
fn paged_bf16_caches_widen_on_intel_and_pair_on_zen4() {
    let intel = described_avx512_host("Intel(R) Xeon(R) Processor");
    let zen4 = described_avx512_host("AMD EPYC 9R14 96-Core Processor");
    let latent = problem(
        "paged:num_seqs=2,context_len=300,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=16,dtype=bf16",
    );
    let grouped = problem(
        "paged:num_seqs=2,context_len=300,q_heads=8,kv_heads=2,head_dim=128,block_size=16,dtype=bf16",
    );
    let f16 = problem(
        "paged:num_seqs=2,context_len=300,q_heads=8,kv_heads=2,head_dim=128,block_size=16,dtype=f16",
    );
    let guess = |p: &Problem, host: &Device| match CpuSpace.heuristic(p, host) {
        Config::Paged(c) => c,
        other => panic!("{p}: {other}"),
    };
    for p in [&latent, &grouped] {
        let (on_intel, on_zen4) = (guess(p, &intel), guess(p, &zen4));
        assert!(on_intel.key_tiles && on_intel.widen, "{p}: {on_intel:?}");
        assert!(on_zen4.key_tiles && !on_zen4.widen, "{p}: {on_zen4:?}");
        for host in [&intel, &zen4] {
            let key_tiles = |widen: bool| {
                CpuSpace
                    .candidates(p, host)
                    .into_iter()
                    .filter(|c| {
                        matches!(c, Config::Paged(c) if c.key_tiles && c.isa >= Isa::Avx512 && c.widen == widen)
                    })
                    .map(|c| match c {
                        Config::Paged(c) => PagedConfig { widen: false, ..c },
                        _ => unreachable!(),
                    })
                    .collect::<Vec<_>>()
            };
            let (pairs, widened) = (key_tiles(false), key_tiles(true));
            assert!(!pairs.is_empty(), "{p} on {host}");
            assert_eq!(
                pairs, widened,
                "{p} on {host}: each key-tile config both ways"
            );
        }
    }
    let on_f16 = guess(&f16, &intel);
    assert!(on_f16.key_tiles && !on_f16.widen, "{on_f16:?}");
    assert!(CpuSpace
        .candidates(&f16, &intel)
        .iter()
        .all(|c| matches!(c, Config::Paged(c) if !c.widen)));
    // Refused where there is nothing to choose.
    let widened = guess(&grouped, &intel);
    for (c, p, why) in [
        (widened, &f16, "this cache is f16"),
        (
            PagedConfig {
                key_tiles: false,
                ..widened
            },
            &grouped,
            "key_tiles = false",
        ),
        (
            PagedConfig {
                isa: Isa::Avx2Fma,
                ..widened
            },
            &grouped,
            "isa avx2-fma",
        ),
    ] {
        let err = CpuSpace
            .validate(&Config::Paged(c), p, &intel)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(why) && err.contains("widen"),
            "{c:?} on {p}: {err}"
        );
    }
    // Stored configs from before the field keep their text; widening names itself.
    let stored = Config::Paged(PagedConfig {
        widen: false,
        ..widened
    });
    let text = serde_json::to_string(&stored).unwrap();
    assert!(!text.contains("widen"), "{text}");
    let config = Config::Paged(widened);
    let text = serde_json::to_string(&config).unwrap();
    assert!(text.contains(r#""widen":true"#), "{text}");
    assert_eq!(serde_json::from_str::<Config>(&text).unwrap(), config);
    assert!(config.to_string().ends_with(" widen"), "{config}");
}

/// Paged attention on AMX tiles: offered for bf16 with a head dimension that is a multiple
/// of 32 on AMX hosts (a described one here, as a colleague's database would describe it)
/// and taken by the heuristic there, with every KV head of a row in one task; refused with
/// the reason for f16, head_dim 80, alongside `key_tiles`, and on hosts without usable tiles;
/// `whole_rows` refused without grouped query heads and taken by the heuristic for the
/// vectorised per-token kernel too. On a host
/// with them, every candidate runs on the tiles against the reference, with sequences of
/// mixed lengths. The kernel's awkward shapes run on the software model of the tiles on
/// every host (`paged_amx`'s unit test).
#[test]
fn amx_paged_matches_reference_or_is_refused() {
    let amx_host = described_amx_host();
    let spec = "num_seqs=3,context_len=600,q_heads=8,kv_heads=2,head_dim=64,block_size=16";
    let bf16 = problem(&format!("paged:{spec},dtype=bf16"));
    let tiles = |c: &Config| matches!(c, Config::Paged(p) if p.amx);
    let amx: Vec<Config> = CpuSpace
        .candidates(&bf16, &amx_host)
        .into_iter()
        .filter(tiles)
        .collect();
    // Partitions 0, 256 and 512 × grouped (a KV head a task or whole rows) or not, on 1, 2
    // and 4 threads.
    assert_eq!(amx.len(), 3 * 3 * 3);
    for c in &amx {
        CpuSpace
            .validate(c, &bf16, &amx_host)
            .unwrap_or_else(|e| panic!("{c}: {e}"));
    }
    let heuristic = CpuSpace.heuristic(&bf16, &amx_host);
    assert!(
        matches!(heuristic, Config::Paged(c) if c.amx && c.whole_rows),
        "{heuristic}"
    );
    let one_kv = problem("paged:num_seqs=3,context_len=600,q_heads=8,kv_heads=1,head_dim=64,block_size=16,dtype=bf16");
    let heuristic = CpuSpace.heuristic(&one_kv, &amx_host);
    assert!(
        matches!(heuristic, Config::Paged(c) if c.amx && !c.whole_rows),
        "{heuristic}"
    );
    let Config::Paged(whole) = CpuSpace.heuristic(&bf16, &amx_host) else {
        unreachable!("paged heuristic")
    };
    let per_token = PagedConfig {
        amx: false,
        key_tiles: false,
        isa: Isa::Avx512,
        ..whole
    };
    CpuSpace
        .validate(&Config::Paged(per_token), &bf16, &amx_host)
        .unwrap_or_else(|e| panic!("{per_token:?}: {e}"));
    let ungrouped = PagedConfig {
        group_heads: false,
        ..whole
    };
    let err = CpuSpace
        .validate(&Config::Paged(ungrouped), &bf16, &amx_host)
        .unwrap_err();
    assert!(
        err.to_string().contains("set group_heads"),
        "{ungrouped:?}: {err}"
    );
    // A host without AVX2 runs the per-token kernel untuned: over whole rows where it is
    // vectorised (NEON), a KV head a task on the portable level.
    let mut info = kerntune_kernels::CpuInfo::detect().clone();
    for (isa, whole_rows) in [(Isa::Neon, true), (Isa::Portable, false)] {
        info.isa = isa;
        let heuristic = CpuSpace.heuristic(&bf16, &Device::Cpu(info.clone()));
        assert!(
            matches!(heuristic, Config::Paged(c)
                if !c.amx && !c.key_tiles && c.whole_rows == whole_rows && c.isa == isa),
            "{isa}: {heuristic}"
        );
        // A tuned AMX config carried to such a host is refused for the tiles it lacks, not
        // only for its ISA level.
        let err = CpuSpace
            .validate(&amx[0], &bf16, &Device::Cpu(info.clone()))
            .unwrap_err();
        assert!(err.to_string().contains("AMX tiles"), "{isa}: {err}");
    }
    for (other, why) in [
        (format!("paged:{spec},dtype=f16"), "bf16 caches"),
        (
            "paged:num_seqs=3,context_len=600,q_heads=8,kv_heads=2,head_dim=80,block_size=16,dtype=bf16".to_string(),
            "head_dim and v_head_dim that are multiples of 32",
        ),
        // A latent cache's values in whole tiles of 32 too.
        (
            "paged:num_seqs=3,context_len=600,q_heads=8,kv_heads=2,head_dim=64,v_head_dim=48,block_size=16,dtype=bf16".to_string(),
            "v_head_dim = 48",
        ),
    ] {
        let p = problem(&other);
        assert!(!CpuSpace.candidates(&p, &amx_host).iter().any(tiles), "{p}");
        let heuristic = CpuSpace.heuristic(&p, &amx_host);
        assert!(!tiles(&heuristic), "{p}");
        assert!(matches!(heuristic, Config::Paged(c) if c.key_tiles), "{p}");
        let err = CpuSpace.validate(&amx[0], &p, &amx_host).unwrap_err();
        assert!(err.to_string().contains(why), "{err}");
    }
    let Config::Paged(c) = amx[0] else {
        unreachable!("paged candidates")
    };
    let both = Config::Paged(PagedConfig {
        key_tiles: true,
        ..c
    });
    let err = CpuSpace.validate(&both, &bf16, &amx_host).unwrap_err();
    assert!(err.to_string().contains("two different kernels"), "{err}");

    let Some(here) = on_tiles_or_refused("paged", &bf16, &amx, tiles) else {
        return;
    };
    let mut data = ProblemData::random(&bf16, 7).with_context_lens(vec![1, 600, 250]);
    let reference = data.reference();
    let mut scratch = Scratch::new();
    for c in &here {
        let err = error_of(&mut data, c, &reference, &mut scratch);
        assert!(err <= bf16.tolerance(), "{c}: {err:e}");
    }
}

/// Paged configs stored before `whole_rows` and `turn` read as a KV head a task (and the
/// kernel's turn) and keep their text; setting either adds its key, and the config's name
/// says so.
#[test]
fn paged_configs_from_before_whole_rows_keep_their_meaning() {
    let stored = r#"{"family":"paged","isa":"avx512-amx","partition":512,"group_heads":true,"threads":2,"key_tiles":false,"amx":true}"#;
    let old: Config = serde_json::from_str(stored).unwrap();
    let Config::Paged(c) = old else {
        panic!("{old}")
    };
    assert!(!c.whole_rows);
    assert_eq!(serde_json::to_string(&old).unwrap(), stored);
    assert_eq!(c.turn, 0);
    let whole = Config::Paged(PagedConfig {
        whole_rows: true,
        ..c
    });
    let text = serde_json::to_string(&whole).unwrap();
    assert!(text.contains(r#""whole_rows":true"#), "{text}");
    assert!(!text.contains("turn"), "{text}");
    assert_eq!(serde_json::from_str::<Config>(&text).unwrap(), whole);
    assert!(whole.to_string().contains(" whole-rows"), "{whole}");
    let turned = Config::Paged(PagedConfig {
        whole_rows: true,
        key_tiles: true,
        amx: false,
        turn: 64,
        ..c
    });
    let text = serde_json::to_string(&turned).unwrap();
    assert!(text.contains(r#""turn":64"#), "{text}");
    assert_eq!(serde_json::from_str::<Config>(&text).unwrap(), turned);
    assert!(turned.to_string().ends_with(" turn=64"), "{turned}");
}

/// Sequences of different lengths in one call, some a single token, through every partition size.
#[test]
fn paged_mixed_context_lengths() {
    let p = problem("paged:num_seqs=4,context_len=200,q_heads=8,kv_heads=2,head_dim=64,block_size=16,dtype=bf16");
    let mut data = ProblemData::random(&p, 3).with_context_lens(vec![1, 200, 17, 64]);
    let reference = data.reference();
    let mut scratch = Scratch::new();
    for c in CpuSpace.candidates(&p, &Device::host()) {
        let err = error_of(&mut data, &c, &reference, &mut scratch);
        assert!(err <= p.tolerance(), "{c}: {err:e}");
    }
}

/// Sliding windows: every candidate against the reference with sequences shorter than the
/// window, longer by a few tokens, and far longer, windows starting inside a block, a window
/// of one token, a window longer than a partition, every block size and input type. The
/// cache rows before each window are NaN, as rows a server gave to another sequence since
/// may hold anything: no kernel may read them into a result, even with a weight of zero.
#[test]
fn every_paged_candidate_matches_reference_within_a_window() {
    let mut ran = 0;
    for (seqs, ctx, hq, hkv, d, bs, window, lens) in [
        (3, 300, 8, 2, 64, 16, 37, vec![1, 300, 40]),
        (2, 1100, 8, 8, 128, 16, 600, vec![1100, 601]),
        (4, 77, 8, 1, 128, 8, 1, vec![77, 1, 9, 8]),
        (2, 45, 6, 2, 80, 32, 44, vec![45, 44]),
    ] {
        for dtype in DType::ALL {
            let p = problem(&format!(
                "paged:num_seqs={seqs},context_len={ctx},q_heads={hq},kv_heads={hkv},head_dim={d},block_size={bs},dtype={dtype},window={window}"
            ));
            let Problem::Paged(paged) = p else {
                unreachable!("a paged spec")
            };
            assert_eq!(paged.window, Some(window), "{p}");
            ran += every_paged_candidate_on(&p, &lens, |d| poison_before_windows(d, &paged));
        }
    }
    eprintln!("verified {ran} windowed paged configs");
}

/// Sinks in decode: every candidate against the reference with one partition and with
/// several (the sink joins once, in the combination), a context of one token, mixed
/// lengths, grouped heads, a window, every block size and input type.
#[test]
fn every_paged_candidate_matches_reference_with_sinks() {
    let ran = every_paged_candidate_in_each_type(&[
        (
            "num_seqs=3,context_len=1,q_heads=4,kv_heads=4,head_dim=64,block_size=16,sinks=true",
            vec![1, 1, 1],
        ),
        (
            "num_seqs=2,context_len=1100,q_heads=8,kv_heads=1,head_dim=128,block_size=16,sinks=true",
            vec![1100, 333],
        ),
        (
            "num_seqs=4,context_len=300,q_heads=8,kv_heads=2,head_dim=64,block_size=8,window=37,sinks=true",
            vec![300, 1, 40, 299],
        ),
        (
            "num_seqs=2,context_len=45,q_heads=6,kv_heads=2,head_dim=80,block_size=32,sinks=true",
            vec![45, 17],
        ),
    ]);
    eprintln!("verified {ran} paged configs with sinks");
}

/// Fp8 caches (vLLM's `--kv-cache-dtype fp8`): every CPU candidate on each format under f16
/// and bf16 queries, against the reference on the same bytes times the same scales: context
/// 1, contexts no multiple of the block, several partitions, GQA 1, 8 and 64, head dims 80
/// and 7 (no whole vector), a window with sinks and a soft-cap beside, sequences of mixed
/// lengths.
#[test]
fn every_paged_candidate_matches_reference_on_fp8_caches() {
    let mut ran = 0;
    for (tail, lens) in [
        ("num_seqs=3,context_len=1,q_heads=4,kv_heads=4,head_dim=64,block_size=16", vec![1; 3]),
        (
            "num_seqs=2,context_len=1100,q_heads=8,kv_heads=1,head_dim=128,block_size=16",
            vec![1100, 333],
        ),
        (
            "num_seqs=2,context_len=300,q_heads=64,kv_heads=1,head_dim=64,block_size=32",
            vec![300, 17],
        ),
        (
            "num_seqs=4,context_len=45,q_heads=6,kv_heads=2,head_dim=80,block_size=8,window=37,sinks=true,softcap=30",
            vec![45, 1, 40, 44],
        ),
        (
            "num_seqs=2,context_len=50,q_heads=4,kv_heads=2,head_dim=7,block_size=16",
            vec![50, 3],
        ),
    ] {
        for dtype in ["f16", "bf16"] {
            for kv in ["fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"] {
                let p = problem(&format!("paged:{tail},dtype={dtype},kv_dtype={kv}"));
                ran += every_paged_candidate_on(&p, &lens, |_| {});
            }
        }
    }
    eprintln!("verified {ran} paged configs on fp8 caches");
}

/// Each scale reaches the output: a kernel run with a key scale or a value scale other than
/// the reference's is off by far more than rounding (the value scale by exactly its ratio),
/// on each kernel the host has; scales that are not positive, and scales on caches that are
/// not fp8, are refused by name.
#[test]
fn fp8_cache_scales_reach_the_output_and_are_checked() {
    use kerntune_kernels::kernel::KvScales;
    let device = Device::host();
    let p = problem(
        "paged:num_seqs=2,context_len=200,q_heads=8,kv_heads=2,head_dim=64,dtype=bf16,kv_dtype=fp8_e4m3",
    );
    let mut data = ProblemData::random(&p, 3);
    let reference = data.reference();
    let right = data.kv_scales;
    assert_eq!(right, ProblemData::FP8_SCALES);
    let mut scratch = Scratch::new();
    let mut kernels = std::collections::BTreeSet::new();
    for c in CpuSpace.candidates(&p, &device) {
        let Config::Paged(pc) = c else { unreachable!() };
        if !kernels.insert((pc.isa, pc.key_tiles, pc.partition > 0)) {
            continue;
        }
        for (scales, least) in [
            (
                KvScales {
                    k: 2.0 * right.k,
                    ..right
                },
                0.05,
            ),
            (
                KvScales {
                    v: 2.0 * right.v,
                    ..right
                },
                0.99,
            ),
        ] {
            data.kv_scales = scales;
            let err = error_of(&mut data, &c, &reference, &mut scratch);
            assert!(err > least, "{c} with {scales:?}: {err:e}");
        }
        data.kv_scales = right;
        let err = error_of(&mut data, &c, &reference, &mut scratch);
        assert!(err <= p.tolerance(), "{c}: {err:e}");
    }
    let c = CpuSpace.heuristic(&p, &device);
    for (bad, name) in [
        (KvScales { k: 0.0, v: 1.0 }, "k_scale"),
        (
            KvScales {
                k: 1.0,
                v: f32::NAN,
            },
            "v_scale",
        ),
    ] {
        data.kv_scales = bad;
        let e = CpuBackend
            .run(&p, &c, data.args(), scratch.get(1 << 20))
            .unwrap_err();
        assert!(e.to_string().contains(name), "{e}");
    }
    let plain =
        problem("paged:num_seqs=2,context_len=20,q_heads=8,kv_heads=2,head_dim=64,dtype=bf16");
    let mut data = ProblemData::random(&plain, 3);
    assert_eq!(data.kv_scales, KvScales::ONE);
    data.kv_scales = KvScales { k: 0.5, v: 1.0 };
    let c = CpuSpace.heuristic(&plain, &device);
    let e = CpuBackend
        .run(&plain, &c, data.args(), scratch.get(1 << 20))
        .unwrap_err();
    assert!(
        e.to_string().contains("k_scale") && e.to_string().contains("fp8"),
        "{e}"
    );
}

/// Multi-head latent attention's decode: one cache whose rows are keys and whose values are
/// each row's first `v_head_dim` values. DeepSeek-V3's shape at TP8 (16 query heads on one
/// latent of 576, values of 512) in every input type and on fp8, and awkward ones: values of
/// 48 and 5 of rows of 80 and 7, two latent heads, context 1, a window with sinks and a cap.
#[test]
fn every_paged_candidate_matches_reference_on_a_latent_cache() {
    let mut ran = 0;
    let deepseek = "num_seqs=2,context_len=300,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=16,scale=0.1352";
    let cases = [
        (deepseek, vec![300, 17]),
        (
            "num_seqs=4,context_len=45,q_heads=6,kv_heads=2,head_dim=80,v_head_dim=48,block_size=8,window=37,sinks=true,softcap=30",
            vec![45, 1, 40, 44],
        ),
        (
            "num_seqs=3,context_len=50,q_heads=4,kv_heads=1,head_dim=7,v_head_dim=5,block_size=16",
            vec![1, 50, 33],
        ),
        // FlashMLA's blocks of 64 and AITER's of one token.
        (
            "num_seqs=2,context_len=300,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=64,scale=0.1352",
            vec![300, 65],
        ),
        (
            "num_seqs=2,context_len=40,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=1,scale=0.1352",
            vec![40, 3],
        ),
    ];
    ran += every_paged_candidate_in_each_type(&cases);
    for kv in ["fp8_e4m3", "fp8_e5m2"] {
        let p = problem(&format!("paged:{deepseek},dtype=bf16,kv_dtype={kv}"));
        ran += every_paged_candidate_on(&p, &[300, 17], |_| {});
    }
    eprintln!("verified {ran} paged configs on latent caches");
}

/// A latent problem is keyed by its `v_head_dim` and reads back; values wider than the keys,
/// a value cache passed beside the latent one, and two fp8 scales for its one cache are
/// refused by name, and its output holds `v_head_dim` values a row.
#[test]
fn a_latent_problem_is_keyed_and_its_calls_checked() {
    use kerntune_kernels::kernel::KvScales;
    let spec = "paged:num_seqs=2,context_len=20,q_heads=16,kv_heads=1,head_dim=576,dtype=bf16";
    let p = problem(&format!("{spec},v_head_dim=512"));
    let Problem::Paged(pp) = p else {
        unreachable!()
    };
    assert!(pp.is_latent());
    assert!(p.key().contains(",v_head_dim=512"), "{}", p.key());
    assert_eq!(p.key().parse::<Problem>().unwrap(), p);
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<Problem>(&json).unwrap(), p);
    assert_eq!(problem(&format!("{spec},v_head_dim=576")), problem(spec));
    assert!(!problem(spec).key().contains("v_head_dim"));
    for (bad, field) in [
        (format!("{spec},v_head_dim=577"), "v_head_dim"),
        (format!("{spec},v_head_dim=0"), "v_head_dim"),
        (
            "paged:num_seqs=2,context_len=20,q_heads=16,kv_heads=1,head_dim=1025".into(),
            "head_dim",
        ),
    ] {
        let e = bad.parse::<Problem>().unwrap_err().to_string();
        assert!(e.contains(field), "{bad}: {e}");
    }
    let mut data = ProblemData::random(&p, 7);
    assert_eq!(data.out.len(), 2 * 16 * 512);
    assert!(data.inputs[2].is_empty());
    // A value cache beside the latent one would be ignored: refused.
    let e = runs_then_refuses_keys_as_values(&p, &mut data);
    assert!(e.contains("value_cache") && e.contains("empty"), "{e}");
    let device = Device::host();
    let mut scratch = Scratch::new();
    let fp8 = problem(&format!("{spec},v_head_dim=512,kv_dtype=fp8_e4m3"));
    let mut data = ProblemData::random(&fp8, 7);
    assert_eq!(data.kv_scales.k, data.kv_scales.v);
    data.kv_scales = KvScales { k: 0.5, v: 0.25 };
    let c = CpuSpace.heuristic(&fp8, &device);
    let e = CpuBackend
        .run(&fp8, &c, data.args(), scratch.get(1 << 22))
        .unwrap_err()
        .to_string();
    assert!(e.contains("v_scale") && e.contains("k_scale twice"), "{e}");
}

/// `kv_dtype` is keyed where it differs from the query's (a problem on caches of its own
/// dtype is the plain one), reads back, and is refused with an f32 query or as an attention
/// problem's `dtype` (fp8 is a GEMM's input type too, tested with the GEMMs).
#[test]
fn kv_dtype_is_keyed_and_fp8_only_holds_attentions_caches() {
    let spec = "paged:num_seqs=2,context_len=20,q_heads=8,kv_heads=2,head_dim=64,dtype=bf16";
    let p = problem(&format!("{spec},kv_dtype=fp8_e4m3fnuz"));
    assert!(p.key().contains(",kv_dtype=fp8_e4m3fnuz"), "{}", p.key());
    assert_eq!(p.key().parse::<Problem>().unwrap(), p);
    assert_eq!(problem(&format!("{spec},kv_dtype=bf16")), problem(spec));
    assert!(!problem(spec).key().contains("kv_dtype"));
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<Problem>(&json).unwrap(), p);
    for (bad, field) in [
        (
            "paged:num_seqs=2,context_len=20,q_heads=8,head_dim=64,dtype=f32,kv_dtype=fp8_e5m2",
            "kv_dtype",
        ),
        (
            "paged:num_seqs=2,context_len=20,q_heads=8,head_dim=64,dtype=bf16,kv_dtype=f16",
            "kv_dtype",
        ),
        (
            "paged:num_seqs=2,context_len=20,q_heads=8,head_dim=64,dtype=fp8_e4m3",
            "dtype",
        ),
        ("flash:q_len=4,q_heads=2,head_dim=8,dtype=fp8_e5m2", "dtype"),
        (
            "paged:num_seqs=2,context_len=20,q_heads=8,head_dim=64,kv_dtype=fp8",
            "kv_dtype",
        ),
    ] {
        let e = bad.parse::<Problem>().unwrap_err().to_string();
        assert!(e.contains(field), "{bad}: {e}");
    }
}

/// NaN in every cache row of a token before its sequence's window.
fn poison_before_windows(data: &mut ProblemData, p: &PagedProblem) {
    let (mb, bs, width) = (
        data.max_blocks_per_seq,
        p.block_size,
        p.kv_heads * p.head_dim,
    );
    for (s, &len) in data.context_lens.clone().iter().enumerate() {
        for t in 0..p.first_token(len as usize) {
            let row = data.block_tables[s * mb + t / bs] as usize * bs + t % bs;
            for cache in &mut data.inputs[1..] {
                let rows = row * width..(row + 1) * width;
                match cache {
                    TensorBuf::F32(c) => c[rows].fill(f32::NAN),
                    TensorBuf::F16(c) => c[rows].fill(half::f16::NAN),
                    TensorBuf::Bf16(c) => c[rows].fill(half::bf16::NAN),
                    // NaN in E5M2; E4M3's NaN byte, which the kernels read as 480 (they
                    // take caches to hold values), or fnuz's largest value: a read shows.
                    TensorBuf::Fp8(_, c) => c[rows].fill(0x7f),
                    TensorBuf::Int4(_) => unreachable!("caches hold no int4 words"),
                }
            }
        }
    }
}

/// A window changes what is computed: the reference over the last `window` tokens differs
/// from full attention's, and a window as long as the context is no window at all.
#[test]
fn a_paged_window_bounds_the_reference_and_a_long_one_is_dropped() {
    let spec = "paged:num_seqs=2,context_len=100,q_heads=4,kv_heads=2,head_dim=64,dtype=f32";
    assert_window_moves_most_values(spec, 10);
    for long in [100, 4096] {
        let p = problem(&format!("{spec},window={long}"));
        assert_eq!(p, problem(spec), "window={long}");
        assert_eq!(p.key(), problem(spec).key());
    }
    let p = problem(&format!("{spec},window=99"));
    assert!(p.key().ends_with(",window=99"), "{}", p.key());
    assert_eq!(p.key().parse::<Problem>().unwrap(), p);
    let err = format!("{spec},window=0").parse::<Problem>().unwrap_err();
    assert!(err.to_string().contains("window"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_flash_shapes_match_reference(
        q in 1usize..40, extra in 0usize..30, kvh in 1usize..3, group in 1usize..5,
        d in 1usize..100, causal in prop::bool::ANY, dt in 0usize..3,
        pick in any::<prop::sample::Index>(), window in prop::option::of(1usize..70),
        sinks in prop::bool::ANY, softcap in prop::option::of(0.2f32..60.0),
        narrow in prop::option::of(0.0f64..1.0), alibi in prop::bool::ANY,
    ) {
        let dtype = DType::ALL[dt];
        let softcap = softcap.map(|c| format!(",softcap={c}")).unwrap_or_default();
        // Value heads of 1..=d values.
        let dv = narrow.map(|f| 1 + (f * d as f64) as usize % d).unwrap_or(d);
        let window = match (causal, window) {
            (true, Some(w)) => format!(",window={w}"),
            _ => String::new(),
        };
        // ALiBi counts back from each query: causal problems only.
        let alibi = alibi && causal;
        let p = problem(&format!(
            "flash:batch=1,q_len={q},kv_len={},q_heads={},kv_heads={kvh},head_dim={d},v_head_dim={dv},causal={causal},dtype={dtype},sinks={sinks}{window}{softcap},alibi={alibi}",
            q + extra, kvh * group
        ));
        let device = Device::host();
        let candidates = CpuSpace.candidates(&p, &device);
        check_all(&p, &[CpuSpace.default_config(&p, &device), CpuSpace.heuristic(&p, &device), *pick.get(&candidates)]);
    }

    #[test]
    fn random_paged_shapes_match_reference(
        seqs in 1usize..5, ctx in 1usize..400, kvh in 1usize..3, group in 1usize..9,
        d in 1usize..100, bs in 0usize..3, dt in 0usize..3, pick in any::<prop::sample::Index>(),
        window in prop::option::of(1usize..400), sinks in prop::bool::ANY,
        softcap in prop::option::of(0.2f32..60.0), kv in 0usize..4, alibi in prop::bool::ANY,
    ) {
        let window = window.map(|w| format!(",window={w}")).unwrap_or_default();
        let softcap = softcap.map(|c| format!(",softcap={c}")).unwrap_or_default();
        let dtype = DType::ALL[dt];
        // The query's own type, or (under a 16-bit query) an fp8 cache.
        let kv = match kv {
            1..=3 if dtype != DType::F32 => {
                format!(",kv_dtype={}", ["fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"][kv - 1])
            }
            _ => String::new(),
        };
        let p = problem(&format!(
            "paged:num_seqs={seqs},context_len={ctx},q_heads={},kv_heads={kvh},head_dim={d},block_size={},dtype={dtype},sinks={sinks}{window}{softcap}{kv},alibi={alibi}",
            kvh * group, [8, 16, 32][bs]
        ));
        let device = Device::host();
        let candidates = CpuSpace.candidates(&p, &device);
        check_all(&p, &[CpuSpace.default_config(&p, &device), CpuSpace.heuristic(&p, &device), *pick.get(&candidates)]);
    }
}

/// On a host without usable AMX tiles: every one of `amx` (valid on a described AMX host) is
/// refused here with the reason, and none is offered; `None`. On a host with them: every AMX
/// candidate (`tiles`) of `problem` here matches the reference; `Some` of them.
fn on_tiles_or_refused(
    kernel: &str,
    problem: &Problem,
    amx: &[Config],
    tiles: impl Fn(&Config) -> bool,
) -> Option<Vec<Config>> {
    let host = kerntune_kernels::CpuInfo::detect();
    let device = Device::host();
    if host.isa != Isa::Avx512Amx {
        for c in amx {
            let err = CpuSpace.validate(c, problem, &device).unwrap_err();
            assert!(err.to_string().contains("AMX tiles"), "{err}");
        }
        assert!(!CpuSpace.candidates(problem, &device).iter().any(&tiles));
        eprintln!(
            "amx {kernel} kernel not run on tiles: {} has no usable AMX ({}; refusal checked)",
            host.model, host.isa
        );
        return None;
    }
    let here: Vec<Config> = CpuSpace
        .candidates(problem, &device)
        .into_iter()
        .filter(|c| tiles(c))
        .collect();
    assert!(!here.is_empty());
    assert_eq!(check_all(problem, &here), here.len());
    Some(here)
}

/// Flash attention on AMX tiles: offered for bf16 with an even head dimension on AMX hosts
/// (described here, as a colleague's machine is, so every machine checks the space), run
/// against the reference where this host has tiles, refused with the reason where it does not.
#[test]
fn amx_flash_matches_reference_or_is_refused() {
    let amx_host = described_amx_host();
    let bf16 = problem(
        "flash:batch=1,q_len=21,kv_len=40,q_heads=4,kv_heads=2,head_dim=72,causal=true,dtype=bf16",
    );
    let tiles = |c: &Config| matches!(c, Config::Flash(f) if f.amx);
    let amx: Vec<Config> = CpuSpace
        .candidates(&bf16, &amx_host)
        .into_iter()
        .filter(tiles)
        .collect();
    // 5 br × 3 bc × grouped or not × 2 splits, on 1, 2 and 4 threads.
    assert_eq!(amx.len(), 60 * 3);
    for c in &amx {
        CpuSpace
            .validate(c, &bf16, &amx_host)
            .unwrap_or_else(|e| panic!("{c}: {e}"));
    }
    assert!(tiles(&CpuSpace.heuristic(&bf16, &amx_host)));
    for other in [
        "flash:batch=1,q_len=21,kv_len=40,q_heads=4,kv_heads=2,head_dim=72,causal=true,dtype=f16",
        "flash:batch=1,q_len=21,kv_len=40,q_heads=4,kv_heads=2,head_dim=71,causal=true,dtype=bf16",
    ] {
        let p = problem(other);
        assert!(!CpuSpace.candidates(&p, &amx_host).iter().any(tiles), "{p}");
        assert!(!tiles(&CpuSpace.heuristic(&p, &amx_host)), "{p}");
        let err = CpuSpace.validate(&amx[0], &p, &amx_host).unwrap_err();
        assert!(err.to_string().contains("even head_dim"), "{err}");
    }

    on_tiles_or_refused("flash", &bf16, &amx, tiles);
}

/// Flash attention on `vdpbf16ps`: offered for bf16 with an even head dimension on hosts with
/// AVX-512-BF16 (described ones here: a Zen 4, an Intel core, one with AMX) and taken by the
/// heuristic where it issues at the f32 FMA's rate (not on Intel cores, whose AMX hosts take
/// the tiles); refused with the reason for f32, an odd head dimension, beside `amx`, below
/// AVX-512 and on hosts without the instructions (tests/without_bf16.rs hides them here).
/// Where this host has them, the heuristic runs against the reference on awkward shapes (the
/// kernel's unit test runs every case of the tiles' on it too).
#[test]
fn dpbf16_flash_matches_reference_or_is_refused() {
    let zen4 = described_avx512_host("AMD EPYC 9654 96-Core Processor");
    let intel = described_avx512_host("Intel Xeon Gold 6348H");
    let spec = "batch=1,q_len=70,kv_len=70,q_heads=8,kv_heads=2,head_dim=64,causal=true";
    let bf16 = problem(&format!("flash:{spec},dtype=bf16"));
    let pairs = |c: &Config| matches!(c, Config::Flash(f) if f.dpbf16);
    for host in [&zen4, &intel, &described_amx_host()] {
        let offered: Vec<Config> = CpuSpace
            .candidates(&bf16, host)
            .into_iter()
            .filter(pairs)
            .collect();
        // br 16 to 256 (at most 512 rows: 256 with the group of 4 is out) × bc 128 to 512 ×
        // heads grouped or not × both splits, on each thread count.
        let threads = if host == &zen4 || host == &intel {
            2
        } else {
            3
        };
        assert_eq!(offered.len(), (5 * 3 * 2 - 3) * 2 * threads, "{host}");
        for c in &offered {
            CpuSpace
                .validate(c, &bf16, host)
                .unwrap_or_else(|e| panic!("{c}: {e}"));
        }
    }
    let heuristic = |p: &Problem, host: &Device| match CpuSpace.heuristic(p, host) {
        Config::Flash(c) => c,
        other => panic!("{p}: {other}"),
    };
    let zen4_pick = heuristic(&bf16, &zen4);
    assert!(zen4_pick.dpbf16 && !zen4_pick.amx, "{zen4_pick:?}");
    // 256 rows: 64 positions of the group of 4.
    assert_eq!((zen4_pick.br, zen4_pick.bc), (64, 256), "{zen4_pick:?}");
    assert!(!heuristic(&bf16, &intel).dpbf16);
    assert!(heuristic(&bf16, &described_amx_host()).amx);
    let f32 = problem(&format!("flash:{spec},dtype=f32"));
    let odd = problem(&format!("flash:{},dtype=bf16", spec.replace("64", "63")));
    for p in [&f32, &odd] {
        assert!(!heuristic(p, &zen4).dpbf16, "{p}");
        assert!(!CpuSpace.candidates(p, &zen4).iter().any(pairs), "{p}");
        let err = CpuSpace
            .validate(&Config::Flash(zen4_pick), p, &zen4)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("needs bf16 inputs and an even head_dim"),
            "{p}: {err}"
        );
    }
    for (bad, why) in [
        (
            FlashConfig {
                amx: true,
                ..zen4_pick
            },
            "at most one",
        ),
        (
            FlashConfig {
                isa: Isa::Avx2Fma,
                ..zen4_pick
            },
            "AVX-512-BF16",
        ),
    ] {
        let host = if bad.amx {
            described_amx_host()
        } else {
            zen4.clone()
        };
        let bad = FlashConfig {
            isa: if bad.amx { Isa::Avx512Amx } else { bad.isa },
            ..bad
        };
        let err = CpuSpace
            .validate(&Config::Flash(bad), &bf16, &host)
            .unwrap_err();
        assert!(err.to_string().contains(why), "{bad:?}: {err}");
    }
    // The config's text and JSON name the kernel; configs stored before it keep theirs.
    let text = serde_json::to_string(&Config::Flash(zen4_pick)).unwrap();
    assert!(text.contains(r#""dpbf16":true"#), "{text}");
    assert!(Config::Flash(zen4_pick).to_string().contains(" dpbf16 "));
    let plain = serde_json::to_string(&Config::Flash(heuristic(&f32, &zen4))).unwrap();
    assert!(!plain.contains("dpbf16"), "{plain}");

    let host = kerntune_kernels::CpuInfo::detect();
    if !(host.avx512_bf16 && host.isa >= Isa::Avx512) {
        eprintln!(
            "dpbf16 flash not run: {} ({}) lacks AVX-512-BF16 (its configs are refused there: \
             tests/without_bf16.rs)",
            host.model, host.isa
        );
        return;
    }
    let device = Device::host();
    let mut ran = 0;
    for spec in [
        "batch=2,q_len=1,kv_len=1,q_heads=8,kv_heads=8,head_dim=2,causal=true",
        "batch=1,q_len=37,kv_len=131,q_heads=8,kv_heads=1,head_dim=128,causal=true",
        "batch=3,q_len=17,kv_len=17,q_heads=3,kv_heads=3,head_dim=80,causal=false",
        "batch=1,q_len=97,kv_len=300,q_heads=4,kv_heads=2,head_dim=192,v_head_dim=128,causal=true,window=41",
    ] {
        let p = problem(&format!("flash:{spec},dtype=bf16"));
        let pick = CpuSpace.heuristic(&p, &device);
        if !host.intel() {
            assert!(pairs(&pick), "{p}: {pick}");
        }
        let mut configs = vec![Config::Flash(FlashConfig {
            isa: Isa::Avx512,
            dpbf16: true,
            amx: false,
            ..match pick {
                Config::Flash(c) => c,
                other => panic!("{p}: {other}"),
            }
        })];
        configs.extend(
            [(1, 128), (5, 256)].map(|(br, bc)| match configs[0] {
                Config::Flash(c) => Config::Flash(FlashConfig { br, bc, ..c }),
                ref other => panic!("{p}: {other}"),
            }),
        );
        ran += check_all(&p, &configs);
    }
    eprintln!("verified {ran} dpbf16 flash configs");
}
