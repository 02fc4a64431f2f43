//! leasehold from asynchronous code: each locked section runs on tokio's blocking pool.
//!
//! The registry's calls block (a database round trip, or a wait for the lock), and a guard is
//! tied to the thread that took it (it is not `Send`). So an async task hands the whole section
//! — take the lock, do the work, release — to `spawn_blocking`, and awaits its result. Async work
//! that must happen under the lock runs inside that closure with `Handle::block_on`: the blocking
//! thread keeps the guard while the runtime drives the future.
//!
//! `cargo run --example async_service` (SQLite in a temporary directory, no setup).

use leasehold::LockRegistry;
use std::sync::Arc;
use std::time::Duration;

/// Stands for the async work a service does under the lock (an HTTP call, a query through an
/// async driver): here a yield and the number it was given back.
async fn publish_report(fencing_token: u64) -> u64 {
    tokio::task::yield_now().await;
    fencing_token
}

fn main() -> leasehold::Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let registry = Arc::new(
        LockRegistry::sqlite(dir.path().join("locks.db"))
            .create_table(true)
            .build()?,
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");

    let tokens = runtime.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let registry = Arc::clone(&registry);
            let handle = tokio::runtime::Handle::current();
            // The section runs on a blocking thread: it may wait for the lock without stalling
            // the runtime's other tasks.
            tasks.push(tokio::task::spawn_blocking(move || {
                let lock = registry.obtain("nightly-report")?;
                match lock.try_lock_for(Duration::from_secs(10))? {
                    Some(guard) => {
                        let published = handle.block_on(publish_report(guard.fencing_token()));
                        guard.unlock()?; // Err(LeaseLost) if the lease ran out meanwhile
                        Ok(Some(published))
                    }
                    None => Ok(None),
                }
            }));
        }
        let mut tokens = Vec::new();
        for task in tasks {
            let outcome: leasehold::Result<Option<u64>> = task.await.expect("the task ran");
            tokens.extend(outcome?);
        }
        Ok::<_, leasehold::Error>(tokens)
    })?;

    // Four sections, one at a time. Threads of one registry pass the lock among themselves
    // without a statement, so sections that followed each other there share a token.
    assert_eq!(tokens.len(), 4);
    println!("four sections under one lock, fencing tokens {tokens:?}");
    Ok(())
}
