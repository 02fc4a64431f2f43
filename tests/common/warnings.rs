//! The warnings a test binary logs, kept for the tests that look for one.

use std::sync::Mutex;

static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Keeper;

impl log::Log for Keeper {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            SEEN.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(record.args().to_string());
        }
    }
    fn flush(&self) {}
}

/// Starts keeping warnings (once per binary).
pub fn keep() {
    if log::set_logger(&Keeper).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

/// The warnings so far that contain `text`.
pub fn containing(text: &str) -> Vec<String> {
    SEEN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|warning| warning.contains(text))
        .cloned()
        .collect()
}
