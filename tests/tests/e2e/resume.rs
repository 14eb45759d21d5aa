//! A run stopped in the middle (as by Ctrl-C) keeps what it finished and resumes without
//! redoing it.

use std::sync::atomic::{AtomicBool, Ordering};

use kerntune_db::Db;
use kerntune_e2e::{cpu, job, small_problems};
use kerntune_kernels::kernel::Args;
use kerntune_kernels::{Backend, Config, CpuBackend, CpuSpace, Device, KernelError, Problem};
use kerntune_tuner::tune::{self, Job};
use kerntune_tuner::TuneError;

/// Raises the job's stop flag once a flash problem starts, as a Ctrl-C in the middle would.
#[derive(Debug)]
struct StopAtFlash<'a> {
    stop: &'a AtomicBool,
}

impl Backend for StopAtFlash<'_> {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn scratch_len(&self, p: &Problem, c: &Config) -> usize {
        CpuBackend.scratch_len(p, c)
    }
    fn run(&self, p: &Problem, c: &Config, a: Args<'_>, s: &mut [f32]) -> Result<(), KernelError> {
        if matches!(p, Problem::Flash(_)) {
            self.stop.store(true, Ordering::SeqCst);
        }
        CpuBackend.run(p, c, a, s)
    }
}

#[tokio::test]
async fn interrupted_run_resumes_without_redoing_finished_problems() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("k.db")).await.unwrap();
    let device = Device::host();
    let problems = small_problems(); // gemm, gemm, flash, paged
    let stop = AtomicBool::new(false);
    let stopper = StopAtFlash { stop: &stop };
    let stopped = Job {
        stop: &stop,
        ..job(&db, &device)
    };
    let err = tune::run(&stopped, &mut cpu(&stopper, &CpuSpace), &problems)
        .await
        .unwrap_err();
    assert!(
        matches!(err, TuneError::Interrupted { done: 2, left: 2 }),
        "{err}"
    );
    assert_eq!(
        db.winners(None).await.unwrap().len(),
        2,
        "the two GEMMs were committed"
    );
    assert!(
        db.measurements(&problems[2].problem.key())
            .await
            .unwrap()
            .is_empty(),
        "the interrupted problem left nothing behind"
    );
    let out = tune::run(
        &job(&db, &device),
        &mut cpu(&CpuBackend, &CpuSpace),
        &problems,
    )
    .await
    .unwrap();
    let status: Vec<&str> = out.iter().map(|o| o.status.as_str()).collect();
    assert_eq!(status, ["skipped", "skipped", "tuned", "tuned"]);
    assert_eq!(db.winners(None).await.unwrap().len(), 4);
    let runs = db.runs().await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(),
        ["interrupted", "done"]
    );
}
