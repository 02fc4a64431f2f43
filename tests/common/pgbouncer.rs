//! A PgBouncer for the tests: transaction pooling mode in front of the server of
//! [`postgres_url`], on a spare port, its configuration, pid file and log in a temporary
//! directory, run as user `postgres` when the tests run as root (PgBouncer refuses root), and
//! stopped by the pid in its pid file when dropped. Without `pgbouncer` installed, starting one
//! fails the test under `CI=true` (`.ci/run` installs it) and skips it otherwise.

use super::{postgres_url, Db, Route};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Bound on waiting for PgBouncer to listen.
const GENEROUS: Duration = Duration::from_secs(60);

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The `pgbouncer` executable, if installed.
fn pgbouncer_binary() -> Option<PathBuf> {
    [
        "/usr/sbin/pgbouncer",
        "/usr/bin/pgbouncer",
        "/usr/local/bin/pgbouncer",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|path| path.exists())
}

/// A PgBouncer of this test run, stopped when dropped.
pub struct PgBouncer {
    dir: tempfile::TempDir,
    pub port: u16,
    database: String,
}

impl PgBouncer {
    /// Starts one in transaction mode in front of the server of [`postgres_url`], with at most
    /// `server_connections` connections to it; `None` (after saying why) when PgBouncer is not
    /// installed outside CI. Panics under `CI=true` when it is not.
    pub fn start(server_connections: u32) -> Option<PgBouncer> {
        let Some(binary) = pgbouncer_binary() else {
            assert!(
                !ci(),
                "pgbouncer is required under CI=true (.ci/run installs it)"
            );
            super::skipped(
                "PgBouncer tests: pgbouncer is not installed (apt-get install pgbouncer)",
            );
            return None;
        };
        let direct: postgres::Config = postgres_url().parse().expect("LEASEHOLD_POSTGRES_URL");
        let host = match direct.get_hosts().first() {
            Some(postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".to_string(),
        };
        let server_port = direct.get_ports().first().copied().unwrap_or(5432);
        let database = direct.get_dbname().unwrap_or("test").to_string();
        let user = direct.get_user().unwrap_or("postgres").to_string();
        let dir = tempfile::tempdir().expect("temporary directory");
        let port = spare_port();
        let path = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(path("users.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        let ini = format!(
            "[databases]\n\
             {database} = host={host} port={server_port} dbname={database} user={user}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {users}\n\
             pool_mode = transaction\n\
             default_pool_size = {server_connections}\n\
             max_db_connections = {server_connections}\n\
             reserve_pool_size = 0\n\
             max_client_conn = 2000\n\
             ignore_startup_parameters = extra_float_digits\n\
             pidfile = {pidfile}\n\
             logfile = {logfile}\n",
            users = path("users.txt"),
            pidfile = path("pgbouncer.pid"),
            logfile = path("pgbouncer.log"),
        );
        std::fs::write(path("pgbouncer.ini"), ini).unwrap();
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.starts_with(b"0\n"));
        let mut command = if root {
            // PgBouncer refuses to run as root.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&binary);
            command
        } else {
            Command::new(&binary)
        };
        let status = command
            .arg("-d")
            .arg(path("pgbouncer.ini"))
            .status()
            .expect("starting pgbouncer");
        let bouncer = PgBouncer {
            dir,
            port,
            database,
        };
        assert!(
            status.success(),
            "pgbouncer did not start: {}",
            bouncer.log()
        );
        let give_up = Instant::now() + GENEROUS;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < give_up,
                "pgbouncer does not listen: {}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(bouncer)
    }

    /// Its URL, for registries.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.port, self.database
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    fn pid(&self) -> Option<String> {
        let pid = std::fs::read_to_string(self.dir.path().join("pgbouncer.pid")).ok()?;
        Some(pid.trim().to_string()).filter(|pid| !pid.is_empty())
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let Some(pid) = self.pid() else { return };
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let give_up = Instant::now() + Duration::from_secs(10);
        while Instant::now() < give_up
            && Command::new("kill")
                .args(["-0", &pid])
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A local TCP port nobody listens on now.
pub fn spare_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The PgBouncer the conformance tests share, started by the first and stopped after the last
/// that runs at a time.
fn shared_pgbouncer() -> Option<Arc<PgBouncer>> {
    static SHARED: Mutex<Weak<PgBouncer>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(bouncer) = shared.upgrade() {
        return Some(bouncer);
    }
    let bouncer = Arc::new(PgBouncer::start(4)?);
    *shared = Arc::downgrade(&bouncer);
    Some(bouncer)
}

/// The database of a conformance test through the shared PgBouncer (`tests/conformance.rs`,
/// `postgres_through_pgbouncer`): sets this thread's
/// [`Route`] for the fixture about to be made. Without PgBouncer (outside CI) the route leads
/// nowhere, so the fixture reports the test as skipped.
pub fn through_pgbouncer() -> Db {
    let route = match shared_pgbouncer() {
        Some(bouncer) => Route {
            url: bouncer.url(),
            listener_url: postgres_url(),
            keep: bouncer,
        },
        None => Route {
            url: format!("postgres://postgres@127.0.0.1:{}/test", spare_port()),
            listener_url: postgres_url(),
            keep: Arc::new(()),
        },
    };
    super::ROUTE.with(|current| *current.borrow_mut() = Some(route));
    Db::Postgres
}
