//! Selection on a crafted database, hostile rows, concurrent dispatch through reloads, and a
//! database written by `tune` used end to end.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kerntune::{Dispatcher, Match};
use kerntune_db::{Db, MeasurementRecord, ProblemRecord, ProblemResult, RunStatus, Stats, Status};
use kerntune_kernels::config::{GemmConfig, GemmVariant, Inner, Split};
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::kernel::Args;
use kerntune_kernels::reference::relative_error;
use kerntune_kernels::{Config, CpuSpace, Device, Problem, Space, CPU_SOURCE_HASH};
use kerntune_tuner::tune::{device_record, kernel_record};

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Stores winners as (problem spec, config JSON), with the given kernel source hash. A run
/// that finishes leaves a snapshot the runtime reads in one row; one that does not (a tuner
/// killed mid-run) leaves only winner rows, read one by one.
fn craft(path: &Path, rows: &[(&str, String)], hash: &str, finish: bool) {
    block_on(async {
        let db = Db::open(path).await.unwrap();
        let device = Device::host();
        let dev = db.device_id(&device_record(&device)).await.unwrap();
        let run = db
            .begin_run("test", "test", dev, "test-host")
            .await
            .unwrap();
        for (spec, config) in rows {
            let p: Problem = spec.parse().unwrap();
            let kid = db.kernel_id(&kernel_record(&p, "cpu", hash)).await.unwrap();
            let m = MeasurementRecord {
                config: config.clone(),
                status: Status::Ok,
                message: None,
                error: Some(0.0),
                stats: Some(Stats {
                    median_ns: 1e3,
                    min_ns: 1e3,
                    p20_ns: 1e3,
                    p80_ns: 1e3,
                    reps: 3,
                    throughput: 1.0,
                    unit: "FLOP/s".into(),
                    cold_cache: true,
                }),
            };
            let rec = ProblemRecord {
                family: p.family().to_string(),
                key: p.key(),
                fields: String::new(),
            };
            db.record_problem(&ProblemResult {
                run_id: run,
                device_id: dev,
                kernel_id: kid,
                problem: &rec,
                measurements: &[m],
                winner: Some(0),
                default: Some(0),
                final_round: 0,
                tool_version: "test",
            })
            .await
            .unwrap();
        }
        if finish {
            db.finish_run(run, RunStatus::Done).await.unwrap();
        }
        db.close().await;
    });
}

/// Runs `check` on a database crafted both ways: with and without the snapshot row.
fn both_paths(rows: &[(&str, String)], check: impl Fn(&Path, bool)) {
    for finish in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.db");
        craft(&path, rows, CPU_SOURCE_HASH, finish);
        check(&path, finish);
    }
}

/// Two distinct CPU candidates of `first`: `a` stored as its winner, `b` as `second`'s; `check`
/// runs on a dispatcher over each way of writing that database, with `a`, `b` and a selector
/// that answers a spec's match and config.
fn two_winners(first: &str, second: &str, check: impl Fn(&Dispatcher, Config, Config)) {
    let p: Problem = first.parse().unwrap();
    let mut others = CpuSpace.candidates(&p, &Device::host()).into_iter();
    let (a, b) = (others.next().unwrap(), others.next().unwrap());
    assert_ne!(a, b);
    let rows = [(first, a.to_json()), (second, b.to_json())];
    both_paths(&rows, |path, _| check(&Dispatcher::open(path), a, b));
}

/// What `d` selects for `spec`: how it matched, and the config.
fn sel(d: &Dispatcher, spec: &str) -> (Match, Config) {
    let s = d.select(&spec.parse().unwrap());
    (s.matched, s.config)
}

/// A valid, recognisable GEMM config: the portable 4×8 kernel with `tiles` in its blocks.
fn marked(tiles: usize) -> Config {
    Config::Gemm(GemmConfig {
        variant: GemmVariant::Packed,
        isa: kerntune_kernels::Isa::Portable,
        mr: 4,
        nr: 8,
        mc: 4 * tiles,
        kc: 32,
        nc: 8 * tiles,
        split: Split::N,
        threads: 1,
        prefetch: true,
        inner: Inner::M,
    })
}

#[test]
fn exact_bucket_nearest_and_default() {
    let rows = [
        ("gemm:m=16,n=256,k=128", marked(2).to_json()),
        ("gemm:m=64,n=256,k=128", marked(3).to_json()),
        (
            "paged:num_seqs=8,context_len=1024,q_heads=8,kv_heads=1,head_dim=64",
            CpuSpace
                .default_config(
                    &"paged:context_len=8,q_heads=8,kv_heads=1,head_dim=64"
                        .parse()
                        .unwrap(),
                    &Device::host(),
                )
                .to_json(),
        ),
    ];
    both_paths(&rows, |path, _| selections(path));
}

fn selections(path: &Path) {
    let dir = path.parent().unwrap();
    let d = Dispatcher::open(path);
    assert!(d.note().is_none());
    let sel = |s: &str| d.select(&s.parse().unwrap());
    assert_eq!(sel("gemm:m=16,n=256,k=128").matched, Match::Exact);
    assert_eq!(sel("gemm:m=16,n=256,k=128").config, marked(2));
    // m = 9 rounds up to the m = 16 bucket, m = 40 to the m = 64 one.
    assert_eq!(
        (
            sel("gemm:m=9,n=256,k=128").matched,
            sel("gemm:m=9,n=256,k=128").config
        ),
        (Match::Bucket, marked(2))
    );
    assert_eq!(sel("gemm:m=40,n=256,k=128").config, marked(3));
    // Beyond the largest bucket: the nearest tuned problem.
    assert_eq!(
        (
            sel("gemm:m=500,n=256,k=128").matched,
            sel("gemm:m=500,n=256,k=128").config
        ),
        (Match::Nearest, marked(3))
    );
    assert_eq!(
        sel("paged:num_seqs=3,context_len=700,q_heads=8,kv_heads=1,head_dim=64").matched,
        Match::Bucket
    );
    // Other static dimensions: the heuristic.
    let other: Problem = "gemm:m=16,n=255,k=128".parse().unwrap();
    assert_eq!(d.select(&other).matched, Match::Default);
    assert_eq!(
        d.select(&other).config,
        CpuSpace.heuristic(&other, &Device::host())
    );
    let s = d.stats();
    assert_eq!(
        (s.exact, s.bucket, s.nearest, s.defaults, s.loaded),
        (2, 4, 2, 2, 3)
    );

    // The untuned problems come out in the format `tune --shapes untuned:PATH` reads.
    let file = dir.join("untuned.txt");
    assert_eq!(d.write_untuned(&file).unwrap(), 5);
    let derived = kerntune_tuner::shapes::expand(
        &format!("untuned:{}", file.display()),
        None,
        1e12,
        &Default::default(),
    )
    .unwrap()
    .problems;
    assert_eq!(derived.len(), 5);
    assert!(derived.iter().any(|x| x.problem == other));
}

/// A server computes its softmax scale its own way: `96 ** -0.5` rounded from f64 is one bit
/// off `1 / sqrt(96)` in f32, the tuner's default. Selection ignores the scale (every kernel
/// takes it as an argument), so tuned winners are found whatever its last bits.
#[test]
fn the_softmax_scale_does_not_decide_selection() {
    let device = Device::host();
    let tuned = "paged:num_seqs=8,context_len=1024,q_heads=8,kv_heads=1,head_dim=96";
    let p: Problem = tuned.parse().unwrap();
    let heuristic = CpuSpace.heuristic(&p, &device);
    let winner = CpuSpace
        .candidates(&p, &device)
        .into_iter()
        .find(|c| *c != heuristic)
        .expect("a paged config other than the heuristic");
    let server = (96f64).powf(-0.5) as f32;
    let Problem::Paged(q) = p else { unreachable!() };
    assert_ne!(
        server.to_bits(),
        q.scale.get().to_bits(),
        "the server's scale differs from the tuned one in its last bits"
    );
    let gemma = 1.0 / 168f32.sqrt();
    let rows = [
        (tuned, winner.to_json()),
        (
            &*format!("flash:q_len=512,q_heads=8,kv_heads=4,head_dim=128,scale={gemma},dtype=bf16"),
            CpuSpace
                .heuristic(
                    &"flash:q_len=512,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16"
                        .parse()
                        .unwrap(),
                    &device,
                )
                .to_json(),
        ),
    ];
    both_paths(&rows, |path, _| {
        let d = Dispatcher::open(path);
        let sel = |s: &str| d.select(&s.parse().unwrap());
        let asked = format!("{tuned},scale={server}");
        assert_eq!(sel(&asked).matched, Match::Exact);
        assert_eq!(sel(&asked).config, winner);
        // Its bucket too: fewer sequences, shorter contexts.
        let shorter = format!(
            "paged:num_seqs=3,context_len=700,q_heads=8,kv_heads=1,head_dim=96,scale={server}"
        );
        assert_eq!(
            (sel(&shorter).matched, sel(&shorter).config),
            (Match::Bucket, winner)
        );
        // Tuned at Gemma's scale, asked for at the default one.
        assert_eq!(
            sel("flash:q_len=512,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16").matched,
            Match::Exact
        );
        // A prefill of several sequences: the batch is a dynamic dimension too, so it finds
        // the tuned single-sequence problem nearest to it rather than the heuristic.
        assert_eq!(
            sel("flash:batch=4,q_len=512,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16").matched,
            Match::Nearest
        );
    });
}

/// A sliding window is part of what a call is: a windowed layer's calls find the winners
/// tuned with that window (bucket or nearest), full attention's never do, and a window no
/// shorter than a call's context is no window (the full-attention winners serve it).
#[test]
fn a_sliding_window_decides_selection() {
    let full = "paged:num_seqs=8,context_len=1024,q_heads=8,kv_heads=1,head_dim=64";
    let windowed = "paged:num_seqs=8,context_len=4096,q_heads=8,kv_heads=1,head_dim=64,window=1024";
    two_winners(windowed, full, |d, a, b| {
        let sel = |s: &str| sel(d, s);
        let call = |ctx: usize, window: &str| {
            format!("paged:num_seqs=4,context_len={ctx},q_heads=8,kv_heads=1,head_dim=64{window}")
        };
        assert_eq!(sel(windowed), (Match::Exact, a));
        assert_eq!(sel(&call(2000, ",window=1024")), (Match::Bucket, a));
        assert_eq!(sel(&call(8192, ",window=1024")), (Match::Nearest, a));
        assert_eq!(sel(&call(900, ",window=1024")), (Match::Bucket, b));
        assert_eq!(sel(&call(4096, "")), (Match::Nearest, b));
        // Another window is another layer: nothing tuned applies.
        assert_eq!(sel(&call(4096, ",window=512")).0, Match::Default);
    });
}

/// Sinks are a static dimension: a gpt-oss call finds the winners tuned with sinks, a call
/// without them the plain ones, and neither the other's; a call with sinks through the
/// dispatcher matches the reference.
#[test]
fn sinks_decide_selection() {
    let plain = "flash:q_len=256,kv_len=256,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16";
    let sunk = format!("{plain},sinks=true");
    two_winners(&sunk, plain, |d, a, b| {
        let sel = |s: &str| sel(d, s);
        assert_eq!(sel(&sunk), (Match::Exact, a));
        assert_eq!(sel(plain), (Match::Exact, b));
        let longer = "flash:q_len=200,kv_len=1000,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16";
        assert_eq!(sel(&format!("{longer},sinks=true")), (Match::Nearest, a));
        assert_eq!(sel(longer), (Match::Nearest, b));
        let other_heads = "flash:q_len=256,q_heads=16,kv_heads=2,head_dim=64,dtype=bf16";
        assert_eq!(sel(&format!("{other_heads},sinks=true")).0, Match::Default);

        let p: Problem = sunk.parse().unwrap();
        let mut data = ProblemData::random(&p, 3);
        let reference = data.reference();
        let Args::Flash(args) = data.args() else {
            unreachable!("a flash problem")
        };
        assert_eq!(d.flash_attention(&p, args).unwrap(), Match::Exact);
        let err = relative_error(&data.out, &reference);
        assert!(err <= p.tolerance(), "{err:e}");
    });
}

/// ALiBi is a static dimension: a Bloom or MPT call finds the winners tuned with ALiBi (whose
/// GPU builds add the bias), a call without it the plain ones, and neither the other's; a
/// decode call with ALiBi through the dispatcher, on sequences of their own lengths, matches
/// the reference.
#[test]
fn alibi_decides_selection() {
    let plain = "paged:num_seqs=8,context_len=2048,q_heads=14,kv_heads=14,head_dim=128,dtype=bf16";
    let biased = format!("{plain},alibi=true");
    two_winners(&biased, plain, |d, a, b| {
        let sel = |s: &str| sel(d, s);
        assert_eq!(sel(&biased), (Match::Exact, a));
        assert_eq!(sel(plain), (Match::Exact, b));
        let call =
            "paged:num_seqs=3,context_len=1500,q_heads=14,kv_heads=14,head_dim=128,dtype=bf16";
        assert_eq!(sel(&format!("{call},alibi=true")).1, a);
        assert_eq!(sel(call).1, b);

        let p: Problem = format!("{call},alibi=true").parse().unwrap();
        let mut data = ProblemData::random(&p, 3).with_context_lens(vec![1500, 1, 700]);
        let reference = data.reference();
        let Args::Paged(args) = data.args() else {
            unreachable!("a paged problem")
        };
        assert_ne!(d.paged_attention(&p, args).unwrap(), Match::Default);
        let err = relative_error(&data.out, &reference);
        assert!(err <= p.tolerance(), "{err:e}");
    });
}

/// A soft-cap's presence is a static dimension, its value is not (an argument of the capped
/// builds, as the scale is): a Gemma 2 call with any cap finds the capped winners, a call
/// without one the plain ones; through the dispatcher it matches the reference.
#[test]
fn a_softcap_decides_selection_and_its_value_does_not() {
    let plain = "paged:num_seqs=8,context_len=4096,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16";
    let capped = format!("{plain},softcap=50");
    two_winners(&capped, plain, |d, a, b| {
        let sel = |s: &str| sel(d, s);
        assert_eq!(sel(&capped), (Match::Exact, a));
        assert_eq!(sel(&format!("{plain},softcap=30")), (Match::Exact, a));
        assert_eq!(sel(plain), (Match::Exact, b));
        let call = "paged:num_seqs=3,context_len=3000,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16,softcap=0.5";
        assert_eq!(sel(call).1, a);
        paged_call_matches_reference(d, call);
    });
}

/// A paged call of `spec` through `d` matches the reference; returns its data.
fn paged_call_matches_reference(d: &Dispatcher, spec: &str) -> ProblemData {
    let call: Problem = spec.parse().unwrap();
    let mut data = ProblemData::random(&call, 3);
    let reference = data.reference();
    let Args::Paged(args) = data.args() else {
        unreachable!("a paged problem")
    };
    d.paged_attention(&call, args).unwrap();
    let err = relative_error(&data.out, &reference);
    assert!(err <= call.tolerance(), "{err:e}");
    data
}

/// What a paged cache holds is a static dimension: a call on an fp8 cache finds the winners
/// tuned for its format, a call on a bf16 cache the plain ones, another fp8 format neither;
/// through the dispatcher, with the cache's scales, it matches the reference, and a call
/// whose scales are not positive is refused by name.
#[test]
fn an_fp8_cache_decides_selection_and_its_scales_reach_the_output() {
    let plain = "paged:num_seqs=8,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16";
    let fp8 = format!("{plain},kv_dtype=fp8_e4m3");
    two_winners(&fp8, plain, |d, a, b| {
        let sel = |s: &str| sel(d, s);
        assert_eq!(sel(&fp8), (Match::Exact, a));
        assert_eq!(sel(plain), (Match::Exact, b));
        assert_eq!(sel(&format!("{plain},kv_dtype=fp8_e5m2")).0, Match::Default);
        let call = "paged:num_seqs=3,context_len=3000,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,kv_dtype=fp8_e4m3";
        assert_eq!(sel(call).1, a);
        let mut data = paged_call_matches_reference(d, call);
        data.kv_scales.v = -1.0;
        let Args::Paged(args) = data.args() else {
            unreachable!("a paged problem")
        };
        let e = d.paged_attention(&call.parse().unwrap(), args).unwrap_err();
        assert!(e.to_string().contains("v_scale"), "{e}");
    });
}

/// An fp8 GEMM's format is a static dimension: a W8A8 call finds the winners tuned in its
/// format, a bf16 call the bf16 ones, another fp8 format neither; through the dispatcher,
/// with per-token and per-channel scales (and per-tensor ones), it matches the reference,
/// and a call with scales missing or of the wrong count is refused by name.
#[test]
fn an_fp8_gemm_decides_selection_and_its_scales_reach_the_output() {
    let plain = "gemm:m=4,n=1280,k=8192,dtype=bf16,b=nk";
    let fp8 = "gemm:m=4,n=1280,k=8192,dtype=fp8_e4m3,b=nk";
    two_winners(fp8, plain, |d, a, b| {
        let sel = |s: &str| sel(d, s);
        assert_eq!(sel(fp8), (Match::Exact, a));
        assert_eq!(sel(plain), (Match::Exact, b));
        assert_eq!(
            sel("gemm:m=4,n=1280,k=8192,dtype=fp8_e5m2,b=nk").0,
            Match::Default
        );
        let call: Problem = "gemm:m=3,n=1280,k=8192,dtype=fp8_e4m3,b=nk"
            .parse()
            .unwrap();
        assert_eq!(sel(&call.key()).1, a);
        let mut data = ProblemData::random(&call, 3);
        let reference = data.reference();
        let Args::Gemm(args) = data.args() else {
            unreachable!("a GEMM")
        };
        d.gemm(&call, args).unwrap();
        let err = relative_error(&data.out, &reference);
        assert!(err <= call.tolerance(), "{err:e}");
        // One scale for each tensor: every output is that product times the per-row
        // and per-column one's, divided out.
        let per_row = data.out.clone();
        let (sa, sb) = (data.a_scales.clone(), data.b_scales.clone());
        data.a_scales = vec![0.5];
        data.b_scales = vec![0.25];
        let Args::Gemm(args) = data.args() else {
            unreachable!("a GEMM")
        };
        d.gemm(&call, args).unwrap();
        for (at, (&got, &want)) in data.out.iter().zip(&per_row).enumerate() {
            let (i, j) = (at / 1280, at % 1280);
            let want = want / (sa[i] * sb[j]) * 0.125;
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                "C[{i}][{j}] {got} {want}"
            );
        }
        for (a_scales, name) in [(vec![], "a_scales"), (vec![1.0; 2], "a_scales")] {
            data.a_scales = a_scales;
            let Args::Gemm(args) = data.args() else {
                unreachable!("a GEMM")
            };
            let e = d.gemm(&call, args).unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
        }
    });
}

/// A latent cache's value width is a static dimension: a DeepSeek decode call finds the
/// winners tuned on its latent cache, a call on the same rows as keys and values the plain
/// ones; through the dispatcher a bucketed latent call matches the reference.
#[test]
fn a_latent_cache_decides_selection() {
    let plain = "paged:num_seqs=8,context_len=4096,q_heads=16,kv_heads=1,head_dim=576,dtype=bf16";
    let latent = format!("{plain},v_head_dim=512,scale=0.1352");
    two_winners(&latent, plain, |d, a, b| {
        let sel = |s: &str| sel(d, s);
        assert_eq!(sel(&latent), (Match::Exact, a));
        assert_eq!(sel(plain), (Match::Exact, b));
        assert_eq!(sel(&format!("{plain},v_head_dim=256")).0, Match::Default);
        let call = "paged:num_seqs=3,context_len=300,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,dtype=bf16,scale=0.1352";
        assert_eq!(sel(call), (Match::Bucket, a));
        paged_call_matches_reference(d, call);
    });
}

/// How wide flash attention's value heads are is a static dimension: latent attention's
/// prefill (keys of 192, values of 128) finds its own winners, the plain problem of the same
/// keys its own, another value width neither; a call of another length takes the narrow
/// problem's bucket and matches the reference through the dispatcher.
#[test]
fn narrow_value_heads_decide_selection() {
    let plain = "flash:q_len=512,kv_len=512,q_heads=16,kv_heads=16,head_dim=192,dtype=bf16";
    let narrow = format!("{plain},v_head_dim=128");
    two_winners(&narrow, plain, |d, a, b| {
        let sel = |s: &str| sel(d, s);
        assert_eq!(sel(&narrow), (Match::Exact, a));
        assert_eq!(sel(plain), (Match::Exact, b));
        assert_eq!(sel(&format!("{plain},v_head_dim=64")).0, Match::Default);
        let spec = "flash:q_len=300,kv_len=300,q_heads=16,kv_heads=16,head_dim=192,v_head_dim=128,dtype=bf16";
        assert_eq!(sel(spec), (Match::Bucket, a));
        let call: Problem = spec.parse().unwrap();
        let mut data = ProblemData::random(&call, 3);
        let reference = data.reference();
        let Args::Flash(args) = data.args() else {
            unreachable!("a flash problem")
        };
        d.flash_attention(&call, args).unwrap();
        let err = relative_error(&data.out, &reference);
        assert!(err <= call.tolerance(), "{err:e}");
    });
}

#[test]
fn hostile_and_stale_rows_are_skipped_and_counted() {
    let good = marked(2).to_json();
    let evil = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        f(&mut v);
        v.to_string()
    };
    let rows = [
        ("gemm:m=1,n=64,k=64", good.clone()),
        ("gemm:m=2,n=64,k=64", evil(&|v| v["mc"] = 0.into())),
        ("gemm:m=3,n=64,k=64", evil(&|v| v["kc"] = (-5).into())),
        ("gemm:m=4,n=64,k=64", evil(&|v| v["nc"] = u64::MAX.into())),
        (
            "gemm:m=5,n=64,k=64",
            evil(&|v| v["variant"] = "turbo".into()),
        ),
        (
            "gemm:m=6,n=64,k=64",
            evil(&|v| v["threads"] = 100_000.into()),
        ),
        ("gemm:m=7,n=64,k=64", "not json at all".into()),
        (
            "gemm:m=8,n=64,k=64",
            r#"{"family":"paged","isa":"portable","partition":0,"group_heads":false,"threads":1}"#
                .into(),
        ),
    ];
    both_paths(&rows, |path, finish| {
        craft(
            path,
            &[("gemm:m=9,n=64,k=64", good.clone())],
            "0000000000000000",
            finish,
        );
        hostile(path);
    });
}

#[test]
fn a_snapshot_is_never_stale_and_a_broken_one_falls_back_to_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.db");
    craft(
        &path,
        &[("gemm:m=1,n=64,k=64", marked(2).to_json())],
        CPU_SOURCE_HASH,
        true,
    );
    assert_eq!(Dispatcher::open(&path).stats().loaded, 1);
    // A run killed before it finished: its winner drops the snapshot, so nothing is missed.
    craft(
        &path,
        &[("gemm:m=2,n=64,k=64", marked(3).to_json())],
        CPU_SOURCE_HASH,
        false,
    );
    let d = Dispatcher::open(&path);
    assert_eq!(d.stats().loaded, 2);
    assert_eq!(
        d.select(&"gemm:m=2,n=64,k=64".parse().unwrap()).config,
        marked(3)
    );
    // A finished run rebuilds it; a body damaged by hand is ignored in favour of the rows.
    craft(
        &path,
        &[("gemm:m=3,n=64,k=64", marked(4).to_json())],
        CPU_SOURCE_HASH,
        true,
    );
    let status = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); \
             n=c.execute(\"UPDATE winner_snapshots SET body=x'7b2262726f6b656e'\").rowcount; \
             c.commit(); sys.exit(0 if n == 1 else 1)",
        )
        .arg(&path)
        .status()
        .expect("python3 with sqlite3 is available");
    assert!(status.success());
    let d = Dispatcher::open(&path);
    assert_eq!(d.stats().loaded, 3);
    assert!(d.note().is_none());
}

fn hostile(path: &Path) {
    let d = Dispatcher::open(path);
    let s = d.stats();
    assert_eq!((s.loaded, s.rejected, s.stale), (1, 7, 1));
    // A rejected row's problem falls back to a valid config and still computes correctly.
    for m in 1..=9 {
        let p: Problem = format!("gemm:m={m},n=64,k=64").parse().unwrap();
        let mut data = ProblemData::random(&p, 2);
        let reference = data.reference();
        let Args::Gemm(args) = data.args() else {
            unreachable!()
        };
        d.gemm(&p, args).unwrap();
        assert!(relative_error(&data.out, &reference) < 1e-4);
    }
}

#[test]
fn missing_or_corrupt_database_runs_on_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let d = Dispatcher::open(dir.path().join("absent.db"));
    assert!(d.note().unwrap().contains("no tuning database"));
    let junk = dir.path().join("junk.db");
    std::fs::write(
        &junk,
        b"this is not a database, just some bytes that are long enough....",
    )
    .unwrap();
    let d = Dispatcher::open(&junk);
    assert!(d.note().unwrap().contains("unreadable"), "{:?}", d.note());
    assert_eq!(
        d.select(&"gemm:m=1,n=8,k=8".parse().unwrap()).matched,
        Match::Default
    );
}

#[tokio::test]
async fn opens_inside_a_tokio_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.db");
    let db = Db::open(&path).await.unwrap();
    db.close().await;
    let d = Dispatcher::open(&path);
    assert!(d.note().is_none());
    d.reload().unwrap();
}

#[test]
fn eight_threads_dispatch_correctly_through_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.db");
    craft(
        &path,
        &[("gemm:m=5,n=40,k=33", marked(2).to_json())],
        CPU_SOURCE_HASH,
        true,
    );
    let d = Arc::new(Dispatcher::open(&path));
    let stop = Arc::new(AtomicBool::new(false));
    let problems: Vec<Problem> = [
        "gemm:m=5,n=40,k=33",
        "gemm:m=3,n=40,k=33",
        "flash:q_len=9,q_heads=4,kv_heads=2,head_dim=32",
        "paged:num_seqs=2,context_len=50,q_heads=4,kv_heads=1,head_dim=32,block_size=8",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let workers: Vec<_> = (0..8)
        .map(|t| {
            let (d, stop, problems) = (d.clone(), stop.clone(), problems.clone());
            std::thread::spawn(move || {
                let mut calls = 0;
                while !stop.load(Ordering::Relaxed) || calls < 20 {
                    let p = &problems[(t + calls) % problems.len()];
                    let mut data = ProblemData::random(p, calls as u64);
                    let reference = data.reference();
                    match data.args() {
                        Args::Gemm(a) => d.gemm(p, a),
                        Args::Flash(a) => d.flash_attention(p, a),
                        Args::Paged(a) => d.paged_attention(p, a),
                    }
                    .unwrap();
                    let err = relative_error(&data.out, &reference);
                    assert!(err < p.tolerance(), "{p}: {err}");
                    calls += 1;
                }
                calls
            })
        })
        .collect();
    for i in 0..10 {
        // Alternate the stored winner while the workers run.
        craft(
            &path,
            &[("gemm:m=5,n=40,k=33", marked(2 + i % 2).to_json())],
            CPU_SOURCE_HASH,
            i % 3 != 0,
        );
        d.reload().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let total: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(total >= 160);
    assert_eq!(d.select(&problems[0]).config, marked(3));
}

#[tokio::test]
async fn a_database_written_by_tune_is_used_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.db");
    let device = Device::host();
    let problems: Vec<kerntune_tuner::shapes::Derived> = [
        "gemm:m=4,n=48,k=40",
        "paged:num_seqs=2,context_len=40,q_heads=4,kv_heads=2,head_dim=32,block_size=8",
    ]
    .iter()
    .map(|s| kerntune_tuner::shapes::Derived {
        problem: s.parse().unwrap(),
        origin: "test".into(),
    })
    .collect();
    let db = Db::open(&path).await.unwrap();
    let job = kerntune_tuner::tune::Job {
        db: &db,
        device: &device,
        strategy: kerntune_tuner::search::Strategy::Random,
        budget: std::time::Duration::from_millis(300),
        total_budget: std::time::Duration::from_secs(60),
        max_configs: 8,
        retune: false,
        policy: kerntune_tuner::measure::Policy {
            min_reps: 3,
            max_reps: 3,
            rotate_bytes: 0,
            ..Default::default()
        },
        command_line: "test".into(),
        progress: kerntune_tuner::progress::Progress::Quiet,
        stop: &AtomicBool::new(false),
    };
    let mut cpu = kerntune_tuner::tune::CpuSweep::new(&kerntune_kernels::CpuBackend, &CpuSpace);
    kerntune_tuner::tune::run(&job, &mut cpu, &problems)
        .await
        .unwrap();
    let winners = db.winners(None).await.unwrap();
    db.close().await;
    let d = Dispatcher::open(&path);
    assert_eq!(d.stats().loaded, 2);
    for (derived, w) in problems.iter().zip(&winners) {
        let p = derived.problem;
        let sel = d.select(&p);
        assert_eq!(sel.matched, Match::Exact);
        let stored = winners.iter().find(|r| r.problem == p.key()).unwrap_or(w);
        assert_eq!(sel.config, Config::from_json(&stored.config).unwrap());
        let mut data = ProblemData::random(&p, 9);
        let reference = data.reference();
        match data.args() {
            Args::Gemm(a) => d.gemm(&p, a),
            Args::Paged(a) => d.paged_attention(&p, a),
            Args::Flash(a) => d.flash_attention(&p, a),
        }
        .unwrap();
        assert!(relative_error(&data.out, &reference) < 1e-3);
    }
}

/// A GEMM's scale blocks are a static dimension: a block-scaled call finds the winners tuned
/// block-scaled (whose kernels apply the scales inside each group of k), a per-channel call
/// the per-channel ones, and neither the other's; a block-scaled call past the tuned tokens
/// still runs its stream winner (any M there), and through the dispatcher each matches the
/// reference; per-channel scales on a block-scaled call are refused by name.
#[test]
fn scale_blocks_decide_selection() {
    let plain = "gemm:m=4,n=1280,k=8192,dtype=fp8_e4m3,b=nk";
    let blocked = format!("{plain},block=128");
    two_winners(&blocked, plain, |d, a, b| {
        let sel = |s: &str| sel(d, s);
        assert_eq!(sel(&blocked), (Match::Exact, a));
        assert_eq!(sel(plain), (Match::Exact, b));
        assert_eq!(sel(&format!("{plain},block=64")).0, Match::Default);
        for (m, matched) in [(3, Match::Bucket), (40, Match::Nearest)] {
            let call: Problem = format!("gemm:m={m},n=1280,k=8192,dtype=fp8_e4m3,b=nk,block=128")
                .parse()
                .unwrap();
            assert_eq!(sel(&call.key()), (matched, a));
            let mut data = ProblemData::random(&call, 3);
            let reference = data.reference();
            let Args::Gemm(args) = data.args() else {
                unreachable!("a GEMM")
            };
            assert_eq!(d.gemm(&call, args).unwrap(), matched);
            let err = relative_error(&data.out, &reference);
            assert!(err <= call.tolerance(), "{call}: {err:e}");
            data.b_scales = vec![1.0; 1280];
            let Args::Gemm(args) = data.args() else {
                unreachable!("a GEMM")
            };
            let e = d.gemm(&call, args).unwrap_err();
            assert!(e.to_string().contains("b_scales"), "{e}");
        }
    });
}
