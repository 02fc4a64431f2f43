//! One module per subcommand; each takes its parsed arguments and returns the exit code.

pub mod cleanup;
pub mod init;
pub mod lead;
pub mod list;
pub mod release;
pub mod run;
pub mod status;
