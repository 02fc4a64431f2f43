-- leasehold lock table for MySQL and MariaDB. The registry runs this file itself when built
-- with `create_table(true)`, with INT_ replaced by the configured prefix.
-- Columns up to EXPIRED_AFTER are Spring Integration's INT_LOCK layout (DATETIME(6), as in
-- Spring's MySQL script), so Spring's JdbcLockRegistry and leasehold can share the table and
-- exclude each other. FENCING_TOKEN is leasehold's addition (and LOCK_NAME, the lock's name, which leasehold's grant fills
-- and Spring leaves NULL): its default lets Spring's own
-- INSERT work unchanged.
-- Timestamps are UTC wall-clock values (UTC_TIMESTAMP(6) on the database's clock), independent
-- of the session time zone.
CREATE TABLE IF NOT EXISTS INT_LOCK (
    LOCK_KEY CHAR(36) NOT NULL,
    REGION VARCHAR(100) NOT NULL,
    CLIENT_ID CHAR(36),
    CREATED_DATE DATETIME(6) NOT NULL,
    EXPIRED_AFTER DATETIME(6) NOT NULL,
    FENCING_TOKEN BIGINT NOT NULL DEFAULT 0,
    LOCK_NAME VARCHAR(1024) CHARACTER SET utf8mb4,
    CONSTRAINT INT_LOCK_PK PRIMARY KEY (LOCK_KEY, REGION)
) ENGINE = InnoDB;
