//! The `leasehold` command, run as a real process against every database: `run`
//! never overlaps, passes the command's exit code through, and exits with its own codes when
//! the lock is busy or the lease is lost; `status`, `list`, `init`, `release --force` and
//! `cleanup`. Every process of the command is stopped on a loss and when leasehold
//! dies, and the terminal keeps working (through script(1)); durations are checked before
//! the lock; flock's options, `status --json`, no table from read-only commands.
//! `list --holder`, and `--watch` of `list` and `status`.

#![cfg(feature = "cli")]

mod common;

mod suite {
    use crate::common::{Db, Fixture};
    use std::path::Path;
    use std::process::{Child, Command, Output, Stdio};
    use std::thread;
    use std::time::{Duration, Instant};

    const BUSY: i32 = 75;
    const LOST: i32 = 74;
    const GENEROUS: Duration = Duration::from_secs(30);
    /// Seconds of a `--wait` for a key held throughout: longer than the command's own bounds
    /// on everything before its first answer (5 s to connect, 5 s for the statement), so that
    /// the first answer ("held") comes within the wait unless the command gives up on its own.
    /// (A wait that runs out before any answer is a timeout, exit 70, not a conflict.)
    const WAIT: &str = "11";

    fn url(f: &Fixture) -> String {
        match f.db {
            Db::Sqlite => format!("sqlite:{}", f.sqlite_path().display()),
            Db::Postgres => crate::common::postgres_url(),
            Db::Mysql => crate::common::mysql_url(),
        }
    }

    /// `leasehold SUBCOMMAND --database … --prefix … ARGS…` on the fixture's table.
    fn leasehold(f: &Fixture, subcommand: &str, args: &[&str]) -> Command {
        leasehold_on(f, &f.prefix, subcommand, args)
    }

    /// `leasehold SUBCOMMAND --database … --prefix PREFIX ARGS…` on the fixture's database.
    fn leasehold_on(f: &Fixture, prefix: &str, subcommand: &str, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .arg(subcommand)
            .args(["--database", &url(f), "--prefix", prefix])
            .args(args)
            .env_remove("LEASEHOLD_DATABASE_URL");
        command
    }

    fn stdout(output: &Output) -> String {
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs `ddl` (several statements) on the fixture's database with the driver directly.
    fn execute_ddl(f: &Fixture, ddl: &str) {
        crate::common::raw::Raw::open(f).execute_batch(ddl);
    }

    fn output(mut command: Command) -> Output {
        command
            .stdin(Stdio::null())
            .output()
            .expect("leasehold runs")
    }

    fn code(output: &Output) -> i32 {
        output.status.code().unwrap_or_else(|| panic!("{output:?}"))
    }

    fn wait_for_file(path: &Path) {
        let deadline = Instant::now() + GENEROUS;
        while !path.exists() {
            assert!(
                Instant::now() < deadline,
                "{} never appeared",
                path.display()
            );
            thread::sleep(Duration::from_millis(10));
        }
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

    pub fn concurrent_runs_never_overlap(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let stamps = dir.path().join("stamps");
        let script = format!(
            "echo start >> '{0}'; sleep 0.3; echo end >> '{0}'",
            stamps.display()
        );
        let runs: Vec<Child> = (0..3)
            .map(|_| {
                leasehold(f, "run", &["--key", "job", "--wait", "60s", "--"])
                    .args(["sh", "-c", &script])
                    .stdin(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut run in runs {
            assert_eq!(wait_with_deadline(&mut run).code(), Some(0));
        }
        let lines = std::fs::read_to_string(&stamps).unwrap();
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(lines.len(), 6, "{lines:?}");
        for pair in lines.chunks(2) {
            assert_eq!(pair, ["start", "end"], "overlap: {lines:?}");
        }
    }

    pub fn no_wait_and_an_expired_wait_exit_busy_without_running(f: &Fixture) {
        let registry = f.registry();
        let held = registry.obtain("busy").unwrap().lock().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let touch = format!("touch '{}'", marker.display());
        let no_wait = output({
            let mut c = leasehold(f, "run", &["--key", "busy", "--no-wait", "--"]);
            c.args(["sh", "-c", &touch]);
            c
        });
        assert_eq!(code(&no_wait), BUSY, "{no_wait:?}");
        let stderr = String::from_utf8_lossy(&no_wait.stderr);
        assert!(stderr.contains(registry.client_id()), "{stderr}");
        let waited = output({
            let wait = format!("{WAIT}s");
            let mut c = leasehold(f, "run", &["--key", "busy", "--wait", &wait, "--"]);
            c.args(["sh", "-c", &touch]);
            c
        });
        assert_eq!(code(&waited), BUSY, "{waited:?}");
        assert!(!marker.exists(), "the command ran");
        held.unlock().unwrap();
        let free = output({
            let mut c = leasehold(f, "run", &["--key", "busy", "--no-wait", "--"]);
            c.args(["sh", "-c", &touch]);
            c
        });
        assert_eq!(code(&free), 0, "{free:?}");
        assert!(marker.exists());
    }

    /// flock(1)'s habits: `-n`, `-w SECS` with plain and fractional seconds, `-E N`. The waits
    /// run side by side, each [`WAIT`] long or more (the leading-dot form, which is shorter,
    /// is in `cli_defaults.rs`, against a server that never answers).
    pub fn flock_style_no_wait_wait_seconds_and_conflict_exit_code(f: &Fixture) {
        let registry = f.registry();
        let held = registry.obtain("flock").unwrap().lock().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let touch = format!("touch '{}'", marker.display());
        let try_run = |options: &[&str]| {
            let mut c = leasehold(f, "run", &[&["--key", "flock"], options, &["--"]].concat());
            c.args(["sh", "-c", &touch])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().expect("leasehold runs")
        };
        let fraction = format!("{WAIT}.5");
        let millis = format!("{WAIT}500ms");
        let runs: Vec<_> = [
            (vec!["-n"], BUSY),
            (vec!["-w", &fraction], BUSY),
            (vec!["-w", WAIT], BUSY),
            (vec!["--wait", WAIT], BUSY),
            (vec!["-w", &millis], BUSY),
            (vec!["-n", "-E", "3"], 3),
            (vec!["-w", WAIT, "--conflict-exit-code", "0"], 0),
            (vec!["-n", "-E", "256"], 64),
            (vec!["-w", "1.5s.2"], 64),
        ]
        .into_iter()
        .map(|(options, expected)| {
            let run = try_run(&options);
            (options, expected, run)
        })
        .collect();
        for (options, expected, run) in runs {
            let busy = run.wait_with_output().unwrap();
            assert_eq!(code(&busy), expected, "{options:?}: {busy:?}");
        }
        assert!(!marker.exists(), "a command ran");
        held.unlock().unwrap();
        let free = output({
            let mut c = leasehold(
                f,
                "run",
                &["--key", "flock", "-w", &fraction, "-E", "3", "--"],
            );
            c.args(["sh", "-c", &touch]);
            c
        });
        assert_eq!(code(&free), 0, "{free:?}");
        assert!(marker.exists());
    }

    /// `status` shows when the lease runs out, in time left and as a UTC timestamp, and
    /// `status --json` says the same as one object.
    pub fn status_shows_the_absolute_expiry_and_speaks_json(f: &Fixture) {
        let kept = output({
            let mut c = leasehold(f, "run", &["--key", "kept", "--keep-for", "1h", "--"]);
            c.arg("true");
            c
        });
        assert_eq!(code(&kept), 0, "{kept:?}");
        // Kept, not renewed: the row stays as it is for the hour.
        let holder = f.registry().holder("kept").unwrap().expect("held");
        let expires_at = humantime::format_rfc3339_millis(holder.expires_at).to_string();
        let status = output(leasehold(f, "status", &["--key", "kept"]));
        assert_eq!(code(&status), 0, "{status:?}");
        let line = stdout(&status);
        assert!(line.contains("expires in "), "{line}");
        assert!(
            line.contains(&format!("(at {expires_at})")),
            "{expires_at} in {line}"
        );

        let json = output(leasehold(f, "status", &["--key", "kept", "--json"]));
        assert_eq!(code(&json), 0, "{json:?}");
        let object: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
        assert_eq!(object["key"], "kept");
        assert_eq!(object["lock_key"], leasehold::lock_key_for("kept"));
        assert_eq!(object["state"], "held");
        assert_eq!(object["client_id"], holder.client_id.as_str());
        assert_eq!(object["expires_at"], expires_at.as_str());
        assert_eq!(
            object["acquired"],
            humantime::format_rfc3339_millis(holder.acquired).to_string()
        );
        assert_eq!(object["fencing_token"], holder.fencing_token);
        let left = object["expires_in_ms"].as_i64().unwrap();
        assert!(left > 0 && left <= 3_600_000, "{object}");

        let free = output(leasehold(f, "status", &["--key", "never", "--json"]));
        assert_eq!(code(&free), 1, "{free:?}");
        let object: serde_json::Value = serde_json::from_str(&stdout(&free)).unwrap();
        assert_eq!(object["state"], "free");
        assert_eq!(object["lock_key"], leasehold::lock_key_for("never"));
        assert!(object["client_id"].is_null() && object["fencing_token"].is_null());
    }

    pub fn the_commands_exit_code_passes_through(f: &Fixture) {
        let failed = output({
            let mut c = leasehold(f, "run", &["--key", "code", "--"]);
            c.args(["sh", "-c", "echo out; exit 3"]);
            c
        });
        assert_eq!(code(&failed), 3, "{failed:?}");
        assert_eq!(String::from_utf8_lossy(&failed.stdout), "out\n");
        let missing = output({
            let mut c = leasehold(f, "run", &["--key", "code", "--"]);
            c.arg("/nonexistent/command");
            c
        });
        assert_eq!(code(&missing), 127, "{missing:?}");
        let token = output({
            let mut c = leasehold(f, "run", &["--key", "code", "--"]);
            c.args([
                "sh",
                "-c",
                "echo \"$LEASEHOLD_KEY $LEASEHOLD_FENCING_TOKEN\"",
            ]);
            c
        });
        let printed = String::from_utf8_lossy(&token.stdout).to_string();
        let (key, token) = printed.trim().split_once(' ').expect("two words");
        assert_eq!(key, "code");
        assert!(token.parse::<u64>().unwrap() > 0);
        // The lock was released each time.
        let status = output(leasehold(f, "status", &["--key", "code"]));
        assert_eq!(code(&status), 1, "{status:?}");
        assert!(String::from_utf8_lossy(&status.stdout).contains("code: released"));
    }

    pub fn keep_for_makes_a_second_run_inside_the_period_exit_busy(f: &Fixture) {
        let first = output({
            let mut c = leasehold(f, "run", &["--key", "daily", "--keep-for", "1h", "--"]);
            c.arg("true");
            c
        });
        assert_eq!(code(&first), 0, "{first:?}");
        let second = output({
            let mut c = leasehold(f, "run", &["--key", "daily", "--no-wait", "--"]);
            c.arg("true");
            c
        });
        assert_eq!(code(&second), BUSY, "{second:?}");
        let status = output(leasehold(f, "status", &["--key", "daily"]));
        assert_eq!(code(&status), 0, "{status:?}");
        let shown = String::from_utf8_lossy(&status.stdout);
        assert!(
            shown.contains("held by") && shown.contains("expires in"),
            "{shown}"
        );
        // An operator frees it; the next run goes ahead.
        let released = output(leasehold(f, "release", &["--key", "daily", "--force"]));
        assert_eq!(code(&released), 0, "{released:?}");
        let third = output({
            let mut c = leasehold(f, "run", &["--key", "daily", "--no-wait", "--"]);
            c.arg("true");
            c
        });
        assert_eq!(code(&third), 0, "{third:?}");
    }

    /// Every duration is checked before anything runs: `run --keep-for 8d` (the library keeps
    /// a row at most 7 days) exits with a usage error before it takes the lock or runs the
    /// job.
    pub fn out_of_range_durations_exit_usage_before_the_lock_is_taken(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let touch = format!("touch '{}'", marker.display());
        for (subcommand, option, value, range) in [
            ("run", "--keep-for", "8d", "0s to 7days"),
            ("run", "--grace", "8d", "0s to 7days"),
            ("run", "--ttl", "5ms", "10ms to 7days"),
            ("run", "--ttl", "8d", "10ms to 7days"),
            ("lead", "--ttl", "8d", "10ms to 7days"),
            ("lead", "--poll", "0s", "1ms to 1h"),
            ("lead", "--grace", "1year", "0s to 7days"),
        ] {
            let key = if subcommand == "run" {
                "--key"
            } else {
                "--group"
            };
            let refused = output({
                let mut c = leasehold(f, subcommand, &[key, "ranges", option, value, "--"]);
                c.args(["sh", "-c", &touch]);
                c
            });
            assert_eq!(
                code(&refused),
                64,
                "{subcommand} {option} {value}: {refused:?}"
            );
            let stderr = String::from_utf8_lossy(&refused.stderr);
            assert!(
                stderr.contains(&format!("allowed range {range}")),
                "{subcommand} {option} {value}: {stderr}"
            );
            assert!(
                !marker.exists(),
                "{subcommand} {option} {value}: the command ran"
            );
        }
        let status = output(leasehold(f, "status", &["--key", "ranges"]));
        assert_eq!(code(&status), 1, "nothing took the lock: {status:?}");
        let longest = output({
            let mut c = leasehold(f, "run", &["--key", "ranges", "--keep-for", "7d", "--"]);
            c.arg("true");
            c
        });
        assert_eq!(code(&longest), 0, "7 days is allowed: {longest:?}");
    }

    pub fn a_lost_lease_stops_the_command_with_the_lost_code(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let started = dir.path().join("started");
        let script = format!("echo started > '{}'; exec sleep 60", started.display());
        let began = Instant::now();
        let mut run = leasehold(f, "run", &["--key", "lost", "--ttl", "1s", "--"])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_file(&started);
        let released = output(leasehold(f, "release", &["--key", "lost", "--force"]));
        assert_eq!(code(&released), 0, "{released:?}");
        assert!(String::from_utf8_lossy(&released.stdout).contains("released"));
        let status = wait_with_deadline(&mut run);
        assert_eq!(status.code(), Some(LOST));
        assert!(
            began.elapsed() < Duration::from_secs(50),
            "the command was not stopped"
        );
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(stderr.contains("lost the lease"), "{stderr}");
        // Without --force, release refuses.
        let refused = output(leasehold(f, "release", &["--key", "lost"]));
        assert_eq!(code(&refused), 64, "{refused:?}");
    }

    /// A script that records `ready`, then, on each of `signals`, writes the signal's name to
    /// `got` and exits 7.
    fn trapping_script(ready: &Path, got: &Path, signals: &[&str]) -> String {
        let traps: String = signals
            .iter()
            .map(|name| {
                format!(
                    "trap 'echo {name} >> \"{}\"; exit 7' {name}; ",
                    got.display()
                )
            })
            .collect();
        format!(
            "{traps}echo $$ > '{}'; while true; do sleep 0.05; done",
            ready.display()
        )
    }

    /// Waits until process `pid` catches signal number `signal` (Linux: `SigCgt` in
    /// `/proc/PID/status`), so a signal sent next finds the handler and not the default action.
    fn wait_for_handler(pid: u32, signal: u32) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let caught = status
                .lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .map(|mask| u64::from_str_radix(mask.trim(), 16).unwrap())
                .unwrap();
            if caught & (1 << (signal - 1)) != 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{pid} never caught signal {signal}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn send(signal: &str, pid: u32) {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    pub fn int_term_and_hup_are_forwarded_to_the_command(f: &Fixture) {
        for signal in ["INT", "TERM", "HUP"] {
            let dir = tempfile::tempdir().unwrap();
            let (ready, got) = (dir.path().join("ready"), dir.path().join("got"));
            let script = trapping_script(&ready, &got, &["INT", "TERM", "HUP"]);
            let mut run = leasehold(f, "run", &["--key", "signals", "--"])
                .args(["sh", "-c", &script])
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            wait_for_file(&ready);
            send(signal, run.id());
            assert_eq!(wait_with_deadline(&mut run).code(), Some(7), "{signal}");
            let got = std::fs::read_to_string(&got).unwrap();
            assert_eq!(got, format!("{signal}\n"), "delivered once, as sent");
            let status = output(leasehold(f, "status", &["--key", "signals"]));
            assert_eq!(code(&status), 1, "released after the command: {status:?}");
        }
    }

    /// Ctrl-C typed in a terminal goes to the foreground process group — the command's, which
    /// leasehold gave the terminal — and must reach the command once, not a second time from
    /// leasehold. Runs `leasehold run` on a pseudo-terminal through `script(1)` (util-linux)
    /// and types Ctrl-C into it.
    pub fn ctrl_c_in_a_terminal_reaches_the_command_once(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let (ready, got, child) = (
            dir.path().join("ready"),
            dir.path().join("got"),
            dir.path().join("child.sh"),
        );
        // Records every INT and goes on; a TERM ends it.
        std::fs::write(
            &child,
            format!(
                "trap 'echo INT >> \"{got}\"' INT\n\
                 trap 'echo TERM >> \"{got}\"; exit 0' TERM\n\
                 echo $$ > '{ready}'\n\
                 while true; do sleep 0.05; done\n",
                got = got.display(),
                ready = ready.display()
            ),
        )
        .unwrap();
        let leasehold_command = leasehold(f, "run", &["--key", "tty", "--"]);
        let words: Vec<String> = std::iter::once(leasehold_command.get_program())
            .chain(leasehold_command.get_args())
            .chain([std::ffi::OsStr::new("sh"), child.as_os_str()])
            .map(|word| format!("'{}'", word.to_str().unwrap()))
            .collect();
        let mut script = Command::new("script")
            .args(["-qec", &format!("exec {}", words.join(" ")), "/dev/null"])
            .env("SHELL", "/bin/sh")
            .env_remove("LEASEHOLD_DATABASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("script(1) from util-linux runs the test on a pseudo-terminal");
        wait_for_file(&ready);
        let mut typed = script.stdin.take().unwrap();
        std::io::Write::write_all(&mut typed, b"\x03").unwrap();
        let deadline = Instant::now() + GENEROUS;
        while std::fs::read_to_string(&got).unwrap_or_default().is_empty() {
            assert!(
                Instant::now() < deadline,
                "Ctrl-C never reached the command"
            );
            thread::sleep(Duration::from_millis(10));
        }
        // A second INT from leasehold would be pending before this TERM (lower signals are
        // delivered first), so the file tells whether one was sent.
        let shell = std::fs::read_to_string(&ready).unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", shell.trim())).unwrap();
        // pid (comm) state ppid …: the command's parent is leasehold.
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        let pid: u32 = after_comm.split(' ').nth(1).unwrap().parse().unwrap();
        send("TERM", pid);
        let status = wait_with_deadline(&mut script);
        drop(typed);
        assert_eq!(std::fs::read_to_string(&got).unwrap(), "INT\nTERM\n");
        assert!(status.success(), "{status:?}");
    }

    /// The state letter of process `pid` (`R`, `S`, `T` for stopped…), from `/proc`.
    fn state_of(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 2..].chars().next()
    }

    /// The parent of process `pid`, from `/proc`.
    fn parent_of(pid: u32) -> u32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        after_comm.split(' ').nth(1).unwrap().parse().unwrap()
    }

    /// In an interactive shell with job control, Ctrl-Z stops the job — the command and
    /// leasehold — and gives the shell its terminal back; `fg` continues both, and the command
    /// reads the terminal again.
    pub fn ctrl_z_and_fg_in_an_interactive_shell(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let (ready, got, stopped) = (
            dir.path().join("ready"),
            dir.path().join("got"),
            dir.path().join("stopped"),
        );
        let mut run = leasehold(f, "run", &["--key", "job", "--"]);
        run.args([
            "sh",
            "-c",
            &format!(
                "echo $$ > \"{}\"; read line; echo \"got $line\" > \"{}\"",
                ready.display(),
                got.display()
            ),
        ]);
        let mut script = Command::new("script")
            .args(["-qec", "bash --norc --noprofile -i", "/dev/null"])
            .env("SHELL", "/bin/sh")
            .env_remove("LEASEHOLD_DATABASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("script(1) from util-linux, and bash");
        let _reaper = Reaper(vec![script.id()]);
        let mut typed = script.stdin.take().unwrap();
        let mut type_in =
            |text: &str| std::io::Write::write_all(&mut typed, text.as_bytes()).unwrap();
        type_in(&format!("{}\n", shell_words(&run)));
        let command = read_pid(&ready);
        let leasehold = parent_of(command);
        type_in("\x1a");
        let deadline = Instant::now() + GENEROUS;
        while state_of(command) != Some('T') || state_of(leasehold) != Some('T') {
            assert!(Instant::now() < deadline, "the job did not stop");
            thread::sleep(Duration::from_millis(10));
        }
        // The shell has the terminal again: it reads this line, and reports the stop (148).
        type_in(&format!("echo $? > '{}'\nfg\n", stopped.display()));
        wait_for_text(&stopped, "148\n");
        type_in("hello\n");
        wait_for_text(&got, "got hello\n");
        type_in("exit\n");
        assert!(wait_with_deadline(&mut script).success());
    }

    /// With its input redirected, leasehold still gives the command the terminal: a password
    /// prompt reads `/dev/tty`, and must not be stopped in the background.
    pub fn the_command_reads_the_terminal_when_leaseholds_input_is_redirected(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let (ready, got) = (dir.path().join("ready"), dir.path().join("got"));
        let mut run = leasehold(f, "run", &["--key", "tty", "--"]);
        run.args([
            "sh",
            "-c",
            &format!(
                "echo > \"{}\"; read line < /dev/tty; echo \"got $line\" > \"{}\"",
                ready.display(),
                got.display()
            ),
        ]);
        let mut script = on_a_terminal(&format!("exec {} < /dev/null", shell_words(&run)));
        let _reaper = Reaper(vec![script.id()]);
        let mut typed = script.stdin.take().unwrap();
        wait_for_file(&ready);
        std::io::Write::write_all(&mut typed, b"secret\n").unwrap();
        wait_for_text(&got, "got secret\n");
        let status = wait_with_deadline(&mut script);
        drop(typed);
        assert!(status.success(), "{status:?}");
    }

    /// Ctrl-Z stops the command's group (it has the terminal); leasehold follows as a job does
    /// and continues the command when continued — here at once, as leasehold's group under
    /// script(1) is orphaned and ignores the stop. The command must not stay stopped.
    pub fn ctrl_z_in_a_terminal_does_not_leave_the_command_stopped(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let (ready, done) = (dir.path().join("ready"), dir.path().join("done"));
        let mut run = leasehold(f, "run", &["--key", "tty", "--"]);
        run.args([
            "sh",
            "-c",
            &format!(
                "echo > \"{}\"; read line; echo \"done $line\" > \"{}\"",
                ready.display(),
                done.display()
            ),
        ]);
        let mut script = on_a_terminal(&format!("exec {}", shell_words(&run)));
        let _reaper = Reaper(vec![script.id()]);
        let mut typed = script.stdin.take().unwrap();
        wait_for_file(&ready);
        std::io::Write::write_all(&mut typed, b"\x1a").unwrap();
        thread::sleep(Duration::from_millis(300));
        std::io::Write::write_all(&mut typed, b"go\n").unwrap();
        wait_for_text(&done, "done go\n");
        let status = wait_with_deadline(&mut script);
        drop(typed);
        assert!(status.success(), "{status:?}");
    }

    pub fn a_sigkilled_holders_lock_is_taken_after_its_ttl_and_its_command_stopped(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let (ready, got) = (dir.path().join("ready"), dir.path().join("got"));
        let script = trapping_script(&ready, &got, &["TERM"]);
        let mut holder = leasehold(f, "run", &["--key", "crash", "--ttl", "4s", "--"])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_file(&ready);
        holder.kill().unwrap(); // SIGKILL: no release, no forwarding
        holder.wait().unwrap();
        // The command learns through leasehold's watchdog.
        wait_for_file(&got);
        assert_eq!(std::fs::read_to_string(&got).unwrap(), "TERM\n");
        let busy = output({
            let mut c = leasehold(f, "run", &["--key", "crash", "--no-wait", "--"]);
            c.arg("true");
            c
        });
        assert_eq!(code(&busy), BUSY, "held until the TTL runs out: {busy:?}");
        let taken = output({
            let mut c = leasehold(f, "run", &["--key", "crash", "--wait", "30s", "--"]);
            c.args(["sh", "-c", "echo taken"]);
            c
        });
        assert_eq!(code(&taken), 0, "{taken:?}");
        assert_eq!(stdout(&taken), "taken\n");
    }

    /// Whether process `pid` runs: a zombie (which only waits to be reaped) counts as gone.
    fn alive(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => !matches!(
                stat[stat.rfind(')').unwrap() + 2..].chars().next(),
                Some('Z' | 'X')
            ),
            Err(_) => false,
        }
    }

    /// The pid a script wrote to `path` (waiting until it is there in full).
    fn read_pid(path: &Path) -> u32 {
        let deadline = Instant::now() + GENEROUS;
        loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if let Some(pid) = text.strip_suffix('\n').and_then(|t| t.parse().ok()) {
                return pid;
            }
            assert!(Instant::now() < deadline, "no pid in {}", path.display());
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILLs the processes it names when dropped, so that a failing test leaves no `sleep`
    /// behind.
    struct Reaper(Vec<u32>);

    impl Drop for Reaper {
        fn drop(&mut self) {
            for pid in &self.0 {
                if alive(*pid) {
                    let _ = Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                }
            }
        }
    }

    fn wait_until_gone(pid: u32, what: &str) {
        let deadline = Instant::now() + GENEROUS;
        while alive(pid) {
            assert!(Instant::now() < deadline, "{what} (pid {pid}) still runs");
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// A `sh -c` script that starts, in the background, a `sleep` (its pid in `normal`) and a
    /// shell that ignores SIGTERM and becomes a `sleep` (its pid in `stubborn`), then waits.
    fn grandchildren_script(normal: Option<&Path>, stubborn: Option<&Path>) -> String {
        let mut script = String::new();
        if let Some(normal) = normal {
            script.push_str(&format!("sleep 300 & echo $! > '{}'; ", normal.display()));
        }
        if let Some(stubborn) = stubborn {
            script.push_str(&format!(
                "sh -c 'trap \"\" TERM; echo $$ > \"{}\"; exec sleep 300' & ",
                stubborn.display()
            ));
        }
        script.push_str("wait");
        script
    }

    pub fn a_lost_lease_stops_every_process_of_the_command_before_exiting_lost(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let (normal, stubborn) = (dir.path().join("normal"), dir.path().join("stubborn"));
        let script = grandchildren_script(Some(&normal), Some(&stubborn));
        let mut run = leasehold(f, "run", &["--key", "tree", "--grace", "1s", "--"])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pids = [read_pid(&normal), read_pid(&stubborn)];
        let _reaper = Reaper(pids.to_vec());
        let released = output(leasehold(f, "release", &["--key", "tree", "--force"]));
        assert_eq!(code(&released), 0, "{released:?}");
        let status = wait_with_deadline(&mut run);
        // "Stopped" only once every process of the command is gone.
        let running: Vec<u32> = pids.into_iter().filter(|pid| alive(*pid)).collect();
        assert_eq!(status.code(), Some(LOST));
        assert!(
            running.is_empty(),
            "grandchildren {running:?} outlived the loss"
        );
        let stderr = stderr_of(&mut run);
        assert!(
            stderr.contains("SIGKILL"),
            "the stubborn one was killed: {stderr}"
        );
    }

    /// A signal sent to leasehold reaches every process of the command, once.
    pub fn a_forwarded_signal_reaches_the_commands_grandchildren(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let (ready, got) = (dir.path().join("ready"), dir.path().join("got"));
        let inner = trapping_script(&ready, &got, &["TERM"]);
        let script = format!("sh -c '{}' & wait", inner.replace('\'', "'\\''"));
        let mut run = leasehold(f, "run", &["--key", "forward", "--"])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = read_pid(&ready);
        let _reaper = Reaper(vec![pid]);
        send("TERM", run.id());
        // The outer shell dies of it (128 + 15); the grandchild traps it.
        assert_eq!(wait_with_deadline(&mut run).code(), Some(128 + 15));
        assert_eq!(std::fs::read_to_string(&got).unwrap(), "TERM\n");
        assert!(!alive(pid));
    }

    /// What the command leaves running in its group keeps the lock until it ends, as a
    /// background child keeps a flock(1) lock through the inherited descriptor.
    pub fn the_lock_is_kept_until_what_the_command_left_running_ends(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let done = dir.path().join("done");
        // Its output goes elsewhere, so that only leasehold's end ends `output()`.
        let script = format!(
            "(sleep 0.5; echo done > '{}') > /dev/null 2>&1 & exit 4",
            done.display()
        );
        let run = output({
            let mut c = leasehold(f, "run", &["--key", "leftovers", "--"]);
            c.args(["sh", "-c", &script]);
            c
        });
        assert_eq!(code(&run), 4, "the command's own code: {run:?}");
        assert_eq!(
            std::fs::read_to_string(&done).unwrap_or_default(),
            "done\n",
            "leasehold ended before the background job: {run:?}"
        );
        let status = output(leasehold(f, "status", &["--key", "leftovers"]));
        assert_eq!(code(&status), 1, "released after it: {status:?}");
    }

    pub fn a_sigkilled_leasehold_takes_its_commands_grandchildren_with_it(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let normal = dir.path().join("normal");
        let script = grandchildren_script(Some(&normal), None);
        let mut holder = leasehold(f, "run", &["--key", "orphans", "--"])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = read_pid(&normal);
        let _reaper = Reaper(vec![pid]);
        holder.kill().unwrap(); // SIGKILL: leasehold can do nothing more itself
        holder.wait().unwrap();
        wait_until_gone(pid, "the grandchild");
    }

    pub fn a_grandchild_that_ignores_sigterm_is_killed_after_the_grace_when_leasehold_dies(
        f: &Fixture,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let stubborn = dir.path().join("stubborn");
        let script = grandchildren_script(None, Some(&stubborn));
        let mut holder = leasehold(f, "run", &["--key", "stubborn", "--grace", "1s", "--"])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = read_pid(&stubborn);
        let _reaper = Reaper(vec![pid]);
        holder.kill().unwrap();
        holder.wait().unwrap();
        wait_until_gone(pid, "the grandchild that ignores SIGTERM");
    }

    /// The processes whose parent is `pid` and whose command line contains `word`.
    fn children_of(pid: u32, word: &str) -> Vec<u32> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(word)
                && std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok()
                && parent_of(child) == pid
            {
                found.push(child);
            }
        }
        found
    }

    /// Without its watchdog, leasehold could not stop the command if it died: it refuses to
    /// start the command.
    pub fn without_its_watchdog_leasehold_does_not_start_the_command(f: &Fixture) {
        let registry = f.registry();
        let held = registry.obtain("guarded").unwrap().lock().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let mut run = leasehold(f, "run", &["--key", "guarded", "--wait", "60s", "--"])
            .args(["sh", "-c", &format!("touch '{}'", marker.display())])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + GENEROUS;
        let watchdog = loop {
            if let [watchdog] = children_of(run.id(), "__watchdog")[..] {
                break watchdog;
            }
            assert!(Instant::now() < deadline, "no watchdog");
            thread::sleep(Duration::from_millis(10));
        };
        send("KILL", watchdog);
        wait_until_gone(watchdog, "the watchdog");
        held.unlock().unwrap();
        let status = wait_with_deadline(&mut run);
        let stderr = stderr_of(&mut run);
        assert_eq!(status.code(), Some(70), "{stderr}");
        assert!(stderr.contains("watchdog ended"), "{stderr}");
        assert!(!marker.exists(), "the command ran");
        let status = output(leasehold(f, "status", &["--key", "guarded"]));
        assert_eq!(code(&status), 1, "released: {status:?}");
    }

    /// As PID 1 of a container (here: of a new PID namespace, through unshare(1)), leasehold
    /// adopts the processes its command leaves behind, and must reap them: a zombie stays a
    /// member of its process group, and would keep leasehold waiting for the group for ever.
    pub fn as_init_of_a_container_leasehold_reaps_what_its_command_left(f: &Fixture) {
        let namespaces = Command::new("unshare")
            .args(["--pid", "--fork", "true"])
            .status();
        if !namespaces.is_ok_and(|s| s.success()) {
            crate::common::skipped("unshare --pid (root) is not available here");
            return;
        }
        let run = leasehold(f, "run", &["--key", "init", "--"]);
        // --kill-child: a leasehold that hangs dies with unshare when the deadline kills it.
        let mut init = Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child"])
            .arg(run.get_program())
            .args(run.get_args())
            .args(["sh", "-c", "sleep 0.2 & exit 5"])
            .env_remove("LEASEHOLD_DATABASE_URL")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        assert_eq!(wait_with_deadline(&mut init).code(), Some(5));
    }

    /// Runs `shell_command` (a `sh -c` string) on a pseudo-terminal through `script(1)`
    /// (util-linux); its standard input is what the test types.
    fn on_a_terminal(shell_command: &str) -> Child {
        Command::new("script")
            .args(["-qec", shell_command, "/dev/null"])
            .env("SHELL", "/bin/sh")
            .env_remove("LEASEHOLD_DATABASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("script(1) from util-linux runs the test on a pseudo-terminal")
    }

    /// `command` as words quoted for `sh`.
    fn shell_words(command: &Command) -> String {
        let words: Vec<String> = std::iter::once(command.get_program())
            .chain(command.get_args())
            .map(|word| format!("'{}'", word.to_str().unwrap()))
            .collect();
        words.join(" ")
    }

    fn wait_for_text(path: &Path, text: &str) {
        let deadline = Instant::now() + GENEROUS;
        loop {
            let seen = std::fs::read_to_string(path).unwrap_or_default();
            if seen == text {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} holds {seen:?}, not {text:?}",
                path.display()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The command reads the terminal while it runs, and the shell that started leasehold reads
    /// it again afterwards (leasehold gave the terminal back).
    pub fn the_command_reads_the_terminal_and_the_shell_gets_it_back(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let (ready, got, after) = (
            dir.path().join("ready"),
            dir.path().join("got"),
            dir.path().join("after"),
        );
        let mut run = leasehold(f, "run", &["--key", "tty", "--"]);
        run.args([
            "sh",
            "-c",
            &format!(
                "echo > \"{}\"; read line; echo \"got $line\" > \"{}\"",
                ready.display(),
                got.display()
            ),
        ]);
        let mut script = on_a_terminal(&format!(
            "{}; read again; echo \"after $again\" > '{}'",
            shell_words(&run),
            after.display()
        ));
        let _reaper = Reaper(vec![script.id()]);
        let mut typed = script.stdin.take().unwrap();
        wait_for_file(&ready);
        std::io::Write::write_all(&mut typed, b"hello\n").unwrap();
        wait_for_text(&got, "got hello\n");
        std::io::Write::write_all(&mut typed, b"again\n").unwrap();
        wait_for_text(&after, "after again\n");
        let status = wait_with_deadline(&mut script);
        drop(typed);
        assert!(status.success(), "{status:?}");
    }

    /// `leasehold lead` on group `group` running `sh -c script`, with short timings.
    fn lead(f: &Fixture, group: &str, extra: &[&str], script: &str) -> Child {
        leasehold(
            f,
            "lead",
            &[
                &[
                    "--group", group, "--ttl", "2s", "--poll", "50ms", "--grace", "5s",
                ],
                extra,
                &["--", "sh", "-c", script],
            ]
            .concat(),
        )
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    }

    fn stderr_of(child: &mut Child) -> String {
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        stderr
    }

    pub fn two_leads_never_run_their_commands_at_once(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let stamps = dir.path().join("stamps");
        let script = format!(
            "echo \"start $LEASEHOLD_GROUP $LEASEHOLD_TERM\" >> '{0}'; sleep 0.5; \
             echo end >> '{0}'; exit 3",
            stamps.display()
        );
        let mut leads: Vec<Child> = (0..2).map(|_| lead(f, "scheduler", &[], &script)).collect();
        for lead in &mut leads {
            assert_eq!(
                wait_with_deadline(lead).code(),
                Some(3),
                "the command's code"
            );
        }
        let lines = std::fs::read_to_string(&stamps).unwrap();
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(lines.len(), 4, "{lines:?}");
        let mut terms = Vec::new();
        for pair in lines.chunks(2) {
            assert_eq!(pair[1], "end", "overlap: {lines:?}");
            let term = pair[0].strip_prefix("start scheduler ").expect("start");
            terms.push(term.parse::<u64>().unwrap());
        }
        assert!(terms[1] > terms[0], "terms increase: {terms:?}");
        let status = output(leasehold(f, "status", &["--key", "scheduler"]));
        assert_eq!(code(&status), 1, "resigned: {status:?}");
    }

    pub fn losing_leadership_stops_the_command_and_the_lead_competes_again(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let script = format!(
            "trap 'echo \"stopped $LEASEHOLD_TERM\" >> \"{0}\"; exit 9' TERM; \
             echo \"start $LEASEHOLD_TERM\" >> '{0}'; \
             while true; do sleep 0.05; done",
            log.display()
        );
        let lines = || -> Vec<String> {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .map(String::from)
                .collect()
        };
        let wait_for_lines = |n: usize| {
            let deadline = Instant::now() + GENEROUS;
            while lines().len() < n {
                assert!(Instant::now() < deadline, "{:?}", lines());
                thread::sleep(Duration::from_millis(10));
            }
        };
        let mut leader = lead(f, "singleton", &[], &script);
        wait_for_lines(1);
        let released = output(leasehold(f, "release", &["--key", "singleton", "--force"]));
        assert_eq!(code(&released), 0, "{released:?}");
        // The next renewal finds the row gone: the command is stopped, and the lead stands by
        // and is elected again (nobody else competes), with a new term.
        wait_for_lines(3);
        let seen = lines();
        let first = seen[0].strip_prefix("start ").unwrap();
        assert_eq!(seen[1], format!("stopped {first}"), "{seen:?}");
        let second = seen[2].strip_prefix("start ").unwrap();
        assert!(second.parse::<u64>().unwrap() > first.parse::<u64>().unwrap());
        // A signal goes to the command; when it ends, lead ends with its code and resigns.
        send("TERM", leader.id());
        assert_eq!(wait_with_deadline(&mut leader).code(), Some(9));
        assert_eq!(lines().len(), 4, "{:?}", lines());
        let stderr = stderr_of(&mut leader);
        assert!(stderr.contains("lost the leadership"), "{stderr}");
        let status = output(leasehold(f, "status", &["--key", "singleton"]));
        assert_eq!(code(&status), 1, "resigned: {status:?}");

        // With --once, the loss ends lead with the lost code.
        let mut once = lead(f, "singleton", &["--once"], &script);
        wait_for_lines(5);
        let released = output(leasehold(f, "release", &["--key", "singleton", "--force"]));
        assert_eq!(code(&released), 0, "{released:?}");
        assert_eq!(wait_with_deadline(&mut once).code(), Some(LOST));
        let seen = lines();
        assert_eq!(seen.len(), 6, "{seen:?}");
        assert!(seen[5].starts_with("stopped "), "{seen:?}");
    }

    pub fn a_lost_leadership_stops_every_process_of_the_command(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let (normal, stubborn) = (dir.path().join("normal"), dir.path().join("stubborn"));
        let script = grandchildren_script(Some(&normal), Some(&stubborn));
        let mut leader = leasehold(
            f,
            "lead",
            &[
                "--group", "tree", "--ttl", "3s", "--grace", "1s", "--once", "--", "sh", "-c",
                &script,
            ],
        )
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let pids = [read_pid(&normal), read_pid(&stubborn)];
        let _reaper = Reaper(pids.to_vec());
        let released = output(leasehold(f, "release", &["--key", "tree", "--force"]));
        assert_eq!(code(&released), 0, "{released:?}");
        let status = wait_with_deadline(&mut leader);
        let running: Vec<u32> = pids.into_iter().filter(|pid| alive(*pid)).collect();
        assert_eq!(status.code(), Some(LOST), "{}", stderr_of(&mut leader));
        assert!(
            running.is_empty(),
            "grandchildren {running:?} outlived the loss"
        );
    }

    pub fn a_standby_lead_exits_on_a_signal_without_running_the_command(f: &Fixture) {
        let registry = f.registry();
        let held = registry.obtain("taken").unwrap().lock().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let mut standby = lead(f, "taken", &[], &format!("touch '{}'", marker.display()));
        // Standing by: the group's lock stays with the registry above. A fixed pause before
        // the signal could end before the handlers were in place on a loaded machine (the
        // default action then killed it: no exit code 143).
        wait_for_handler(standby.id(), 15);
        thread::sleep(Duration::from_millis(300));
        assert!(standby.try_wait().unwrap().is_none(), "still standing by");
        send("TERM", standby.id());
        assert_eq!(wait_with_deadline(&mut standby).code(), Some(128 + 15));
        assert!(!marker.exists(), "the command ran");
        held.unlock().unwrap();
    }

    pub fn list_shows_the_rows_as_a_table_and_as_json(f: &Fixture) {
        let empty = output(leasehold(f, "list", &[]));
        assert_eq!(code(&empty), 0, "{empty:?}");
        assert!(stdout(&empty).starts_with("no locks in table"), "{empty:?}");
        let empty = output(leasehold(f, "list", &["--json"]));
        assert_eq!(stdout(&empty), "[]\n");

        let holder = f.registry();
        let held = holder
            .obtain("nightly \"report\"\\x")
            .unwrap()
            .lock()
            .unwrap();
        holder
            .obtain("named")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        holder
            .obtain("unnamed")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        let names = ["--key", "nightly \"report\"\\x", "--key", "named"];

        let table = output(leasehold(f, "list", &names));
        assert_eq!(code(&table), 0, "{table:?}");
        let shown = stdout(&table);
        let lines: Vec<&str> = shown.lines().collect();
        // `--key` filters: the two rows of those names.
        assert_eq!(lines.len(), 3, "{shown}");
        let columns: Vec<&str> = lines[0].split("  ").filter(|c| !c.is_empty()).collect();
        let columns: Vec<&str> = columns.iter().map(|c| c.trim()).collect();
        assert_eq!(
            columns,
            [
                "KEY",
                "STATE",
                "HOLDER",
                "ACQUIRED (UTC)",
                "EXPIRES IN",
                "TOKEN"
            ]
        );
        let line = |start: &str| {
            *lines
                .iter()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("{start} in {shown}"))
        };
        let row = line("nightly \"report\"\\x");
        assert!(row.contains(" held "), "{row}");
        assert!(row.contains(holder.client_id()), "{row}");
        assert!(row.ends_with(&held.fencing_token().to_string()), "{row}");
        assert!(line("named ").contains(" released "), "{shown}");
        // Without --key every row, each named by the table's LOCK_NAME column.
        let unnamed = leasehold::lock_key_for("unnamed");
        let every = stdout(&output(leasehold(f, "list", &[])));
        assert_eq!(every.lines().count(), 4, "{every}");
        assert!(
            every
                .lines()
                .any(|l| l.starts_with("unnamed ") && l.contains(" released ")),
            "{every}"
        );

        let json = output(leasehold(f, "list", &[&["--json"], &names[..]].concat()));
        assert_eq!(code(&json), 0, "{json:?}");
        let json = stdout(&json);
        assert!(json.starts_with("[{") && json.ends_with("}]\n"), "{json}");
        assert_eq!(json.matches("\"lock_key\":").count(), 2, "{json}");
        let every_json = stdout(&output(leasehold(f, "list", &["--json"])));
        let held_object = format!(
            "{{\"key\":\"nightly \\\"report\\\"\\\\x\",\"lock_key\":\"{}\",\"state\":\"held\",\
             \"client_id\":\"{}\",",
            leasehold::lock_key_for("nightly \"report\"\\x"),
            holder.client_id()
        );
        assert!(json.contains(&held_object), "{held_object} in {json}");
        assert!(
            json.contains(&format!("\"fencing_token\":{}}}", held.fencing_token())),
            "{json}"
        );
        assert!(
            every_json.contains(&format!(
                "{{\"key\":\"unnamed\",\"lock_key\":\"{unnamed}\",\"state\":\"released\",\
                 \"client_id\":null,"
            )),
            "{every_json}"
        );
        assert!(
            json.contains("\"expires_at\":null,\"expires_in_ms\":null,"),
            "{json}"
        );
        held.unlock().unwrap();

        let bad = output(leasehold(f, "list", &["--key", ""]));
        assert_eq!(code(&bad), 64, "{bad:?}");
        assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid lock key"));
    }

    /// `list --holder` shows only the rows a client id (or a host's or process's
    /// client ids, given as `HOST/` or `HOST/PID/`) holds now, as a table and as JSON.
    pub fn list_holder_shows_only_what_that_client_holds(f: &Fixture) {
        let as_client = |id: &str| f.builder().client_id(id).build().unwrap();
        let (web1, web1_other, web2) = (
            as_client("web-1/100/aaaa"),
            as_client("web-1/101/cccc"),
            as_client("web-2/200/bbbb"),
        );
        let one = web1.obtain("one").unwrap().lock().unwrap();
        let three = web1_other.obtain("three").unwrap().lock().unwrap();
        let two = web2.obtain("two").unwrap().lock().unwrap();
        web1.obtain("gone")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        let keys_of = |args: &[&str]| {
            let listed = output(leasehold(f, "list", args));
            assert_eq!(code(&listed), 0, "{listed:?}");
            let mut keys: Vec<String> = stdout(&listed)
                .lines()
                .skip(1)
                .map(|line| line.split(' ').next().unwrap().to_string())
                .collect();
            keys.sort();
            keys
        };
        assert_eq!(keys_of(&["--holder", "web-1/100/aaaa"]), ["one"]);
        assert_eq!(keys_of(&["--holder", "web-1/"]), ["one", "three"]);
        assert_eq!(keys_of(&["--holder", "web-1/101/"]), ["three"]);
        assert_eq!(
            keys_of(&["--holder", "web-2/200/bbbb", "--holder", "web-1/100/"]),
            ["one", "two"]
        );
        assert_eq!(keys_of(&[]), ["gone", "one", "three", "two"]);

        let json = output(leasehold(f, "list", &["--holder", "web-2/", "--json"]));
        assert_eq!(code(&json), 0, "{json:?}");
        let json = stdout(&json);
        assert_eq!(json.matches("\"lock_key\":").count(), 1, "{json}");
        assert!(
            json.contains("{\"key\":\"two\",")
                && json.contains("\"state\":\"held\",\"client_id\":\"web-2/200/bbbb\","),
            "{json}"
        );

        // Neither a prefix without its `/` nor a released row's last holder counts.
        let none = output(leasehold(f, "list", &["--holder", "web-1"]));
        assert_eq!(code(&none), 0, "{none:?}");
        assert!(
            stdout(&none).starts_with("no locks held by web-1 in table"),
            "{none:?}"
        );
        let none = output(leasehold(f, "list", &["--holder", "web-1/", "--json"]));
        assert_eq!(stdout(&none).matches("\"lock_key\":").count(), 2);
        let bad = output(leasehold(f, "list", &["--holder", ""]));
        assert_eq!(code(&bad), 64, "{bad:?}");
        assert!(String::from_utf8_lossy(&bad.stderr).contains("--holder needs"));
        for guard in [one, two, three] {
            guard.unlock().unwrap();
        }
    }

    /// A child that is killed if the test fails before it ends.
    struct Watching(Child);

    impl Drop for Watching {
        fn drop(&mut self) {
            if self.0.try_wait().ok().flatten().is_none() {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }

    /// `leasehold ARGS…` started with its standard output and error read line by line on
    /// threads, into one channel (error lines as `stderr: …`).
    fn spawn_reading(mut command: Command) -> (Watching, std::sync::mpsc::Receiver<String>) {
        use std::io::BufRead;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("leasehold starts");
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let err = std::io::BufReader::new(child.stderr.take().unwrap());
        let (lines, read) = std::sync::mpsc::channel();
        let errors = lines.clone();
        thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                if lines.send(line).is_err() {
                    break; // dropping `out` closes the pipe
                }
            }
        });
        thread::spawn(move || {
            for line in err.lines() {
                let Ok(line) = line else { break };
                if errors.send(format!("stderr: {line}")).is_err() {
                    break;
                }
            }
        });
        (Watching(child), read)
    }

    /// The next line of `lines` that satisfies `wanted`, skipping the others; fails after
    /// GENEROUS.
    fn line_where(
        lines: &std::sync::mpsc::Receiver<String>,
        what: &str,
        wanted: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + GENEROUS;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if wanted(&line) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line with {what} within {GENEROUS:?}: {e}"),
            }
        }
    }

    /// `list --watch --json` prints one JSON array per refresh; a lock taken and
    /// released between refreshes shows in the next ones; SIGINT ends it with 0.
    pub fn list_watch_prints_every_refresh_and_stops_on_a_signal(f: &Fixture) {
        let (mut watching, lines) = spawn_reading(leasehold(
            f,
            "list",
            &["--watch", "0.2", "--json", "--holder", "me/1/x"],
        ));
        // Two refreshes of the empty listing.
        for _ in 0..2 {
            let line = lines
                .recv_timeout(GENEROUS)
                .expect("a refresh within GENEROUS");
            assert_eq!(line, "[]");
        }
        let me = f.builder().client_id("me/1/x").build().unwrap();
        let guard = me.obtain("watched").unwrap().lock().unwrap();
        let held = line_where(&lines, "the held lock", |l| l != "[]");
        assert!(
            held.starts_with("[{\"key\":\"watched\",")
                && held.contains("\"state\":\"held\",\"client_id\":\"me/1/x\",")
                && held.contains(&format!("\"fencing_token\":{}}}]", guard.fencing_token())),
            "{held}"
        );
        guard.unlock().unwrap();
        // Released: no longer held by me/1/x.
        line_where(&lines, "the released lock gone", |l| l == "[]");
        send("INT", watching.0.id());
        assert_eq!(wait_with_deadline(&mut watching.0).code(), Some(0));

        // A watch that cannot show its first refresh ends at once, with the error's code.
        let missing = output(leasehold_on(f, "missing_", "list", &["--watch", "1"]));
        assert_eq!(code(&missing), 70, "{missing:?}");
        let fast = output(leasehold(f, "list", &["--watch", "10ms"]));
        assert_eq!(code(&fast), 64, "{fast:?}");
    }

    /// `status --watch` to a pipe appends every refresh after a header with the
    /// interval and the database clock; it shows the holder once the key is taken, and ends
    /// with 0 when its reader goes away.
    pub fn status_watch_appends_refreshes_and_ends_when_nobody_reads(f: &Fixture) {
        let (mut watching, lines) = spawn_reading(leasehold(
            f,
            "status",
            &["--key", "watched", "--watch", "200ms"],
        ));
        let header = |line: &str| {
            line.starts_with("Every 200ms at ")
                && line.ends_with(&format!(
                    " (database clock): leasehold status watched, table {}, region DEFAULT",
                    f.table()
                ))
        };
        for _ in 0..2 {
            let line = lines.recv_timeout(GENEROUS).expect("a header");
            assert!(header(&line), "{line}");
            assert_eq!(lines.recv_timeout(GENEROUS).unwrap(), "watched: free");
            assert_eq!(lines.recv_timeout(GENEROUS).unwrap(), "");
        }
        let holder = f.registry();
        let guard = holder.obtain("watched").unwrap().lock().unwrap();
        let held = line_where(&lines, "the holder", |l| {
            l != "watched: free" && !header(l) && !l.is_empty()
        });
        assert!(
            held.starts_with(&format!("watched: held by {} since ", holder.client_id()))
                && held.ends_with(&format!("fencing token {}", guard.fencing_token())),
            "{held}"
        );
        drop(lines); // the reading thread ends at its next line, closing the pipe
        assert_eq!(wait_with_deadline(&mut watching.0).code(), Some(0));
        guard.unlock().unwrap();
    }

    /// A refresh that fails after the first (here: the table is dropped) is reported
    /// on stderr and the watch goes on; it shows the key again once the table is back.
    pub fn a_watch_reports_a_failed_refresh_and_goes_on(f: &Fixture) {
        let (_watching, lines) = spawn_reading(leasehold(
            f,
            "status",
            &["--key", "watched", "--watch", "0.2"],
        ));
        line_where(&lines, "the first refresh", |l| l == "watched: free");
        execute_ddl(f, &format!("DROP TABLE {}", f.table()));
        let failed = line_where(&lines, "a failed refresh", |l| l.starts_with("stderr: "));
        assert!(
            failed.starts_with("stderr: leasehold: ") && failed.ends_with("trying again in 200ms)"),
            "{failed}"
        );
        let made = output(leasehold(f, "init", &[]));
        assert_eq!(code(&made), 0, "{made:?}");
        let holder = f.registry();
        let guard = holder.obtain("watched").unwrap().lock().unwrap();
        line_where(&lines, "the holder once the table is back", |l| {
            l.starts_with(&format!("watched: held by {} ", holder.client_id()))
        });
        guard.unlock().unwrap();
    }

    /// `list --watch` on a terminal (script(1)'s pseudo-terminal, 6 rows of 50
    /// columns) redraws the screen in place, cuts lines to the width, counts the rows that do
    /// not fit, shows a lock taken meanwhile, and ends with 0 at Ctrl-C.
    pub fn list_watch_on_a_terminal_redraws_in_place_until_ctrl_c(f: &Fixture) {
        use std::io::Read;
        let registry = f.registry();
        for key in ["a", "b", "c", "d", "e"] {
            registry
                .obtain(key)
                .unwrap()
                .lock()
                .unwrap()
                .unlock()
                .unwrap();
        }
        let watch = leasehold(f, "list", &["--watch", "0.2"]);
        let words: Vec<String> = std::iter::once(watch.get_program())
            .chain(watch.get_args())
            .map(|word| format!("'{}'", word.to_str().unwrap()))
            .collect();
        let mut script = Watching(
            Command::new("script")
                .args([
                    "-qec",
                    &format!("stty rows 6 cols 50; exec {}", words.join(" ")),
                    "/dev/null",
                ])
                .env("SHELL", "/bin/sh")
                .env_remove("LEASEHOLD_DATABASE_URL")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("script(1) from util-linux runs the test on a pseudo-terminal"),
        );
        let mut screen = script.0.stdout.take().unwrap();
        let shown = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let filled = shown.clone();
        thread::spawn(move || {
            let mut buffer = [0; 4096];
            while let Ok(n @ 1..) = screen.read(&mut buffer) {
                filled
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        // The frames drawn so far, each from cursor-home to clear-to-the-end.
        let frames_where = |what: &str, wanted: &dyn Fn(&str) -> bool| -> Vec<String> {
            let deadline = Instant::now() + GENEROUS;
            loop {
                let text = shown.lock().unwrap().clone();
                let frames: Vec<String> = text
                    .split("\x1b[H")
                    .filter_map(|frame| frame.split_once("\x1b[J").map(|(f, _)| f.to_string()))
                    .collect();
                if frames.iter().any(|frame| wanted(frame)) {
                    return frames;
                }
                assert!(Instant::now() < deadline, "no frame with {what}: {text:?}");
                thread::sleep(Duration::from_millis(20));
            }
        };
        // Each frame is only looked at once it is complete; wait for two.
        let mut frames = frames_where("a frame", &|_| true);
        while frames.len() < 2 {
            frames = frames_where("a second frame", &|_| true);
        }
        let lines: Vec<&str> = frames[0].split("\x1b[K\r\n").collect();
        // Header, empty line, column titles, the first of the five rows, the count of the
        // others; the cursor stays on the sixth line.
        assert_eq!(lines.len(), 5 + 1, "{lines:?}");
        assert!(lines[0].starts_with("Every 200ms at "), "{lines:?}");
        assert!(
            lines.iter().all(|line| line.chars().count() <= 50),
            "{lines:?}"
        );
        assert_eq!(lines[1], "");
        assert!(lines[2].starts_with("KEY  STATE"), "{lines:?}");
        assert!(lines[3].starts_with("a    released  -"), "{lines:?}");
        assert!(lines[4].starts_with("… 4 more lines"), "{lines:?}");
        assert_eq!(lines[5], "");
        // The next frame draws the same rows over the first (only the header's clock moves).
        let next: Vec<&str> = frames[1].split("\x1b[K\r\n").collect();
        assert_eq!(next[1..], lines[1..]);

        let guard = f.registry().obtain("a").unwrap().lock().unwrap();
        frames_where("the held lock", &|frame| {
            frame.contains("\x1b[K\r\na    held")
        });
        std::io::Write::write_all(script.0.stdin.as_mut().unwrap(), b"\x03").unwrap();
        assert_eq!(wait_with_deadline(&mut script.0).code(), Some(0));
        guard.unlock().unwrap();
    }

    pub fn init_creates_the_table_or_prints_its_ddl(f: &Fixture) {
        let (made, printed) = (format!("{}I_", f.prefix), format!("{}P_", f.prefix));
        let checked =
            |prefix: &str| output(leasehold_on(f, prefix, "list", &["--no-create-table"]));
        let missing = checked(&made);
        assert_eq!(code(&missing), 70, "{missing:?}");
        let ddl = output(leasehold_on(f, &printed, "init", &["--print"]));
        assert_eq!(code(&ddl), 0, "{ddl:?}");
        let ddl = stdout(&ddl);
        assert!(
            ddl.contains(&format!("CREATE TABLE IF NOT EXISTS {printed}LOCK")),
            "{ddl}"
        );
        assert!(ddl.contains(&format!("{printed}LOCK_FLOOR")), "{ddl}");
        assert!(ddl.contains(&format!("{printed}LOCK_SEM")), "{ddl}");
        assert_eq!(code(&checked(&printed)), 70, "--print created nothing");

        let init = output(leasehold_on(f, &made, "init", &[]));
        assert_eq!(code(&init), 0, "{init:?}");
        assert!(stdout(&init).contains(&format!("{made}LOCK")), "{init:?}");
        assert!(
            !String::from_utf8_lossy(&init.stderr).contains("warn"),
            "the deletion floor was made too: {init:?}"
        );
        // The printed DDL, run by hand, makes a table just as good.
        execute_ddl(f, &ddl);
        for prefix in [&made, &printed] {
            let listed = checked(prefix);
            assert_eq!(code(&listed), 0, "{prefix}: {listed:?}");
            let run = output({
                let mut c = leasehold_on(f, prefix, "run", &["--no-create-table", "--key", "k"]);
                c.args(["--", "true"]);
                c
            });
            assert!(run.status.success(), "{prefix}: {run:?}");
            assert!(
                !String::from_utf8_lossy(&run.stderr).contains("floor"),
                "{prefix}: the floor is there: {run:?}"
            );
            f.drop_tables(prefix);
        }
        let twice = output(leasehold(f, "init", &[]));
        assert_eq!(code(&twice), 0, "init on an existing table: {twice:?}");
    }

    /// The tables, triggers and functions on the fixture's database whose names start with
    /// `prefix` (case-insensitive; `_` matches any character, which only widens the net).
    fn objects_named(f: &Fixture, prefix: &str) -> Vec<String> {
        let pattern = format!("{}%", prefix.to_lowercase());
        match f.db {
            #[cfg(feature = "sqlite")]
            Db::Sqlite => {
                let conn = rusqlite::Connection::open(f.sqlite_path()).unwrap();
                let mut query = conn
                    .prepare("SELECT type || ' ' || name FROM sqlite_master WHERE name LIKE ?1")
                    .unwrap();
                let rows = query.query_map([&pattern], |row| row.get(0)).unwrap();
                rows.map(Result::unwrap).collect()
            }
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                let mut client =
                    postgres::Client::connect(&crate::common::postgres_url(), postgres::NoTls)
                        .unwrap();
                let rows = client
                    .query(
                        "SELECT 'table ' || table_name::text FROM information_schema.tables \
                           WHERE lower(table_name) LIKE $1 \
                         UNION ALL SELECT 'trigger ' || tgname::text FROM pg_trigger \
                           WHERE lower(tgname::text) LIKE $1 \
                         UNION ALL SELECT 'function ' || proname::text FROM pg_proc \
                           WHERE lower(proname::text) LIKE $1",
                        &[&pattern],
                    )
                    .unwrap();
                rows.iter().map(|row| row.get(0)).collect()
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let opts = mysql::Opts::from_url(&crate::common::mysql_url()).unwrap();
                let mut conn = mysql::Conn::new(opts).unwrap();
                conn.exec(
                    "SELECT CONCAT('table ', table_name) FROM information_schema.tables \
                       WHERE table_schema = DATABASE() AND lower(table_name) LIKE ? \
                     UNION ALL SELECT CONCAT('trigger ', trigger_name) \
                       FROM information_schema.triggers \
                       WHERE trigger_schema = DATABASE() AND lower(trigger_name) LIKE ?",
                    (&pattern, &pattern),
                )
                .unwrap()
            }
            #[allow(unreachable_patterns)]
            other => panic!("{other:?} support is not compiled in"),
        }
    }

    /// Drops the tables of a prefix when dropped, even when the test fails.
    struct DropTables<'a>(&'a Fixture, String);

    impl Drop for DropTables<'_> {
        fn drop(&mut self) {
            self.0.drop_tables(&self.1);
        }
    }

    /// A typo'd `--prefix` given to `list` or `status` creates no table, floor table or trigger,
    /// and the message points at `leasehold init`, not at a DDL file an installed binary's user
    /// does not have.
    pub fn read_only_commands_create_no_table_and_point_at_init(f: &Fixture) {
        let typo = format!("{}TYPO_", f.prefix);
        let _dropper = DropTables(f, typo.clone());
        for (subcommand, args) in [
            ("list", &[][..]),
            ("list", &["--json"][..]),
            ("status", &["--key", "k"][..]),
            ("status", &["--key", "k", "--json"][..]),
            ("release", &["--key", "k", "--force"][..]),
            ("cleanup", &["--older-than", "1d"][..]),
            (
                "run",
                &["--no-create-table", "--key", "k", "--", "true"][..],
            ),
        ] {
            let missing = output(leasehold_on(f, &typo, subcommand, args));
            assert_eq!(code(&missing), 70, "{subcommand} {args:?}: {missing:?}");
            let stderr = String::from_utf8_lossy(&missing.stderr);
            assert!(
                stderr.contains(&format!("{typo}LOCK does not exist"))
                    && stderr.contains("`leasehold init`")
                    && stderr.contains("--prefix"),
                "{subcommand} {args:?}: {stderr}"
            );
        }
        let made = objects_named(f, &typo);
        f.drop_tables(&typo);
        assert!(made.is_empty(), "read-only commands made {made:?}");
        assert!(
            !objects_named(f, &f.prefix).is_empty(),
            "the query sees the fixture's table"
        );

        if f.db == Db::Sqlite {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("typo.db");
            let url = format!("sqlite:{}", file.display());
            for (subcommand, args) in [("status", &["--key", "k"][..]), ("list", &[][..])] {
                let missing = output({
                    let mut c = Command::new(env!("CARGO_BIN_EXE_leasehold"));
                    c.args([subcommand, "--database", &url]).args(args);
                    c
                });
                assert_eq!(code(&missing), 70, "{missing:?}");
                let stderr = String::from_utf8_lossy(&missing.stderr);
                assert!(
                    stderr.contains("leasehold init --database sqlite:"),
                    "{stderr}"
                );
                let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
                assert!(left.is_empty(), "{subcommand} made files: {left:?}");
            }
        }
    }

    pub fn cleanup_deletes_old_rows(f: &Fixture) {
        let registry = f.registry();
        registry
            .obtain("old")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        thread::sleep(Duration::from_millis(20));
        let kept = output(leasehold(f, "cleanup", &["--older-than", "7d"]));
        assert_eq!(code(&kept), 0, "{kept:?}");
        assert_eq!(String::from_utf8_lossy(&kept.stdout), "deleted 0 rows\n");
        let deleted = output(leasehold(f, "cleanup", &["--older-than", "0s"]));
        assert_eq!(String::from_utf8_lossy(&deleted.stdout), "deleted 1 rows\n");
        let bad = output(leasehold(f, "cleanup", &["--older-than", "soon"]));
        assert_eq!(code(&bad), 64, "{bad:?}");
    }

    /// `--listener-url` and `--prepared-statements` reach the registry (PostgreSQL):
    /// a listener URL that cannot be reached is refused when the registry is built, one that
    /// can be works, and prepared statements work straight to the server.
    pub fn postgres_listener_url_and_prepared_statements_reach_the_registry(f: &Fixture) {
        let refused = output(leasehold(
            f,
            "run",
            &[
                "--key",
                "lu",
                "-n",
                "--listener-url",
                "postgres://nobody@127.0.0.1:1/none",
                "--",
                "true",
            ],
        ));
        assert_ne!(code(&refused), 0, "{refused:?}");
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("127.0.0.1:1"),
            "{refused:?}"
        );
        let direct = crate::common::postgres_url();
        let works = output(leasehold(
            f,
            "run",
            &[
                "--key",
                "lu",
                "-n",
                "--listener-url",
                &direct,
                "--prepared-statements",
                "--",
                "true",
            ],
        ));
        assert_eq!(code(&works), 0, "{works:?}");
    }

    /// Starts `leasehold run ARGS -- sh -c SCRIPT` for each (ARGS, SCRIPT) at once and
    /// asserts that every one exits 0.
    fn all_succeed<'a>(f: &Fixture, runs: impl Iterator<Item = (&'a [&'a str], &'a str)>) {
        let children: Vec<Child> = runs
            .map(|(args, script)| {
                let mut command = leasehold(f, "run", args);
                command
                    .args(["--", "sh", "-c", script])
                    .stdin(Stdio::null());
                command.spawn().unwrap()
            })
            .collect();
        for mut child in children {
            assert_eq!(wait_with_deadline(&mut child).code(), Some(0));
        }
    }

    /// `run --permits N` runs at most N commands at once, each with a permit number
    /// of its own (a directory per permit is the outside witness: `mkdir` fails if it exists).
    pub fn runs_with_permits_never_run_more_commands_than_permits(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let witness = dir.path().display().to_string();
        let script = format!(
            "case \"$LEASEHOLD_PERMIT\" in 0|1) ;; *) exit 8 ;; esac; \
             mkdir '{witness}/permit'$LEASEHOLD_PERMIT || exit 9; \
             ls '{witness}' | grep -c permit >> '{witness}/counts'; sleep 0.3; \
             rmdir '{witness}/permit'$LEASEHOLD_PERMIT"
        );
        let args = ["--key", "exports", "--permits", "2", "--wait", "60s"];
        all_succeed(f, (0..5).map(|_| (&args[..], script.as_str())));
        let counts = std::fs::read_to_string(dir.path().join("counts")).unwrap();
        let counts: Vec<u32> = counts.lines().map(|l| l.trim().parse().unwrap()).collect();
        assert_eq!(counts.len(), 5, "{counts:?}");
        assert!(counts.iter().all(|n| (1..=2).contains(n)), "{counts:?}");
    }

    pub fn runs_with_permits_exit_busy_when_all_are_held_and_usage_for_another_number(f: &Fixture) {
        let registry = f.registry();
        let semaphore = registry.semaphore("pair", 2).unwrap();
        let held = [semaphore.acquire().unwrap(), semaphore.acquire().unwrap()];
        let busy = output({
            let mut c = leasehold(f, "run", &["--key", "pair", "--permits", "2", "-n", "--"]);
            c.arg("true");
            c
        });
        assert_eq!(code(&busy), BUSY, "{busy:?}");
        assert!(String::from_utf8_lossy(&busy.stderr).contains("permits"));
        let listed = stdout(&output(leasehold(f, "list", &[])));
        assert!(listed.contains("pair (permit 0)"), "{listed}");
        assert!(listed.contains("pair (permit 1)"), "{listed}");
        let other = output({
            let mut c = leasehold(f, "run", &["--key", "pair", "--permits", "3", "-n", "--"]);
            c.arg("true");
            c
        });
        assert_eq!(code(&other), 64, "{other:?}");
        assert!(String::from_utf8_lossy(&other.stderr).contains("2 permits"));
        for bad in ["0", "257"] {
            let refused = output({
                let mut c = leasehold(f, "run", &["--key", "pair", "--permits", bad, "--"]);
                c.arg("true");
                c
            });
            assert_eq!(code(&refused), 64, "{refused:?}");
        }
        drop(held);
        let free = output({
            let mut c = leasehold(f, "run", &["--key", "pair", "--permits", "2", "-n", "--"]);
            c.args(["sh", "-c", "echo $LEASEHOLD_PERMIT"]);
            c
        });
        assert_eq!(code(&free), 0, "{free:?}");
        assert!(["0\n", "1\n"].contains(&stdout(&free).as_str()), "{free:?}");
    }

    /// A SIGKILLed `run --permits` leaves its permit to run out; another holder takes it with
    /// a larger token.
    pub fn a_sigkilled_runs_permit_comes_back_after_its_ttl(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        let script = format!(
            "echo $LEASEHOLD_FENCING_TOKEN > '{0}.tmp'; mv '{0}.tmp' '{0}'; \
             while true; do sleep 0.05; done",
            token.display()
        );
        let mut holder = leasehold(
            f,
            "run",
            &["--key", "solo", "--permits", "1", "--ttl", "2s", "--"],
        )
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
        wait_for_file(&token);
        let old: u64 = std::fs::read_to_string(&token)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        holder.kill().unwrap(); // SIGKILL: no release
        holder.wait().unwrap();
        let permit = f
            .registry()
            .semaphore("solo", 1)
            .unwrap()
            .try_acquire_for(GENEROUS)
            .unwrap()
            .expect("the permit came back");
        assert!(permit.fencing_token() > old);
    }

    /// A `run --permits` paused (SIGSTOP) past its time-to-live loses the permit to another
    /// instance; resumed, it stops its command and exits with the lost code.
    pub fn a_paused_runs_permit_is_taken_and_the_resumed_run_exits_lost(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let started = dir.path().join("started");
        let script = format!("echo started > '{}'; exec sleep 60", started.display());
        let mut run = leasehold(
            f,
            "run",
            &["--key", "paused", "--permits", "1", "--ttl", "1s", "--"],
        )
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
        wait_for_file(&started);
        send("STOP", run.id());
        let taken = f
            .registry()
            .semaphore("paused", 1)
            .unwrap()
            .try_acquire_for(GENEROUS)
            .unwrap();
        send("CONT", run.id());
        let permit = taken.expect("the paused run's permit ran out");
        assert_eq!(wait_with_deadline(&mut run).code(), Some(LOST));
        assert!(permit.is_held(), "the new holder keeps it");
    }

    /// `run --read` runs share the key, a `--write` run runs alone (files in a
    /// directory are the outside witness), and a busy side exits 75.
    pub fn read_runs_share_and_write_runs_run_alone(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let witness = dir.path().display().to_string();
        let read = format!(
            "ls '{witness}' | grep -q w && exit 9; touch '{witness}/r'$$; sleep 0.3; \
             ls '{witness}' | grep -q w && exit 9; rm '{witness}/r'$$"
        );
        let write = format!(
            "[ -z \"$(ls '{witness}')\" ] || exit 9; touch '{witness}/w'$$; sleep 0.2; \
             rm '{witness}/w'$$"
        );
        let (reads, writes) = (
            ["--key", "shared", "--read", "--wait", "60s"],
            ["--key", "shared", "--write", "--wait", "60s"],
        );
        let runs = [(&reads[..], read.as_str()), (&writes[..], write.as_str())];
        all_succeed(f, runs.into_iter().cycle().take(6));
        let registry = f.registry();
        let writing = registry.rw_lock("shared").unwrap().write().unwrap();
        for side in ["--read", "--write"] {
            let busy = output({
                let mut c = leasehold(f, "run", &["--key", "shared", side, "-n", "--"]);
                c.arg("true");
                c
            });
            assert_eq!(code(&busy), BUSY, "{side}: {busy:?}");
        }
        drop(writing);
        let reading = registry.rw_lock("shared").unwrap().read().unwrap();
        let beside = output({
            let mut c = leasehold(f, "run", &["--key", "shared", "--read", "-n", "--"]);
            c.args(["sh", "-c", "echo read"]);
            c
        });
        assert_eq!(stdout(&beside), "read\n", "{beside:?}");
        drop(reading);
    }

    /// `status --key KEY` of a name and its parts, as lines (exit code 0 when anything is held)
    /// and as JSON.
    fn status_of(f: &Fixture, key: &str) -> (i32, String, serde_json::Value) {
        let lines = output(leasehold(f, "status", &["--key", key]));
        let json = output(leasehold(f, "status", &["--key", key, "--json"]));
        assert_eq!(code(&lines), code(&json), "{lines:?} {json:?}");
        let object =
            serde_json::from_str(&stdout(&json)).unwrap_or_else(|e| panic!("{e}: {json:?}"));
        (code(&lines), stdout(&lines), object)
    }

    /// `status` shows a semaphore's number of permits and each held permit (its
    /// holder, expiry and token), and says when they are all free.
    pub fn status_shows_a_semaphores_permits_and_their_holders(f: &Fixture) {
        let (free, text, object) = status_of(f, "exports");
        assert_eq!((free, text.as_str()), (1, "exports: free\n"));
        assert!(
            object["semaphore"].is_null() && object["rw_lock"].is_null(),
            "{object}"
        );
        assert_eq!(object["held"], false);

        let dir = tempfile::tempdir().unwrap();
        let started = dir.path().join("started");
        let script = format!("echo started > '{}'; exec sleep 60", started.display());
        let mut run = leasehold(f, "run", &["--key", "exports", "--permits", "3", "--"])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_file(&started);
        let registry = f.registry();
        let permit = registry
            .semaphore("exports", 3)
            .unwrap()
            .try_acquire_for(GENEROUS)
            .unwrap()
            .expect("a permit is free");
        let (held, text, object) = status_of(f, "exports");
        assert_eq!(held, 0, "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "the lock is free, two permits held: {text}");
        assert_eq!(lines[0], "exports: semaphore of 3 permits, 2 held");
        let mine = format!(
            "  permit {}: held by {} since ",
            permit.slot(),
            registry.client_id()
        );
        assert!(
            lines.iter().any(|line| line.starts_with(&mine)),
            "{mine} in {text}"
        );
        assert!(
            text.contains(&format!("fencing token {}\n", permit.fencing_token())),
            "{text}"
        );
        let runs = format!("/{}/", run.id());
        assert!(
            lines
                .iter()
                .any(|line| line.contains("held by") && line.contains(&runs)),
            "the run's process {runs} in {text}"
        );

        assert_eq!(
            (object["held"].clone(), object["state"].clone()),
            (true.into(), "free".into())
        );
        let semaphore = &object["semaphore"];
        assert_eq!(semaphore["permits"], 3, "{object}");
        assert_eq!(semaphore["held"], 2, "{object}");
        let holders = semaphore["holders"].as_array().unwrap();
        let own = holders
            .iter()
            .find(|h| h["client_id"] == registry.client_id())
            .unwrap_or_else(|| panic!("{object}"));
        assert_eq!(own["part"], format!("permit {}", permit.slot()));
        assert_eq!(own["fencing_token"], permit.fencing_token());
        let left = own["expires_in_ms"].as_i64().unwrap();
        assert!(left > 0 && left <= 10_000, "{own}");

        permit.unlock().unwrap();
        send("TERM", run.id());
        wait_with_deadline(&mut run);
        let (free, text, object) = status_of(f, "exports");
        assert_eq!(free, 1, "{text}");
        assert_eq!(text, "exports: semaphore of 3 permits, all free\n");
        assert_eq!(object["semaphore"]["held"], 0, "{object}");
        assert_eq!(object["semaphore"]["holders"], serde_json::json!([]));
        assert_eq!(object["held"], false);
    }

    /// `status` shows a reader/writer lock's readers and its writer, a writer that
    /// waits for readers, and a free one.
    pub fn status_shows_a_reader_writer_locks_readers_and_writer(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let reading = a.rw_lock("cache").unwrap().read().unwrap();
        let also = b.rw_lock("cache").unwrap().read().unwrap();
        let (held, text, object) = status_of(f, "cache");
        assert_eq!(held, 0, "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0], "cache: reader/writer lock, read by 2 readers",
            "{text}"
        );
        assert_eq!(lines.len(), 3, "{text}");
        for registry in [&a, &b] {
            let holder = format!("held by {} since", registry.client_id());
            assert!(
                lines[1..]
                    .iter()
                    .any(|l| l.starts_with("  read ") && l.contains(&holder)),
                "{holder} in {text}"
            );
        }
        let rw = &object["rw_lock"];
        assert_eq!(
            (rw["state"].clone(), rw["readers"].clone()),
            ("read".into(), 2.into()),
            "{object}"
        );
        assert!(object["semaphore"].is_null(), "{object}");
        assert!(rw["holders"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["part"].as_str().unwrap().starts_with("read ")));
        drop(also);

        // A writer of another registry takes the write row and waits for the reader.
        let writer = {
            let registry = f.registry();
            thread::spawn(move || {
                let lock = registry.rw_lock("cache").unwrap();
                let guard = lock.try_write_for(GENEROUS).unwrap().expect("written");
                let id = registry.client_id().to_string();
                guard.unlock().unwrap();
                id
            })
        };
        let deadline = Instant::now() + GENEROUS;
        let text = loop {
            // The lines and the JSON are two runs: both must have seen the writer waiting.
            let (_, text, object) = status_of(f, "cache");
            if object["rw_lock"]["state"] == "writer_waiting" && text.contains("a writer waits") {
                assert_eq!(object["rw_lock"]["readers"], 1, "{object}");
                break text;
            }
            assert!(Instant::now() < deadline, "no waiting writer: {text}");
            thread::sleep(Duration::from_millis(50));
        };
        assert!(
            text.starts_with("cache: reader/writer lock, a writer waits for 1 reader to leave\n  write: held by "),
            "{text}"
        );
        drop(reading);
        let writer_id = writer.join().unwrap();
        assert_ne!(writer_id, a.client_id());

        let writing = a.rw_lock("cache").unwrap().write().unwrap();
        let (held, text, object) = status_of(f, "cache");
        assert_eq!(held, 0, "{text}");
        assert_eq!(
            text.lines().collect::<Vec<_>>()[..1],
            ["cache: reader/writer lock, written"],
            "{text}"
        );
        assert!(
            text.contains(&format!("\n  write: held by {} since", a.client_id())),
            "{text}"
        );
        let rw = &object["rw_lock"];
        assert_eq!(rw["state"], "write", "{object}");
        assert_eq!(rw["holders"][0]["part"], "write", "{object}");
        assert_eq!(rw["holders"][0]["client_id"], a.client_id(), "{object}");
        writing.unlock().unwrap();
        let (free, text, object) = status_of(f, "cache");
        assert_eq!(
            (free, text.as_str()),
            (1, "cache: reader/writer lock, free\n")
        );
        assert_eq!(object["rw_lock"]["state"], "free", "{object}");
    }

    /// `status` works on a table made before semaphores existed (no semaphore table) and
    /// does not create that table.
    pub fn status_without_a_semaphore_table_creates_none(f: &Fixture) {
        execute_ddl(f, &format!("DROP TABLE {}_SEM", f.table()));
        let sem_tables = || {
            objects_named(f, &f.prefix)
                .into_iter()
                .filter(|name| name.to_lowercase().contains("lock_sem"))
                .collect::<Vec<_>>()
        };
        assert!(sem_tables().is_empty());
        let registry = f.registry();
        let reading = registry.rw_lock("k").unwrap().read().unwrap();
        let (held, text, object) = status_of(f, "k");
        assert_eq!(held, 0, "{text}");
        assert_eq!(
            text.lines().next(),
            Some("k: reader/writer lock, read by 1 reader")
        );
        assert!(object["semaphore"].is_null(), "{object}");
        drop(reading);
        let (free, text, _) = status_of(f, "k");
        assert_eq!(free, 1, "{text}");
        assert!(sem_tables().is_empty(), "status made {:?}", sem_tables());
    }

    /// `run` with several `--key` holds every key while the command runs, or none: one held
    /// elsewhere exits busy and leaves the others free; the command sees each key's token.
    pub fn a_run_with_several_keys_holds_them_all_or_none(f: &Fixture) {
        let registry = f.registry();
        let keys = ["--key", "c", "--key", "a", "--key", "b"];
        let held = registry.obtain("b").unwrap().lock().unwrap();
        let busy = output({
            let mut command = leasehold(f, "run", &["-n"]);
            command.args(keys).args(["--", "true"]);
            command
        });
        assert_eq!(code(&busy), BUSY, "{busy:?}");
        let said = String::from_utf8_lossy(&busy.stderr);
        assert!(said.contains("one is held elsewhere"), "{said}");
        for key in ["a", "c"] {
            assert!(
                registry.holder(key).unwrap().is_none(),
                "{key} was given back"
            );
        }
        held.unlock().unwrap();

        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("seen");
        let go = dir.path().join("go");
        let script = format!(
            "printf '%s\\n%s\\n' \"$LEASEHOLD_KEY\" \"$LEASEHOLD_FENCING_TOKENS\" > '{0}.tmp' && \
             mv '{0}.tmp' '{0}' && while [ ! -e '{1}' ]; do sleep 0.01; done",
            seen.display(),
            go.display()
        );
        let mut run = leasehold(f, "run", &["-w", "60"])
            .args(keys)
            .args(["--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_file(&seen);
        let text = std::fs::read_to_string(&seen).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0], "a",
            "LEASEHOLD_KEY is the first key in order: {text}"
        );
        assert_eq!(lines.len(), 4, "{text}");
        for (line, key) in lines[1..].iter().zip(["a", "b", "c"]) {
            let (token, named) = line.split_once(' ').expect("TOKEN KEY");
            assert_eq!(named, key, "{text}");
            let holder = registry
                .holder(key)
                .unwrap()
                .expect("held while the command runs");
            assert_eq!(holder.fencing_token.to_string(), token, "{text}");
        }
        std::fs::write(&go, "").unwrap();
        assert_eq!(wait_with_deadline(&mut run).code(), Some(0));
        for key in ["a", "b", "c"] {
            assert!(
                registry.holder(key).unwrap().is_none(),
                "{key} released after the run"
            );
        }

        let usage = output({
            let mut command = leasehold(f, "run", &["--permits", "2"]);
            command.args(keys).args(["--", "true"]);
            command
        });
        assert_eq!(code(&usage), 64, "{usage:?}");
    }
}

macro_rules! cli {
    ($db:expr) => {
        crate::suite_for!($db;
            concurrent_runs_never_overlap,
            no_wait_and_an_expired_wait_exit_busy_without_running,
            the_commands_exit_code_passes_through,
            flock_style_no_wait_wait_seconds_and_conflict_exit_code,
            status_shows_the_absolute_expiry_and_speaks_json,
            keep_for_makes_a_second_run_inside_the_period_exit_busy,
            out_of_range_durations_exit_usage_before_the_lock_is_taken,
            a_lost_lease_stops_the_command_with_the_lost_code,
            int_term_and_hup_are_forwarded_to_the_command,
            ctrl_c_in_a_terminal_reaches_the_command_once,
            a_sigkilled_holders_lock_is_taken_after_its_ttl_and_its_command_stopped,
            a_lost_lease_stops_every_process_of_the_command_before_exiting_lost,
            a_forwarded_signal_reaches_the_commands_grandchildren,
            the_lock_is_kept_until_what_the_command_left_running_ends,
            a_sigkilled_leasehold_takes_its_commands_grandchildren_with_it,
            a_grandchild_that_ignores_sigterm_is_killed_after_the_grace_when_leasehold_dies,
            as_init_of_a_container_leasehold_reaps_what_its_command_left,
            without_its_watchdog_leasehold_does_not_start_the_command,
            the_command_reads_the_terminal_and_the_shell_gets_it_back,
            ctrl_z_in_a_terminal_does_not_leave_the_command_stopped,
            ctrl_z_and_fg_in_an_interactive_shell,
            the_command_reads_the_terminal_when_leaseholds_input_is_redirected,
            two_leads_never_run_their_commands_at_once,
            losing_leadership_stops_the_command_and_the_lead_competes_again,
            a_standby_lead_exits_on_a_signal_without_running_the_command,
            a_lost_leadership_stops_every_process_of_the_command,
            cleanup_deletes_old_rows,
            read_only_commands_create_no_table_and_point_at_init,
            list_shows_the_rows_as_a_table_and_as_json,
            list_holder_shows_only_what_that_client_holds,
            list_watch_prints_every_refresh_and_stops_on_a_signal,
            status_watch_appends_refreshes_and_ends_when_nobody_reads,
            list_watch_on_a_terminal_redraws_in_place_until_ctrl_c,
            a_watch_reports_a_failed_refresh_and_goes_on,
            init_creates_the_table_or_prints_its_ddl,
            runs_with_permits_never_run_more_commands_than_permits,
            runs_with_permits_exit_busy_when_all_are_held_and_usage_for_another_number,
            a_sigkilled_runs_permit_comes_back_after_its_ttl,
            read_runs_share_and_write_runs_run_alone,
            a_paused_runs_permit_is_taken_and_the_resumed_run_exits_lost,
            status_shows_a_semaphores_permits_and_their_holders,
            status_shows_a_reader_writer_locks_readers_and_writer,
            status_without_a_semaphore_table_creates_none,
            a_run_with_several_keys_holds_them_all_or_none,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    cli!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    cli!(crate::common::Db::Postgres);
    crate::suite_for!(crate::common::Db::Postgres;
        postgres_listener_url_and_prepared_statements_reach_the_registry);
}

#[cfg(feature = "mysql")]
mod mysql {
    cli!(crate::common::Db::Mysql);
}
