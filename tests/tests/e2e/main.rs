//! kerntune's end-to-end tests, one test binary: each module used to be a binary of its own,
//! and each linked the kernels, the tuner, the database and the runtime again (about a minute
//! and a half of a CI run between them).

mod cold_timing;
mod final_round;
mod gpu_sweep;
mod races;
mod resume;
mod sharing;
mod tune_run;
