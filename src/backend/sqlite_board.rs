//! SQLite release wake-ups across the processes of one host: a *release board*, a small file
//! beside the database that every process maps into memory, and a futex on it.
//!
//! SQLite has no notifications, but every process that shares an SQLite file shares a host,
//! so they can share memory. The board (`<database>-leasehold`, 32 KiB) holds one sequence
//! word and [`SLOTS`] slots of two words each:
//!
//! ```text
//!   word 0            the release sequence: +1 on every announced release (the futex word)
//!   slot s, word 0    the slot's release count: +1 on every release of a key hashed to s
//!   slot s, word 1    the turn age (µs, saturated) of the slot's latest release
//! ```
//!
//! - **Release** (`SqlStore::release` after the row was released, and forced releases): write
//!   the turn age, add one to the slot's count, add one to the sequence, `FUTEX_WAKE` every
//!   thread waiting on the sequence. Releases that end a turn quietly (see
//!   `RegistryBuilder::turn_window`) announce nothing, as on PostgreSQL.
//! - **Listener** (one thread per registry, only while one of its threads waits, as on
//!   PostgreSQL; see [`crate::wakeups`]): keeps a copy of the slot counts; reads the sequence,
//!   compares the counts, reports every slot that moved, then `FUTEX_WAIT`s on the sequence
//!   with the value it read and a one-second timeout (the tick). A release between the read
//!   and the wait changes the sequence, so the wait returns at once: nothing is missed.
//!
//! A slot is a hash of (table, region, `LOCK_KEY`) modulo [`SLOTS`]: two keys that share one
//! cost an extra attempt, nothing more. The board only hurries pollers: the row decides who
//! holds the lock, so a process that crashed (its lease still runs until it expires), a Spring
//! Integration client (which announces nothing) or a board that cannot be opened (a read-only
//! directory; a warning says so) leave waiters polling every `idle_between_tries`, as before.
//! Deleting the board file while processes use it splits them into those that mapped the old
//! file and those that map the new one: wake-ups between the two groups fall back to polling.
//!
//! Linux only (the futex); elsewhere SQLite waiters poll. This is the crate's only unsafe code:
//! mapping the file, the futex calls, and reading the mapping's words as atomics.
#![allow(unsafe_code)]

use super::{ListenerEvent, ListenerHandler, ListenerReply};
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Slots on the board (a power of two).
pub(crate) const SLOTS: usize = 4096;
/// Words on the board: the sequence, padding to keep slots aligned in pairs, the slots.
const WORDS: usize = 2 + 2 * SLOTS;

/// The board's file for the database at `database`.
pub(crate) fn board_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push("-leasehold");
    PathBuf::from(name)
}

/// The slot of a `LOCK_KEY` of `table` in `region`: FNV-1a, stable across processes and
/// builds.
pub(crate) fn slot_of(table: &str, region: &str, lock_key: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in table
        .bytes()
        .chain([0])
        .chain(region.bytes())
        .chain([0])
        .chain(lock_key.bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash as usize) & (SLOTS - 1)
}

/// One process's mapping of a release board.
pub(crate) struct Board {
    words: *const AtomicU32,
    path: PathBuf,
    /// Kept open for the mapping's lifetime (not needed by `mmap`, but it names the file in
    /// `/proc/self/fd` for whoever debugs a process).
    _file: File,
}

// SAFETY: the mapping is shared memory accessed only through atomics, valid until `Drop`.
unsafe impl Send for Board {}
// SAFETY: as above.
unsafe impl Sync for Board {}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board").field("path", &self.path).finish()
    }
}

impl Board {
    /// Opens (creating it when missing) and maps the board of the database at `database`.
    pub fn open(database: &Path) -> io::Result<Board> {
        let path = board_path(database);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let size = (WORDS * 4) as u64;
        // Growing keeps what is there and fills the rest with zeros; two processes growing it
        // at once both set the same length.
        if file.metadata()?.len() < size {
            file.set_len(size)?;
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared read-write mapping of a file at least `size` long; nothing
        // else in this process maps it through this `Board`.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Board {
            words: map as *const AtomicU32,
            path,
            _file: file,
        })
    }

    fn word(&self, index: usize) -> &AtomicU32 {
        assert!(index < WORDS);
        // SAFETY: in bounds of the mapping, which lives as long as `self`; `AtomicU32` has the
        // layout of `u32` and the mapping is page-aligned.
        unsafe { &*self.words.add(index) }
    }

    fn sequence_word(&self) -> &AtomicU32 {
        self.word(0)
    }

    fn count_word(&self, slot: usize) -> &AtomicU32 {
        self.word(2 + 2 * slot)
    }

    fn age_word(&self, slot: usize) -> &AtomicU32 {
        self.word(3 + 2 * slot)
    }

    /// A key of `slot` was released after a turn of `turn_age`: wakes every listener.
    pub fn announce(&self, slot: usize, turn_age: Duration) {
        let age = u32::try_from(turn_age.as_micros()).unwrap_or(u32::MAX);
        self.age_word(slot).store(age, Ordering::SeqCst);
        self.count_word(slot).fetch_add(1, Ordering::SeqCst);
        self.sequence_word().fetch_add(1, Ordering::SeqCst);
        // SAFETY: FUTEX_WAKE on a word of a live shared mapping (not FUTEX_PRIVATE: other
        // processes wait on the same file page).
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.sequence_word().as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// The release sequence now.
    fn sequence(&self) -> u32 {
        self.sequence_word().load(Ordering::SeqCst)
    }

    /// Waits until the sequence is no longer `seen`, or `timeout` passes (spurious returns
    /// are possible: callers read again).
    fn wait(&self, seen: u32, timeout: Duration) {
        let timespec = libc::timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on a word of a live shared mapping with a relative timeout.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.sequence_word().as_ptr(),
                libc::FUTEX_WAIT,
                seen,
                &timespec as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// Copies the slot counts into `counts`.
    fn read_counts(&self, counts: &mut Vec<u32>) {
        counts.clear();
        counts.extend((0..SLOTS).map(|slot| self.count_word(slot).load(Ordering::SeqCst)));
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`; no reference outlives `self`.
        unsafe {
            libc::munmap(self.words as *mut libc::c_void, WORDS * 4);
        }
    }
}

/// Starts the listener thread of a registry on `board` (see the module docs and
/// [`Backend::listen_for_releases`](super::Backend::listen_for_releases)).
pub(crate) fn listen(
    board: Arc<Board>,
    table: String,
    region: String,
    handler: ListenerHandler,
    requests: crossbeam_channel::Receiver<()>,
) -> bool {
    let listener = BoardListener {
        board,
        table,
        region,
        handler,
        requests,
    };
    super::listener::spawn_listener("SQLite", move || listener.run())
}

struct BoardListener {
    board: Arc<Board>,
    table: String,
    region: String,
    handler: ListenerHandler,
    /// Subscription requests; disconnected once the registry is gone.
    requests: crossbeam_channel::Receiver<()>,
}

impl BoardListener {
    /// How often a subscribed listener reports a tick (and learns whether to go on).
    const TICK: Duration = Duration::from_secs(1);

    /// Waits for a subscription request, serves it until the registry lets go; ends with the
    /// registry.
    fn run(self) {
        let mut seen = Vec::with_capacity(SLOTS);
        let mut now = Vec::with_capacity(SLOTS);
        while self.requests.recv().is_ok() {
            while self.requests.try_recv().is_ok() {}
            self.board.read_counts(&mut seen);
            if (self.handler)(ListenerEvent::Subscribed) == ListenerReply::Stop {
                return;
            }
            let mut next_tick = Instant::now() + Self::TICK;
            loop {
                let sequence = self.board.sequence();
                self.board.read_counts(&mut now);
                let moved: Vec<usize> = (0..SLOTS).filter(|&s| seen[s] != now[s]).collect();
                std::mem::swap(&mut seen, &mut now);
                if !moved.is_empty() {
                    let released = |lock_key: &str| {
                        let slot = slot_of(&self.table, &self.region, lock_key);
                        moved.binary_search(&slot).ok().map(|_| {
                            let age = self.board.age_word(slot).load(Ordering::SeqCst);
                            Duration::from_micros(u64::from(age))
                        })
                    };
                    let event = ListenerEvent::ReleasedAmong {
                        released: &released,
                    };
                    if (self.handler)(event) == ListenerReply::Stop {
                        return;
                    }
                }
                let at = Instant::now();
                if at >= next_tick {
                    next_tick = at + Self::TICK;
                    match (self.handler)(ListenerEvent::Tick) {
                        ListenerReply::Keep => {}
                        ListenerReply::Unsubscribe => break,
                        ListenerReply::Stop => return,
                    }
                    if matches!(
                        self.requests.try_recv(),
                        Err(crossbeam_channel::TryRecvError::Disconnected)
                    ) {
                        return;
                    }
                }
                self.board
                    .wait(sequence, next_tick.saturating_duration_since(at));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_stable_and_spread() {
        assert_eq!(
            slot_of("INT_LOCK", "DEFAULT", "a"),
            slot_of("INT_LOCK", "DEFAULT", "a")
        );
        let slots: std::collections::HashSet<usize> = (0..1000)
            .map(|i| slot_of("INT_LOCK", "DEFAULT", &format!("key-{i}")))
            .collect();
        assert!(slots.len() > 850, "1,000 keys took {} slots", slots.len());
        assert_ne!(
            slot_of("INT_LOCK", "A", "k"),
            slot_of("INT_LOCK", "B", "k"),
            "regions differ"
        );
    }

    #[test]
    fn an_announcement_on_one_mapping_wakes_a_waiter_on_another() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("l.db");
        let (a, b) = (
            Board::open(&database).unwrap(),
            Board::open(&database).unwrap(),
        );
        let seen = b.sequence();
        let slot = slot_of("T", "R", "k");
        let waiter = std::thread::spawn(move || {
            let started = Instant::now();
            b.wait(seen, Duration::from_secs(30));
            let mut counts = Vec::new();
            b.read_counts(&mut counts);
            (
                started.elapsed(),
                counts[slot],
                b.age_word(slot).load(Ordering::SeqCst),
            )
        });
        std::thread::sleep(Duration::from_millis(50));
        a.announce(slot, Duration::from_micros(1234));
        let (waited, count, age) = waiter.join().unwrap();
        assert!(waited < Duration::from_secs(30), "woken, not timed out");
        assert_eq!((count, age), (1, 1234));
        assert_eq!(a.sequence(), 1);
    }
}
