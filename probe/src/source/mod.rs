//! Evidence sources: where a span's events come from, behind one small
//! interface (the model is Falco's libscap: each engine behind one shape,
//! chosen when it is opened, the consumer unaware of which one runs).
//!
//! A source follows workloads for spans, drains what it saw into the open
//! spans through a [`SpanSink`], and has the last word on a span when it
//! ends (what it still holds, its drops, what it learnt around the
//! workload). What it cannot see travels as data on the span
//! ([`crate::spans::Source::sight`]), never as a branch in attribution.
//!
//! - [`ebpf::EbpfSource`]: the probe's eBPF programs in this kernel.
//! - [`crate::gvisor::source::GvisorSource`]: gVisor's runtime-monitoring
//!   points, for a workload whose kernel is gVisor's.
//!
//! The daemon holds a list of them and opens each span on one; `probe
//! trace` runs one command on one ([`TraceSource`]). A third source is a
//! module implementing these traits and one line where the daemon and
//! `probe trace` open their sources.

use std::ffi::OsString;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::process::{Child, Command};

use crate::event::KernelEvent;
use crate::protocol::ErrorBody;
use crate::spans::{Source, SpanEvidence};
use crate::status::DaemonStatus;

pub mod ebpf;

/// What a span follows, as its `begin_span` asked.
#[derive(Debug, Clone, Default)]
pub struct Follow {
    /// A process, numbered as the source numbers them (the host's pids for
    /// eBPF, the sandbox's own under gVisor).
    pub pid: Option<u32>,
    /// With `pid`: its descendants (and threads) as they are now, and what
    /// they start later.
    pub tree: bool,
    /// With `pid`: its seccomp mode, as the caller knows it.
    pub seccomp: Option<u32>,
    /// With `pid`: note its memory cgroup and limit now.
    pub memory_limited: bool,
    /// A cgroup to follow for the span's whole life.
    pub cgroup: Option<PathBuf>,
    /// Which container of the sandboxes the source monitors.
    pub within: Option<Within>,
}

/// A container of a sandbox whose own kernel runs the workload.
#[derive(Debug, Clone)]
pub enum Within {
    /// The client named it.
    Container(String),
    /// The one behind the client's connection (the client runs inside a
    /// sandbox): its container when found, and the runsc that started it.
    Behind {
        container: Option<String>,
        runsc: Option<u32>,
    },
}

/// Where a source delivers what it drained: the open spans.
pub trait SpanSink {
    /// Open span `span`'s evidence (None: ended, or never begun).
    fn evidence(&mut self, span: u64) -> Option<&mut SpanEvidence>;
    /// Adds `ev`, timed from the span's start, to open span `span`.
    fn deliver(&mut self, span: u64, ev: KernelEvent);
    /// Counts one record the source read (delivered or not).
    fn read(&mut self) {}
    /// Counts one event of a span no longer open.
    fn late(&mut self) {}
    /// Counts one record that could not be decoded.
    fn undecodable(&mut self) {}
}

/// One span as a sink: `probe trace`'s only span.
impl SpanSink for SpanEvidence {
    fn evidence(&mut self, span: u64) -> Option<&mut SpanEvidence> {
        (span == self.id).then_some(self)
    }

    fn deliver(&mut self, span: u64, ev: KernelEvent) {
        if span == self.id {
            self.add(ev);
        }
    }
}

/// A source of kernel evidence: the daemon's and `probe trace`'s view of it.
pub trait EvidenceSource: Send {
    /// Which source this is (stored on each span; its sight says what it
    /// cannot see).
    fn kind(&self) -> Source;

    /// Starts following `what` for `span`, a new span not yet in `sink`.
    /// Answers how many threads or processes a walk attached. On an error
    /// nothing of the span is followed.
    fn begin(
        &mut self,
        span: &mut SpanEvidence,
        what: &Follow,
        sink: &mut dyn SpanSink,
    ) -> Result<Option<usize>, ErrorBody>;

    /// Adds process `pid` to open span `span` (`attach`).
    fn attach(&mut self, span: &mut SpanEvidence, pid: u32) -> Result<(), ErrorBody>;

    /// Moves at most `max` of what the source holds into the open spans.
    /// Answers how many records it read.
    fn drain(&mut self, max: usize, sink: &mut dyn SpanSink) -> usize;

    /// Whether span `span` may be closed now: its root's exit has arrived,
    /// where the source's events trail the caller's own wait.
    fn settled(&mut self, _span: u64, _sink: &mut dyn SpanSink) -> bool {
        true
    }

    /// The source's last word on span `span`, which then ends: what it still
    /// holds, its drops, what it learnt around the workload. The span is
    /// still in `sink`.
    fn close(&mut self, span: u64, sink: &mut dyn SpanSink);

    /// A descriptor that turns readable when events wait (None: drained on
    /// the read interval only).
    fn poll_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Forgets what the source still keeps for spans no longer open (ones
    /// whose end could not name everything). Answers events lost that way.
    fn sweep(&mut self, _open: &dyn Fn(u64) -> bool) -> u64 {
        0
    }

    /// Its part of `probe status`.
    fn describe(&self, status: &mut DaemonStatus);
}

/// How a source stops a workload it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Asked to end (SIGTERM, passed on by a runtime to its container).
    Ask,
    /// Ended now (SIGKILL to all it runs).
    Kill,
}

/// A source that runs one command itself: `probe trace`.
pub trait TraceSource: EvidenceSource {
    /// The command line to run for `command` (a runtime adds its monitor).
    fn command(&mut self, command: &[OsString]) -> anyhow::Result<Vec<OsString>> {
        Ok(command.to_vec())
    }

    /// Starts `cmd` as span `span`'s workload, followed from its first
    /// instruction where the source can. The outer error: it never ran; the
    /// inner one: its exec failed, which the source saw.
    fn spawn(
        &mut self,
        cmd: &mut Command,
        span: &mut SpanEvidence,
    ) -> anyhow::Result<Result<Child, std::io::Error>>;

    /// How a deadline stops the workload.
    fn on_timeout(&self) -> Stop;

    /// Stops the workload (`child`, and all of the span the source knows).
    fn stop(&self, span: &SpanEvidence, child: u32, how: Stop);

    /// After the command's exit: waits (bounded) for what still belongs to
    /// the span (leftover processes, the sandbox's last points).
    fn settle(&mut self, span: &mut SpanEvidence);
}
