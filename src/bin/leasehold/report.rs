//! Reports on stderr: `--verbose`'s steps, and the library's warnings always (in the
//! command's words, see [`crate::exit::for_cli`]).

use std::time::SystemTime;

/// Stderr reports of `--verbose`, and the library's warnings always (as the `log` logger).
pub struct Reporter {
    pub verbose: bool,
}

impl Reporter {
    /// Says `what` with a timestamp, under `--verbose`.
    pub fn say(&self, what: std::fmt::Arguments<'_>) {
        if self.verbose {
            eprintln!(
                "{} leasehold: {what}",
                humantime::format_rfc3339_millis(SystemTime::now())
            );
        }
    }
}

impl log::Log for Reporter {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
            || (self.verbose && metadata.level() <= log::Level::Info)
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            eprintln!(
                "{} leasehold: {}: {}",
                humantime::format_rfc3339_millis(SystemTime::now()),
                record.level().as_str().to_ascii_lowercase(),
                crate::exit::for_cli(&record.args().to_string())
            );
        }
    }

    fn flush(&self) {}
}
