-- leasehold lock table for PostgreSQL. The registry runs this file itself when built with
-- `create_table(true)`, with INT_ replaced by the configured prefix.
-- Columns up to EXPIRED_AFTER are Spring Integration's INT_LOCK layout, so Spring's
-- JdbcLockRegistry and leasehold can share the table and exclude each other. FENCING_TOKEN is
-- leasehold's addition (and LOCK_NAME, the lock's name, which leasehold's grant fills
-- and Spring leaves NULL): its default lets Spring's own INSERT work unchanged.
-- Timestamps are UTC wall-clock values without a time zone (as Spring writes them), taken from
-- the database's clock by leasehold.
CREATE TABLE IF NOT EXISTS INT_LOCK (
    LOCK_KEY CHAR(36) NOT NULL,
    REGION VARCHAR(100) NOT NULL,
    CLIENT_ID CHAR(36),
    CREATED_DATE TIMESTAMP NOT NULL,
    EXPIRED_AFTER TIMESTAMP NOT NULL,
    FENCING_TOKEN BIGINT NOT NULL DEFAULT 0,
    LOCK_NAME VARCHAR(1024),
    CONSTRAINT INT_LOCK_PK PRIMARY KEY (LOCK_KEY, REGION)
);
