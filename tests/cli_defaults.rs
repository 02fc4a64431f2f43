//! The `leasehold` command's defaults, run as a real process against every database: nothing
//! but `init` (or `--create`) makes a table or an SQLite file; `-q` keeps refusals silent;
//! `list --key` filters; a forwarded SIGTERM is followed by SIGKILL after `--grace`; `status`
//! and `list` say the same of a row; read-only commands open SQLite read-only and a directory
//! SQLite cannot write is named; messages speak of the command, not of the library; a table of
//! another shape is not offered a `DROP TABLE`; SIGTSTP never stops leasehold inside a
//! statement; what a command leaves running is said, and an interrupt stops it; the URL's
//! connect timeout, `-w` and `--db-timeout` bound the waits for the database; odd inputs get
//! one answer from every subcommand.
//!
//! `LEASEHOLD_TEST_BIN` runs the tests against another build of the command.

#![cfg(feature = "cli")]

mod common;

mod suite {
    use crate::common::{Db, Fixture};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Output, Stdio};
    use std::thread;
    use std::time::{Duration, Instant};

    const GENEROUS: Duration = Duration::from_secs(30);

    fn binary() -> PathBuf {
        std::env::var_os("LEASEHOLD_TEST_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_leasehold")))
    }

    fn url(f: &Fixture) -> String {
        match f.db {
            Db::Sqlite => format!("sqlite:{}", f.sqlite_path().display()),
            Db::Postgres => crate::common::postgres_url(),
            Db::Mysql => crate::common::mysql_url(),
        }
    }

    /// `leasehold SUBCOMMAND --database … --prefix PREFIX ARGS…`, in a process group of its
    /// own (so that it never takes the test's terminal).
    fn leasehold_on(f: &Fixture, prefix: &str, subcommand: &str, args: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(binary());
        command
            .arg(subcommand)
            .args(["--database", &url(f), "--prefix", prefix])
            .args(args)
            .env_remove("LEASEHOLD_DATABASE_URL")
            .stdin(Stdio::null())
            .process_group(0);
        command
    }

    fn leasehold(f: &Fixture, subcommand: &str, args: &[&str]) -> Command {
        leasehold_on(f, &f.prefix, subcommand, args)
    }

    fn output(mut command: Command) -> Output {
        command.output().expect("leasehold runs")
    }

    fn code(output: &Output) -> i32 {
        output.status.code().unwrap_or_else(|| panic!("{output:?}"))
    }

    fn stderr(output: &Output) -> String {
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    fn stdout(output: &Output) -> String {
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn json(output: &Output) -> serde_json::Value {
        serde_json::from_str(&stdout(output)).unwrap_or_else(|e| panic!("{e}: {output:?}"))
    }

    fn wait_for_file(path: &Path) {
        let deadline = Instant::now() + GENEROUS;
        while std::fs::read_to_string(path).map_or(true, |text| !text.ends_with('\n')) {
            assert!(
                Instant::now() < deadline,
                "{} never written",
                path.display()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn read_pid(path: &Path) -> u32 {
        wait_for_file(path);
        std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    fn wait_with_deadline(child: &mut Child) -> std::process::ExitStatus {
        let deadline = Instant::now() + GENEROUS;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("leasehold did not end in {GENEROUS:?}");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The state letter of process `pid` (`T` when stopped), from `/proc`.
    fn state_of(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 2..].chars().next()
    }

    fn send(signal: &str, pid: u32) {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    /// Kills (and continues) a process group when dropped, so that a failing test leaves
    /// nothing running.
    struct Reaper(Vec<u32>);

    impl Drop for Reaper {
        fn drop(&mut self) {
            for pid in &self.0 {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }

    /// Drops the tables of a prefix when dropped, even when the test fails.
    struct DropTables<'a>(&'a Fixture, String);

    impl Drop for DropTables<'_> {
        fn drop(&mut self) {
            self.0.drop_tables(&self.1);
        }
    }

    /// Whether table `{prefix}LOCK` exists on the fixture's database.
    fn table_exists(f: &Fixture, prefix: &str) -> bool {
        let table = format!("{prefix}LOCK").to_lowercase();
        match f.db {
            #[cfg(feature = "sqlite")]
            Db::Sqlite => {
                if !f.sqlite_path().exists() {
                    return false;
                }
                let conn = rusqlite::Connection::open(f.sqlite_path()).unwrap();
                conn.query_row(
                    "SELECT count(*) FROM sqlite_master WHERE lower(name) = ?1",
                    [&table],
                    |row| row.get::<_, i64>(0),
                )
                .unwrap()
                    > 0
            }
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                let mut client =
                    postgres::Client::connect(&crate::common::postgres_url(), postgres::NoTls)
                        .unwrap();
                let row = client
                    .query_one(
                        "SELECT count(*) FROM information_schema.tables \
                         WHERE lower(table_name) = $1",
                        &[&table],
                    )
                    .unwrap();
                row.get::<_, i64>(0) > 0
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let opts = mysql::Opts::from_url(&crate::common::mysql_url()).unwrap();
                let mut conn = mysql::Conn::new(opts).unwrap();
                let count: Option<i64> = conn
                    .exec_first(
                        "SELECT count(*) FROM information_schema.tables \
                         WHERE table_schema = DATABASE() AND lower(table_name) = ?",
                        (&table,),
                    )
                    .unwrap();
                count.unwrap_or(0) > 0
            }
            #[allow(unreachable_patterns)]
            other => panic!("{other:?} support is not compiled in"),
        }
    }

    /// Runs `sql` (several statements) on the fixture's database with the driver directly.
    fn execute(f: &Fixture, sql: &str) {
        crate::common::raw::Raw::open(f).execute_batch(sql);
    }

    /// A mistyped `--prefix` (or SQLite path) made `run` and `lead` create a second lock table
    /// and run the job under it, beside an instance holding the key in the real one.
    pub fn run_and_lead_use_only_an_existing_table_and_point_at_init(f: &Fixture) {
        let typo = format!("{}TYPO_", f.prefix);
        let _dropper = DropTables(f, typo.clone());
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        let touch = format!("touch '{}'", ran.display());
        for (subcommand, args) in [
            ("run", &["--key", "job"][..]),
            ("run", &["--key", "job", "--permits", "2"][..]),
            ("run", &["--key", "job", "--read"][..]),
            ("lead", &["--group", "job", "--once"][..]),
        ] {
            let mut command = leasehold_on(f, &typo, subcommand, args);
            command.args(["--", "sh", "-c", &touch]);
            let refused = output(command);
            assert_eq!(code(&refused), 70, "{subcommand} {args:?}: {refused:?}");
            let said = stderr(&refused);
            assert!(
                said.contains(&format!("{typo}LOCK does not exist"))
                    && said.contains("`leasehold init`")
                    && said.contains("--create")
                    && said.contains("--prefix"),
                "{subcommand} {args:?}: {said}"
            );
            assert!(!ran.exists(), "{subcommand} {args:?} ran the command");
            assert!(
                !table_exists(f, &typo),
                "{subcommand} {args:?} made the table"
            );
        }
        // --create makes the table, as init does, and runs.
        let mut command = leasehold_on(f, &typo, "run", &["--create", "--key", "job"]);
        command.args(["--", "sh", "-c", &touch]);
        let created = output(command);
        assert_eq!(code(&created), 0, "{created:?}");
        assert!(ran.exists() && table_exists(f, &typo));

        if f.db == Db::Sqlite {
            // A mistyped file name: no file appears, nothing runs.
            let file = dir.path().join("jbos.db");
            std::fs::remove_file(&ran).unwrap();
            for subcommand in ["run", "lead"] {
                let key = if subcommand == "run" {
                    "--key"
                } else {
                    "--group"
                };
                let refused = output({
                    let mut c = Command::new(binary());
                    c.args([subcommand, "--database"])
                        .arg(format!("sqlite:{}", file.display()))
                        .args([key, "job", "--", "sh", "-c", &touch])
                        .stdin(Stdio::null());
                    c
                });
                assert_eq!(code(&refused), 70, "{refused:?}");
                assert!(
                    stderr(&refused).contains("leasehold init --database sqlite:"),
                    "{refused:?}"
                );
                assert!(!file.exists() && !ran.exists(), "{subcommand} made or ran");
            }
        }
    }

    /// A crontab line written the flock way (`-n -E 0`) mailed the operator at every skip.
    /// (A wait takes seconds: it includes connecting, and a wait that ends before the
    /// database answered is a database failure, exit 70; on a loaded machine a fresh
    /// process's first MySQL statement took over 200 ms.)
    pub fn quiet_refusals_print_nothing(f: &Fixture) {
        let registry = f.registry();
        let held = registry.obtain("nightly").unwrap().lock().unwrap();
        for (args, expected) in [
            (&["-n", "-q", "-E", "0"][..], 0),
            (&["--no-wait", "--quiet"][..], 75),
            (&["--wait", "3", "-q"][..], 75),
            (&["--permits", "1", "-q", "-n"][..], 75),
        ] {
            if args.contains(&"--permits") {
                let _permit = registry.semaphore("nightly", 1).unwrap().acquire().unwrap();
                let mut command = leasehold(f, "run", &["--key", "nightly"]);
                command.args(args).args(["--", "true"]);
                let skipped = output(command);
                assert_eq!(code(&skipped), expected, "{args:?}: {skipped:?}");
                assert!(
                    skipped.stderr.is_empty() && skipped.stdout.is_empty(),
                    "{skipped:?}"
                );
                continue;
            }
            let mut command = leasehold(f, "run", &["--key", "nightly"]);
            command.args(args).args(["--", "echo", "ran"]);
            let skipped = output(command);
            assert_eq!(code(&skipped), expected, "{args:?}: {skipped:?}");
            assert!(
                skipped.stderr.is_empty() && skipped.stdout.is_empty(),
                "{args:?}: {skipped:?}"
            );
        }
        // Without it the refusal is said; failures are said with it.
        let mut command = leasehold(f, "run", &["--key", "nightly", "-n", "--", "true"]);
        command.stdin(Stdio::null());
        let said = output(command);
        assert_eq!(code(&said), 75);
        assert!(stderr(&said).contains("is held"), "{said:?}");
        let failed = output(leasehold_on(
            f,
            &format!("{}NONE_", f.prefix),
            "run",
            &["-q", "-n", "--key", "nightly", "--", "true"],
        ));
        assert_eq!(code(&failed), 70);
        assert!(stderr(&failed).contains("leasehold init"), "{failed:?}");
        held.unlock().unwrap();
    }

    /// `list --key NAME` only named rows; everyone reads it as a filter, as it is on `status`.
    pub fn list_key_shows_only_the_rows_of_that_name(f: &Fixture) {
        let registry = f.registry();
        registry
            .obtain("a")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        let other = registry.obtain("b").unwrap().lock().unwrap();
        let permit = registry.semaphore("a", 3).unwrap().acquire().unwrap();
        let other_permit = registry.semaphore("b", 3).unwrap().acquire().unwrap();
        let reading = registry.rw_lock("a").unwrap().read().unwrap();
        let listed = output(leasehold(f, "list", &["--key", "a", "--json"]));
        assert_eq!(code(&listed), 0, "{listed:?}");
        let rows = json(&listed);
        let rows = rows.as_array().unwrap();
        let shown: Vec<(String, String)> = rows
            .iter()
            .map(|row| {
                (
                    row["key"].as_str().unwrap_or("?").to_string(),
                    row["state"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(rows.len(), 3, "{shown:?}");
        assert!(shown.iter().all(|(key, _)| key == "a"), "{shown:?}");
        let lock_key = leasehold::lock_key_for("a");
        assert!(
            rows.iter()
                .any(|row| row["lock_key"] == lock_key.as_str() && row["state"] == "released"),
            "{shown:?}"
        );
        // The table for people, and two names.
        let table = output(leasehold(f, "list", &["--key", "a"]));
        let text = stdout(&table);
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(
            !text.contains(" b ") && text.contains("a (permit "),
            "{text}"
        );
        let both = json(&output(leasehold(
            f,
            "list",
            &["--key", "a", "--key", "b", "--json"],
        )));
        assert_eq!(both.as_array().unwrap().len(), 5, "{both}");
        let none = output(leasehold(f, "list", &["--key", "c"]));
        assert_eq!(code(&none), 0);
        assert!(stdout(&none).starts_with("no locks named c"), "{none:?}");
        drop((other, permit, other_permit, reading));
    }

    /// A command that ignores a forwarded SIGTERM kept the lock until something SIGKILLed
    /// leasehold itself.
    pub fn a_forwarded_sigterm_is_followed_by_sigkill_after_the_grace(f: &Fixture) {
        for subcommand in ["run", "lead"] {
            let dir = tempfile::tempdir().unwrap();
            let ready = dir.path().join("ready");
            let script = format!(
                "trap '' TERM; echo $$ > '{}'; while :; do sleep 0.05; done",
                ready.display()
            );
            let name = if subcommand == "run" {
                "--key"
            } else {
                "--group"
            };
            let mut run = leasehold(f, subcommand, &[name, "stubborn", "--grace", "1s", "--"])
                .args(["sh", "-c", &script])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let _reaper = Reaper(vec![run.id()]);
            let command = read_pid(&ready);
            let _command_reaper = Reaper(vec![command]);
            send("TERM", run.id());
            let status = wait_with_deadline(&mut run);
            assert_eq!(status.code(), Some(128 + 9), "{subcommand}: {status:?}");
            let mut said = String::new();
            std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut said).unwrap();
            assert!(said.contains("SIGKILL"), "{subcommand}: {said}");
            assert!(
                state_of(command).is_none(),
                "{subcommand}: the command is gone"
            );
            let free = output(leasehold(f, "status", &["--key", "stubborn", "--json"]));
            assert_eq!(code(&free), 1, "{subcommand}: released: {free:?}");
        }
        // --help says so.
        let help = output({
            let mut c = Command::new(binary());
            c.args(["run", "--help"]);
            c
        });
        let help = stdout(&help);
        assert!(
            help.contains("SIGTERM sent to leasehold") && help.contains("timeout -k"),
            "{help}"
        );
    }

    /// `status` said `free` (token null) of a row `list` called `released` with its token.
    pub fn status_and_list_say_the_same_of_a_row(f: &Fixture) {
        let registry = f.registry();
        let guard = registry.obtain("done").unwrap().lock().unwrap();
        let token = guard.fencing_token();
        guard.unlock().unwrap();
        let expiring = f
            .builder()
            .time_to_live(leasehold::MIN_TIME_TO_LIVE)
            .renewal(false)
            .build()
            .unwrap();
        let crashed = expiring.obtain("crashed").unwrap().lock().unwrap();
        let crashed_token = crashed.fencing_token();
        std::mem::forget(crashed);
        thread::sleep(Duration::from_millis(200));
        let listed = json(&output(leasehold(
            f,
            "list",
            &["--key", "done", "--key", "crashed", "--json"],
        )));
        for (key, word, expected) in [
            ("done", "released", token),
            ("crashed", "expired", crashed_token),
        ] {
            let row = listed
                .as_array()
                .unwrap()
                .iter()
                .find(|row| row["key"] == key)
                .unwrap_or_else(|| panic!("{key} in {listed}"));
            assert_eq!(row["state"], word, "{row}");
            assert_eq!(row["fencing_token"], expected, "{row}");
            let status = output(leasehold(f, "status", &["--key", key, "--json"]));
            assert_eq!(code(&status), 1, "{status:?}");
            let object = json(&status);
            for field in [
                "state",
                "fencing_token",
                "client_id",
                "expires_at",
                "acquired",
            ] {
                assert_eq!(object[field], row[field], "{field}: {object} vs {row}");
            }
            let line = stdout(&output(leasehold(f, "status", &["--key", key])));
            assert!(
                line.starts_with(&format!("{key}: {word}"))
                    && line.contains(&format!("fencing token {expected}")),
                "{line}"
            );
        }
        let never = output(leasehold(f, "status", &["--key", "never", "--json"]));
        assert_eq!(json(&never)["state"], "free");
        assert_eq!(json(&never)["fencing_token"], serde_json::Value::Null);
    }

    /// A command that runs `leasehold ARGS` as another user (nobody, when the tests run as
    /// root) who may not write what root made; `None` when there is no way to.
    fn as_other_user(args: &[String]) -> Command {
        let root = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
            .unwrap_or(false);
        let mut command = if root {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(binary());
            c
        } else {
            Command::new(binary())
        };
        command
            .args(args)
            .env_remove("LEASEHOLD_DATABASE_URL")
            .stdin(Stdio::null());
        command
    }

    /// `status` and `list` of a user who may only read the database file failed ("attempt to
    /// write a readonly database"); one whose directory is not writable, or who may not read
    /// the `-shm` file, got a message about permissions in general, not about the files SQLite
    /// needs beside the database.
    pub fn read_only_users_read_and_unwritable_directories_are_named(f: &Fixture) {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(f.db, Db::Sqlite);
        let dir = tempfile::tempdir().unwrap();
        let locks = dir.path().join("locks");
        std::fs::create_dir(&locks).unwrap();
        let file = locks.join("jobs.db");
        let url = format!("sqlite:{}", file.display());
        let init = output({
            let mut c = Command::new(binary());
            c.args(["init", "--database", &url]);
            c
        });
        assert_eq!(code(&init), 0, "{init:?}");
        let registry = leasehold::LockRegistry::sqlite(&file).build().unwrap();
        let held = registry.obtain("job").unwrap().lock().unwrap();
        let token = held.fencing_token();
        // Another user, or this one without write permission: may read, not write.
        for path in [dir.path(), &locks] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        for entry in std::fs::read_dir(&locks).unwrap() {
            let path = entry.unwrap().path();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        }
        std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o555)).unwrap();
        let args = |rest: &[&str]| -> Vec<String> {
            let mut all = vec![rest[0].to_string(), "--database".to_string(), url.clone()];
            all.extend(rest[1..].iter().map(|s| s.to_string()));
            all
        };
        // While a holder has the database open, its -wal and -shm files are there: reading
        // needs no write.
        let status = output(as_other_user(&args(&["status", "--key", "job", "--json"])));
        assert_eq!(code(&status), 0, "{status:?}");
        assert_eq!(json(&status)["fencing_token"], token);
        assert!(stderr(&status).is_empty(), "{status:?}");
        let list = output(as_other_user(&args(&["list", "--json"])));
        assert_eq!(code(&list), 0, "{list:?}");
        // Reading needs the files beside it readable too; the message names the one that is
        // not (it said only "unable to open database file").
        let shm = locks.join("jobs.db-shm");
        std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o600)).unwrap();
        let unreadable = output(as_other_user(&args(&["status", "--key", "job"])));
        assert_eq!(code(&unreadable), 70, "{unreadable:?}");
        assert!(
            stderr(&unreadable).contains(&format!("may not read {}", shm.display())),
            "{unreadable:?}"
        );
        std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o444)).unwrap();
        // Taking a lock writes: the message says what may not be written.
        let run = output(as_other_user(&args(&[
            "run", "--key", "other", "-n", "--", "true",
        ])));
        assert_eq!(code(&run), 70, "{run:?}");
        assert!(
            stderr(&run).contains("may not write the database file"),
            "{run:?}"
        );
        // Once nobody has it open, SQLite must create -wal and -shm beside it to write.
        held.unlock().unwrap();
        drop(registry);
        std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o755)).unwrap();
        for suffix in ["-wal", "-shm"] {
            let mut name = file.clone().into_os_string();
            name.push(suffix);
            let _ = std::fs::remove_file(name);
        }
        std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o555)).unwrap();
        let command = args(&["run", "--key", "job", "--", "true"]);
        let refused = output(as_other_user(&command));
        assert_eq!(code(&refused), 70, "{command:?}: {refused:?}");
        let said = stderr(&refused);
        assert!(
            said.contains(&format!("directory {}", locks.display()))
                && said.contains("WAL")
                && said.contains("jobs.db-wal")
                && said.contains("jobs.db-shm"),
            "{command:?}: {said}"
        );
        std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A user who may only read the database and its directory could run `status` and `list`
    /// only while a process had the database open (its -wal and -shm beside it); otherwise
    /// both exited 70. With no write-ahead log to leave out, they read the file as it is and
    /// say on stderr that it is a snapshot; `--watch`, which an immutable read would show
    /// frozen, is refused; a -wal with commits in it (a crashed writer's) is never left out.
    pub fn a_reader_who_may_not_create_the_wal_files_reads_a_labelled_snapshot(f: &Fixture) {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(f.db, Db::Sqlite);
        let mode = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        mode(dir.path(), 0o755);
        let locks = dir.path().join("locks");
        std::fs::create_dir(&locks).unwrap();
        let file = locks.join("jobs.db");
        let url = format!("sqlite:{}", file.display());
        let init = output({
            let mut c = Command::new(binary());
            c.args(["init", "--database", &url]);
            c
        });
        assert_eq!(code(&init), 0, "{init:?}");
        // A holder's row (a holder whose connections are closed, or Spring Integration's).
        let lock_key = leasehold::lock_key_for("job");
        let hold = |client: &str| {
            format!(
                "INSERT INTO INT_LOCK (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER) \
                 VALUES ('{lock_key}', 'DEFAULT', '{client}', \
                 strftime('%Y-%m-%d %H:%M:%f', 'now'), \
                 strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 hour')) \
                 ON CONFLICT DO UPDATE SET CLIENT_ID = excluded.CLIENT_ID"
            )
        };
        let conn = rusqlite::Connection::open(&file).unwrap();
        conn.execute_batch(&hold("host-a/1/aaaa")).unwrap();
        drop(conn);
        let beside = |suffix: &str| {
            let mut name = file.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        };
        assert!(
            !beside("-wal").exists(),
            "the last connection removes the log"
        );
        mode(&file, 0o444);
        mode(&locks, 0o555);
        let args = |rest: &[&str]| -> Vec<String> {
            let mut all = vec![rest[0].to_string(), "--database".to_string(), url.clone()];
            all.extend(rest[1..].iter().map(|s| s.to_string()));
            all
        };
        let status = output(as_other_user(&args(&["status", "--key", "job", "--json"])));
        assert_eq!(code(&status), 0, "{status:?}");
        assert_eq!(json(&status)["client_id"], "host-a/1/aaaa", "{status:?}");
        let said = stderr(&status);
        assert!(
            said.contains("snapshot") && said.contains(&file.display().to_string()),
            "{said}"
        );
        let list = output(as_other_user(&args(&["list"])));
        assert_eq!(code(&list), 0, "{list:?}");
        assert!(stdout(&list).contains("host-a/1/aaaa"), "{list:?}");
        assert!(stderr(&list).contains("snapshot"), "{list:?}");
        for watching in [
            args(&["status", "--key", "job", "--watch", "1"]),
            args(&["list", "--watch", "1"]),
        ] {
            let refused = output(as_other_user(&watching));
            assert_eq!(code(&refused), 70, "{watching:?}: {refused:?}");
            assert!(
                stderr(&refused).contains("--watch needs a live read"),
                "{refused:?}"
            );
        }
        // A writer that crashed with a commit only in its log: the file alone is out of date,
        // and no snapshot of it is shown.
        mode(&locks, 0o755);
        mode(&file, 0o644);
        let conn = rusqlite::Connection::open(&file).unwrap();
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap();
        conn.execute_batch(&hold("host-b/2/bbbb")).unwrap();
        let crashed = dir.path().join("crashed");
        std::fs::create_dir(&crashed).unwrap();
        for suffix in ["", "-wal"] {
            let mut name = crashed.join("jobs.db").into_os_string();
            name.push(suffix);
            std::fs::copy(beside(suffix), name).unwrap();
        }
        drop(conn);
        let crashed_url = format!("sqlite:{}", crashed.join("jobs.db").display());
        for entry in std::fs::read_dir(&crashed).unwrap() {
            mode(&entry.unwrap().path(), 0o444);
        }
        mode(&crashed, 0o555);
        let refused = output(as_other_user(&[
            "status".into(),
            "--database".into(),
            crashed_url.clone(),
            "--key".into(),
            "job".into(),
        ]));
        assert_eq!(code(&refused), 70, "{refused:?}");
        assert!(
            !stdout(&refused).contains("host-a") && stderr(&refused).contains("jobs.db-shm"),
            "{refused:?}"
        );
        // Where the log can be read, it holds the later commit.
        mode(&crashed, 0o755);
        let live = output({
            let mut c = Command::new(binary());
            c.args([
                "status",
                "--database",
                &crashed_url,
                "--key",
                "job",
                "--json",
            ]);
            c
        });
        assert_eq!(json(&live)["client_id"], "host-b/2/bbbb", "{live:?}");
        mode(&locks, 0o755);
    }

    /// Messages for library users reached command users: a DDL file of the source tree, a
    /// constructor, `create_table(true)`; and a table of another shape met through a mistaken
    /// prefix was offered `DROP TABLE`.
    pub fn messages_name_the_command_and_spare_foreign_tables(f: &Fixture) {
        let foreign = format!("{}APP_", f.prefix);
        let _dropper = DropTables(f, foreign.clone());
        execute(
            f,
            &format!(
                "CREATE TABLE {foreign}LOCK (ID INT PRIMARY KEY, REGION VARCHAR(10), AMOUNT INT)"
            ),
        );
        for (subcommand, args) in [
            ("status", &["--key", "k"][..]),
            ("list", &[][..]),
            ("run", &["--key", "k", "--", "true"][..]),
            ("run", &["--create", "--key", "k", "--", "true"][..]),
            ("init", &[][..]),
        ] {
            let refused = output(leasehold_on(f, &foreign, subcommand, args));
            assert_eq!(code(&refused), 70, "{subcommand} {args:?}: {refused:?}");
            let said = stderr(&refused);
            assert!(
                said.contains("not a lock table")
                    && said.contains("check --prefix")
                    && !said.contains("DROP")
                    && !said.contains("ALTER"),
                "{subcommand} {args:?}: {said}"
            );
        }
        // A lock table of an old shape (Spring Integration's first, without REGION) is
        // recognised: the fix names the command's DDL, not a file of the source tree.
        let old = format!("{}OLD_", f.prefix);
        let _old_dropper = DropTables(f, old.clone());
        execute(
            f,
            &format!(
                "CREATE TABLE {old}LOCK (LOCK_KEY CHAR(36) PRIMARY KEY, CLIENT_ID CHAR(36), \
                 CREATED_DATE TIMESTAMP NOT NULL)"
            ),
        );
        let refused = output(leasehold_on(f, &old, "status", &["--key", "k"]));
        assert_eq!(code(&refused), 70, "{refused:?}");
        let said = stderr(&refused);
        assert!(
            said.contains(&format!("DROP TABLE {old}LOCK"))
                && said.contains("leasehold init")
                && !said.contains("sql/"),
            "{said}"
        );
        // A table without its deletion floor: the warning names the command, not a DDL file.
        let bare = format!("{}BARE_", f.prefix);
        let _bare_dropper = DropTables(f, bare.clone());
        let timestamp = if f.db == Db::Mysql {
            "DATETIME(6)"
        } else {
            "TIMESTAMP"
        };
        execute(
            f,
            &format!(
                "CREATE TABLE {bare}LOCK (LOCK_KEY CHAR(36) NOT NULL, REGION VARCHAR(100) NOT \
                 NULL, CLIENT_ID CHAR(36), CREATED_DATE {timestamp} NOT NULL, EXPIRED_AFTER \
                 {timestamp} NOT NULL, FENCING_TOKEN BIGINT NOT NULL DEFAULT 0, PRIMARY KEY \
                 (LOCK_KEY, REGION))"
            ),
        );
        let warned = output(leasehold_on(f, &bare, "status", &["--key", "k"]));
        assert_eq!(code(&warned), 1, "{warned:?}");
        let said = stderr(&warned);
        assert!(
            said.contains("deletion floor")
                && said.contains("leasehold init")
                && !said.contains("sql/")
                && !said.contains("create_table"),
            "{said}"
        );
    }

    /// A `mysql://` URL given PostgreSQL's port was told to use `LockRegistry::postgres`.
    pub fn a_url_of_the_wrong_database_names_the_url_to_give(f: &Fixture) {
        assert_eq!(f.db, Db::Postgres);
        let port = crate::common::postgres_url()
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next().map(str::to_string))
            .unwrap();
        let refused = output({
            let mut c = Command::new(binary());
            c.args(["status", "--key", "k", "--database"])
                .arg(format!("mysql://root@127.0.0.1:{port}/test"));
            c
        });
        assert_eq!(code(&refused), 70, "{refused:?}");
        let said = stderr(&refused);
        assert!(
            said.contains("postgres:// URL") && !said.contains("LockRegistry"),
            "{said}"
        );
    }

    /// SIGTSTP stopped leasehold wherever it was, inside an SQLite statement too — which keeps
    /// the file's write lock and stops every lock on the database — and with it the renewals:
    /// the lease ran out while the command ran on.
    pub fn sigtstp_stops_the_command_and_leasehold_keeps_renewing(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let script = format!(
            "echo $$ > '{}'; while :; do sleep 0.05; done",
            ready.display()
        );
        let mut run = leasehold(f, "run", &["--key", "paused", "--ttl", "1s", "--"])
            .args(["sh", "-c", &script])
            .spawn()
            .unwrap();
        let leasehold_pid = run.id();
        let _reaper = Reaper(vec![leasehold_pid]);
        let command = read_pid(&ready);
        let _command_reaper = Reaper(vec![command]);
        let first = json(&output(leasehold(
            f,
            "status",
            &["--key", "paused", "--json"],
        )));
        send("TSTP", leasehold_pid);
        let deadline = Instant::now() + GENEROUS;
        while state_of(command) != Some('T') {
            assert!(Instant::now() < deadline, "the command was not stopped");
            thread::sleep(Duration::from_millis(10));
        }
        // Three time-to-lives later leasehold runs and holds the lease, renewed.
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            let state = state_of(leasehold_pid);
            if state == Some('T') {
                send("CONT", leasehold_pid);
                panic!("leasehold stopped itself");
            }
            thread::sleep(Duration::from_millis(20));
        }
        let held = output(leasehold(f, "status", &["--key", "paused", "--json"]));
        assert_eq!(code(&held), 0, "{held:?}");
        let held = json(&held);
        assert_eq!(held["fencing_token"], first["fencing_token"]);
        assert!(
            held["expires_at"].as_str().unwrap() > first["expires_at"].as_str().unwrap(),
            "renewed: {first} then {held}"
        );
        assert_eq!(state_of(command), Some('T'), "the command stays stopped");
        // SIGCONT continues the command; SIGTERM ends both.
        send("CONT", leasehold_pid);
        while state_of(command) == Some('T') {
            assert!(Instant::now() < deadline, "the command was not continued");
            thread::sleep(Duration::from_millis(10));
        }
        send("TERM", leasehold_pid);
        assert_eq!(wait_with_deadline(&mut run).code(), Some(128 + 15));
    }

    /// A process stopped inside an SQLite statement keeps the file's write lock: every lock of
    /// every process on the database waits until it is continued. A fail point keeps
    /// leasehold's acquire inside its statement (it has written; the write lock is held) while
    /// SIGTSTP arrives: leasehold stops only once the statement has ended.
    #[cfg(feature = "failpoints")]
    pub fn sigtstp_never_stops_leasehold_inside_an_sqlite_statement(f: &Fixture) {
        assert_eq!(f.db, Db::Sqlite);
        let mut run = leasehold(f, "run", &["--key", "frozen", "--", "true"])
            .env(
                "FAILPOINTS",
                "sqlite::acquire_inside_statement=1*sleep(1500)",
            )
            .spawn()
            .unwrap();
        let pid = run.id();
        let _reaper = Reaper(vec![pid]);
        let observer = rusqlite::Connection::open(f.sqlite_path()).unwrap();
        let write = |wait: Duration| {
            observer.busy_timeout(wait).unwrap();
            observer.execute_batch("BEGIN IMMEDIATE; ROLLBACK")
        };
        // Inside the statement: the write lock is taken.
        let deadline = Instant::now() + GENEROUS;
        while write(Duration::ZERO).is_ok() {
            assert!(
                Instant::now() < deadline,
                "leasehold never took the write lock"
            );
            thread::sleep(Duration::from_millis(5));
        }
        send("TSTP", pid);
        while state_of(pid) != Some('T') {
            assert!(Instant::now() < deadline, "leasehold did not stop");
            thread::sleep(Duration::from_millis(10));
        }
        // Stopped, and not inside the statement: others write.
        let written = write(Duration::from_secs(10));
        send("CONT", pid);
        written.expect("the database is free while leasehold is stopped");
        assert_eq!(wait_with_deadline(&mut run).code(), Some(0));
    }
    /// The lines a child writes to a pipe (its stderr, a terminal's output), read as they come.
    struct Said {
        lines: std::sync::mpsc::Receiver<String>,
        seen: String,
    }

    impl Said {
        fn of(pipe: impl std::io::Read + Send + 'static) -> Said {
            let (sender, lines) = std::sync::mpsc::channel();
            thread::spawn(move || {
                let mut pipe = std::io::BufReader::new(pipe);
                let mut line = Vec::new();
                while std::io::BufRead::read_until(&mut pipe, b'\n', &mut line).unwrap_or(0) > 0 {
                    if sender
                        .send(String::from_utf8_lossy(&line).into_owned())
                        .is_err()
                    {
                        break;
                    }
                    line.clear();
                }
            });
            Said {
                lines,
                seen: String::new(),
            }
        }

        /// The first line (from here on) that holds `text`.
        fn wait_for(&mut self, text: &str) -> String {
            let deadline = Instant::now() + GENEROUS;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.lines.recv_timeout(left) {
                    Ok(line) => {
                        self.seen.push_str(&line);
                        if line.contains(text) {
                            return line;
                        }
                    }
                    Err(_) => panic!("never said {text:?}; said: {}", self.seen),
                }
            }
        }

        /// Everything said, once the writer has closed the pipe.
        fn all(mut self) -> String {
            while let Ok(line) = self.lines.recv_timeout(GENEROUS) {
                self.seen.push_str(&line);
            }
            self.seen
        }
    }

    /// Kills one process when dropped.
    struct Killer(u32);

    impl Drop for Killer {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// The parent of process `pid`, from `/proc`.
    fn parent_of(pid: u32) -> u32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        after_comm.split(' ').nth(1).unwrap().parse().unwrap()
    }

    /// A command that ended leaving a process in its group (a shell's background job, which
    /// ignores SIGINT and SIGQUIT) kept leasehold waiting without a word, the interrupts that
    /// reached leasehold went to that process and changed nothing, and once it had ended the
    /// init of the system reaped it, a second or more late.
    pub fn what_the_command_left_running_is_said_and_an_interrupt_stops_it(f: &Fixture) {
        for (subcommand, signal) in [("run", "INT"), ("lead", "QUIT")] {
            let dir = tempfile::tempdir().unwrap();
            let left = dir.path().join("left");
            let script = format!(
                "trap '' TERM; sleep 300 & echo $! > '{}'; exit 3",
                left.display()
            );
            let name = if subcommand == "run" {
                "--key"
            } else {
                "--group"
            };
            let mut args = vec![name, "leftover", "--grace", "1s"];
            if subcommand == "lead" {
                args.push("--once");
            }
            args.extend(["--", "sh", "-c", &script]);
            let mut run = leasehold(f, subcommand, &args)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let _reaper = Reaper(vec![run.id()]);
            let mut said = Said::of(run.stderr.take().unwrap());
            let sleeper = read_pid(&left);
            let _killer = Killer(sleeper);
            let line = said.wait_for("waiting for the processes it left");
            assert!(
                line.contains("exit code 3")
                    && line.contains(&format!("SIGINT to leasehold (pid {})", run.id())),
                "{subcommand}: {line}"
            );
            // Orphaned, it is leasehold's to reap the moment it ends.
            assert_eq!(parent_of(sleeper), run.id(), "{subcommand}");
            send(signal, run.id());
            let status = wait_with_deadline(&mut run);
            assert_eq!(
                status.code(),
                Some(3),
                "{subcommand}: the command's own code"
            );
            assert!(state_of(sleeper).is_none(), "{subcommand}: it was stopped");
            let said = said.all();
            assert!(
                said.contains("interrupted: stopping") && said.contains("sending SIGKILL"),
                "{subcommand}: {said}"
            );
            let free = output(leasehold(f, "status", &["--key", "leftover"]));
            assert_eq!(code(&free), 1, "{subcommand}: released: {free:?}");
        }
    }

    /// In a terminal, Ctrl-C ended the command; what it left running in its group ignores the
    /// terminal's signals, and a second Ctrl-C or a Ctrl-\ went to it, not to leasehold, which
    /// waited without a word. Runs on a pseudo-terminal through script(1).
    pub fn a_second_interrupt_in_a_terminal_stops_what_the_command_left(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let left = dir.path().join("left");
        let script = format!(
            "trap '' TERM; sleep 300 & echo $! > '{}'; wait",
            left.display()
        );
        let run = leasehold(
            f,
            "run",
            &["--key", "tty", "--grace", "1s", "--", "sh", "-c", &script],
        );
        let words: Vec<String> = std::iter::once(run.get_program())
            .chain(run.get_args())
            .map(|word| format!("'{}'", word.to_str().unwrap().replace('\'', r"'\''")))
            .collect();
        let mut terminal = Command::new("script")
            .args(["-qec", &format!("exec {}", words.join(" ")), "/dev/null"])
            .env("SHELL", "/bin/sh")
            .env_remove("LEASEHOLD_DATABASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("script(1) from util-linux runs the test on a pseudo-terminal");
        let _reaper = Reaper(vec![terminal.id()]);
        let mut screen = Said::of(terminal.stdout.take().unwrap());
        let mut typed = terminal.stdin.take().unwrap();
        let sleeper = read_pid(&left);
        let _killer = Killer(sleeper);
        std::io::Write::write_all(&mut typed, b"\x03").unwrap();
        let line = screen.wait_for("waiting for the processes it left");
        assert!(
            line.contains("exit code 130") && line.contains("Ctrl-C stops them"),
            "{line}"
        );
        std::io::Write::write_all(&mut typed, b"\x1c").unwrap();
        let status = wait_with_deadline(&mut terminal);
        drop(typed);
        assert_eq!(status.code(), Some(130), "the command's own code");
        assert!(state_of(sleeper).is_none(), "it was stopped");
        let shown = screen.all();
        assert!(shown.contains("interrupted: stopping"), "{shown}");
    }

    /// `command`'s output, or a panic if it has not ended within [`GENEROUS`].
    fn output_within(mut command: Command) -> Output {
        let child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let (sender, receiver) = std::sync::mpsc::channel();
        thread::spawn(move || sender.send(child.wait_with_output()));
        match receiver.recv_timeout(GENEROUS) {
            Ok(output) => output.unwrap(),
            Err(_) => {
                drop(Killer(pid));
                panic!("{command:?} did not end in {GENEROUS:?}");
            }
        }
    }

    /// `url` (a server's) with its host and port replaced by `address`.
    fn url_at(url: &str, address: std::net::SocketAddr) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let user = authority
            .rsplit_once('@')
            .map(|(user, _)| format!("{user}@"));
        let url = format!("{scheme}://{}{address}{path}", user.unwrap_or_default());
        if scheme.starts_with("mysql") {
            // The MySQL driver otherwise moves to the local server's Unix socket.
            let separator = if url.contains('?') { '&' } else { '?' };
            format!("{url}{separator}prefer_socket=false")
        } else {
            url
        }
    }

    /// `leasehold SUBCOMMAND --database URL ARGS…` with the fixture's prefix, in a process
    /// group of its own.
    fn leasehold_at(f: &Fixture, url: &str, subcommand: &str, args: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(binary());
        command
            .args([subcommand, "--database", url, "--prefix", &f.prefix])
            .args(args)
            .env_remove("LEASEHOLD_DATABASE_URL")
            .stdin(Stdio::null())
            .process_group(0);
        command
    }

    /// A PostgreSQL URL's `connect_timeout` (a MySQL URL's `tcp_connect_timeout_ms`), `--wait`
    /// (in seconds, a leading-dot fraction included, as flock(1) takes it) and `--db-timeout`
    /// bound connecting to a server that never answers: the command exits 70 naming the bound.
    pub fn the_url_the_wait_and_db_timeout_bound_connecting(f: &Fixture) {
        // Connections complete (the listen backlog), and nothing ever answers them.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = url_at(&url(f), silent.local_addr().unwrap());
        let separator = if url.contains('?') { '&' } else { '?' };
        let limited = match f.db {
            Db::Postgres => format!("{url}{separator}connect_timeout=1"),
            _ => format!("{url}{separator}tcp_connect_timeout_ms=1000"),
        };
        for (url, subcommand, args, within) in [
            (&limited, "status", &["--key", "k"][..], "within 1s"),
            (
                &limited,
                "list",
                &["--db-timeout", "1.5s"][..],
                "within 1.5s",
            ),
            (
                &url,
                "run",
                &["-w", "1", "--db-timeout", "1h", "--key", "k", "--", "true"][..],
                "within 1s",
            ),
            (
                &url,
                "run",
                &[
                    "--wait",
                    ".9",
                    "--db-timeout",
                    "1h",
                    "--key",
                    "k",
                    "--",
                    "true",
                ][..],
                "within 900ms",
            ),
        ] {
            let refused = output_within(leasehold_at(f, url, subcommand, args));
            assert_eq!(code(&refused), 70, "{subcommand} {args:?}: {refused:?}");
            let said = stderr(&refused);
            assert!(
                said.contains(&format!("cannot reach {}", server_name(f))) && said.contains(within),
                "{subcommand} {args:?}: {said}"
            );
        }
    }

    fn server_name(f: &Fixture) -> &'static str {
        match f.db {
            Db::Postgres => "PostgreSQL",
            _ => "MySQL",
        }
    }

    /// A loopback TCP proxy to the fixture's server whose connections can be frozen: bytes stop
    /// flowing both ways, connections stay open (a server or network that hangs).
    struct Proxy {
        address: std::net::SocketAddr,
        frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl Proxy {
        fn to(f: &Fixture) -> Proxy {
            use std::net::{TcpListener, TcpStream, ToSocketAddrs};
            use std::sync::atomic::{AtomicBool, Ordering};
            let server = url(f);
            let rest = server.split_once("://").unwrap().1;
            let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let port = if f.db == Db::Postgres { 5432 } else { 3306 };
            let upstream = match host.contains(':') {
                true => host.to_socket_addrs(),
                false => (host, port).to_socket_addrs(),
            }
            .unwrap()
            .next()
            .unwrap();
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap();
            let frozen = std::sync::Arc::new(AtomicBool::new(false));
            let flag = std::sync::Arc::clone(&frozen);
            thread::spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(upstream) else {
                        continue;
                    };
                    for (mut from, mut to) in [
                        (client.try_clone().unwrap(), server.try_clone().unwrap()),
                        (server, client),
                    ] {
                        let flag = std::sync::Arc::clone(&flag);
                        thread::spawn(move || {
                            let mut buffer = [0u8; 16 * 1024];
                            while let Ok(n @ 1..) = std::io::Read::read(&mut from, &mut buffer) {
                                while flag.load(Ordering::SeqCst) {
                                    thread::sleep(Duration::from_millis(5));
                                }
                                if std::io::Write::write_all(&mut to, &buffer[..n]).is_err() {
                                    break;
                                }
                            }
                            let _ = to.shutdown(std::net::Shutdown::Both);
                        });
                    }
                }
            });
            Proxy { address, frozen }
        }

        fn freeze(&self) {
            self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Drop for Proxy {
        fn drop(&mut self) {
            self.frozen
                .store(false, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A run whose server stopped answering while its command ran exited 5 s after the
    /// command, whatever the operator wanted; the loss that such a server causes was reported
    /// with the library's builder settings in it.
    pub fn a_server_that_stops_answering_is_given_up_after_db_timeout(f: &Fixture) {
        // The release after the command.
        let proxy = Proxy::to(f);
        let through = url_at(&url(f), proxy.address);
        let dir = tempfile::tempdir().unwrap();
        let (ready, go) = (dir.path().join("ready"), dir.path().join("go"));
        let script = format!(
            "echo $$ > '{}'; while [ ! -e '{}' ]; do sleep 0.05; done",
            ready.display(),
            go.display()
        );
        let mut run = leasehold_at(
            f,
            &through,
            "run",
            &[
                "--db-timeout",
                "1s",
                "--key",
                "vanish",
                "--",
                "sh",
                "-c",
                &script,
            ],
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let _reaper = Reaper(vec![run.id()]);
        read_pid(&ready);
        proxy.freeze();
        std::fs::write(&go, "").unwrap();
        let status = wait_with_deadline(&mut run);
        let said = Said::of(run.stderr.take().unwrap()).all();
        assert_eq!(status.code(), Some(70), "{said}");
        // The release gave up after the 2 s asked for (the message says how long it tried),
        // not after the 5 s of the default.
        let tried = said
            .split_once("releasing \"vanish\" failed: release did not complete within ")
            .and_then(|(_, rest)| rest.split_once(':'))
            .and_then(|(tried, _)| humantime::parse_duration(tried).ok())
            .unwrap_or_else(|| panic!("{said}"));
        assert!(tried < Duration::from_secs(4), "{said}");
        drop(proxy);

        // A loss: renewals that get no answer.
        let proxy = Proxy::to(f);
        let through = url_at(&url(f), proxy.address);
        let _ = std::fs::remove_file(&ready);
        let script = format!("echo $$ > '{}'; exec sleep 300", ready.display());
        let mut run = leasehold_at(
            f,
            &through,
            "run",
            &[
                "--ttl", "1s", "--grace", "1s", "--key", "lost", "--", "sh", "-c", &script,
            ],
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let _reaper = Reaper(vec![run.id()]);
        let command = read_pid(&ready);
        let _killer = Killer(command);
        proxy.freeze();
        let status = wait_with_deadline(&mut run);
        let said = Said::of(run.stderr.take().unwrap()).all();
        assert_eq!(status.code(), Some(74), "{said}");
        assert!(said.contains("lost the lease of \"lost\""), "{said}");
        for library in ["RegistryBuilder", "Tuning", "LockRegistry", "Error {"] {
            assert!(!said.contains(library), "{library} in {said}");
        }
    }

    /// Odd inputs got a different answer from each subcommand: `sqlite::memory:` and a path in
    /// a missing directory were "run init" for `list` and refused by `init`, a directory was a
    /// "disk I/O error" for some;
    /// `--permits 0` said to use `obtain`, `--ttl -1` to write `-- -1`, and `PT15M` was
    /// refused.
    pub fn every_subcommand_answers_odd_inputs_alike(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let directory = format!("sqlite:{}", dir.path().display());
        let subcommands: [(&str, &[&str]); 7] = [
            ("run", &["--key", "k", "--", "true"]),
            ("lead", &["--group", "g", "--once", "--", "true"]),
            ("status", &["--key", "k"]),
            ("list", &[]),
            ("init", &[]),
            ("release", &["--key", "k", "--force"]),
            ("cleanup", &["--older-than", "1d"]),
        ];
        let nowhere = format!("sqlite:{}/missing/locks.db", dir.path().display());
        for (url, answer, exit) in [
            ("sqlite::memory:", "is a database in memory", 64),
            (directory.as_str(), "names a directory", 64),
            (nowhere.as_str(), "there is no directory", 70),
        ] {
            for (subcommand, args) in subcommands {
                let refused = output(leasehold_at(f, url, subcommand, args));
                let said = stderr(&refused);
                assert_eq!(code(&refused), exit, "{subcommand} {url}: {said}");
                assert!(
                    said.contains(answer)
                        && !said.contains("leasehold init")
                        && !said.contains("invalid setting")
                        && !said.contains("I/O error"),
                    "{subcommand} {url}: {said}"
                );
            }
        }
        let run = |args: &[&str]| {
            let mut command = leasehold(f, "run", &["--key", "odd"]);
            command.args(args).args(["--", "true"]);
            output(command)
        };
        let permits = run(&["--permits", "0"]);
        assert_eq!(code(&permits), 64, "{permits:?}");
        assert!(
            stderr(&permits).contains("1 to 256") && !stderr(&permits).contains("obtain"),
            "{permits:?}"
        );
        for negative in ["-1", "-1s"] {
            let refused = run(&["--ttl", negative]);
            assert_eq!(code(&refused), 64, "{refused:?}");
            let said = stderr(&refused);
            assert!(
                said.contains("cannot be negative") && !said.contains("-- -1"),
                "{said}"
            );
        }
        // ISO 8601, as ShedLock and Java write durations.
        let iso = run(&["--ttl", "PT15M", "--keep-for", "PT0.5S", "-w", "PT10S"]);
        assert_eq!(code(&iso), 0, "{iso:?}");
        let months = run(&["--ttl", "P1M"]);
        assert_eq!(code(&months), 64, "{months:?}");
        assert!(stderr(&months).contains("no fixed length"), "{months:?}");
        // The help says how leasehold differs from flock where scripts look.
        let help = output({
            let mut c = Command::new(binary());
            c.args(["run", "--help"]);
            c
        });
        let help = stdout(&help);
        assert!(
            help.contains("exit 75 where flock(1) exits 1") && help.contains("PT10M"),
            "{help}"
        );
    }

    /// A MySQL URL without a database was "table missing" for every command but `init`, and a
    /// refused connection was shown in the driver's `DriverError { … }`.
    pub fn a_mysql_url_without_a_database_or_server_is_said_plainly(f: &Fixture) {
        assert_eq!(f.db, Db::Mysql);
        let url = url(f);
        let no_database = url[..url.rfind('/').unwrap()].to_string();
        for subcommand in ["status", "list", "init", "run"] {
            let mut command = leasehold_at(f, &no_database, subcommand, &[]);
            match subcommand {
                "status" => command.args(["--key", "k"]),
                "run" => command.args(["--key", "k", "--", "true"]),
                _ => &mut command,
            };
            let refused = output(command);
            assert_eq!(code(&refused), 64, "{subcommand}: {refused:?}");
            assert!(
                stderr(&refused).contains("names no database"),
                "{subcommand}: {refused:?}"
            );
        }
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let refused = output(leasehold_at(
            f,
            &url_at(&url, closed),
            "status",
            &["--key", "k", "--db-timeout", "0.5s"],
        ));
        assert_eq!(code(&refused), 70, "{refused:?}");
        let said = stderr(&refused);
        assert!(
            said.contains("Connection refused") && !said.contains("Error {"),
            "{said}"
        );
    }

    /// `examples/fenced_ledger.rs --help` said "unknown option --help" and exited 2. Run when
    /// the example has been built (`cargo build --example fenced_ledger`).
    pub fn the_fenced_ledger_example_prints_its_usage(_f: &Fixture) {
        let example = std::env::current_exe()
            .unwrap()
            .parent()
            .and_then(Path::parent)
            .unwrap()
            .join("examples/fenced_ledger");
        if !example.exists() {
            crate::common::skipped(&format!(
                "{} is not built: cargo build --example fenced_ledger",
                example.display()
            ));
            return;
        }
        for flag in ["--help", "-h"] {
            let help = output({
                let mut c = Command::new(&example);
                c.arg(flag);
                c
            });
            assert_eq!(code(&help), 0, "{help:?}");
            assert!(
                stdout(&help).starts_with("usage: fenced_ledger DATABASE"),
                "{help:?}"
            );
        }
    }
}

macro_rules! defaults {
    ($db:expr) => {
        crate::suite_for!($db;
            run_and_lead_use_only_an_existing_table_and_point_at_init,
            quiet_refusals_print_nothing,
            list_key_shows_only_the_rows_of_that_name,
            a_forwarded_sigterm_is_followed_by_sigkill_after_the_grace,
            status_and_list_say_the_same_of_a_row,
            messages_name_the_command_and_spare_foreign_tables,
            sigtstp_stops_the_command_and_leasehold_keeps_renewing,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    defaults!(crate::common::Db::Sqlite);
    crate::suite_for!(crate::common::Db::Sqlite;
        read_only_users_read_and_unwritable_directories_are_named,
        a_reader_who_may_not_create_the_wal_files_reads_a_labelled_snapshot,
        what_the_command_left_running_is_said_and_an_interrupt_stops_it,
        a_second_interrupt_in_a_terminal_stops_what_the_command_left,
        every_subcommand_answers_odd_inputs_alike,
        the_fenced_ledger_example_prints_its_usage);
    #[cfg(feature = "failpoints")]
    crate::suite_for!(crate::common::Db::Sqlite;
        sigtstp_never_stops_leasehold_inside_an_sqlite_statement);
}

#[cfg(feature = "postgres")]
mod postgres {
    defaults!(crate::common::Db::Postgres);
    crate::suite_for!(crate::common::Db::Postgres;
        a_url_of_the_wrong_database_names_the_url_to_give,
        the_url_the_wait_and_db_timeout_bound_connecting,
        a_server_that_stops_answering_is_given_up_after_db_timeout);
}

#[cfg(feature = "mysql")]
mod mysql {
    defaults!(crate::common::Db::Mysql);
    crate::suite_for!(crate::common::Db::Mysql;
        the_url_the_wait_and_db_timeout_bound_connecting,
        a_server_that_stops_answering_is_given_up_after_db_timeout,
        a_mysql_url_without_a_database_or_server_is_said_plainly);
}
