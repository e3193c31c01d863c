//! Background processes (`start_process` and friends): output is buffered
//! with cursors, the exit and the kernel's attribution are kept for the
//! next poll, and the tree dies with the session.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use probe::attribution::{ExitStatus, Words};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

use crate::cgroup::CallCgroups;
use crate::workload::{Running, exit_status};

/// Bytes kept per stream; beyond it output is counted but dropped.
pub const BUFFER_CAP: usize = 64 << 20;
/// Bytes one poll returns per stream at most.
pub const POLL_MAX: usize = 8 << 20;

#[derive(Default)]
struct Stream {
    data: Vec<u8>,
    total: u64,
}

pub struct Ended {
    pub exit: ExitStatus,
    pub duration: Duration,
    pub kernel: Value,
}

pub struct Background {
    pub pid: u32,
    stdin: tokio::sync::Mutex<Option<tokio::net::unix::pipe::Sender>>,
    streams: Mutex<[Stream; 2]>,
    ended: Mutex<Option<Arc<Ended>>>,
    /// Bumped on every change, so pollers can wait for one.
    version: watch::Sender<u64>,
    tree: Arc<CallCgroups>,
}

/// What a poll sees: per stream (new bytes, next cursor, buffer full).
pub struct Snapshot {
    pub stdout: (Vec<u8>, u64, bool),
    pub stderr: (Vec<u8>, u64, bool),
    pub ended: Option<Arc<Ended>>,
}

impl Background {
    /// Starts pumping `running`'s output; `command` is what it was asked
    /// to run (a witness for the attribution at its end).
    pub fn spawn(running: Running, command: String) -> Arc<Background> {
        let Running {
            pid,
            stdin,
            stdout,
            stderr,
            waiter,
            tree,
            span,
            kernel,
            started,
            fails_on_exit: _,
            spare: _,
            live,
        } = running;
        let bg = Arc::new(Background {
            pid,
            stdin: tokio::sync::Mutex::new(stdin),
            streams: Mutex::new(Default::default()),
            ended: Mutex::new(None),
            version: watch::channel(0).0,
            tree,
        });
        let out = tokio::spawn(bg.clone().pump(stdout, 0));
        let err = tokio::spawn(bg.clone().pump(stderr, 1));
        let me = bg.clone();
        tokio::spawn(async move {
            let exit = match waiter.await {
                Ok(Ok(s)) => exit_status(s),
                _ => ExitStatus::default(),
            };
            let duration = started.elapsed();
            // its last words: the pumps end at once unless something it
            // left running holds the pipes
            let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
            while !(out.is_finished() && err.is_finished())
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let said = me.said();
            let words = Words::new(Some(command), Some(&said));
            // attribution first: killing the leftovers is ours, not the workload's
            // the call that started it has answered already
            let kernel = kernel
                .end_with_words(&span, Some(&exit), None, false, &words)
                .await;
            let tree = me.tree.clone();
            let _ = tokio::task::spawn_blocking(move || Running::kill_tree(&tree, pid)).await;
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                let _ = out.await;
                let _ = err.await;
            })
            .await;
            *me.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(Ended {
                exit,
                duration,
                kernel,
            }));
            me.version.send_modify(|v| *v += 1);
            drop(live); // live until its tree is gone
        });
        bg
    }

    async fn pump(self: Arc<Self>, mut r: impl AsyncRead + Unpin, which: usize) {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = r.read(&mut buf).await {
            {
                let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
                let s = &mut streams[which];
                s.total += n as u64;
                let room = BUFFER_CAP.saturating_sub(s.data.len());
                s.data.extend_from_slice(&buf[..n.min(room)]);
            }
            self.version.send_modify(|v| *v += 1);
        }
    }

    /// The tails of what it wrote to stdout, then stderr.
    fn said(&self) -> Vec<u8> {
        let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let mut said = Vec::new();
        for s in streams.iter() {
            said.extend_from_slice(&s.data[s.data.len().saturating_sub(Words::MAX)..]);
            said.push(b'\n');
        }
        said
    }

    fn snapshot(&self, cursors: (u64, u64)) -> Snapshot {
        let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let part = |s: &Stream, cursor: u64| {
            let from = (cursor as usize).min(s.data.len());
            let to = (from + POLL_MAX).min(s.data.len());
            (
                s.data[from..to].to_vec(),
                to as u64,
                s.total > s.data.len() as u64,
            )
        };
        Snapshot {
            stdout: part(&streams[0], cursors.0),
            stderr: part(&streams[1], cursors.1),
            ended: self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    /// New output since the cursors; waits up to `wait` for some (or the exit).
    pub async fn poll(&self, cursors: (u64, u64), wait: Duration) -> Snapshot {
        let deadline = tokio::time::Instant::now() + wait;
        let mut rx = self.version.subscribe();
        loop {
            let snap = self.snapshot(cursors);
            let news =
                snap.ended.is_some() || !snap.stdout.0.is_empty() || !snap.stderr.0.is_empty();
            // a change can carry nothing new past these cursors (a full buffer): wait again
            if news
                || !matches!(
                    tokio::time::timeout_at(deadline, rx.changed()).await,
                    Ok(Ok(()))
                )
            {
                return snap;
            }
        }
    }

    pub async fn write_stdin(&self, data: &[u8], close: bool) -> Result<(), String> {
        let mut guard = self.stdin.lock().await;
        let Some(pipe) = guard.as_mut() else {
            return Err("stdin is closed".into());
        };
        if !data.is_empty() {
            pipe.write_all(data)
                .await
                .map_err(|e| format!("cannot write to stdin: {e}"))?;
            pipe.flush()
                .await
                .map_err(|e| format!("cannot write to stdin: {e}"))?;
        }
        if close {
            *guard = None;
        }
        Ok(())
    }

    /// SIGKILL kills the whole tree; other signals go to the process group.
    pub async fn signal(&self, sig: nix::sys::signal::Signal) {
        if self
            .ended
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return;
        }
        if sig == nix::sys::signal::Signal::SIGKILL {
            let (tree, pid) = (self.tree.clone(), self.pid);
            let _ = tokio::task::spawn_blocking(move || Running::kill_tree(&tree, pid)).await;
        } else {
            crate::workload::kill_group(self.pid, sig);
        }
    }

    /// For the session's end: kill without waiting for the runtime.
    pub fn kill_now(&self) {
        if self
            .ended
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
        {
            Running::signal_tree(&self.tree, self.pid);
        }
    }
}

/// A `kB` field of /proc/PID/status (e.g. `VmHWM`), in KiB; 0 when unreadable.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
