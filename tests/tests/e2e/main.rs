//! kerntune's end-to-end tests, one test binary: each module used to be a binary of its own
//! that compiled and linked the kernels, the tuner, the database and the runtime again (about
//! two minutes of compile time between the seven, against forty seconds for this one).

mod budgets;
mod cold_timing;
mod final_round;
mod gpu_sweep;
mod races;
mod resume;
mod sharing;
mod tune_run;
