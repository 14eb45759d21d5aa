//! Running a compiler on a translation unit from standard input, and the first errors of a
//! compiler's log: shared by the HIP compile, NVRTC and the host emulator's C++ builds.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs `command` with `source` on its standard input, capturing its output.
pub(crate) fn run_with_input(command: &mut Command, source: &str) -> Result<Output, String> {
    let program = command.get_program().to_string_lossy().into_owned();
    // A process group of its own: Ctrl-C at a terminal signals the whole foreground group,
    // and a compiler killed by it would read as a build that does not compile, and be cached
    // as one. `tune` stops on Ctrl-C after the compiles in flight, which finish.
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(command, 0);
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let mut stdin = child.stdin.take().expect("stdin was piped");
    let source = source.to_string();
    // Written from another thread: a compiler that fails early stops reading its input.
    let writer = std::thread::spawn(move || stdin.write_all(source.as_bytes()));
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{program} failed to run: {e}"))?;
    let _ = writer.join();
    Ok(out)
}

/// The first three lines of `log` that report an error, joined; `otherwise` when none does.
pub(crate) fn first_errors(log: &str, otherwise: impl FnOnce() -> String) -> String {
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("error"))
        .take(3)
        .collect();
    if errors.is_empty() {
        otherwise()
    } else {
        errors.join("; ")
    }
}
