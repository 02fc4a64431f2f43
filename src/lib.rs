//! Distributed locks and leases kept in a SQL database, for synchronous Rust.
//!
//! (Crate documentation: see README and the design section below.)
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod cache;
mod error;
mod key;
mod lease;
mod lock;
mod registry;

pub use backend::Statistics;
pub use error::{DatabaseError, Error, LossReason, Result};
pub use key::{lock_key_for, MAX_KEY_BYTES};
pub use lease::{LeaseLost, LostCallback};
pub use lock::{Lock, LockGuard};
pub use registry::{
    LockRegistry, RegistryBuilder, MAX_IDLE_BETWEEN_TRIES, MAX_PREFIX_CHARS, MAX_REGION_CHARS,
    MAX_TIME_TO_LIVE, MIN_TIME_TO_LIVE,
};
