//! How long work reports its progress on standard error: bars redrawn in place on a terminal,
//! plain lines where a bar would print nothing (a log file, `nohup`, a CI job, `kubectl
//! logs`), nothing where the caller reports for itself; and the units times and rates are
//! shown in.

use std::fmt::Display;
use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The three ways of showing progress.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Progress {
    /// indicatif's bars, redrawn in place.
    Bars,
    /// A line for each finished step that takes seconds (a problem tuned, a compile phase).
    Lines,
    /// Nothing.
    #[default]
    Quiet,
}

impl Progress {
    /// Bars on a terminal, lines elsewhere; nothing with `--json`, whose readers may take
    /// standard error with standard output (`2>&1 | jq`).
    pub fn for_stderr(json: bool) -> Progress {
        match (json, std::io::stderr().is_terminal()) {
            (true, _) => Progress::Quiet,
            (false, true) => Progress::Bars,
            (false, false) => Progress::Lines,
        }
    }

    /// A bar of `len` steps drawn with `template`, hidden unless this is [`Progress::Bars`].
    pub fn bar(self, len: u64, template: &str) -> ProgressBar {
        let bar = ProgressBar::new(len);
        if self == Progress::Bars {
            bar.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
        } else {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        bar
    }

    /// Writes `line` on standard error if this is [`Progress::Lines`].
    pub fn line(self, line: impl Display) {
        if self == Progress::Lines {
            eprintln!("{line}");
        }
    }
}

/// A median as the summary shows it.
pub fn fmt_time(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.1} us", ns / 1e3)
    }
}

/// A throughput in `unit` (`B/s` or FLOP/s) as the summary shows it.
pub fn fmt_rate(v: f64, unit: &str) -> String {
    match unit {
        "B/s" => format!("{:.1} GB/s", v / 1e9),
        _ => format!("{:.1} GF/s", v / 1e9),
    }
}
