-- leasehold's waiting line for MySQL and MariaDB: the instances waiting for a lock, oldest first, so
-- that a freed lock goes to the instance that has waited longest. The registry runs this file
-- itself when built with `create_table(true)` (and `leasehold init` does), with INT_ replaced
-- by the configured prefix. Without it, locks work as before and waiting instances have no
-- order among them. Spring Integration never reads it.
-- One row per lock, region and waiting instance (CLIENT_ID): SINCE is when it started waiting,
-- EXPIRED_AFTER when its place lapses unless the instance, still waiting, refreshes it; times
-- are UTC on the database clock, as in INT_LOCK.
CREATE TABLE IF NOT EXISTS INT_LOCK_QUEUE (
    LOCK_KEY CHAR(36) NOT NULL,
    REGION VARCHAR(100) NOT NULL,
    CLIENT_ID VARCHAR(36) NOT NULL,
    SINCE DATETIME(6) NOT NULL,
    EXPIRED_AFTER DATETIME(6) NOT NULL,
    PRIMARY KEY (LOCK_KEY, REGION, CLIENT_ID)
) ENGINE = InnoDB;
