//! Claims: how `tune` processes sharing one database divide its problems. A problem is the
//! first claimant's while its process lives and its lease runs; recording it or finishing the
//! run releases it; a claim whose process is gone on this host, or whose lease ran out, is
//! taken over; a tuned problem is no one's to claim.

use std::str::FromStr;
use std::time::Duration;

use kerntune_db::{
    Claim, Db, DeviceRecord, KernelRecord, MeasurementRecord, ProblemRecord, ProblemResult,
    RunStatus, Stats, Status,
};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};

const LEASE: Duration = Duration::from_secs(600);

struct Setup {
    db: Db,
    device: i64,
    kernel: i64,
}

async fn setup(path: &std::path::Path) -> Setup {
    let db = Db::open(path).await.unwrap();
    let device = db
        .device_id(&DeviceRecord {
            identity: "gpu/NVIDIA H200/sm_90/132cu".into(),
            kind: "gpu".into(),
            model: "NVIDIA H200".into(),
            arch: "sm_90".into(),
            compute_units: 132,
            runtime: "CUDA 13.0".into(),
            host: "node-a".into(),
        })
        .await
        .unwrap();
    let kernel = db
        .kernel_id(&KernelRecord {
            family: "gemm".into(),
            backend: "cuda".into(),
            variant: "gpu".into(),
            source_hash: "0123456789abcdef".into(),
        })
        .await
        .unwrap();
    Setup { db, device, kernel }
}

impl Setup {
    async fn run(&self) -> i64 {
        self.db
            .begin_run("0.1.0", "tune --device h200", self.device, "node-a")
            .await
            .unwrap()
    }

    async fn claim(&self, run: i64, problem: &str, host: &str, since: Option<&str>) -> Claim {
        self.db
            .claim(run, self.device, self.kernel, problem, host, LEASE, since)
            .await
            .unwrap()
    }

    async fn record(&self, run: i64, problem: &str) {
        let measurements = [MeasurementRecord {
            config: "{\"family\":\"gpu-gemm\"}".into(),
            status: Status::Ok,
            message: None,
            error: Some(0.0),
            stats: Some(Stats {
                median_ns: 10.0,
                min_ns: 10.0,
                p20_ns: 10.0,
                p80_ns: 10.0,
                reps: 3,
                throughput: 1.0,
                unit: "FLOP/s".into(),
                cold_cache: true,
            }),
        }];
        self.db
            .record_problem(&ProblemResult {
                run_id: run,
                device_id: self.device,
                kernel_id: self.kernel,
                problem: &ProblemRecord {
                    family: "gemm".into(),
                    key: problem.into(),
                    fields: "{}".into(),
                },
                measurements: &measurements,
                winner: Some(0),
                default: Some(0),
                final_round: 0,
                tool_version: "0.1.0",
            })
            .await
            .unwrap();
    }
}

/// Runs `sql` on the file behind the library's back, as another process would.
async fn edit(path: &std::path::Path, sql: &str) {
    let mut conn = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    conn.execute(sql).await.unwrap();
    conn.close().await.unwrap();
}

/// The pid of a process that has exited.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[tokio::test]
async fn a_problem_is_its_first_claimants_until_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(&dir.path().join("c.db")).await;
    let (a, b) = (s.run().await, s.run().await);
    let p = "gemm:m=1,n=8,k=8,dtype=bf16,b=nk";
    assert_eq!(s.claim(a, p, "node-a", None).await, Claim::Ours);
    // Renewing one's own claim is allowed; another run (this process, alive) is refused.
    assert_eq!(s.claim(a, p, "node-a", None).await, Claim::Ours);
    let held = s.claim(b, p, "node-a", None).await;
    assert_eq!(
        held,
        Claim::Held {
            host: "node-a".into(),
            pid: i64::from(std::process::id())
        }
    );
    // Another problem is free.
    let q = "gemm:m=2,n=8,k=8,dtype=bf16,b=nk";
    assert_eq!(s.claim(b, q, "node-a", None).await, Claim::Ours);
    // Recorded, the problem is tuned: no one claims it, unless re-tuning since before it.
    s.record(a, p).await;
    assert_eq!(s.claim(b, p, "node-a", None).await, Claim::Tuned);
    let since = s.db.run_started_at(b).await.unwrap();
    assert_eq!(s.claim(b, p, "node-a", Some(&since)).await, Claim::Tuned);
    assert_eq!(
        s.claim(b, p, "node-a", Some("9999-01-01T00:00:00.000Z"))
            .await,
        Claim::Ours,
        "a re-tuning run that began after the winner was stored tunes it again"
    );
    // The end of a run releases what it still held.
    s.db.finish_run(b, RunStatus::Interrupted).await.unwrap();
    let c = s.run().await;
    assert_eq!(s.claim(c, q, "node-a", None).await, Claim::Ours);
    assert!(s.db.integrity_problems().await.unwrap().is_empty());
}

#[tokio::test]
async fn claims_of_processes_gone_or_past_their_lease_are_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let s = setup(&path).await;
    let (a, b) = (s.run().await, s.run().await);
    let p = "gemm:m=1,n=8,k=8,dtype=bf16,b=nk";
    assert_eq!(s.claim(a, p, "node-a", None).await, Claim::Ours);
    // Its process was killed (SIGKILL: no release): on its own host that shows at once.
    edit(&path, &format!("UPDATE claims SET pid = {}", dead_pid())).await;
    assert_eq!(s.claim(b, p, "node-a", None).await, Claim::Ours);
    // On another host the process cannot be seen: the claim holds until its lease runs out.
    edit(&path, "UPDATE claims SET host = 'node-b', run_id = 1").await;
    assert!(matches!(
        s.claim(b, p, "node-a", None).await,
        Claim::Held { host, .. } if host == "node-b"
    ));
    edit(
        &path,
        "UPDATE claims SET expires_at = '2000-01-01T00:00:00.000Z'",
    )
    .await;
    assert_eq!(s.claim(b, p, "node-a", None).await, Claim::Ours);
}
