//! The tuner end to end on the CPU: tune, reopen, read back, skip on rerun, and record
//! failures as data.

use kerntune_db::Db;
use kerntune_e2e::{
    cpu, job, panicking_config, small_problems, wrong_config, FakeBackend, FakeSpace,
};
use kerntune_kernels::{Config, CpuBackend, CpuSpace, Device};
use kerntune_tuner::tune;

#[tokio::test]
async fn tunes_every_family_then_skips_on_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.db");
    let device = Device::host();
    let problems = small_problems();
    {
        let db = Db::open(&path).await.unwrap();
        let out = tune::run(
            &job(&db, &device),
            &mut cpu(&CpuBackend, &CpuSpace),
            &problems,
        )
        .await
        .unwrap();
        assert!(out.iter().all(|o| o.status == "tuned"), "{out:#?}");
        assert!(
            out.iter().all(|o| o.speedup.is_some_and(|s| s >= 1.0)),
            "winner slower than default: {out:#?}"
        );
        db.close().await;
    }
    let db = Db::open_existing(&path).await.unwrap();
    let winners = db.winners(Some(&device.identity())).await.unwrap();
    assert_eq!(winners.len(), problems.len());
    for d in &problems {
        let w = winners
            .iter()
            .find(|w| w.problem == d.problem.key())
            .expect("winner stored");
        let config = Config::from_json(&w.config).unwrap();
        assert!(kerntune_kernels::Space::validate(&CpuSpace, &config, &d.problem, &device).is_ok());
        assert_eq!(w.source_hash, kerntune_kernels::CPU_SOURCE_HASH);
    }
    let again = tune::run(
        &job(&db, &device),
        &mut cpu(&CpuBackend, &CpuSpace),
        &problems,
    )
    .await
    .unwrap();
    assert!(again.iter().all(|o| o.status == "skipped"), "{again:#?}");
    let runs = db.runs().await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(),
        ["done", "done"]
    );
    assert!(db.integrity_problems().await.unwrap().is_empty());
}

#[tokio::test]
async fn wrong_and_panicking_candidates_are_recorded_and_never_win() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("k.db")).await.unwrap();
    let device = Device::host();
    let problems = &small_problems()[..1];
    let out = tune::run(
        &job(&db, &device),
        &mut cpu(&FakeBackend, &FakeSpace),
        problems,
    )
    .await
    .unwrap();
    assert_eq!(out[0].status, "tuned");
    assert_eq!(out[0].failed, 2, "{out:#?}");
    let key = problems[0].problem.key();
    let rows = db.measurements(&key).await.unwrap();
    let find = |c: &Config| {
        rows.iter()
            .find(|r| r.0 == c.to_json())
            .cloned()
            .expect("measured")
    };
    let wrong = find(&wrong_config());
    assert_eq!(wrong.1, "failed_verification");
    assert!(wrong.3.unwrap().contains("exceeds"));
    let crashed = find(&panicking_config());
    assert_eq!(crashed.1, "error");
    assert!(crashed.3.unwrap().contains("the fake kernel crashed"));
    let winners = db.winners(None).await.unwrap();
    assert_eq!(winners.len(), 1);
    assert_ne!(winners[0].config, wrong_config().to_json());
    assert_ne!(winners[0].config, panicking_config().to_json());
}

/// A decode problem on an fp8 cache, end to end beside the same shape on a bf16 cache: both
/// tuned on the CPU (every candidate verified on the fp8 bytes and their scales), stored
/// under keys of their own, exported and imported into a colleague's database, where the
/// runtime selects each one's own winner and serves an fp8 call that matches the reference.
#[tokio::test]
async fn an_fp8_cache_problem_is_tuned_shared_and_served_apart() {
    let plain = "paged:num_seqs=3,context_len=300,q_heads=8,kv_heads=2,head_dim=64,dtype=bf16";
    tuned_shared_and_served_apart(plain, &format!("{plain},kv_dtype=fp8_e4m3")).await;
}

/// A latent-cache decode problem (DeepSeek's 576-value rows, 512-value values) and the same
/// rows as plain keys and values go the same way: two winners, exported and imported, each
/// served its own, the latent call matching the reference through the dispatcher.
#[tokio::test]
async fn a_latent_cache_problem_is_tuned_shared_and_served_apart() {
    let plain = "paged:num_seqs=2,context_len=200,q_heads=16,kv_heads=1,head_dim=576,dtype=bf16";
    tuned_shared_and_served_apart(plain, &format!("{plain},v_head_dim=512,scale=0.1352")).await;
}

/// Latent attention's prefill (DeepSeek's keys of 192, values of 128) and the plain problem
/// of its keys likewise.
#[tokio::test]
async fn a_narrow_value_prefill_is_tuned_shared_and_served_apart() {
    let plain = "flash:q_len=40,kv_len=40,q_heads=2,kv_heads=2,head_dim=192,dtype=bf16";
    tuned_shared_and_served_apart(plain, &format!("{plain},v_head_dim=128")).await;
}

/// An FP8 checkpoint's GEMM (W8A8, scales per token and per channel) beside the same shape in
/// bf16: both tuned on the CPU (every fp8 candidate verified on the bytes and their scales),
/// shared, each served its own winner, the fp8 call matching the reference.
#[tokio::test]
async fn an_fp8_gemm_is_tuned_shared_and_served_apart() {
    tuned_shared_and_served_apart(
        "gemm:m=24,n=96,k=160,dtype=bf16,b=nk",
        "gemm:m=24,n=96,k=160,dtype=fp8_e4m3,b=nk",
    )
    .await;
}

/// A block-scaled FP8 checkpoint's GEMM (DeepSeek-V3's scheme, blocks of 128 here over 12
/// tokens: the stream kernel and, on AMX hosts, amx-direct in slices of whole blocks) beside
/// the same shape scaled per channel: both tuned, shared, each served its own winner, the
/// block-scaled call matching the reference.
#[tokio::test]
async fn a_block_scaled_fp8_gemm_is_tuned_shared_and_served_apart() {
    tuned_shared_and_served_apart(
        "gemm:m=12,n=160,k=300,dtype=fp8_e4m3,b=nk",
        "gemm:m=12,n=160,k=300,dtype=fp8_e4m3,b=nk,block=128",
    )
    .await;
}

/// A 4-bit checkpoint's GEMM (W4A16, GPTQ's packing, groups of 64 over 5 tokens) beside the
/// same shape in f16: both tuned (every int4 candidate verified on the words, scales and zero
/// points), shared, each served its own winner, the int4 call matching the reference.
#[tokio::test]
async fn an_int4_gemm_is_tuned_shared_and_served_apart() {
    tuned_shared_and_served_apart(
        "gemm:m=5,n=100,k=192,dtype=f16,b=kn",
        "gemm:m=5,n=100,k=192,dtype=f16,b=kn,int4=64",
    )
    .await;
}

/// Tunes `plain` and `other` into one database on the CPU, exports its winners and imports
/// them into another, and checks each problem is served its own winner there, and that a
/// call of `other` through the dispatcher matches the reference.
async fn tuned_shared_and_served_apart(plain: &str, other: &str) {
    use kerntune::{Dispatcher, Match};
    use kerntune_kernels::data::ProblemData;
    use kerntune_kernels::kernel::Args;
    use kerntune_kernels::reference::relative_error;
    use kerntune_tuner::shapes::Derived;
    use kerntune_tuner::share::{self, format::Format};

    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let export = dir.path().join("winners.jsonl");
    let device = Device::host();
    let problems: Vec<Derived> = [plain, other]
        .iter()
        .map(|s| Derived {
            problem: s.parse().unwrap(),
            origin: "test".into(),
        })
        .collect();
    let db = Db::open(&a).await.unwrap();
    let out = tune::run(
        &job(&db, &device),
        &mut cpu(&CpuBackend, &CpuSpace),
        &problems,
    )
    .await
    .unwrap();
    assert!(out.iter().all(|o| o.status == "tuned"), "{out:#?}");
    let winners = db.winners(Some(&device.identity())).await.unwrap();
    assert_eq!(winners.len(), 2);
    let other_key = problems[1].problem.key();
    assert!(winners.iter().any(|w| w.problem == other_key));
    db.close().await;
    share::export(&a, None, false, Format::Jsonl, &export)
        .await
        .unwrap();
    let report = share::import(&b, &export, kerntune_db::Prefer::Best, true)
        .await
        .unwrap();
    assert!(report.rejected.is_empty(), "{:?}", report.rejected);

    let d = Dispatcher::open(&b);
    for (p, w) in problems.iter().map(|p| {
        let key = p.problem.key();
        (
            p.problem,
            winners.iter().find(|w| w.problem == key).unwrap(),
        )
    }) {
        let sel = d.select(&p);
        assert_eq!(sel.matched, Match::Exact, "{p}");
        assert_eq!(sel.config, Config::from_json(&w.config).unwrap(), "{p}");
    }
    let p = problems[1].problem;
    let mut data = ProblemData::random(&p, 7);
    let reference = data.reference();
    let how = match data.args() {
        Args::Paged(args) => d.paged_attention(&p, args).unwrap(),
        Args::Flash(args) => d.flash_attention(&p, args).unwrap(),
        Args::Gemm(args) => d.gemm(&p, args).unwrap(),
    };
    assert_eq!(how, Match::Exact);
    let err = relative_error(&data.out, &reference);
    assert!(err <= p.tolerance(), "{err:e}");
}
