//! The runtime library serving tuned winners on an NVIDIA GPU, as a server links it: a
//! `GpuDispatcher` opened on a database that `tune --device h200` wrote, each problem's inputs
//! in the caller's device memory, the tuned kernel launched on the caller's CUDA stream, and
//! the output checked against the CPU reference. Shapes that were not tuned show the fallback:
//! the nearest tuned kernel of their class, or `NoGpuKernel` for the caller's own kernel.
//!
//! `cargo run --release -p kerntune-runtime --features cuda --example cuda_dispatch -- DB
//! DEVICE PROBLEM...` (`scripts/gpu-check.sh` runs it on the database its tuning step wrote).
//! Exits 1 when a launched kernel's output is wrong, 2 on a usage or device error.

use std::process::ExitCode;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use kerntune::{DevicePtrs, GpuDispatcher, RuntimeError};
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::{Problem, TensorBuf};
use kerntune_tuner::measure::{check_rows, Failure};

/// Device memory the example owns: inputs as raw words, tables, output, scratch.
struct OnDevice {
    _inputs: Vec<CudaSlice<u8>>,
    _tables: Vec<CudaSlice<u32>>,
    out: CudaSlice<f32>,
    _scratch: Option<CudaSlice<u8>>,
    ptrs: DevicePtrs,
    scratch: u64,
    scratch_bytes: usize,
}

fn bytes_of(t: &TensorBuf) -> Vec<u8> {
    t.view().as_bytes().to_vec()
}

fn upload(
    stream: &Arc<CudaStream>,
    data: &ProblemData,
    scratch_bytes: usize,
) -> Result<OnDevice, cudarc::driver::DriverError> {
    let addr = |p: (u64, _)| p.0;
    let inputs: Vec<CudaSlice<u8>> = data
        .inputs
        .iter()
        .map(|t| stream.memcpy_stod(&bytes_of(t)))
        .collect::<Result<_, _>>()?;
    let mut ptrs = DevicePtrs::default();
    for (slot, buf) in ptrs.inputs.iter_mut().zip(&inputs) {
        *slot = addr(buf.device_ptr(stream));
    }
    let mut tables = Vec::new();
    if !data.block_tables.is_empty() {
        tables.push(stream.memcpy_stod(&data.block_tables)?);
        tables.push(stream.memcpy_stod(&data.context_lens)?);
        ptrs.block_tables = addr(tables[0].device_ptr(stream));
        ptrs.context_lens = addr(tables[1].device_ptr(stream));
        ptrs.max_blocks_per_seq = data.max_blocks_per_seq;
    }
    let out = stream.alloc_zeros::<f32>(data.out.len())?;
    ptrs.out = addr(out.device_ptr(stream));
    let scratch = (scratch_bytes > 0)
        .then(|| stream.alloc_zeros::<u8>(scratch_bytes))
        .transpose()?;
    let scratch_addr = scratch.as_ref().map_or(0, |s| addr(s.device_ptr(stream)));
    Ok(OnDevice {
        _inputs: inputs,
        _tables: tables,
        out,
        _scratch: scratch,
        ptrs,
        scratch: scratch_addr,
        scratch_bytes,
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: cuda_dispatch DB DEVICE PROBLEM... (e.g. kerntune.db h200 gemm:m=16,n=1280,k=8192,dtype=bf16)");
        return ExitCode::from(2);
    }
    let (db, device) = (&args[0], &args[1]);
    let problems: Vec<Problem> = match args[2..].iter().map(|s| s.parse()).collect() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let gpu = match GpuDispatcher::open(db, device) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(note) = gpu.note() {
        eprintln!("note: {note}");
    }
    let s = gpu.gpu_stats();
    println!(
        "runtime on {}: {} builds loaded, {} winners without code, {} refused",
        gpu.device_name(),
        s.builds,
        s.missing,
        s.failed
    );
    // The caller's context and stream: the device's primary context, which the dispatcher's
    // loaded modules share.
    let stream = match CudaContext::new(0).map(|ctx| ctx.new_stream()) {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) | Err(e) => {
            eprintln!("error: opening the CUDA device: {e:?}");
            return ExitCode::from(2);
        }
    };
    let mut wrong = 0;
    for p in &problems {
        let data = ProblemData::random(p, 3);
        let on = match upload(&stream, &data, gpu.scratch_bytes(p)) {
            Ok(on) => on,
            Err(e) => {
                eprintln!("error: {p}: device memory: {e:?}");
                return ExitCode::from(2);
            }
        };
        let selection = gpu.select(p);
        // SAFETY: every address is this device's memory sized for `p` (inputs, tables and
        // output from its data, scratch as the dispatcher asked), and the stream is live.
        let launched = unsafe {
            gpu.launch(
                p,
                &on.ptrs,
                on.scratch,
                on.scratch_bytes,
                stream.cu_stream() as u64,
            )
        };
        match launched {
            Ok(matched) => {
                let out = match stream
                    .synchronize()
                    .and_then(|()| stream.memcpy_dtov(&on.out))
                {
                    Ok(out) => out,
                    Err(e) => {
                        eprintln!("error: {p}: the kernel failed: {e:?}");
                        return ExitCode::from(2);
                    }
                };
                let rows = data.verify_rows();
                let reference = data.reference_rows(&rows);
                let (ok, worst) = match check_rows(p, &out, data.row_len(), &rows, &reference) {
                    Ok(worst) => (true, worst),
                    Err(Failure::Wrong(worst)) => (false, worst),
                    Err(Failure::Error(e) | Failure::Lost(e)) => {
                        unreachable!("a comparison has no errors: {e}")
                    }
                };
                wrong += usize::from(!ok);
                println!(
                    "{} {matched:?} {}: relative error {worst:.1e} {}",
                    if ok { "ok   " } else { "WRONG" },
                    selection.config,
                    p.key()
                );
            }
            Err(e @ RuntimeError::NoGpuKernel { .. }) => {
                println!("none  {}: {e}", p.key());
            }
            Err(e) => {
                eprintln!("error: {p}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if wrong > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
