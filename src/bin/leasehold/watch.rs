//! `--watch` of `status` and `list`: the same output again every interval, until a signal.
//!
//! # Design
//!
//! - **One registry** (one connection) for the whole watch; each refresh is the queries of one
//!   run without `--watch`, and the header shows the database clock of that refresh.
//! - **The interval** counts from the start of one refresh to the start of the next; a
//!   refresh slower than the interval is followed by the next at once.
//! - **Three ways to show it**, chosen once: on a terminal (and without `--json`) the screen is
//!   redrawn in place like watch(1) — cursor home, each line cleared to its end, the rest of
//!   the screen cleared — so nothing flickers and the last refresh stays on the screen after
//!   the end; lines are cut to the terminal's width and rows beyond its height are counted in
//!   a last line. To a pipe or a file every refresh is appended after its header line and
//!   followed by an empty line. With `--json` each refresh is the JSON of one run on one line
//!   (JSON Lines), without a header.
//! - **Failures**: a failure of the first refresh ends the watch with its exit code (a wrong
//!   URL or a missing table is not something to watch). A later one — the database restarting,
//!   a network break — is shown (on the screen, else on stderr) and the next refresh tries
//!   again.
//! - **The end**: SIGINT, SIGTERM and SIGHUP are caught by a thread that hands them to the
//!   main thread, which waits for the next refresh on that channel: the watch ends at once
//!   between refreshes (exit 0). A refresh stuck on the database cannot look at the channel;
//!   a second signal while the first is still waiting there ends leasehold at once, with
//!   128 + the signal's number. A reader that went away (a closed pipe: `| head`) ends the
//!   watch with 0 too.

use crate::exit::{self, Failure};
use leasehold::crossbeam_channel::{self, RecvTimeoutError};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, SystemTime};

/// One refresh: what a run without `--watch` prints, and the database clock when it ran.
pub struct Frame {
    pub text: String,
    pub at: SystemTime,
}

/// How a watch shows its refreshes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Display {
    /// Redrawn in place on a terminal.
    Screen,
    /// Appended, each after a header line.
    Appended,
    /// One JSON document per line.
    JsonLines,
}

/// Shows `refresh()` every `every` until a signal; the header names the command (`list`,
/// `status KEY`) and `registry`'s table and region. Returns the exit code.
pub fn watch(
    every: Duration,
    command: &str,
    registry: &leasehold::LockRegistry,
    json: bool,
    mut refresh: impl FnMut() -> Result<Frame, Failure>,
) -> Result<u8, Failure> {
    let display = if json {
        Display::JsonLines
    } else if std::io::stdout().is_terminal() {
        Display::Screen
    } else {
        Display::Appended
    };
    let stop = stop_on_signals()?;
    let interval = humantime::format_duration(every).to_string();
    let title = format!(
        "{command}, table {}, region {}",
        registry.table(),
        registry.region()
    );
    let mut first = true;
    loop {
        let started = Instant::now();
        let shown = match refresh() {
            Ok(frame) => {
                let clock = humantime::format_rfc3339_millis(frame.at);
                let header =
                    format!("Every {interval} at {clock} (database clock): leasehold {title}");
                match display {
                    Display::JsonLines => frame.text,
                    Display::Appended => format!("{header}\n{}\n", frame.text),
                    Display::Screen => screen(&header, &frame.text),
                }
            }
            Err(failure) if first => return Err(failure),
            Err(failure) => {
                let clock = humantime::format_rfc3339_millis(SystemTime::now());
                let line = format!(
                    "leasehold: {} (at {clock}, this host's clock; trying again in {interval})",
                    failure.message
                );
                if display == Display::Screen {
                    screen(&format!("Every {interval}: leasehold {title}"), &line)
                } else {
                    eprintln!("{line}");
                    String::new()
                }
            }
        };
        first = false;
        let mut out = std::io::stdout().lock();
        if out
            .write_all(shown.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            // Nobody reads any more.
            return Ok(0);
        }
        drop(out);
        match stop.recv_timeout((started + every).saturating_duration_since(Instant::now())) {
            Ok(_) => return Ok(0),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Failure::new(exit::ERROR, "the signal thread ended"))
            }
        }
    }
}

/// A channel that receives SIGINT, SIGTERM and SIGHUP; from the call on they no longer end
/// leasehold, unless one arrives while the one before is still unread (see the module docs).
fn stop_on_signals() -> Result<crossbeam_channel::Receiver<i32>, Failure> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut caught = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| Failure::new(exit::ERROR, format!("cannot catch signals: {e}")))?;
    let (tell, told) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("leasehold-watch-signals".into())
        .spawn(move || {
            for signal in caught.forever() {
                if tell.try_send(signal).is_err() {
                    std::process::exit(128 + signal);
                }
            }
        })
        .map_err(|e| Failure::new(exit::ERROR, format!("cannot start a thread: {e}")))?;
    Ok(told)
}

/// The escape sequences that redraw the screen with `header`, an empty line and `text`, fitted
/// to the terminal.
fn screen(header: &str, text: &str) -> String {
    let (rows, columns) = terminal_size().unwrap_or((24, 80));
    let lines: Vec<&str> = [header, ""].into_iter().chain(text.lines()).collect();
    // The cursor stays on the line after the last, which must not scroll the screen.
    let room = rows.saturating_sub(1).max(3);
    let (shown, hidden) = if lines.len() > room {
        (&lines[..room - 1], lines.len() - (room - 1))
    } else {
        (&lines[..], 0)
    };
    let mut out = String::from("\x1b[H");
    let mut put = |line: &str| {
        out.extend(line.chars().take(columns));
        out.push_str("\x1b[K\n");
    };
    for line in shown {
        put(line);
    }
    if hidden > 0 {
        put(&format!(
            "… {hidden} more lines (a taller terminal, --holder, or --json shows them)"
        ));
    }
    out.push_str("\x1b[J");
    out
}

/// The terminal's rows and columns (TIOCGWINSZ on standard output), when it says.
#[allow(unsafe_code)]
fn terminal_size() -> Option<(usize, usize)> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct it is given.
    let got = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (got == 0 && size.ws_row > 0 && size.ws_col > 0)
        .then_some((usize::from(size.ws_row), usize::from(size.ws_col)))
}
