-- leasehold's deletion floor for PostgreSQL: keeps fencing tokens rising when rows of INT_LOCK
-- are deleted, as Spring Integration does on every unlock and operators do when cleaning up.
-- Run it after sql/postgres.sql, with INT_ replaced by the configured prefix (psql -1 runs it in
-- one transaction); the registry runs it itself when built with `create_table(true)`. Running
-- it again replaces the trigger.
-- INT_LOCK_FLOOR keeps, per REGION and per first two characters of LOCK_KEY (at most 256 rows
-- a region for Spring's hexadecimal keys), the highest FENCING_TOKEN of any row deleted from
-- INT_LOCK. A grant's token is above it. Only deletions of rows that carried a token write it
-- (Spring's own rows have token 0); grants only read it, so users that take locks need SELECT
-- on it. The trigger function runs as its owner (SECURITY DEFINER, with the search_path of its
-- creation), so users that delete rows need no privileges on INT_LOCK_FLOOR.
CREATE TABLE IF NOT EXISTS INT_LOCK_FLOOR (
    REGION VARCHAR(100) NOT NULL,
    KEY_PREFIX VARCHAR(2) NOT NULL,
    FENCING_TOKEN BIGINT NOT NULL,
    PRIMARY KEY (REGION, KEY_PREFIX)
);
DROP TRIGGER IF EXISTS INT_LOCK_FLOOR ON INT_LOCK;
CREATE OR REPLACE FUNCTION INT_LOCK_FLOOR() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO INT_LOCK_FLOOR AS kept (REGION, KEY_PREFIX, FENCING_TOKEN)
    VALUES (OLD.REGION, substr(OLD.LOCK_KEY::text, 1, 2), OLD.FENCING_TOKEN)
    ON CONFLICT (REGION, KEY_PREFIX) DO UPDATE SET FENCING_TOKEN = excluded.FENCING_TOKEN
    WHERE kept.FENCING_TOKEN < excluded.FENCING_TOKEN;
    RETURN NULL;
END
$$;
CREATE TRIGGER INT_LOCK_FLOOR AFTER DELETE ON INT_LOCK
FOR EACH ROW WHEN (OLD.FENCING_TOKEN > 0) EXECUTE FUNCTION INT_LOCK_FLOOR();
