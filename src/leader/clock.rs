//! The offset between this instance's wall clock and the database clock: measured, shown,
//! and used to correct the wall-clock times an election reports. Leases never depend on it.

use super::ClientClock;
use crate::error::Result;
use crate::registry::LockRegistry;
use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One measurement of the offset between the database clock and this instance's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockOffset {
    micros: i64,
    round_trip: Duration,
    measured_at: Instant,
}

impl ClockOffset {
    /// Database clock minus client clock, in microseconds: positive when the database is ahead.
    pub fn as_micros(&self) -> i64 {
        self.micros
    }

    /// The size of the offset, whichever clock is ahead.
    pub fn magnitude(&self) -> Duration {
        Duration::from_micros(self.micros.unsigned_abs())
    }

    /// `true` when the database clock is ahead of the client clock.
    pub fn database_is_ahead(&self) -> bool {
        self.micros > 0
    }

    /// The round trip of the measuring query; the offset is uncertain by half of it.
    pub fn round_trip(&self) -> Duration {
        self.round_trip
    }

    /// When it was measured, on the monotonic clock.
    pub fn measured_at(&self) -> Instant {
        self.measured_at
    }

    /// `client_time` moved onto the database clock (client time plus the offset).
    pub fn to_database_time(&self, client_time: SystemTime) -> SystemTime {
        let shift = self.magnitude();
        let moved = if self.micros >= 0 {
            client_time.checked_add(shift)
        } else {
            client_time.checked_sub(shift)
        };
        moved.unwrap_or(client_time)
    }
}

impl fmt::Display for ClockOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.micros < 0 { "-" } else { "+" };
        write!(
            f,
            "{sign}{:.3} s (database minus client; ±{:.3} s)",
            self.magnitude().as_secs_f64(),
            self.round_trip.as_secs_f64() / 2.0
        )
    }
}

/// Reads the database clock between two readings of the client clock.
pub(super) fn measure(registry: &LockRegistry, clock: &ClientClock) -> Result<ClockOffset> {
    let before = clock();
    let (database, round_trip) = registry.database_time()?;
    let after = clock();
    let measured_at = Instant::now();
    let midpoint =
        (i128::from(micros_since_epoch(before)) + i128::from(micros_since_epoch(after))) / 2;
    let offset = i128::from(micros_since_epoch(database)) - midpoint;
    Ok(ClockOffset {
        micros: i64::try_from(offset).unwrap_or(if offset < 0 { i64::MIN + 1 } else { i64::MAX }),
        round_trip,
        measured_at,
    })
}

fn micros_since_epoch(at: SystemTime) -> i64 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_micros()).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset(micros: i64) -> ClockOffset {
        ClockOffset {
            micros,
            round_trip: Duration::from_millis(2),
            measured_at: Instant::now(),
        }
    }

    #[test]
    fn offsets_move_client_time_onto_the_database_clock() {
        let t = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(
            offset(2_000_000).to_database_time(t),
            t + Duration::from_secs(2)
        );
        assert_eq!(
            offset(-2_000_000).to_database_time(t),
            t - Duration::from_secs(2)
        );
        assert!(offset(1).database_is_ahead());
        assert_eq!(offset(-1_500_000).magnitude(), Duration::from_millis(1500));
        assert!(offset(-1_500_000).to_string().starts_with("-1.500 s"));
    }

    #[test]
    fn times_before_the_epoch_are_negative_micros() {
        assert_eq!(
            micros_since_epoch(UNIX_EPOCH - Duration::from_micros(5)),
            -5
        );
        assert_eq!(micros_since_epoch(UNIX_EPOCH + Duration::from_micros(5)), 5);
    }
}
