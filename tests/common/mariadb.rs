//! Starting and stopping one MariaDB server — the one a set of options describes — by its own
//! pid file and port, never by the program's name: other `mariadbd` processes may run beside it
//! (a server on a spare port, the nodes of a Galera test cluster), and a start that matched
//! any of them would do nothing and then wait in vain.
//!
//! The pid file, data directory, port and error log are the server's own settings, read with
//! `mariadbd --print-defaults` (what the server itself would read). The server runs when its
//! pid file names a live `mariadbd` working in its data directory (a server changes into it
//! first thing; a pid file left by a crash may name a reused pid, even another `mariadbd`'s),
//! and is up when, also, its port answers `mysqladmin ping`. The start is
//! `start-stop-daemon --pidfile` (as `.ci/run` does), after removing a stale pid file.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MARIADBD: &str = "/usr/sbin/mariadbd";

/// One MariaDB server, as its options describe it.
#[derive(Debug, Clone)]
pub struct Mariadb {
    /// Options given to `mariadbd` before all others (e.g. `--defaults-file=…`); none for the
    /// system's server.
    options: Vec<String>,
    pub pid_file: PathBuf,
    pub datadir: PathBuf,
    pub port: u16,
    pub log_error: Option<PathBuf>,
}

impl Mariadb {
    /// The system's server (`/etc/mysql`), which the tests use on 127.0.0.1:3306.
    pub fn system() -> Mariadb {
        Mariadb::with_options(&[])
    }

    /// The server that `mariadbd OPTIONS` would start.
    pub fn with_options(options: &[&str]) -> Mariadb {
        let out = Command::new(MARIADBD)
            .args(options)
            .arg("--print-defaults")
            .output()
            .unwrap_or_else(|e| panic!("running {MARIADBD} --print-defaults: {e}"));
        let said = String::from_utf8_lossy(&out.stdout);
        // "…/mariadbd would have been started with the following arguments:\n--a=1 --b …"
        let arguments = said.lines().last().unwrap_or_default();
        let setting = |name: &str| {
            arguments
                .split_whitespace()
                .filter_map(|arg| arg.strip_prefix(name)?.strip_prefix('='))
                .next_back()
                .map(str::to_string)
        };
        let pid_file = setting("--pid-file").map(PathBuf::from).unwrap_or_else(|| {
            panic!("{MARIADBD} {options:?} names no pid-file: {said}");
        });
        let datadir = setting("--datadir").map(PathBuf::from).unwrap_or_else(|| {
            panic!("{MARIADBD} {options:?} names no datadir: {said}");
        });
        let port = setting("--port").map_or(3306, |port| port.parse().expect("a port number"));
        Mariadb {
            options: options.iter().map(|o| o.to_string()).collect(),
            pid_file,
            datadir: datadir.canonicalize().unwrap_or(datadir),
            port,
            log_error: setting("--log-error").map(PathBuf::from),
        }
    }

    /// The pid of this server: the process its pid file names, if that is a live `mariadbd`
    /// working in this server's data directory.
    pub fn pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(&self.pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
        (exe == Path::new(MARIADBD) && cwd == self.datadir && alive(pid)).then_some(pid)
    }

    /// Whether something answers on this server's port (`mysqladmin ping` succeeds even when
    /// it is refused access).
    pub fn answers(&self) -> bool {
        Command::new("mysqladmin")
            .args(["-h", "127.0.0.1", "-P", &self.port.to_string()])
            .args(["-u", "root", "--connect-timeout=5", "ping"])
            .output()
            .is_ok_and(|out| out.status.success())
    }

    /// Up: the pid file names a live `mariadbd`, and the port answers.
    pub fn is_up(&self) -> bool {
        self.pid().is_some() && self.answers()
    }

    /// Starts the server unless it is up, and waits until it is (at most `within`).
    pub fn start(&self, within: Duration) {
        if self.is_up() {
            return;
        }
        if self.pid().is_none() && self.pid_file.exists() {
            // Left by a server that died: it would make start-stop-daemon take whatever
            // process now has that pid for this server.
            std::fs::remove_file(&self.pid_file).expect("removing a stale pid file");
        }
        if let Some(dir) = self.pid_file.parent() {
            run(
                "install",
                &["-d", "-o", "mysql", &dir.display().to_string()],
            );
        }
        let pid_file = self.pid_file.display().to_string();
        let mut args = vec![
            "--start",
            "--oknodo",
            "--background",
            "--pidfile",
            &pid_file,
        ];
        args.extend(["--exec", MARIADBD, "--"]);
        args.extend(self.options.iter().map(String::as_str));
        args.push("--user=mysql");
        run("start-stop-daemon", &args);
        self.wait_until(within, "up", Mariadb::is_up);
    }

    /// Shuts the server down through its port and waits (at most `within`) until its process
    /// has exited (it removes its pid file a little before) and the port no longer answers.
    pub fn stop(&self, within: Duration) {
        let pid = self.pid();
        let port = self.port.to_string();
        run(
            "mysqladmin",
            &["-h", "127.0.0.1", "-P", &port, "-u", "root", "shutdown"],
        );
        self.wait_until(within, "down", |server| {
            server.pid().is_none() && !pid.is_some_and(alive) && !server.answers()
        });
    }

    fn wait_until(&self, within: Duration, state: &str, done: impl Fn(&Mariadb) -> bool) {
        let give_up = Instant::now() + within;
        while !done(self) {
            if Instant::now() >= give_up {
                panic!(
                    "MariaDB (pid file {}, port {}) did not go {state} within {within:?}: pid \
                     {:?}, port answers: {}; the end of its error log:\n{}",
                    self.pid_file.display(),
                    self.port,
                    self.pid(),
                    self.answers(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of the server's error log, for a failure message.
    fn log_tail(&self) -> String {
        let Some(log) = &self.log_error else {
            return "(no log-error setting)".into();
        };
        match std::fs::read_to_string(log) {
            Ok(text) => {
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(15)..].join("\n")
            }
            Err(e) => format!("({}: {e})", log.display()),
        }
    }
}

/// Whether process `pid` exists and has not exited (a zombie has).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        state
            .flatten()
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}

/// Runs `program` and panics, with its output, unless it succeeds.
pub fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
