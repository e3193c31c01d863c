//! The gVisor source: the probe listens as runsc's monitor; each point the
//! sandboxes send becomes a [`crate::event::KernelEvent`], routed to its
//! span by container and the sandbox's own pids ([`super::routes`]). The
//! sandbox's memory is watched from the host ([`super::memory`]), since
//! gVisor has no point for an OOM kill.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::memory::{Finder, SandboxMemory};
use super::monitor::{Delivery, Monitor};
use super::routes::{RouteError, Routes};
use super::session;
use crate::protocol::{ErrorBody, ErrorCode};
use crate::source::{EvidenceSource, Follow, SpanSink, Stop, TraceSource, Within};
use crate::spans::{Source, SpanEvidence};
use crate::status::{DaemonStatus, GvisorSandbox, GvisorStatus};

/// How long points may trail the runsc process's exit: the sandbox
/// hangs up its connection when it has sent its last point, usually
/// before runsc returns, but after it when the monitor fell behind.
const SETTLE: Duration = Duration::from_secs(5);

pub struct GvisorSource {
    monitor: Monitor,
    rx: Receiver<Delivery>,
    routes: Routes,
    /// The container of each open span.
    containers: HashMap<u64, String>,
    /// Each open span's sandbox memory.
    memory: HashMap<u64, SandboxMemory>,
    /// `probe trace --gvisor`: every point is this span's, whichever
    /// container sent it.
    everything: Option<u64>,
    /// Connections ever made.
    connections: u64,
    /// `probe trace --gvisor`: the private directory of the socket and
    /// the configuration runsc is started with.
    work: Option<WorkDir>,
    /// `probe trace --gvisor --io-points`: the read/write/close exits its
    /// session asks for.
    io_points: session::IoPoints,
}

impl GvisorSource {
    /// The daemon's monitor socket at `path`.
    pub fn listen(path: &Path) -> anyhow::Result<GvisorSource> {
        let (tx, rx) = channel();
        let monitor = Monitor::listen(path, tx)?;
        Ok(GvisorSource {
            monitor,
            rx,
            routes: Routes::default(),
            containers: HashMap::new(),
            memory: HashMap::new(),
            everything: None,
            connections: 0,
            work: None,
            io_points: session::IoPoints::default(),
        })
    }

    /// For `probe trace --gvisor`: a monitor in a private directory, whose
    /// points all go to one span.
    pub fn for_trace(io: session::IoPoints) -> anyhow::Result<GvisorSource> {
        let work = WorkDir::new()?;
        let mut source = GvisorSource::listen(&work.0.join("monitor.sock"))?;
        source.work = Some(work);
        source.io_points = io;
        Ok(source)
    }

    /// Routes one delivery of the monitor to its spans.
    fn take(&mut self, delivery: Delivery, sink: &mut dyn SpanSink) {
        let (conn, dropped) = match &delivery {
            Delivery::Connected { conn, peer_pid } => {
                self.connections += 1;
                self.routes.connected(*conn, *peer_pid);
                return;
            }
            Delivery::Closed { conn } => {
                self.routes.closed(*conn);
                return;
            }
            Delivery::Container { conn, container } => {
                self.routes.container(*conn, container);
                return;
            }
            Delivery::Dropped { conn, dropped } => (*conn, *dropped),
            Delivery::Point { conn, dropped, .. } => {
                self.routes.counts.points += 1;
                (*conn, *dropped)
            }
        };
        if dropped > 0 {
            // runsc counts per sandbox: every span of it may have lost them
            self.routes.counts.dropped += dropped;
            let spans = match self.everything {
                Some(span) => vec![span],
                None => self.routes.spans_of(conn),
            };
            for span in spans {
                if let Some(evidence) = sink.evidence(span) {
                    evidence.drops.kernel += dropped;
                }
            }
        }
        let Delivery::Point { converted, .. } = delivery else {
            return;
        };
        for mut ev in converted.events {
            sink.read();
            let span = match self.everything {
                Some(span) => Some(span),
                None => self.routes.route(&converted.container, &ev),
            };
            let Some(span) = span else { continue };
            let Some(evidence) = sink.evidence(span) else {
                sink.late();
                continue;
            };
            ev.ts_ns = ev.ts_ns.saturating_sub(evidence.start_ns);
            sink.deliver(span, ev);
        }
    }

    /// The container `within` names, as the sandboxes said so far.
    fn container(&self, within: &Within) -> Result<String, ErrorBody> {
        match within {
            Within::Container(c) => Ok(c.clone()),
            Within::Behind { container, runsc } => match container {
                Some(c) if self.routes.is_connected(c) => Ok(c.clone()),
                // a sandbox process not found: its runsc's connection
                _ => runsc
                    .ok_or(RouteError::NoSandbox)
                    .and_then(|r| self.routes.container_of(r))
                    .map_err(|e| ErrorBody::new(ErrorCode::Unavailable, e.to_string())),
            },
        }
    }

    fn open_connections(&self) -> usize {
        self.routes.sandboxes().len()
    }
}

impl EvidenceSource for GvisorSource {
    fn kind(&self) -> Source {
        Source::Gvisor
    }

    /// A span over a process of a gVisor sandbox (`pid` as the sandbox
    /// sees it, or one `attach` names later). Answers, with `tree`, how
    /// many processes.
    fn begin(
        &mut self,
        span: &mut SpanEvidence,
        what: &Follow,
        sink: &mut dyn SpanSink,
    ) -> Result<Option<usize>, ErrorBody> {
        span.source = Source::Gvisor;
        let Some(within) = &what.within else {
            // `probe trace --gvisor`: the sandbox it starts is the span's
            self.everything = Some(span.id);
            self.memory.insert(span.id, SandboxMemory::new(None, true));
            return Ok(None);
        };
        // what the sandbox said so far names its container
        self.drain(usize::MAX, sink);
        let container = self.container(within)?;
        // without a pid, `attach` names the span's process later
        let n = what
            .pid
            .map(|pid| self.routes.attach(span.id, &container, pid, what.tree));
        span.root_pid = what.pid;
        self.memory.insert(
            span.id,
            SandboxMemory::new(Some(Finder::Container(container.clone())), false),
        );
        self.containers.insert(span.id, container);
        Ok(n.filter(|_| what.tree))
    }

    fn attach(&mut self, span: &mut SpanEvidence, pid: u32) -> Result<(), ErrorBody> {
        let Some(container) = self.containers.get(&span.id) else {
            return Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("span {} follows no gVisor container", span.id),
            ));
        };
        self.routes.attach(span.id, container, pid, false);
        span.root_pid.get_or_insert(pid);
        Ok(())
    }

    fn drain(&mut self, max: usize, sink: &mut dyn SpanSink) -> usize {
        let mut read = 0;
        while read < max {
            let Ok(delivery) = self.rx.try_recv() else {
                break;
            };
            read += 1;
            self.take(delivery, sink);
        }
        for memory in self.memory.values_mut() {
            memory.watch();
        }
        read
    }

    /// Whether the span's root's exit point has arrived (drained first):
    /// it travels the monitor socket while the caller's wait returns.
    fn settled(&mut self, span: u64, sink: &mut dyn SpanSink) -> bool {
        self.drain(usize::MAX, sink);
        sink.evidence(span).is_none_or(|e| {
            e.root_pid
                .is_none_or(|p| e.processes.get(&p).is_some_and(|p| p.exited))
        })
    }

    /// The sandbox's last word: its points so far, and an OOM kill its
    /// memory's witnesses saw. Its drops are runsc's own count, added as
    /// its points arrived.
    fn close(&mut self, span: u64, sink: &mut dyn SpanSink) {
        self.drain(usize::MAX, sink);
        self.routes.end(span);
        self.containers.remove(&span);
        let memory = self.memory.remove(&span);
        let whole = self.everything.take_if(|s| *s == span).is_some();
        let Some(evidence) = sink.evidence(span) else {
            return;
        };
        if whole {
            evidence.root_pid = sandbox_root(evidence);
        }
        if let Some(mut memory) = memory {
            memory.watch();
            if let Some(oom) = memory.kill(evidence) {
                evidence.add(oom);
            }
        }
    }

    fn describe(&self, status: &mut DaemonStatus) {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let stats = &self.monitor.stats;
        status.gvisor = Some(GvisorStatus {
            socket: self.monitor.path().to_path_buf(),
            sandboxes: self
                .routes
                .sandboxes()
                .into_iter()
                .map(|(runsc_pid, containers)| GvisorSandbox {
                    runsc_pid,
                    containers,
                })
                .collect(),
            connections: load(&stats.connections),
            datagrams: load(&stats.datagrams),
            points: self.routes.counts.points,
            unrouted: self.routes.counts.unrouted,
            dropped: self.routes.counts.dropped,
            malformed: load(&stats.malformed),
            refused: load(&stats.refused),
        });
    }
}

impl TraceSource for GvisorSource {
    /// The runsc command line with the probe's session added.
    fn command(&mut self, command: &[OsString]) -> anyhow::Result<Vec<OsString>> {
        let work = self
            .work
            .as_ref()
            .context("this gVisor source was not made for one command")?;
        let config = work.0.join("pod-init.json");
        let rewritten = session::with_pod_init_config(command, &config)?;
        std::fs::write(
            &config,
            serde_json::to_vec_pretty(&session::pod_init_config(
                self.monitor.path(),
                session::IfNoMonitor::Fail,
                self.io_points,
            ))?,
        )
        .with_context(|| format!("writing {}", config.display()))?;
        Ok(rewritten)
    }

    fn spawn(
        &mut self,
        cmd: &mut Command,
        span: &mut SpanEvidence,
    ) -> anyhow::Result<Result<Child, std::io::Error>> {
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                };
                anyhow::bail!(
                    "cannot start {} (exit {code}): {e}",
                    cmd.get_program().to_string_lossy()
                );
            }
        };
        if let Some(memory) = self.memory.get_mut(&span.id) {
            memory.find_by(Finder::Runsc(child.id()));
        }
        Ok(Ok(child))
    }

    fn on_timeout(&self) -> Stop {
        // runsc passes SIGTERM on to the container; the sandbox then says
        // its last points
        Stop::Ask
    }

    fn stop(&self, _span: &SpanEvidence, child: u32, how: Stop) {
        let signal = match how {
            Stop::Ask => Signal::SIGTERM,
            Stop::Kill => Signal::SIGKILL,
        };
        let _ = kill(Pid::from_raw(child as i32), signal);
    }

    /// The sandbox hangs up when it has said everything (one that never
    /// connected has nothing to say).
    fn settle(&mut self, span: &mut SpanEvidence) {
        let until = Instant::now() + SETTLE;
        while self.connections > 0 && self.open_connections() > 0 && Instant::now() < until {
            self.drain(usize::MAX, span);
            std::thread::sleep(Duration::from_millis(5));
        }
        // what arrived by now is kept; what a sandbox still sends is not waited for
        self.drain(usize::MAX, span);
        if self.connections == 0 {
            tracing::warn!(
                "runsc never connected to the probe's monitor: no sandbox was started, or this \
                 runsc has no runtime monitoring (it needs release-20220905 or later)"
            );
        } else if self.open_connections() > 0 {
            tracing::warn!(
                "the sandbox still held its monitor connection {} s after runsc exited: later \
                 points are not in this report",
                SETTLE.as_secs()
            );
        }
    }
}

/// The span's root: the lowest pid seen, the container's init (pid 1 in
/// the sandbox, or the first process of a container that is not the pod's
/// first).
fn sandbox_root(span: &SpanEvidence) -> Option<u32> {
    span.processes
        .keys()
        .copied()
        .chain(span.events.iter().map(|e| e.pid))
        .min()
}

/// A private directory for the socket and the configuration, removed
/// when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> anyhow::Result<WorkDir> {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "probe-gvisor-{}-{}",
            std::process::id(),
            crate::clock::monotonic_ns()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        Ok(WorkDir(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
