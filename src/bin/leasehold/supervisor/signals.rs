//! The signals leasehold forwards to the command's process group.

use crate::exit::{self, Failure};
use leasehold::crossbeam_channel;

/// SIGINT, SIGQUIT, SIGTERM and SIGHUP received by leasehold, for forwarding to the command's
/// group. From the call on, they no longer end leasehold.
pub fn forward_signals() -> Result<crossbeam_channel::Receiver<i32>, Failure> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGQUIT, SIGTERM, SIGHUP])
        .map_err(|e| Failure::new(exit::ERROR, format!("cannot catch signals: {e}")))?;
    let (sender, receiver) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("leasehold-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if sender.send(signal).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Failure::new(exit::ERROR, format!("cannot start a thread: {e}")))?;
    Ok(receiver)
}
