-- leasehold semaphore table for SQLite: one row per counting semaphore, recording its
-- number of permits, so that instances that disagree about it get an error instead of
-- N + M holders. The registry runs this file itself when built with `create_table(true)`
-- (and `leasehold init` does), with INT_ replaced by the configured prefix. Existing tables
-- need only this file run once; plain locks never read it.
-- The permits themselves are rows of INT_LOCK whose LOCK_KEY is never a UUID (32 hex digits
-- of the name's hash, '#', the permit's three-digit slot), so Spring Integration never
-- computes, takes or sees them as its locks.
-- SEM_KEY is the semaphore's name mapped as a lock name is (a UUID, see lock_key_for).
CREATE TABLE IF NOT EXISTS INT_LOCK_SEM (
    SEM_KEY CHAR(36) NOT NULL,
    REGION VARCHAR(100) NOT NULL,
    PERMITS INTEGER NOT NULL,
    PRIMARY KEY (SEM_KEY, REGION)
);
