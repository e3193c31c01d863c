//! The records the campaign's stages hand each other: a step's outcome, a
//! call's error, a test's triage and record, and the causes they name.
//! A leaf: it imports no other module of the crate, so the stages that
//! produce these (verdict, triage, target) and the ones that consume them
//! (db, otel, report) never import each other in a circle.
//!
//! Causes are typed: the sandbox layer's primitives are the probe's own
//! [`Primitive`]; the interface layer has [`InterfacePrimitive`].

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use probe::primitive::{Layer, Primitive};

/// A primitive of the interface layer (the kernel taxonomy has the sandbox's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum InterfacePrimitive {
    #[serde(rename = "interface.transport")]
    Transport,
    #[serde(rename = "interface.protocol")]
    Protocol,
    #[serde(rename = "interface.bytes")]
    Bytes,
}

impl InterfacePrimitive {
    pub const ALL: [InterfacePrimitive; 3] = [
        InterfacePrimitive::Transport,
        InterfacePrimitive::Protocol,
        InterfacePrimitive::Bytes,
    ];

    pub fn id(self) -> &'static str {
        match self {
            InterfacePrimitive::Transport => "interface.transport",
            InterfacePrimitive::Protocol => "interface.protocol",
            InterfacePrimitive::Bytes => "interface.bytes",
        }
    }

    pub fn meaning(self) -> &'static str {
        match self {
            InterfacePrimitive::Transport => {
                "the bridge died, closed the connection, or did not answer in time"
            }
            InterfacePrimitive::Protocol => {
                "a JSON-RPC error, or a result without the promised structure"
            }
            InterfacePrimitive::Bytes => {
                "bytes that came back differ from what was sent or from their own digest"
            }
        }
    }
}

/// The primitive a failure is placed on: the kernel's or the interface's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    Kernel(Primitive),
    Interface(InterfacePrimitive),
}

impl Cause {
    /// The stable id stored in the results (`fs.readonly`, `interface.bytes`, `none`).
    pub fn id(self) -> &'static str {
        match self {
            Cause::Kernel(p) => p.id(),
            Cause::Interface(p) => p.id(),
        }
    }

    /// Parses a stored id; `None` for an id neither taxonomy names.
    pub fn from_id(id: &str) -> Option<Cause> {
        Primitive::from_id(id).map(Cause::Kernel).or_else(|| {
            InterfacePrimitive::ALL
                .into_iter()
                .find(|p| p.id() == id)
                .map(Cause::Interface)
        })
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

impl Serialize for Cause {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.id())
    }
}

/// How a test ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    /// Every step passed, but one was slow or stalled on memory.
    Degraded,
    /// A step the target cannot express stopped the test.
    Unsupported,
}

impl Outcome {
    pub fn id(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Degraded => "degraded",
            Outcome::Unsupported => "unsupported",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// A failed test's layer and primitive, with the evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Triage {
    pub layer: Layer,
    pub primitive: Cause,
    pub confidence: f64,
    pub explanation: String,
    /// The step, the failed expectations, the interface and kernel evidence.
    pub evidence: Value,
}

/// Why a test that passed is `degraded` (see `triage::degraded`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Degraded {
    /// `mem.pressure` when a step stalled on memory; none for slowness alone.
    pub primitive: Option<Primitive>,
    /// `step N: …` for every degraded step.
    pub explanation: String,
}

/// Why a call got no tool result.
#[derive(Debug, Clone)]
pub enum CallError {
    /// The bridge answered with a JSON-RPC error; `kernel` is the probe's
    /// evidence it carried (`error.data["probe/kernel"]`, which the proxy
    /// adds when the server died on the call).
    Protocol {
        message: String,
        kernel: Option<serde_json::Value>,
    },
    /// The connection broke (the bridge died, the socket closed, …).
    /// `kernel`: what the step's earlier calls showed (a follow-up call of
    /// an adapted step broke, and the calls before it may say why).
    Transport {
        message: String,
        kernel: Option<serde_json::Value>,
    },
    /// No answer in time; `kernel` as for `Transport`.
    Timeout {
        after: Duration,
        kernel: Option<serde_json::Value>,
    },
}

impl CallError {
    /// A JSON-RPC error of the caller's own making (an adapter's), with no evidence.
    pub fn protocol(message: String) -> CallError {
        CallError::Protocol {
            message,
            kernel: None,
        }
    }

    /// The connection broke; no evidence with it.
    pub fn transport(message: String) -> CallError {
        CallError::Transport {
            message,
            kernel: None,
        }
    }

    /// No answer within `after`; no evidence with it.
    pub fn timeout(after: Duration) -> CallError {
        CallError::Timeout {
            after,
            kernel: None,
        }
    }

    /// The kernel evidence the error carries.
    pub fn kernel(&self) -> Option<&serde_json::Value> {
        match self {
            CallError::Protocol { kernel, .. }
            | CallError::Transport { kernel, .. }
            | CallError::Timeout { kernel, .. } => kernel.as_ref(),
        }
    }

    /// The same error carrying `evidence` instead.
    pub fn with_kernel(mut self, evidence: Option<serde_json::Value>) -> CallError {
        match &mut self {
            CallError::Protocol { kernel, .. }
            | CallError::Transport { kernel, .. }
            | CallError::Timeout { kernel, .. } => *kernel = evidence,
        }
        self
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Protocol { message, .. } => write!(f, "JSON-RPC error: {message}"),
            CallError::Transport { message, .. } => write!(f, "transport: {message}"),
            CallError::Timeout { after, .. } => write!(f, "no answer in {} s", after.as_secs()),
        }
    }
}

/// What one step did and how it was judged.
#[derive(Debug, Clone, Default)]
pub struct StepOutcome {
    /// Expectations that did not hold, each with what was expected and seen.
    pub failures: Vec<String>,
    /// Evidence that the interface (bridge encoding, protocol, transport) is at fault.
    pub interface: Vec<String>,
    /// The interface primitive the evidence points at, and how surely.
    pub interface_primitive: Option<(InterfacePrimitive, f64)>,
    /// The call got no tool result.
    pub call_error: Option<String>,
    /// The connection is gone: the test cannot go on in this session.
    pub transport_lost: bool,
    pub is_error: Option<bool>,
    /// The step expects a failure (an error, an absent path, a non-zero
    /// exit, a signal): its kernel attribution is the test's intent, not a cause.
    pub expects_failure: bool,
    /// The probe's evidence for the call (events cut to those around the
    /// decisive one), as it came: also when it is not available, since the
    /// proxy adds what it knows beside it (`before_call`, `outcome`).
    pub kernel: Option<Value>,
    /// Why the bridge had no kernel attribution for this call, when it had none.
    pub kernel_unavailable: Option<String>,
    pub response_sha256: Option<String>,
    pub response_bytes: Option<u64>,
    pub duration_ms: f64,
    /// Why a step that passed is degraded: it ran past its
    /// `max_duration_ms`, or it stalled on memory reclaim.
    pub degraded: Vec<String>,
    /// The degradation is the kernel's: memory pressure (`mem.pressure`),
    /// or a process of the call the OOM killer took while the call
    /// "succeeded" (`mem.oom`: a browser tab).
    pub degraded_on: Option<Primitive>,
    /// An image the step read back (a screenshot), kept for the report.
    pub artifact: Option<(&'static str, Vec<u8>)>,
    /// The target cannot express the step (through its adapter): why.
    pub unsupported: Option<String>,
    /// Expectations the target cannot report, left out of the judgement.
    pub unchecked: Vec<String>,
    /// The call as the adapter sent it (`{tool, arguments}`).
    pub target_call: Option<Value>,
}

impl StepOutcome {
    /// Records interface evidence; the surest primitive is kept.
    pub(crate) fn blame(
        &mut self,
        primitive: InterfacePrimitive,
        confidence: f64,
        message: String,
    ) {
        if self.interface_primitive.is_none_or(|(_, c)| c < confidence) {
            self.interface_primitive = Some((primitive, confidence));
        }
        self.interface.push(message);
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
            && self.interface.is_empty()
            && self.call_error.is_none()
            && self.unsupported.is_none()
    }

    /// The probe's attribution of the call: its evidence, when available.
    /// Evidence that is not available names no cause of its own (only what
    /// died before the call may be read from it).
    pub fn attribution(&self) -> Option<&Value> {
        self.kernel
            .as_ref()
            .filter(|k| k["available"] == Value::Bool(true))
    }

    /// The kernel attribution says the call failed, and on what.
    pub fn kernel_failure(&self) -> Option<KernelCause> {
        let k = self.attribution()?;
        (k["failed"] == Value::Bool(true))
            .then(|| KernelCause::of(k))
            .flatten()
    }

    /// The call exited 0, but a child failed on a sandbox primitive (a
    /// pipeline hid it): what the kernel saw.
    pub fn hidden_failure(&self) -> Option<KernelCause> {
        KernelCause::of(&self.attribution()?["hidden_failure"])
    }

    /// What died in the server's tree after its previous call was answered
    /// and before this one began (the proxy's `before_call`: a tab the OOM
    /// killer took while nobody asked). Read also from evidence that is not
    /// available: the call's own span may be lost, the death before it not.
    pub fn died_before_call(&self) -> Option<KernelCause> {
        let before = &self.kernel.as_ref()?["before_call"];
        KernelCause::of(&before["hidden_failure"])
            .or_else(|| KernelCause::of(before))
            .filter(|c| c.primitive != Primitive::None)
    }
}

/// The probe's cause in an attribution-shaped object (an attribution or
/// its `hidden_failure`), in the probe's own types.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct KernelCause {
    pub primitive: Primitive,
    #[serde(default)]
    pub confidence: f64,
    #[serde(default)]
    pub explanation: String,
}

impl KernelCause {
    /// `None` when `v` holds no cause the probe's taxonomy names.
    pub fn of(v: &Value) -> Option<KernelCause> {
        KernelCause::deserialize(v).ok()
    }
}

/// One test's outcome, ready to store.
#[derive(Debug, Clone)]
pub struct TestRecord {
    pub test_id: String,
    pub domain: String,
    pub title: String,
    pub triage: Option<Triage>,
    /// Passed, but degraded (only when `triage` is `None`).
    pub degraded: Option<Degraded>,
    /// A step the target cannot express stopped the test: why.
    pub unsupported: Option<String>,
    pub duration_ms: f64,
    pub runner: String,
    pub mcp_session: Option<String>,
    /// The target that ran it (when the run has several).
    pub target: Option<String>,
    /// (tool, stored request, outcome); `None` for steps not run.
    pub steps: Vec<(String, Value, Option<StepOutcome>)>,
}

impl TestRecord {
    pub fn outcome(&self) -> Outcome {
        match (&self.triage, &self.degraded) {
            _ if self.unsupported.is_some() => Outcome::Unsupported,
            (Some(_), _) => Outcome::Fail,
            (None, Some(_)) => Outcome::Degraded,
            (None, None) => Outcome::Pass,
        }
    }
}
