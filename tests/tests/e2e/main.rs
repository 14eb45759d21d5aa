//! kerntune's end-to-end tests, one test binary: each module used to be a binary of its own,
//! and each linked the kernels, the tuner, the database and the runtime again (about a minute
//! and a half of a CI run between them). The interrupted-run test keeps its own binary
//! (`tests/tests/resume.rs`): the stop flag it raises is process-wide.

mod cold_timing;
mod final_round;
mod gpu_sweep;
mod races;
mod sharing;
mod tune_run;
