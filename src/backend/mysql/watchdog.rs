//! The backstop that holds a MySQL statement to its caller's deadline in total.
//!
//! The socket's `SO_RCVTIMEO` (module docs of `mysql`, "Deadlines") bounds each read by what
//! was left when the call began, so a server or proxy that sends an answer a few bytes at a
//! time, each within that timeout, could keep a call running long after its deadline. The
//! watchdog closes that gap: when a pooled connection's attempt gets its deadline
//! (`set_deadline`), the connection's socket is *watched*; if the attempt is still watched when
//! the deadline comes, the watchdog shuts the socket down (`shutdown(2)`, both directions),
//! which ends a blocked read or write at once, and the connection is discarded when it goes
//! back to the pool (it could be in the middle of a packet).
//!
//! Threads and locks: one thread per process (`leasehold-mysql-deadlines`), started with the
//! first watch. It runs no statement and no user code, only `shutdown(2)` (which does not
//! block), under the mutex that also guards watching and unwatching: once [`Watch::end`]
//! returned, the watchdog never touches that descriptor again, so a descriptor closed and
//! reused afterwards is safe. A connection ends its watch before it goes back to the pool
//! (`has_broken`), before a new deadline (a new watch) and when it is dropped, always while it
//! still owns its socket.

use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashSet};
use std::sync::OnceLock;
use std::time::Instant;

/// A socket descriptor.
#[cfg(unix)]
type Socket = std::os::unix::io::RawFd;
#[cfg(not(unix))]
type Socket = ();

#[derive(Default)]
struct Watched {
    next_id: u64,
    /// The watched sockets, by (deadline, id).
    sockets: BTreeMap<(Instant, u64), Socket>,
    /// Watches whose deadline came while they were watched.
    fired: HashSet<u64>,
    started: bool,
    /// When the thread wakes next on its own (`None`: not before it is notified). A new watch
    /// notifies it only if its deadline comes sooner, so a registry starting one attempt
    /// after another wakes the thread about once per [`GLANCE`], not once per attempt.
    planned: Option<Instant>,
}

/// The longest the thread sleeps while it has watches (or had them a moment ago).
const GLANCE: std::time::Duration = std::time::Duration::from_secs(1);

struct Watchdog {
    watched: Mutex<Watched>,
    changed: Condvar,
}

fn watchdog() -> &'static Watchdog {
    static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();
    WATCHDOG.get_or_init(|| Watchdog {
        watched: Mutex::new(Watched::default()),
        changed: Condvar::new(),
    })
}

/// One watched attempt of one connection; [`end`](Watch::end) it while the socket is open.
#[derive(Debug)]
pub(crate) struct Watch {
    id: u64,
    deadline: Instant,
}

impl Watch {
    /// Watches `socket` until `deadline`. `None` if the watchdog thread cannot be started (the
    /// socket's own timeouts then remain the only bound).
    pub fn start(socket: Socket, deadline: Instant) -> Option<Watch> {
        let dog = watchdog();
        let mut watched = dog.watched.lock();
        if !watched.started {
            std::thread::Builder::new()
                .name("leasehold-mysql-deadlines".into())
                .spawn(|| run(watchdog()))
                .ok()?;
            watched.started = true;
        }
        watched.next_id += 1;
        let id = watched.next_id;
        watched.sockets.insert((deadline, id), socket);
        if watched.planned.is_none_or(|planned| deadline < planned) {
            watched.planned = Some(deadline);
            dog.changed.notify_one();
        }
        Some(Watch { id, deadline })
    }

    /// Stops watching; returns whether the deadline came first (the socket was shut down).
    pub fn end(self) -> bool {
        let mut watched = watchdog().watched.lock();
        watched.sockets.remove(&(self.deadline, self.id));
        watched.fired.remove(&self.id)
    }
}

fn run(dog: &Watchdog) {
    let mut watched = dog.watched.lock();
    let mut idle_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let first = watched
            .sockets
            .iter()
            .next()
            .map(|(&key, &socket)| (key, socket));
        match first {
            Some(((deadline, id), socket)) if deadline <= now => {
                watched.sockets.remove(&(deadline, id));
                watched.fired.insert(id);
                shut_down(socket);
                continue;
            }
            Some(((deadline, _), _)) => {
                idle_since = None;
                watched.planned = Some(deadline.min(now + GLANCE));
            }
            // No watch for a glance: sleep until the next one notifies.
            None if idle_since.is_some_and(|since| now >= since + GLANCE) => {
                watched.planned = None;
            }
            None => {
                idle_since.get_or_insert(now);
                watched.planned = Some(now + GLANCE);
            }
        }
        match watched.planned {
            Some(at) => {
                dog.changed.wait_until(&mut watched, at);
            }
            None => dog.changed.wait(&mut watched),
        }
    }
}

/// Shuts `socket` down in both directions; it stays open (its owner closes it).
#[cfg(unix)]
#[allow(unsafe_code)]
fn shut_down(socket: Socket) {
    use std::os::unix::io::FromRawFd;
    // SAFETY: the descriptor is open: its connection is watched, and a connection ends its
    // watch (under the same mutex the caller holds) before it closes its socket.
    // `ManuallyDrop` keeps the wrapper from closing it. `shutdown` applies to a Unix socket as
    // to a TCP one.
    let stream = std::mem::ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(socket) });
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

#[cfg(not(unix))]
fn shut_down(_socket: Socket) {}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::io::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    #[test]
    fn a_watch_still_running_at_its_deadline_ends_a_blocked_read() {
        let (mut ours, _theirs) = UnixStream::pair().unwrap();
        let watch = Watch::start(ours.as_raw_fd(), Instant::now() + Duration::from_millis(50))
            .expect("watchdog");
        let mut byte = [0u8; 1];
        // Nothing ever arrives: only the shutdown ends the read (end of file).
        assert_eq!(ours.read(&mut byte).unwrap(), 0);
        assert!(watch.end(), "the watch reports that it fired");
    }

    #[test]
    fn an_ended_watch_never_fires() {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let watch = Watch::start(ours.as_raw_fd(), Instant::now() + Duration::from_millis(20))
            .expect("watchdog");
        assert!(!watch.end(), "ended before its deadline");
        std::thread::sleep(Duration::from_millis(100));
        // Still usable in both directions.
        ours.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let read = (&ours).read(&mut byte);
        assert!(
            matches!(read, Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the socket was shut down after its watch ended: {read:?}"
        );
    }
}
