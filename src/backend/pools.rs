//! Connection pools and the first connection: how a store gets its connections.
//!
//! # Connections on demand
//!
//! A store has two pools, the main one (`pool_size`, for acquires, releases and manual renewals)
//! and the renewal pool (`renewal_pool_size`, for background renewals only). Neither opens a
//! connection ahead of need (`min_idle` 0): a pool opens one when a statement finds none idle,
//! up to its size, and closes one that has stayed idle for `idle_connection_timeout`. r2d2
//! looks for idle connections every 30 s (a fixed rate), so an idle connection closes between
//! the timeout and 30 s after it. A process holding one lock therefore keeps one renewal
//! connection (used every renewal period) and, until it times out, the main connection that
//! acquired it. On SQLite a connection is an open file (and its page cache), closed the same
//! way.
//!
//! `build()` still fails fast on a wrong URL or an absent server: each backend opens one
//! direct connection first ([`first_connection`]; SQLite opens the file), and the table check
//! that follows runs on a pooled connection.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::{Failure, FailureKind};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::error::{Error, Result};
use std::time::Duration;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::time::Instant;

/// Pool settings shared by every backend.
#[derive(Debug, Clone)]
pub(crate) struct PoolSettings {
    pub pool_size: u32,
    /// Connections of the renewal pool.
    pub renewal_pool_size: u32,
    /// A pooled connection idle this long is closed (and the PostgreSQL listener's, unsubscribed
    /// this long).
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    /// The registry's `operation_timeout`: the usual deadline of one statement.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub operation_timeout: Duration,
}

/// A pool of at most `size` connections from `manager`, opened on demand (see the module docs):
/// it opens none now.
pub(super) fn build_pool<M: r2d2::ManageConnection>(
    manager: M,
    size: u32,
    pool: &PoolSettings,
) -> r2d2::Pool<M> {
    r2d2::Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .idle_timeout(Some(pool.idle_timeout))
        .test_on_check_out(false)
        .connection_timeout(pool.connect_timeout)
        .error_handler(Box::new(r2d2::NopErrorHandler))
        .build_unchecked(manager)
}

/// Tries one direct connection (`connect` returns the classified failure and a short detail)
/// until `timeout`, retrying every 50 ms while the failure is not fatal (refused, starting up),
/// so that a wrong password or database name is reported as what it is — a pool would only
/// time out.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn first_connection(
    database: &str,
    address: &str,
    timeout: Duration,
    mut connect: impl FnMut() -> Result<(), (Failure, String)>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let pause = Duration::from_millis(50);
    loop {
        let Err((failure, detail)) = connect() else {
            return Ok(());
        };
        let retry = failure.kind != FailureKind::Fatal;
        if !retry || Instant::now() + pause >= deadline {
            let hint = if retry {
                format!(
                    "cannot reach {database} at {address} within {timeout:?} ({detail}): start \
                     the server or fix the URL"
                )
            } else {
                format!("{} (server {address})", failure.hint)
            };
            return Err(Error::Database {
                operation: "connect",
                hint,
                source: failure.source,
            });
        }
        std::thread::sleep(pause);
    }
}
