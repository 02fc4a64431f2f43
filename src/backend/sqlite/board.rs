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
//!   slot s, word 1    unused: nothing writes it, and it reads as zero
//! ```
//!
//! - **Release** (`SqlStore::release` after the row was released, and forced releases): if
//!   anyone is present (below), grow the file back if someone shrank it (one `fstat`), add one
//!   to the slot's count and wake every thread waiting on that count, then add one to the
//!   sequence and wake every thread waiting on it (`FUTEX_WAKE_OP`: the kernel adds, then
//!   wakes). Releases that end a turn (see "Bounded turn" in `lock.rs`) announce nothing, as on
//!   PostgreSQL. While nobody is present a release costs one `fcntl` (and an `fstat` of the
//!   file every 20 ms, a `stat` of the path once a second) instead of the announcement.
//! - **Waiting thread** (a thread inside `lock()` of a key held in another process; see
//!   `Watch` in `lock.rs`): after its first refused attempt it becomes present ([`SlotWait`]),
//!   and tries once more. Before each attempt it reads its slot's count; after a refused one it
//!   `FUTEX_WAIT`s on the count with the value it read, until its next poll. A release after
//!   the read changes the count, so the wait returns at once: nothing is missed. The release
//!   wakes this thread itself, so a handoff between processes costs one wake-up, as a pipe
//!   would. Its presence ends with the `lock()` call.
//! - **Listener** (one thread per registry, only while one of its semaphores, reader/writer
//!   locks or elections waits, as on PostgreSQL; see [`crate::wakeups`]): on subscribing,
//!   becomes present, then copies the slot counts, then nudges every waiting poller of its
//!   registry; then reads the sequence, compares the counts, reports every slot that moved,
//!   then `FUTEX_WAIT`s on the sequence with the value it read and a one-second timeout (the
//!   tick). A release between the read and the wait changes the sequence, so the wait returns
//!   at once. On unsubscribing it lets its presence go.
//!
//! # Presence
//!
//! A listener or a waiting thread is present on a board file while its process holds a
//! shared open-file-description lock (`F_OFD_SETLK`, `F_RDLCK`) on one byte past the board's
//! end, through a second descriptor of the file opened for that (a lock never conflicts with
//! its own description, and the releases of the same process test through the first). The
//! lock is counted: the first presence of the process on the mapping takes it, the last lets
//! it go. A release tests for it after its statement committed (`F_OFD_GETLK` for a write
//! lock: any present process's lock conflicts) and announces only if one is there; when the
//! test fails it announces. The kernel drops a lock when its process ends, and truncating or
//! writing the file leaves it alone, so nothing done to the board's contents hides a
//! presence, and a crashed process costs nothing.
//!
//! No release is missed. The kernel orders every lock operation on the file (one lock list
//! per inode, under one spinlock), so a release's test either sees a presence or came before
//! it was taken:
//! - it saw the lock: the release announces, after the listener or waiting thread became
//!   present. A waiting thread reads its count before each attempt, and its attempts after
//!   becoming present either find the row released or were refused before the release
//!   committed, so before its announcement changed the count that the thread then waits on.
//!   A listener that copied the counts after the announcement will not report it — but then
//!   the release committed before the copy, so before the nudge that follows it, and the
//!   nudged pollers' next attempts (which start after the nudge: one in flight then cuts its
//!   next sleep short) find the row released;
//! - it came before: then the release committed before the test, the test before the lock,
//!   and the lock before the waiting thread's next attempt or the listener's nudge, which
//!   finds the row released.
//!
//! A listener that follows a replaced file becomes present on the new one before it lets the
//! old one go and nudges every poller (below), by the same argument. `tests/sqlite_board.rs`
//! forces the second case with the fail point `sqlite_board::waiter_before_presence` (a
//! waiting thread held just before it takes its presence while the holder releases).
//!
//! A slot is a hash of (table, region, `LOCK_KEY`) modulo [`SLOTS`]: two keys that share one
//! cost an extra attempt, nothing more. The board only hurries pollers: the row decides who
//! holds the lock, so a process that crashed (its lease still runs until it expires), a Spring
//! Integration client (which announces nothing) or a board that cannot be opened (a read-only
//! directory; a warning says so) leave waiters polling every `idle_between_tries`, as before.
//!
//! # Never touched from user space
//!
//! The file is mapped (a futex shared between processes must live in a shared mapping), but
//! this process never loads or stores through the mapping: a page of a file mapping that lies
//! past the file's end raises `SIGBUS` on access, and any process that may write the file may
//! shrink it. Instead, words are read with `pread`, the counts and the sequence are
//! incremented inside the kernel with `FUTEX_WAKE_OP` (an atomic add on one word, then a
//! wake-up of the sequence's waiters), and waits are `FUTEX_WAIT`. The
//! kernel's own accesses to a page past the end fail with `EFAULT` instead of a signal (the
//! unit tests check it). When an access fails or a read comes back short, the process grows
//! the file back to its size (the lost words read as zero) and logs a warning once; if that
//! fails too, its waiters poll until the board works again.
//!
//! # What may be done to the file
//!
//! Nothing another process or an operator does to the board can crash a process or grant a
//! lock; the worst is wake-ups that come late (one `idle_between_tries`) or spurious attempts.
//! - **Truncate or shrink it** (a temporary-directory cleaner, a backup tool restoring an
//!   empty file): the next process to touch it grows it back and carries on, and releases
//!   wake waiters as before (presence locks are not part of the contents). Waiters of keys
//!   whose counts were cut away make one extra attempt; a release whose count was cut away
//!   before a listener read it wakes nobody (its waiters poll).
//! - **Delete it or replace it** (`rm`, a rename over it): each process follows the file the
//!   path names — a release notices within 20 ms that its file lost its last link (an
//!   `fstat`, at most one per 20 ms, which keeps it off the cost of an uncontended
//!   `unlock()`) and checks the path then, and at least once a second otherwise (one `stat`:
//!   a file renamed away, or one with another hard link); a listener checks every second, and a
//!   waiting thread takes the file a release would before each attempt (so from its next poll
//!   on); a new file is made when there is none — so for about a second, or until a waiting
//!   thread's next poll, wake-ups between processes that have the old file and those that have
//!   the new one may be missed (their waiters poll), and a listener that moves to the new file
//!   makes every waiter of its registry try once.
//! - **Make it unwritable** for some users: their processes warn and poll.
//! - **Put a symbolic link or anything but a regular file there**: refused (opened with
//!   `O_NOFOLLOW`, checked to be a regular file), so nobody can aim a process's writes at
//!   another file; processes keep the board they had, and those that have none warn and poll.
//! - **Write into it**: at worst spurious attempts (the row decides), or wake-ups missed.
//! - **Lock its presence byte** (another program's write lock there): releases announce as
//!   if someone were present; listeners and waiting threads cannot become present (a warning
//!   says so), and releases of other processes still announce, seeing that lock.
//!
//! # Which file: the database's identity
//!
//! The board lies beside the file the database path *resolves to* (symbolic links, `.` and
//! `..` followed, as SQLite does for its `-wal` and `-shm` files): a database opened through
//! a link, a relative path or another mount of its directory shares one board. Not covered,
//! and unsafe for SQLite itself (its `-wal` and `-shm` split too): hard links under other
//! names, and mounts of the database file alone (rather than its directory) at another path.
//!
//! Linux only (the futex, open-file-description locks); elsewhere SQLite waiters poll. This is
//! the crate's only unsafe code: mapping the file, the futex calls, `fstat` and the locks.
#![allow(unsafe_code)]

use crate::backend::{ListenerEvent, ListenerHandler, ListenerReply};
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Slots on the board (a power of two).
pub(crate) const SLOTS: usize = 4096;
/// Words on the board: the sequence, padding to keep slots aligned in pairs, the slots.
const WORDS: usize = 2 + 2 * SLOTS;
/// The board's size in bytes.
const SIZE: usize = WORDS * 4;
/// The first word of the slots.
const FIRST_SLOT_WORD: usize = 2;
/// The byte whose lock says that a listener or a waiting thread is present (past the board's
/// end: locks need no data, and truncating the file does not touch them).
const PRESENCE_BYTE: libc::off_t = SIZE as libc::off_t;
/// How often a release checks that the path still names the file it announces on, beyond the
/// `fstat` of [`LINK_CHECK_EVERY`] (see the module docs).
const PATH_CHECK_EVERY: Duration = Duration::from_secs(1);
/// How often a release checks that the file it announces on is still linked (an `fstat`): a
/// deleted board is followed within this, not only at the next path check. Not on every
/// release: the `fstat` was a sixth of what the registry added to SQLite's uncontended
/// `lock()` + `unlock()`.
const LINK_CHECK_EVERY: Duration = Duration::from_millis(20);

/// The board's file for the database at `database`: beside the file `database` resolves to
/// (see the module docs); beside `database` as given when it cannot be resolved.
pub(crate) fn board_path(database: &Path) -> PathBuf {
    let resolved = std::fs::canonicalize(database).unwrap_or_else(|_| database.to_path_buf());
    let mut name = resolved.into_os_string();
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

fn count_index(slot: usize) -> usize {
    FIRST_SLOT_WORD + 2 * slot
}

/// `FUTEX_WAKE_OP`'s operation "add `oparg`" (the comparison is unused: no second wake-up).
const fn futex_op_add(oparg: u32) -> u32 {
    ((libc::FUTEX_OP_ADD as u32) << 28) | ((oparg & 0xfff) << 12)
}

/// A snapshot of the slot words, read with `pread`.
struct Slots(Vec<u8>);

impl Slots {
    fn new() -> Slots {
        Slots(vec![0; SIZE - FIRST_SLOT_WORD * 4])
    }

    fn word(&self, index: usize) -> u32 {
        let at = (index - FIRST_SLOT_WORD) * 4;
        u32::from_ne_bytes(self.0[at..at + 4].try_into().expect("four bytes"))
    }

    fn count(&self, slot: usize) -> u32 {
        self.word(count_index(slot))
    }
}

/// One mapping of a board file. Its address is only ever handed to the kernel (see the module
/// docs); unmapped when the last user lets go.
struct Mapped {
    map: *mut u32,
    file: File,
    /// A second open file description of the same file, on which this process holds its
    /// presence lock (see [`Presence`]): the releases of this process test for
    /// presence through `file`, and a lock never conflicts with its own description.
    presence: File,
    /// The file's device and inode, to notice that the path names another file.
    identity: (u64, u64),
    /// How many of this process's listeners and waiting threads are present through
    /// `presence` (see [`Presence`]): the lock is taken by the first, let go by the last.
    present: Mutex<usize>,
}

// SAFETY: the mapping is never accessed from user space (only its address is passed to the
// kernel), and it stays mapped until `Drop`.
unsafe impl Send for Mapped {}
// SAFETY: as above; the file is used only through positioned reads and writes.
unsafe impl Sync for Mapped {}

impl Mapped {
    /// Opens (creating it when missing), grows and maps the board file at `path`.
    fn open(path: &Path) -> io::Result<Mapped> {
        use std::os::unix::fs::MetadataExt;
        let file = Self::open_file(path)?;
        let metadata = file.metadata()?;
        if !metadata.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file: delete it, leasehold makes a new one",
            ));
        }
        let identity = (metadata.dev(), metadata.ino());
        // The presence description must be of the same file: the path may have been replaced
        // in between.
        let presence = Self::open_file(path)?;
        let same = presence
            .metadata()
            .is_ok_and(|m| (m.dev(), m.ino()) == identity);
        if !same {
            return Err(io::Error::other(
                "the file was replaced while it was opened",
            ));
        }
        // Growing keeps what is there and fills the rest with zeros; two processes growing it
        // at once both set the same length.
        if metadata.len() < SIZE as u64 {
            file.set_len(SIZE as u64)?;
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of `SIZE` bytes of an open file; a mapping may reach
        // past the file's end (the kernel then refuses its accesses, see `Board::grow_back`).
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapped {
            map: map.cast(),
            file,
            presence,
            identity,
            present: Mutex::new(0),
        })
    }

    /// Opens the board file at `path` for reading and writing, creating it when missing.
    fn open_file(path: &Path) -> io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        // Never through a symbolic link: someone who may write the directory could otherwise
        // aim this process's writes at any file it may write.
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a symbolic link, which leasehold does not follow there: delete it",
                ),
                _ => e,
            })
    }

    /// Whether the file is still linked into the file system (`fstat`, no path walk): a
    /// deleted file, or one replaced by a rename over it, has no link left.
    fn still_linked(&self) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: `fstat` of an open descriptor into a zeroed buffer of the right type.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        let result = unsafe { libc::fstat(self.file.as_raw_fd(), &mut stat) };
        // An error says nothing: the path is checked then.
        result == 0 && stat.st_nlink > 0
    }

    /// The presence lock on `description`: `kind` is `F_RDLCK` (take it), `F_UNLCK` (let it
    /// go), or with `F_OFD_GETLK`, `F_WRLCK` (the test). Open file description locks (not
    /// POSIX record locks, which closing any descriptor of the file would drop).
    fn presence_lock(
        description: &File,
        command: libc::c_int,
        kind: libc::c_int,
    ) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        // SAFETY: a zeroed `flock` (l_pid must be 0 for OFD locks), filled in below.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = kind as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = PRESENCE_BYTE;
        lock.l_len = 1;
        // SAFETY: fcntl with an OFD lock command and a pointer to a live `flock`.
        let result = unsafe { libc::fcntl(description.as_raw_fd(), command, &mut lock) };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
    }

    /// Whether anyone (of any process, this one's included) is present on this file.
    fn anyone_present(&self) -> io::Result<bool> {
        Self::presence_lock(&self.file, libc::F_OFD_GETLK, libc::F_WRLCK)
    }

    /// Takes (`true`) or lets go of this process's presence on this file.
    fn set_present(&self, present: bool) -> io::Result<()> {
        let kind = if present {
            libc::F_RDLCK
        } else {
            libc::F_UNLCK
        };
        Self::presence_lock(&self.presence, libc::F_OFD_SETLK, kind).map(|_| ())
    }

    /// The address of word `index` in the mapping, for the kernel only.
    fn address(&self, index: usize) -> *mut u32 {
        assert!(index < WORDS);
        self.map.wrapping_add(index)
    }

    /// Reads the words from `index` on into `into`; a short read is an error.
    fn pread(&self, index: usize, into: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(into, (index * 4) as u64)
    }

    /// Adds one to word `index` in the kernel, then wakes every thread waiting on it.
    fn add_one(&self, index: usize) -> io::Result<()> {
        // SAFETY: FUTEX_WAKE_OP on a word address of the live mapping (not FUTEX_PRIVATE:
        // other processes wait on the same file page): the operation on the second address
        // comes first, then the wake-up on the first, the same word. The kernel checks the
        // page; a page past the file's end makes the call fail with EFAULT.
        let woken = unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.address(index),
                libc::FUTEX_WAKE_OP,
                i32::MAX,
                0usize, // the second wake-up's count, passed where the timeout goes
                self.address(index),
                futex_op_add(1),
            )
        };
        if woken < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `FUTEX_WAIT` on word `index` while it is `seen`, at most `timeout`: `true` when woken
    /// or the word was no longer `seen` (only announcements wake a board's words), `false`
    /// when the time ran out or a signal came. Only EFAULT (the word is past the file's end)
    /// is an error.
    fn wait(&self, index: usize, seen: u32, timeout: Duration) -> io::Result<bool> {
        let timespec = libc::timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on a word address of the live mapping with a relative timeout;
        // the kernel reads the word (EFAULT past the file's end).
        let result = unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.address(index),
                libc::FUTEX_WAIT,
                seen,
                &timespec as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            )
        };
        match result {
            0 => Ok(true),
            _ => match io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::EFAULT) => Err(e),
                e => Ok(e.raw_os_error() == Some(libc::EAGAIN)),
            },
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`; the kernel keeps no pointer to it
        // (a futex wait still in progress elsewhere holds its own reference to the file).
        unsafe {
            libc::munmap(self.map.cast(), SIZE);
        }
    }
}

/// One process's view of a release board: the mapping of the file its path names, replaced
/// when the path comes to name another file (see the module docs).
pub(crate) struct Board {
    path: PathBuf,
    mapped: Mutex<Arc<Mapped>>,
    /// When the board was opened: the origin of `path_checked`.
    opened: Instant,
    /// When a release last checked the path (nanoseconds since `opened`).
    path_checked: AtomicU64,
    /// When a release last checked that its file is still linked (as `path_checked`).
    link_checked: AtomicU64,
    /// A warning said that the file was found short (said once per board).
    warned_short: AtomicBool,
    /// A warning said that the board failed even after growing it (said once per board).
    warned_failing: AtomicBool,
    /// A warning said that the path named another file (said once per board).
    warned_replaced: AtomicBool,
    /// A warning said that the presence lock was refused (said once per board).
    warned_presence: AtomicBool,
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board").field("path", &self.path).finish()
    }
}

impl Board {
    /// Opens (creating it when missing) and maps the board of the database at `database`.
    pub fn open(database: &Path) -> io::Result<Board> {
        let path = board_path(database);
        let mapped = Mapped::open(&path)?;
        Ok(Board {
            path,
            mapped: Mutex::new(Arc::new(mapped)),
            opened: Instant::now(),
            path_checked: AtomicU64::new(0),
            link_checked: AtomicU64::new(0),
            warned_short: AtomicBool::new(false),
            warned_failing: AtomicBool::new(false),
            warned_replaced: AtomicBool::new(false),
            warned_presence: AtomicBool::new(false),
        })
    }

    /// The mapping in use, without looking at the path.
    fn current(&self) -> Arc<Mapped> {
        Arc::clone(&self.mapped.lock())
    }

    /// The mapping of the file the path names now: when the file was deleted or replaced,
    /// opens (or creates) the one there and uses it from now on. Costs a `stat`.
    fn mapping(&self) -> Arc<Mapped> {
        let current = self.current();
        let named = std::fs::metadata(&self.path).map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino())
        });
        if named.is_ok_and(|identity| identity == current.identity) {
            return current;
        }
        match Mapped::open(&self.path) {
            Ok(mapped) => {
                if !self.warned_replaced.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "the SQLite release board {} was deleted or replaced by another process; \
                         using the file there now (wake-ups announced meanwhile may be missed: \
                         their waiters poll)",
                        self.path.display()
                    );
                }
                let mapped = Arc::new(mapped);
                *self.mapped.lock() = Arc::clone(&mapped);
                mapped
            }
            // Keep the old one: it still works among the processes that have it.
            Err(_) => current,
        }
    }

    /// Runs `attempt` on `mapped`; when it fails, grows the file back and runs it once more.
    /// `false` when it still fails (after a warning, once).
    fn with_repair(
        &self,
        mapped: &Mapped,
        what: &str,
        mut attempt: impl FnMut() -> io::Result<()>,
    ) -> bool {
        let error = match attempt() {
            Ok(()) => return true,
            Err(error) => error,
        };
        let error = match self.grow_back(mapped) {
            Ok(true) => match attempt() {
                Ok(()) => return true,
                Err(error) => error,
            },
            Ok(false) => error,
            Err(error) => error,
        };
        if !self.warned_failing.swap(true, Ordering::Relaxed) {
            log::warn!(
                "SQLite release wake-ups through {} fail ({what}: {error}); waiters poll every \
                 idle_between_tries until it works again",
                self.path.display()
            );
        }
        false
    }

    /// Grows `mapped`'s file back to its size when someone shrank it: whether it had to.
    fn grow_back(&self, mapped: &Mapped) -> io::Result<bool> {
        let len = mapped.file.metadata()?.len();
        if len >= SIZE as u64 {
            return Ok(false);
        }
        mapped.file.set_len(SIZE as u64)?;
        if !self.warned_short.swap(true, Ordering::Relaxed) {
            log::warn!(
                "the SQLite release board {} was shrunk to {len} bytes by another process; \
                 grew it back to {SIZE} (wake-ups announced meanwhile may be missed: their \
                 waiters poll)",
                self.path.display()
            );
        }
        Ok(true)
    }

    /// The mapping a release announces on: the current one while its file is still linked
    /// (one `fstat`, at most every [`LINK_CHECK_EVERY`]), checking the path (a `stat`, see
    /// [`Board::mapping`]) when it is not, and at most every [`PATH_CHECK_EVERY`] otherwise (a
    /// file renamed away, a hard link left).
    fn mapping_for_release(&self) -> Arc<Mapped> {
        let current = self.current();
        let now = u64::try_from(self.opened.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let since = |checked: &AtomicU64| now.saturating_sub(checked.load(Ordering::Relaxed));
        let path_due = since(&self.path_checked) >= PATH_CHECK_EVERY.as_nanos() as u64;
        if !path_due {
            if since(&self.link_checked) < LINK_CHECK_EVERY.as_nanos() as u64 {
                return current;
            }
            self.link_checked.store(now, Ordering::Relaxed);
            if current.still_linked() {
                return current;
            }
        }
        self.path_checked.store(now, Ordering::Relaxed);
        self.link_checked.store(now, Ordering::Relaxed);
        self.mapping()
    }

    /// A key of `slot` was released (the release has committed): wakes every listener and
    /// waiting thread of the file the path names, if anyone is present. `false` when the board
    /// fails (after a warning): waiters poll. The slot is computed ([`slot_of`]) only when
    /// someone is present: most releases find none and skip the hashing.
    pub fn release(&self, slot: impl FnOnce() -> usize) -> bool {
        let mapped = self.mapping_for_release();
        // After the commit (see "Presence" in the module docs); when the test fails, announce.
        if !mapped.anyone_present().unwrap_or(true) {
            return true;
        }
        self.announce_on(&mapped, slot())
    }

    /// A key of `slot` was released: wakes every listener and waiting thread of the
    /// file the path names, present or not. `false` when the board fails (after a warning).
    #[cfg(test)]
    fn announce(&self, slot: usize) -> bool {
        self.announce_on(&self.mapping(), slot)
    }

    fn announce_on(&self, mapped: &Mapped, slot: usize) -> bool {
        // Full size first: on a file cut inside a page, the kernel's add to a word of that
        // page past the end succeeds, and growing the file later would zero it.
        let _ = self.grow_back(mapped);
        self.with_repair(mapped, "announce a release", || {
            mapped.add_one(count_index(slot))?;
            mapped.add_one(0)
        })
    }

    /// Word `index` of `mapped` now, `None` when the board fails.
    fn word(&self, mapped: &Mapped, index: usize) -> Option<u32> {
        let mut word = [0; 4];
        self.with_repair(mapped, "read the board", || mapped.pread(index, &mut word))
            .then(|| u32::from_ne_bytes(word))
    }

    /// The release sequence of `mapped` now.
    #[cfg(test)]
    fn sequence(&self, mapped: &Mapped) -> Option<u32> {
        self.word(mapped, 0)
    }

    /// Copies the slot words of `mapped` into `slots`: `false` when the board fails.
    fn read_slots(&self, mapped: &Mapped, slots: &mut Slots) -> bool {
        self.with_repair(mapped, "read the slots", || {
            mapped.pread(FIRST_SLOT_WORD, &mut slots.0)
        })
    }

    /// Waits until word `index` of `mapped` is no longer `seen`, or `timeout` passes (see
    /// [`Mapped::wait`]); `None` when the board fails.
    fn wait(&self, mapped: &Mapped, index: usize, seen: u32, timeout: Duration) -> Option<bool> {
        let mut moved = false;
        self.with_repair(mapped, "wait for releases", || {
            moved = mapped.wait(index, seen, timeout)?;
            Ok(())
        })
        .then_some(moved)
    }
}

/// A listener's or a waiting thread's presence on one board file (see "Presence" in the
/// module docs): a shared lock on [`PRESENCE_BYTE`] through the mapping's second description,
/// taken by the first presence of this process on the mapping and let go with the last (and
/// by the kernel when the process ends).
struct Presence(Arc<Mapped>);

impl Drop for Presence {
    fn drop(&mut self) {
        let mut present = self.0.present.lock();
        *present -= 1;
        if *present == 0 {
            let _ = self.0.set_present(false);
        }
    }
}

impl Board {
    /// Takes this process's presence on `mapped` (see [`Presence`]). When the kernel refuses
    /// the lock, releases elsewhere may skip their announcements: a warning says so, once.
    fn presence(&self, mapped: &Arc<Mapped>) -> Presence {
        let mut present = mapped.present.lock();
        *present += 1;
        let taken = match *present {
            1 => mapped.set_present(true),
            _ => Ok(()),
        };
        drop(present);
        if let Err(error) = taken {
            if !self.warned_presence.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "cannot mark a waiter present on the SQLite release board {} ({error}); \
                     releases of other processes may not wake its waiters, which poll every \
                     idle_between_tries",
                    self.path.display()
                );
            }
        }
        Presence(Arc::clone(mapped))
    }
}

/// One waiting thread's own sleep until a key of `slot` is released (see "Waiting thread" in
/// the module docs): present on the board from its creation until it is dropped.
pub(crate) struct SlotWait {
    board: Arc<Board>,
    /// The presence on the mapping it waits on.
    presence: Presence,
    /// The slot's count word.
    index: usize,
    /// The slot's count when the thread last armed; `None` when the board failed then.
    seen: Option<u32>,
}

impl SlotWait {
    /// Present on the board (the file the path names: at most one `stat` a second) for a
    /// waiter of keys of `slot`.
    pub fn new(board: &Arc<Board>, slot: usize) -> SlotWait {
        let mapped = board.mapping_for_release();
        fail_point!("sqlite_board::waiter_before_presence");
        SlotWait {
            board: Arc::clone(board),
            presence: board.presence(&mapped),
            index: count_index(slot),
            seen: None,
        }
    }
}

impl crate::backend::ReleaseWait for SlotWait {
    fn arm(&mut self) {
        let named = self.board.mapping_for_release();
        if !Arc::ptr_eq(&named, &self.presence.0) {
            // The file was deleted or replaced: present on the new one before the old one is
            // let go (the attempt that follows sees any release made before).
            self.presence = self.board.presence(&named);
        }
        self.seen = self.board.word(&self.presence.0, self.index);
    }

    fn sleep(&self, until: Instant) -> Option<bool> {
        let seen = self.seen?;
        let timeout = until.saturating_duration_since(Instant::now());
        self.board.wait(&self.presence.0, self.index, seen, timeout)
    }
}

/// Starts the listener thread of a registry on `board` (see the module docs and
/// [`Backend::listen_for_releases`](crate::backend::Backend::listen_for_releases)).
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
    crate::backend::listener::spawn_listener("SQLite", move || listener.run())
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
        let mut seen = Slots::new();
        let mut now = Slots::new();
        while self.requests.recv().is_ok() {
            while self.requests.try_recv().is_ok() {}
            let mut mapped = self.board.mapping();
            // Present before reading the board and nudging the pollers: a release that did
            // not see this presence committed before the nudge (see "Presence").
            let mut _presence = self.board.presence(&mapped);
            self.board.read_slots(&mapped, &mut seen);
            if (self.handler)(ListenerEvent::Subscribed) == ListenerReply::Stop {
                return;
            }
            let mut next_tick = Instant::now() + Self::TICK;
            loop {
                // The sequence before the counts: a release after this read changes it, so
                // the wait below returns at once.
                let sequence = self.board.word(&mapped, 0);
                if sequence.is_some() && self.board.read_slots(&mapped, &mut now) {
                    let moved: Vec<usize> = (0..SLOTS)
                        .filter(|&s| seen.count(s) != now.count(s))
                        .collect();
                    std::mem::swap(&mut seen, &mut now);
                    if !moved.is_empty() {
                        let released = |lock_key: &str| {
                            let slot = slot_of(&self.table, &self.region, lock_key);
                            moved.binary_search(&slot).is_ok()
                        };
                        let event = ListenerEvent::ReleasedAmong {
                            released: &released,
                        };
                        if (self.handler)(event) == ListenerReply::Stop {
                            return;
                        }
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
                    let named = self.board.mapping();
                    if !Arc::ptr_eq(&named, &mapped) {
                        // The file was deleted or replaced: follow the one the path names.
                        // Releases announced there before now are unknown, so every waiter
                        // tries once.
                        mapped = named;
                        // Present on the new file before the old one is let go.
                        _presence = self.board.presence(&mapped);
                        self.board.read_slots(&mapped, &mut seen);
                        let anything = |_: &str| true;
                        let event = ListenerEvent::ReleasedAmong {
                            released: &anything,
                        };
                        if (self.handler)(event) == ListenerReply::Stop {
                            return;
                        }
                        continue;
                    }
                }
                let timeout = next_tick.saturating_duration_since(at);
                let waited = sequence.and_then(|seen| self.board.wait(&mapped, 0, seen, timeout));
                if waited.is_none() {
                    // The board fails: its waiters poll; try it again at the tick.
                    std::thread::sleep(timeout);
                }
                fail_point!("sqlite_board::listener_woken");
            }
        }
    }
}

#[cfg(test)]
mod tests;
