//! The workload's stderr passed through to ours while its tail is kept:
//! what it said is a witness for the attribution (a failed lookup is named
//! as the cause only when something names its path, see
//! `attribution::grade`).

use std::io::{Read as _, Write as _};
use std::process::{ChildStderr, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use crate::attribution::Words;

/// A stderr being passed through; [`StderrTee::said`] reads what it kept.
pub struct StderrTee {
    tail: Arc<Mutex<Vec<u8>>>,
    eof: mpsc::Receiver<()>,
}

/// How long to wait, after the workload ended, for the last of its output
/// (a background process still holding the pipe keeps it open: then what
/// arrived by then is its words).
const EOF_WAIT: Duration = Duration::from_millis(200);

impl StderrTee {
    /// Makes `cmd`'s stderr a pipe: pass the child's end to [`StderrTee::start`].
    pub fn pipe(cmd: &mut Command) {
        cmd.stderr(Stdio::piped());
    }

    /// Copies `from` to our stderr as it comes, keeping the last
    /// [`Words::MAX`] bytes.
    pub fn start(mut from: ChildStderr) -> StderrTee {
        let tail = Arc::new(Mutex::new(Vec::new()));
        let (done, eof) = mpsc::channel();
        let kept = tail.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            let mut out = std::io::stderr();
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                // a closed stderr of ours must not stop the workload's
                let _ = out.write_all(&buf[..n]);
                let mut t = kept.lock().unwrap_or_else(|p| p.into_inner());
                t.extend_from_slice(&buf[..n]);
                let excess = t.len().saturating_sub(Words::MAX);
                t.drain(..excess);
            }
            let _ = done.send(());
        });
        StderrTee { tail, eof }
    }

    /// What the workload said on stderr, once it ended.
    pub fn said(&self) -> Vec<u8> {
        let _ = self.eof.recv_timeout(EOF_WAIT);
        self.tail.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A command line as one string, for [`Words::command`].
pub fn command_line(command: &[std::ffi::OsString]) -> String {
    command
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
