-- leasehold's deletion floor for SQLite: keeps fencing tokens rising when rows of INT_LOCK are
-- deleted, as Spring Integration does on every unlock and operators do when cleaning up. Run it
-- after sql/sqlite.sql, with INT_ replaced by the configured prefix; the registry runs it itself
-- when built with `create_table(true)`. Running it again changes nothing.
-- INT_LOCK_FLOOR keeps, per REGION and per first two characters of LOCK_KEY (at most 256 rows
-- a region for Spring's hexadecimal keys), the highest FENCING_TOKEN of any row deleted from
-- INT_LOCK. A grant's token is above it. Only deletions of rows that carried a token write it
-- (Spring's own rows have token 0); grants only read it.
CREATE TABLE IF NOT EXISTS INT_LOCK_FLOOR (
    REGION VARCHAR(100) NOT NULL,
    KEY_PREFIX VARCHAR(2) NOT NULL,
    FENCING_TOKEN BIGINT NOT NULL,
    PRIMARY KEY (REGION, KEY_PREFIX)
);
CREATE TRIGGER IF NOT EXISTS INT_LOCK_FLOOR AFTER DELETE ON INT_LOCK
FOR EACH ROW WHEN OLD.FENCING_TOKEN > 0
BEGIN
    INSERT INTO INT_LOCK_FLOOR (REGION, KEY_PREFIX, FENCING_TOKEN)
    VALUES (OLD.REGION, substr(OLD.LOCK_KEY, 1, 2), OLD.FENCING_TOKEN)
    ON CONFLICT (REGION, KEY_PREFIX) DO UPDATE SET FENCING_TOKEN = excluded.FENCING_TOKEN
    WHERE excluded.FENCING_TOKEN > INT_LOCK_FLOOR.FENCING_TOKEN;
END;
