//! The host side of gVisor's "remote" sink: a `SOCK_SEQPACKET` Unix socket
//! runsc connects to, once per sandbox (and per `trace create`). Every
//! connection is accepted and answered at once (runsc waits for the
//! handshake with no timeout: one slow answer would hang the next
//! sandbox's start), then read on its own thread; what it says reaches the
//! consumer as [`Delivery`] values on one channel, in order per connection.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;

use anyhow::Context as _;
use nix::sys::socket::{
    AddressFamily, Backlog, MsgFlags, SockFlag, SockType, UnixAddr, accept, bind, listen, recv,
    send, socket,
};

use super::events::{Clock, Converted, convert};
use super::wire::{self, MAX_DATAGRAM};

/// What the monitor hands on.
#[derive(Debug)]
pub enum Delivery {
    /// A sandbox connected and shook hands. `peer_pid`: the host process
    /// that connected (the runsc that started the sandbox).
    Connected { conn: u64, peer_pid: Option<u32> },
    /// The events of one point. `dropped` is how many points runsc dropped
    /// on this connection since its previous datagram (its own count is
    /// cumulative).
    Point {
        conn: u64,
        converted: Converted,
        dropped: u64,
    },
    /// The connection's sandbox runs this container (said once per
    /// container, with its first point, whether that point makes events).
    Container { conn: u64, container: String },
    /// Points lost: runsc's count grew (`dropped` since the last
    /// datagram), or a datagram could not be read (1).
    Dropped { conn: u64, dropped: u64 },
    /// The sandbox hung up (exited, or was killed mid-stream).
    Closed { conn: u64 },
}

/// Counters of the monitor's own life, for status.
#[derive(Debug, Default)]
pub struct MonitorStats {
    pub connections: AtomicU64,
    pub datagrams: AtomicU64,
    /// Datagrams that were not a point (garbage, a truncated header):
    /// skipped, the connection kept.
    pub malformed: AtomicU64,
    /// Connections closed because their first datagram was no handshake.
    pub refused: AtomicU64,
}

/// A listening monitor. Dropping it removes the socket file; connections
/// already open go on until their sandbox hangs up.
pub struct Monitor {
    path: PathBuf,
    pub stats: Arc<MonitorStats>,
}

impl Monitor {
    /// Binds `path` (replacing a stale socket file) and starts accepting.
    pub fn listen(path: &Path, deliver: Sender<Delivery>) -> anyhow::Result<Monitor> {
        if std::os::unix::net::UnixStream::connect(path).is_ok() || seqpacket_answers(path) {
            anyhow::bail!(
                "{} is in use by another monitor (another probe daemon?)",
                path.display()
            );
        }
        let _ = std::fs::remove_file(path);
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .context("socket(AF_UNIX, SOCK_SEQPACKET)")?;
        let addr =
            UnixAddr::new(path).with_context(|| format!("socket path {}", path.display()))?;
        bind(fd.as_raw_fd(), &addr).with_context(|| format!("bind {}", path.display()))?;
        // runsc connects as root: nobody else needs to
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .with_context(|| format!("chmod 0600 {}", path.display()))?;
        listen(&fd, Backlog::new(64).expect("a valid backlog"))
            .with_context(|| format!("listen on {}", path.display()))?;
        let stats = Arc::new(MonitorStats::default());
        let accept_stats = stats.clone();
        std::thread::Builder::new()
            .name("gvisor-accept".into())
            .spawn(move || accept_loop(fd, deliver, accept_stats))
            .context("starting the gVisor monitor thread")?;
        Ok(Monitor {
            path: path.to_path_buf(),
            stats,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether a SEQPACKET listener answers at `path` (a live monitor).
fn seqpacket_answers(path: &Path) -> bool {
    let Ok(fd) = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        return false;
    };
    UnixAddr::new(path).is_ok_and(|addr| nix::sys::socket::connect(fd.as_raw_fd(), &addr).is_ok())
}

fn accept_loop(listener: OwnedFd, deliver: Sender<Delivery>, stats: Arc<MonitorStats>) {
    let next = AtomicU64::new(1);
    loop {
        let raw = match accept(listener.as_raw_fd()) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::ECONNABORTED) => continue,
            // out of fds or memory for a moment: a sandbox waits in the
            // backlog rather than never being heard
            Err(
                e @ (nix::errno::Errno::EMFILE
                | nix::errno::Errno::ENFILE
                | nix::errno::Errno::ENOBUFS
                | nix::errno::Errno::ENOMEM),
            ) => {
                tracing::warn!("gVisor monitor: accept: {e}; retrying");
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            Err(e) => {
                tracing::error!("gVisor monitor: accept: {e}; no new sandbox will be heard");
                return;
            }
        };
        // SAFETY: accept just returned this fd; nobody else owns it.
        let conn_fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let conn = next.fetch_add(1, Ordering::Relaxed);
        let (deliver, stats) = (deliver.clone(), stats.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("gvisor-{conn}"))
            .spawn(move || read_connection(conn, conn_fd, deliver, stats));
        if let Err(e) = spawned {
            tracing::error!("gVisor monitor: cannot read connection {conn}: {e}");
        }
    }
}

/// Handshake, then one datagram per point until the sandbox hangs up.
fn read_connection(conn: u64, fd: OwnedFd, deliver: Sender<Delivery>, stats: Arc<MonitorStats>) {
    let raw = fd.as_raw_fd();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    match recv_datagram(raw, &mut buf) {
        Some(n) if wire::read_handshake(&buf[..n]).is_ok_and(|v| v >= 1) => {}
        other => {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "gVisor monitor: connection {conn} sent no handshake ({} bytes); closed",
                other.unwrap_or(0)
            );
            return;
        }
    }
    if let Err(e) = send(raw, &wire::handshake(), MsgFlags::MSG_NOSIGNAL) {
        tracing::warn!("gVisor monitor: connection {conn}: answering the handshake: {e}");
        return;
    }
    stats.connections.fetch_add(1, Ordering::Relaxed);
    let peer_pid = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::PeerCredentials)
        .ok()
        .and_then(|c| u32::try_from(c.pid()).ok());
    if deliver
        .send(Delivery::Connected { conn, peer_pid })
        .is_err()
    {
        return;
    }
    let clock = Clock::now();
    let mut dropped_so_far = 0u32;
    let mut containers = std::collections::HashSet::new();
    while let Some(n) = recv_datagram(raw, &mut buf) {
        stats.datagrams.fetch_add(1, Ordering::Relaxed);
        let datagram = match wire::decode(&buf[..n]) {
            Ok(d) => d,
            Err(e) => {
                // a point lost all the same: counted as the sandbox's drop
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("gVisor monitor: connection {conn}: skipped a datagram: {e}");
                if deliver
                    .send(Delivery::Dropped { conn, dropped: 1 })
                    .is_err()
                {
                    return;
                }
                continue;
            }
        };
        if let Some(container) = datagram.point.container()
            && !containers.contains(container)
        {
            containers.insert(container.to_string());
            let container = container.to_string();
            if deliver
                .send(Delivery::Container { conn, container })
                .is_err()
            {
                return;
            }
        }
        let dropped = u64::from(datagram.dropped_count.saturating_sub(dropped_so_far));
        dropped_so_far = dropped_so_far.max(datagram.dropped_count);
        let delivery = match convert(&datagram.point, &clock) {
            Some(converted) => Delivery::Point {
                conn,
                converted,
                dropped,
            },
            None if dropped > 0 => Delivery::Dropped { conn, dropped },
            None => continue,
        };
        if deliver.send(delivery).is_err() {
            return;
        }
    }
    let _ = deliver.send(Delivery::Closed { conn });
}

/// One datagram, or `None` at the end of the connection (or an error: the
/// sandbox is gone either way).
fn recv_datagram(fd: RawFd, buf: &mut [u8]) -> Option<usize> {
    loop {
        match recv(fd, buf, MsgFlags::empty()) {
            Ok(0) => return None,
            Ok(n) => return Some(n),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::debug!("gVisor monitor: recv: {e}");
                return None;
            }
        }
    }
}
