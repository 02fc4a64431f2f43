-- leasehold's deletion floor for MySQL and MariaDB: keeps fencing tokens rising when rows of
-- INT_LOCK are deleted, as Spring Integration does on every unlock and operators do when
-- cleaning up. Run it after sql/mysql.sql, with INT_ replaced by the configured prefix; the
-- registry runs it itself when built with `create_table(true)`. Running it again replaces the
-- trigger. (A trigger cannot write the table that fired it, hence the second table.)
-- INT_LOCK_FLOOR keeps, per REGION and per first two characters of LOCK_KEY (at most 256 rows
-- a region for Spring's hexadecimal keys), the highest FENCING_TOKEN of any row deleted from
-- INT_LOCK. A grant's token is above it. Only deletions of rows that carried a token write it
-- (Spring's own rows have token 0); grants only read it, so users that take locks need SELECT
-- on it. The trigger runs with its definer's privileges: users that delete rows need none on
-- INT_LOCK_FLOOR. Creating it takes the TRIGGER privilege (and, with binary logging on, SUPER
-- or log_bin_trust_function_creators).
CREATE TABLE IF NOT EXISTS INT_LOCK_FLOOR (
    REGION VARCHAR(100) NOT NULL,
    KEY_PREFIX VARCHAR(2) NOT NULL,
    FENCING_TOKEN BIGINT NOT NULL,
    PRIMARY KEY (REGION, KEY_PREFIX)
) ENGINE = InnoDB;
DROP TRIGGER IF EXISTS INT_LOCK_FLOOR;
CREATE TRIGGER INT_LOCK_FLOOR AFTER DELETE ON INT_LOCK FOR EACH ROW
    INSERT INTO INT_LOCK_FLOOR (REGION, KEY_PREFIX, FENCING_TOKEN)
    SELECT OLD.REGION, LEFT(OLD.LOCK_KEY, 2), OLD.FENCING_TOKEN FROM DUAL
    WHERE OLD.FENCING_TOKEN > 0
    ON DUPLICATE KEY UPDATE FENCING_TOKEN = GREATEST(FENCING_TOKEN, OLD.FENCING_TOKEN);
