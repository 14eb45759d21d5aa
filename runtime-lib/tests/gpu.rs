//! The GPU dispatcher's answers on a host without the device, and a GPU dispatcher's refusal
//! of host buffers. Launching on a device is tested with a stand-in device in
//! `tests/tests/e2e/gpu_sweep.rs` (kerntune-e2e).

use std::ffi::CStr;

use kerntune::capi::{kt_last_error, KtStats, KtStatus};
use kerntune::capi_gpu::{
    kt_gpu_note, kt_gpu_reload, kt_gpu_stats, kt_gpu_write_untuned, KtGpuStats,
};
use kerntune::{Dispatcher, GpuDispatcher, RuntimeError};
use kerntune_kernels::kernel::GemmArgs;
use kerntune_kernels::{Device, KernelError, Problem, Tensor};

#[test]
fn opening_an_absent_gpu_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("none.db");
    for device in ["mi250", "MI300X", "h200"] {
        let err = GpuDispatcher::open(&db, device).unwrap_err();
        assert!(
            matches!(
                err,
                RuntimeError::Kernel(KernelError::BackendUnavailable { .. })
            ),
            "{device}: {err}"
        );
        // Without the vendor's feature the message names it; with it, what the host lacks.
        let text = err.to_string();
        assert!(
            text.contains("--features") || text.contains("libamdhip64") || text.contains("CUDA"),
            "{device}: {text}"
        );
    }
    // Any GPU of several a process sees (a tensor-parallel worker's own): the same answer.
    for ordinal in [1, 7] {
        let err = GpuDispatcher::open_on(&db, "h100", ordinal).unwrap_err();
        assert!(
            matches!(
                err,
                RuntimeError::Kernel(KernelError::BackendUnavailable { .. })
            ),
            "GPU {ordinal}: {err}"
        );
    }
    let err = GpuDispatcher::open(&db, "tpu9").unwrap_err();
    assert!(err.to_string().contains("unknown device `tpu9`"), "{err}");
    let err = GpuDispatcher::open(&db, "cpu").unwrap_err();
    assert!(err.to_string().contains("Dispatcher::open"), "{err}");
}

#[test]
fn a_gpu_dispatcher_refuses_host_buffers_and_selects_gpu_configs() {
    let dir = tempfile::tempdir().unwrap();
    let d = Dispatcher::open_for(dir.path().join("none.db"), Device::lookup("mi250").unwrap());
    let p: Problem = "gemm:m=2,n=3,k=4".parse().unwrap();
    // Untuned: the GPU space's heuristic, never a CPU config.
    assert!(d.select(&p).config.is_gpu());
    let (a, b, mut c) = (vec![1.0f32; 8], vec![1.0f32; 12], vec![0.0f32; 6]);
    let err = d
        .gemm(&p, GemmArgs::new(Tensor::F32(&a), Tensor::F32(&b), &mut c))
        .unwrap_err();
    assert!(matches!(err, RuntimeError::HostCallOnGpu { .. }), "{err}");
    assert_eq!(c, [0.0; 6], "nothing was written");
}

/// The GPU handle's C calls refuse a NULL handle by name rather than crash (a server whose
/// kt_gpu_open failed may still call them); with a handle they are checked on the stand-in
/// device in `tests/tests/e2e/gpu_sweep.rs`.
#[test]
fn gpu_c_calls_refuse_a_null_handle() {
    let null = std::ptr::null();
    let (mut stats, mut held) = (KtStats::default(), KtGpuStats::default());
    let path = c"untuned.txt";
    // SAFETY: each call is made with a NULL handle, which it must refuse.
    let answers = unsafe {
        [
            kt_gpu_stats(null, &mut stats, &mut held),
            kt_gpu_reload(null),
            kt_gpu_write_untuned(null, path.as_ptr()),
        ]
    };
    for status in answers {
        assert_eq!(status, KtStatus::InvalidArgument);
        // SAFETY: the library's own NUL-terminated message.
        let msg = unsafe { CStr::from_ptr(kt_last_error()) }.to_str().unwrap();
        assert!(msg.contains("handle is NULL"), "{msg}");
    }
    assert_eq!(held, KtGpuStats::default(), "nothing was written");
    // SAFETY: a NULL handle has no note.
    let note = unsafe { CStr::from_ptr(kt_gpu_note(null)) };
    assert_eq!(note.to_str().unwrap(), "");
    assert!(!std::path::Path::new("untuned.txt").exists());
}
