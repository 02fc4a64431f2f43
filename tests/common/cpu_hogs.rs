//! Processes that keep the machine's cores busy, for runs under load (`tests/many_leases.rs`,
//! and `benches/many_leases.rs`, which includes this file by `#[path]`).

/// Processes that keep the machine's cores busy until dropped: shell busy loops, each in a
/// session of its own where `setsid` exists, so that the scheduler weighs them as it weighs
/// other programs on the host (Linux groups a session's threads and children, and splits the
/// processor between such groups before it splits a group's share among its threads).
pub struct CpuHogs(Vec<std::process::Child>);

impl CpuHogs {
    pub fn start(count: usize) -> CpuHogs {
        // Each ends by itself once the process that started it is gone, killed or not.
        let busy_loop = ["sh", "-c", "while kill -0 $PPID 2>/dev/null; do :; done"];
        let setsid = std::path::Path::new("/usr/bin/setsid").exists();
        let hogs = (0..count)
            .map(|_| {
                let mut command = if setsid {
                    let mut command = std::process::Command::new("/usr/bin/setsid");
                    command.args(busy_loop);
                    command
                } else {
                    let mut command = std::process::Command::new(busy_loop[0]);
                    command.args(&busy_loop[1..]);
                    command
                };
                command
                    .stdin(std::process::Stdio::null())
                    .spawn()
                    .expect("a CPU hog (sh)")
            })
            .collect();
        CpuHogs(hogs)
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for hog in &mut self.0 {
            let _ = hog.kill();
            let _ = hog.wait();
        }
    }
}
