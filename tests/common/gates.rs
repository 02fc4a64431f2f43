//! Fail-point gates (feature `failpoints`): hold a thread at a named fail point until the test
//! lets it go, and bounded waits for what the test expects to happen meanwhile. Fail points
//! are the process's: a test that uses them holds a `fail::FailScenario`.

#![cfg(feature = "failpoints")]

use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a gated test waits at most for a thread to arrive or a condition to hold.
pub const GENEROUS: Duration = Duration::from_secs(20);

/// Holds the first thread that reaches a fail point until [`Gate::open`]; later threads pass.
pub struct Gate {
    entered: Receiver<()>,
    open: Sender<()>,
}

impl Gate {
    pub fn first_at(name: &str) -> Gate {
        Gate::first_at_matching(name, || true)
    }

    /// Holds the first thread that reaches `name` while `matching()` is true for it.
    pub fn first_at_matching(
        name: &str,
        matching: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Gate {
        let (entered_tx, entered) = crossbeam_channel::unbounded();
        let (open, open_rx) = crossbeam_channel::unbounded::<()>();
        let hits = AtomicUsize::new(0);
        fail::cfg_callback(name, move || {
            if matching() && hits.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = entered_tx.send(());
                let _ = open_rx.recv_timeout(GENEROUS);
            }
        })
        .unwrap();
        Gate { entered, open }
    }

    pub fn wait_entered(&self) {
        self.entered
            .recv_timeout(GENEROUS)
            .expect("a thread reached the gate");
    }

    pub fn open(&self) {
        let _ = self.open.send(());
    }
}

/// Calls `signal` once when a thread reaches the fail point `name`.
pub fn on_reaching(name: &str, signal: Sender<()>) {
    fail::cfg_callback(name, move || {
        let _ = signal.try_send(());
    })
    .unwrap();
}

/// Polls `done` until it holds; fails the test after [`GENEROUS`].
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + GENEROUS;
    while !done() {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}
