//! Tests of the release board: slots, the shared mapping, futex wake-ups and damage to the file.

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
    let seen = b.sequence(&b.current()).unwrap();
    let slot = slot_of("T", "R", "k");
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        b.wait(&b.current(), 0, seen, Duration::from_secs(30));
        let mut slots = Slots::new();
        assert!(b.read_slots(&b.current(), &mut slots));
        (started.elapsed(), slots.count(slot))
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(a.announce(slot));
    let (waited, count) = waiter.join().unwrap();
    assert!(waited < Duration::from_secs(30), "woken, not timed out");
    assert_eq!(count, 1);
    assert_eq!(a.sequence(&a.current()), Some(1));
}

/// The premise of the design: the kernel's accesses to a mapped page past the file's end
/// fail with EFAULT (a load or store from user space would raise SIGBUS and kill the test
/// binary), and `pread` comes back short.
#[test]
fn past_the_files_end_the_kernel_says_efault_and_no_signal_comes() {
    let dir = tempfile::tempdir().unwrap();
    let board = Mapped::open(&dir.path().join("l.db-leasehold")).unwrap();
    let slot = SLOTS - 1;
    board.file.set_len(0).unwrap();
    let efault = |result: io::Result<()>| {
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EFAULT));
    };
    efault(board.add_one(0));
    efault(board.add_one(count_index(slot)));
    // SAFETY: as in `Board::wait`, with no timeout needed: the call fails at once.
    let waited = unsafe {
        libc::syscall(
            libc::SYS_futex,
            board.address(0),
            libc::FUTEX_WAIT,
            0u32,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    assert_eq!(waited, -1);
    efault(Err(io::Error::last_os_error()));
    let mut word = [0; 4];
    assert_eq!(
        board.pread(0, &mut word).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
    // Half a board: the sequence works, the last slot fails.
    board.file.set_len(4096).unwrap();
    board.add_one(0).unwrap();
    efault(board.add_one(count_index(slot)));
}

#[test]
fn a_shrunk_board_is_grown_back_and_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("l.db");
    let (a, b) = (
        Board::open(&database).unwrap(),
        Board::open(&database).unwrap(),
    );
    let slot = SLOTS - 1;
    let len = || std::fs::metadata(board_path(&database)).unwrap().len();
    let cut = |to: u64| a.current().file.set_len(to).unwrap();
    assert!(a.announce(slot));
    cut(100);
    assert!(b.announce(slot), "grown back");
    assert_eq!(len(), SIZE as u64);
    let mut slots = Slots::new();
    assert!(a.read_slots(&a.current(), &mut slots));
    // The count was lost with the truncation; the release after it counts.
    assert_eq!(slots.count(slot), 1);
    cut(0);
    assert_eq!(
        a.sequence(&a.current()),
        Some(0),
        "read after growing it back"
    );
    // A wait on a shrunk board grows it back and waits on the word as it then is (zero):
    // a waiter that saw another value returns at once.
    cut(0);
    let started = Instant::now();
    a.wait(&a.current(), 0, 1, Duration::from_secs(30));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "waited on the grown board"
    );
    assert_eq!(len(), SIZE as u64);
}

/// A board cut inside its first page: a count in that page past the file's end is still
/// mapped (the page is), so the kernel's add succeeds there, but growing the file back zeroes
/// it. A release grows the file before it counts, so the count survives for the listener.
#[test]
fn a_release_on_a_board_cut_inside_its_first_page_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("l.db");
    let (a, b) = (
        Board::open(&database).unwrap(),
        Board::open(&database).unwrap(),
    );
    // A slot whose count lies in the first page, past the cut.
    let slot = 100;
    assert!(count_index(slot) * 4 > 100 && count_index(slot) * 4 < 4096);
    a.current().file.set_len(100).unwrap();
    assert!(a.announce(slot));
    let mut slots = Slots::new();
    assert!(b.read_slots(&b.current(), &mut slots));
    assert_eq!(slots.count(slot), 1, "the release's count was lost");
    assert_eq!(b.sequence(&b.current()), Some(1));
}

#[test]
fn a_database_reached_through_a_link_has_the_same_board() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("l.db");
    std::fs::write(&database, b"").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::os::unix::fs::symlink(&database, dir.path().join("link.db")).unwrap();
    let board = board_path(&database);
    assert_eq!(board_path(&dir.path().join("link.db")), board);
    assert_eq!(board_path(&dir.path().join("sub/../l.db")), board);
    assert_eq!(
        board.file_name().unwrap(),
        "l.db-leasehold",
        "beside the file it resolves to"
    );
}

#[test]
fn a_deleted_board_is_followed_to_the_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("l.db");
    let old = Board::open(&database).unwrap();
    std::fs::remove_file(board_path(&database)).unwrap();
    let new = Board::open(&database).unwrap();
    let before = old.current();
    assert!(
        !Arc::ptr_eq(&before, &old.mapping()),
        "followed the new file"
    );
    let seen = new.sequence(&new.current()).unwrap();
    assert!(old.announce(0));
    assert_eq!(
        new.sequence(&new.current()),
        Some(seen + 1),
        "announced on the new file"
    );
}

#[test]
fn a_release_announces_only_while_a_listener_is_present() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("l.db");
    let (a, b) = (
        Board::open(&database).unwrap(),
        Board::open(&database).unwrap(),
    );
    let sequence = || a.sequence(&a.current()).unwrap();
    assert!(a.release(|| 3));
    assert_eq!(sequence(), 0, "nobody present: nothing announced");
    let present = b.presence(&b.current());
    assert!(a.release(|| 3));
    assert_eq!(sequence(), 1, "another board's listener is present");
    drop(present);
    assert!(a.release(|| 3));
    assert_eq!(sequence(), 1, "its presence ended");
    // The releasing board's own listener counts too (its lock is on another description).
    let own = a.presence(&a.current());
    assert!(a.release(|| 3));
    assert_eq!(sequence(), 2, "the same board's listener is present");
    drop(own);
    // A truncated file keeps its locks.
    let present = b.presence(&b.current());
    b.current().file.set_len(0).unwrap();
    assert!(a.release(|| 3), "grown back");
    assert_eq!(sequence(), 1, "announced on the emptied board");
    drop(present);
}

/// A release through a deleted board finds the new file within [`LINK_CHECK_EVERY`] (its
/// `fstat` shows no link), not only at its next path check.
#[test]
fn a_release_through_a_deleted_board_announces_on_the_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("l.db");
    let old = Board::open(&database).unwrap();
    std::thread::sleep(LINK_CHECK_EVERY);
    assert!(old.release(|| 0), "checked now");
    std::fs::remove_file(board_path(&database)).unwrap();
    let new = Board::open(&database).unwrap();
    let _present = new.presence(&new.current());
    std::thread::sleep(LINK_CHECK_EVERY);
    assert!(old.release(|| 0));
    assert_eq!(
        new.sequence(&new.current()),
        Some(1),
        "announced on the new file"
    );
}

/// Releases in a row check the link once per [`LINK_CHECK_EVERY`]: one right after a
/// check announces on the file it has, deleted or not (the next check follows the path).
#[test]
fn a_release_right_after_a_link_check_makes_none() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("l.db");
    let old = Board::open(&database).unwrap();
    std::thread::sleep(LINK_CHECK_EVERY);
    let checked = Instant::now();
    assert!(old.release(|| 0), "checked now");
    let before = old.current();
    std::fs::remove_file(board_path(&database)).unwrap();
    let _present = old.presence(&before);
    assert!(old.release(|| 0));
    // On a machine too busy to get here within the interval, the release checked.
    if checked.elapsed() < LINK_CHECK_EVERY {
        assert!(Arc::ptr_eq(&before, &old.current()), "kept the file it had");
        assert_eq!(old.sequence(&before), Some(1), "announced on it");
    }
}

#[test]
fn a_link_or_a_directory_at_the_boards_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (database, victim) = (dir.path().join("l.db"), dir.path().join("victim"));
    std::fs::write(&victim, b"keep").unwrap();
    std::os::unix::fs::symlink(&victim, board_path(&database)).unwrap();
    assert!(Board::open(&database).is_err(), "a link is refused");
    std::fs::remove_file(board_path(&database)).unwrap();
    let board = Board::open(&database).unwrap();
    std::fs::remove_file(board_path(&database)).unwrap();
    std::os::unix::fs::symlink(&victim, board_path(&database)).unwrap();
    assert!(board.announce(0), "the board it had still works");
    std::fs::remove_file(board_path(&database)).unwrap();
    std::fs::create_dir(board_path(&database)).unwrap();
    assert!(board.announce(0));
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"keep",
        "the link's target is untouched"
    );
    assert!(Board::open(&database).is_err(), "a directory is refused");
}
