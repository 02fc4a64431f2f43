//! A bench's child process: the bench binary runs itself again with an environment variable
//! naming what the child is to do, and the two talk in lines over the child's stdin and
//! stdout. The child prints `ready` once it is set up; [`ChildProcess::spawn`] waits for that.
//! Dropping the handle kills and reaps the child.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

pub struct ChildProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl ChildProcess {
    /// Starts this executable again with `env` set to `spec`, and waits for its `ready`.
    pub fn spawn(env: &str, spec: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(env, spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the bench child");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut process = ChildProcess {
            child,
            stdin,
            stdout,
        };
        assert_eq!(process.read_line(), "ready");
        process
    }

    /// Sends one line to the child.
    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The child's next line, without its line end.
    pub fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
