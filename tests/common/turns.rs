//! The contention workload — holds of 1–20 ms, pauses of 0–10 ms, one key — with a
//! witness that counts overlapping critical sections and a tally of each contender's turns.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What one contending thread saw.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Critical sections it ran.
    pub sections: u64,
    /// The longest it waited for the lock, from asking to holding.
    pub longest_wait: Duration,
    /// When that wait began, from the start of the run.
    pub longest_wait_began: Duration,
    /// Each critical section: when it was asked for and when it began.
    pub holds: Vec<(Instant, Instant)>,
}

impl Tally {
    /// Combines the tallies of one instance's threads.
    pub fn merge(tallies: impl IntoIterator<Item = Tally>) -> Tally {
        tallies.into_iter().fold(Tally::default(), |mut all, one| {
            if one.longest_wait > all.longest_wait {
                all.longest_wait = one.longest_wait;
                all.longest_wait_began = one.longest_wait_began;
            }
            all.sections += one.sections;
            all.holds.extend(one.holds);
            all
        })
    }

    /// The section with the longest wait: when it was asked for and when it began.
    pub fn longest(&self) -> Option<(Instant, Instant)> {
        self.holds
            .iter()
            .copied()
            .max_by_key(|(asked, began)| began.duration_since(*asked))
    }
}

/// Counts critical sections that overlap.
#[derive(Default)]
pub struct Witness {
    inside: AtomicBool,
    pub overlaps: AtomicU64,
}

impl Witness {
    fn enter(&self) {
        if self.inside.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self) {
        self.inside.store(false, Ordering::SeqCst);
    }
}

/// A small deterministic generator, so that no test depends on a random crate.
struct Steps(u64);

impl Steps {
    fn millis(&mut self, low: u64, high: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(low + self.0 % (high - low + 1))
    }
}

/// Runs the workload until `end`: `acquire` blocks until it holds the lock (returning what
/// `release` needs), or returns `None` when it gave up.
pub fn contend<G>(
    seed: u64,
    end: Instant,
    witness: &Witness,
    mut acquire: impl FnMut() -> Option<G>,
    mut release: impl FnMut(G),
) -> Tally {
    let mut steps = Steps(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut tally = Tally::default();
    let began = Instant::now();
    while Instant::now() < end {
        let asked = Instant::now();
        let Some(held) = acquire() else { break };
        if asked.elapsed() > tally.longest_wait {
            tally.longest_wait = asked.elapsed();
            tally.longest_wait_began = asked.duration_since(began);
        }
        tally.holds.push((asked, Instant::now()));
        witness.enter();
        std::thread::sleep(steps.millis(1, 20));
        witness.leave();
        tally.sections += 1;
        release(held);
        std::thread::sleep(steps.millis(0, 10));
    }
    tally
}

/// The key's holders run by run, in order: a run is the consecutive sections of one
/// contender (an index into `tallies`, with when its first section began), and the key changed
/// hands between two runs.
pub fn runs(tallies: &[&Tally]) -> Vec<(usize, Instant)> {
    let mut sections: Vec<(Instant, usize)> = tallies
        .iter()
        .enumerate()
        .flat_map(|(who, tally)| tally.holds.iter().map(move |(_, began)| (*began, who)))
        .collect();
    sections.sort();
    let mut runs: Vec<(usize, Instant)> = Vec::new();
    for (began, who) in sections {
        if runs.last().map(|(last, _)| *last) != Some(who) {
            runs.push((who, began));
        }
    }
    runs
}

/// When one wait (asked, began) of contender `me`'s began as the line sees it: when it was
/// asked for, or, for a wait that spans a run of `me`'s own (another of its threads held the
/// key, and its turn ended before this thread had it), when the key left `me` after that run.
/// The line orders instances, and an instance's wait ends with its turn.
pub fn wait_start(
    runs: &[(usize, Instant)],
    me: usize,
    (asked, began): (Instant, Instant),
) -> Instant {
    runs.windows(2)
        .filter(|pair| pair[0].0 == me && pair[1].1 <= began)
        .map(|pair| pair[1].1)
        .max()
        .map_or(asked, |left| left.max(asked))
}

/// The runs of contender `other` (see [`runs`]) that began during one wait (asked, began) of
/// contender `me`'s, from its [`wait_start`].
pub fn runs_during(
    runs: &[(usize, Instant)],
    me: usize,
    other: usize,
    wait: (Instant, Instant),
) -> usize {
    let from = wait_start(runs, me, wait);
    runs.iter()
        .filter(|(who, start)| {
            *who == other && *start >= from && *start > wait.0 && *start < wait.1
        })
        .count()
}

/// Who held the key when, from `lead` before `wait` (a section's asking and beginning) until
/// that wait ended: one entry per run of consecutive sections of one contender (`name`, how
/// many sections, when the run began, in seconds from `start`, the run's start), and after
/// each section whose wait was longer than `long`, who had waited from when. What a round that
/// missed its bound prints, so that the turns that made someone wait can be read off.
pub fn timeline(
    contenders: &[(&str, &Tally)],
    start: Instant,
    wait: (Instant, Instant),
    lead: Duration,
    long: Duration,
) -> String {
    let (from, until) = (wait.0.checked_sub(lead).unwrap_or(wait.0), wait.1);
    let mut holds: Vec<(Instant, Instant, &str)> = contenders
        .iter()
        .flat_map(|(name, tally)| {
            tally
                .holds
                .iter()
                .map(|(asked, began)| (*began, *asked, *name))
        })
        .filter(|(began, _, _)| (from..=until).contains(began))
        .collect();
    holds.sort();
    let at = |t: Instant| t.duration_since(start).as_secs_f64();
    // Lines, and the index of the current run's line with its contender, count and start.
    let mut lines: Vec<String> = Vec::new();
    let mut run: Option<(usize, &str, u32, Instant)> = None;
    for (began, asked, name) in holds {
        match &mut run {
            Some((line, who, count, first)) if *who == name => {
                *count += 1;
                lines[*line] = format!("  {:.3} s {name} x{count}", at(*first));
            }
            _ => {
                lines.push(format!("  {:.3} s {name} x1", at(began)));
                run = Some((lines.len() - 1, name, 1, began));
            }
        }
        if began.duration_since(asked) > long {
            lines.push(format!(
                "    ({name} had waited {:.3} s, from {:.3} s)",
                began.duration_since(asked).as_secs_f64(),
                at(asked)
            ));
        }
    }
    lines.join("\n")
}
