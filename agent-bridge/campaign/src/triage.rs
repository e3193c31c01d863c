//! Triage: which layer a failed test belongs to, on which primitive.
//!
//! Interface evidence (a broken transport, a JSON-RPC error, bytes that did
//! not survive the trip) outranks the kernel; then the probe's attribution
//! of the failing step (or of an earlier step that failed unexpectedly);
//! a process of the server's that died between its previous call and the
//! failing one (the proxy's `before_call`); a process the OOM killer took
//! in an earlier step that "succeeded" (a browser's tab, which the failing
//! step then found gone); a failure with none of these is the test's own.

use serde_json::json;

use super::record::{Cause, Degraded, InterfacePrimitive, Layer, Primitive, StepOutcome, Triage};

/// `Some` when every step passed but one ran past its `max_duration_ms` or
/// stalled in memory reclaim: the test finished, in a worse state than it
/// should have (the seed's browser tests under memory pressure).
pub fn degraded(steps: &[StepOutcome]) -> Option<Degraded> {
    if steps.iter().any(|s| !s.passed()) {
        return None;
    }
    let why: Vec<String> = steps
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.degraded.iter().map(move |d| format!("step {i}: {d}")))
        .collect();
    (!why.is_empty()).then(|| Degraded {
        primitive: steps.iter().find_map(|s| s.degraded_on),
        explanation: why.join("; "),
    })
}

/// `None` when every step passed.
pub fn triage(steps: &[StepOutcome]) -> Option<Triage> {
    let (failed_at, failing) = steps.iter().enumerate().find(|(_, s)| !s.passed())?;
    let mut evidence = json!({
        "step": failed_at,
        "failures": failing.failures,
        "interface": failing.interface,
    });
    if let Some(k) = &failing.kernel {
        evidence["kernel"] = k.clone();
    }
    if let Some((i, s)) = steps
        .iter()
        .enumerate()
        .find(|(_, s)| !s.interface.is_empty())
    {
        let (primitive, confidence) = s
            .interface_primitive
            .unwrap_or((InterfacePrimitive::Bytes, 0.8));
        evidence["interface_step"] = i.into();
        return Some(Triage {
            layer: Layer::Interface,
            primitive: Cause::Interface(primitive),
            confidence,
            explanation: format!("step {i}: {}", s.interface.join("; ")),
            evidence,
        });
    }
    // the failing step's own attribution, else an earlier unexpected one
    let kernel = std::iter::once((failed_at, failing, 1.0)).chain(
        steps[..failed_at]
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, s)| !s.expects_failure)
            .map(|(i, s)| (i, s, 0.8)),
    );
    for (i, s, weight) in kernel {
        if let Some(cause) = s.kernel_failure()
            && cause.primitive != Primitive::None
        {
            if i != failed_at {
                evidence["kernel_step"] = i.into();
                evidence["kernel"] = s.kernel.clone().unwrap_or_default();
            }
            return sandbox(
                cause.primitive,
                cause.confidence * weight,
                format!("step {i}: {}", cause.explanation),
                evidence,
            );
        }
    }
    if let Some(hidden) = failing.hidden_failure() {
        return sandbox(
            hidden.primitive,
            hidden.confidence * 0.8,
            format!(
                "step {failed_at}: the call exited 0, but {}",
                hidden.explanation
            ),
            evidence,
        );
    }
    // a process of the server's that died between the previous call and
    // the failing one (a tab the OOM killer took while nobody asked)
    if let Some(death) = failing.died_before_call() {
        return sandbox(
            death.primitive,
            death.confidence * 0.8,
            format!(
                "step {failed_at}: before its call, {}; then {}",
                death.explanation,
                failing.failures.join("; ")
            ),
            evidence,
        );
    }
    // an earlier step that passed, though the OOM killer took one of its
    // processes (a tab): what the failing step then found gone is its doing
    if let Some((i, death)) = steps[..failed_at].iter().enumerate().find_map(|(i, s)| {
        s.hidden_failure()
            .filter(|h| h.primitive == Primitive::MemOom)
            .map(|h| (i, h))
    }) {
        evidence["kernel_step"] = i.into();
        evidence["kernel"] = steps[i].kernel.clone().unwrap_or_default();
        return sandbox(
            Primitive::MemOom,
            death.confidence * 0.8,
            format!(
                "step {i} succeeded, but {}; then step {failed_at}: {}",
                death.explanation,
                failing.failures.join("; ")
            ),
            evidence,
        );
    }
    Some(Triage {
        layer: Layer::Test,
        primitive: Cause::Kernel(Primitive::None),
        confidence: if failing.attribution().is_some() {
            0.7
        } else {
            0.4
        },
        explanation: format!(
            "step {failed_at}: {} (no interface or kernel evidence{}{})",
            failing.failures.join("; "),
            noticed(failing),
            dropped(failing)
        ),
        evidence,
    })
}

/// "; noticed, not the cause: …": the failed lookups the probe saw in the
/// failing step but nothing corroborated, so a reader can still judge them.
fn noticed(step: &StepOutcome) -> String {
    let lines: Vec<&str> = step
        .kernel
        .as_ref()
        .and_then(|k| k["noticed"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str())
        .collect();
    match lines.as_slice() {
        [] => String::new(),
        [one] => format!("; noticed, not the cause: {one}"),
        [first, rest @ ..] => format!(
            "; noticed, not the cause: {first} (and {} more)",
            rest.len()
        ),
    }
}

/// "; N kernel events were dropped during the call": evidence the probe
/// counted as lost, so "no kernel evidence" may be "the cause was dropped".
fn dropped(step: &StepOutcome) -> String {
    let n = step
        .kernel
        .as_ref()
        .and_then(|k| k["drops"]["kernel"].as_u64())
        .unwrap_or(0);
    match n {
        0 => String::new(),
        1 => "; 1 kernel event was dropped during the call: the cause may be the one lost".into(),
        n => {
            format!("; {n} kernel events were dropped during the call: the cause may be among them")
        }
    }
}

/// A failure placed on a sandbox primitive.
fn sandbox(
    primitive: Primitive,
    confidence: f64,
    explanation: String,
    evidence: serde_json::Value,
) -> Option<Triage> {
    Some(Triage {
        layer: Layer::Sandbox,
        primitive: Cause::Kernel(primitive),
        confidence,
        explanation,
        evidence,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> StepOutcome {
        StepOutcome {
            kernel: Some(json!({"available": true, "failed": false, "primitive": "none"})),
            ..StepOutcome::default()
        }
    }

    fn kernel_fail(primitive: &str) -> StepOutcome {
        StepOutcome {
            kernel: Some(
                json!({"available": true, "failed": true, "primitive": primitive, "confidence": 0.9, "explanation": "why"}),
            ),
            ..StepOutcome::default()
        }
    }

    fn failing(mut s: StepOutcome) -> StepOutcome {
        s.failures
            .push("expected exit code 0, got exit code 1".into());
        s
    }

    #[test]
    fn a_failed_lookup_the_probe_only_noticed_is_shown_in_a_test_layer_failure() {
        let mut s = failing(ok());
        s.kernel = Some(
            json!({"available": true, "failed": true, "primitive": "none",
            "noticed": ["`/usr/share/locale/de/LC_MESSAGES/grep.mo` was missing (openat ENOENT in grep (pid 7))"]}),
        );
        let t = triage(&[s]).unwrap();
        assert_eq!((t.layer.id(), t.primitive.id()), ("test", "none"));
        assert!(
            t.explanation.ends_with(
                "(no interface or kernel evidence; noticed, not the cause: `/usr/share/locale/de/LC_MESSAGES/grep.mo` was missing (openat ENOENT in grep (pid 7)))"
            ),
            "{}",
            t.explanation
        );
    }

    #[test]
    fn kernel_events_dropped_during_an_unexplained_failure_are_said() {
        let mut s = failing(ok());
        s.kernel = Some(
            json!({"available": true, "failed": true, "primitive": "none", "drops": {"kernel": 3, "retention": 0}}),
        );
        let t = triage(&[s]).unwrap();
        assert_eq!((t.layer.id(), t.primitive.id()), ("test", "none"));
        assert!(
            t.explanation.ends_with(
                "(no interface or kernel evidence; 3 kernel events were dropped during the call: the cause may be among them)"
            ),
            "{}",
            t.explanation
        );
    }

    #[test]
    fn a_passing_test_has_no_triage() {
        assert_eq!(triage(&[ok(), ok()]), None);
    }

    #[test]
    fn the_failing_steps_kernel_attribution_is_the_sandbox_cause() {
        let t = triage(&[ok(), failing(kernel_fail("fs.readonly"))]).unwrap();
        assert_eq!((t.layer.id(), t.primitive.id()), ("sandbox", "fs.readonly"));
        assert_eq!(t.evidence["step"], 1);
    }

    #[test]
    fn an_earlier_unexpected_kernel_failure_is_blamed_with_less_confidence() {
        let mut expected = kernel_fail("fs.missing");
        expected.expects_failure = true;
        let t = triage(&[kernel_fail("net.egress"), expected, failing(ok())]).unwrap();
        assert_eq!((t.layer.id(), t.primitive.id()), ("sandbox", "net.egress"));
        assert!(t.confidence < 0.9);
        assert_eq!(t.evidence["kernel_step"], 0);
    }

    #[test]
    fn an_expected_kernel_failure_is_not_blamed() {
        let mut expected = kernel_fail("fs.missing");
        expected.expects_failure = true;
        let t = triage(&[expected, failing(ok())]).unwrap();
        assert_eq!((t.layer.id(), t.primitive.id()), ("test", "none"));
    }

    #[test]
    fn interface_evidence_outranks_the_kernel() {
        let mut s = failing(kernel_fail("fs.readonly"));
        s.interface
            .push("stdout: the bytes came back as `crlf` would leave them".into());
        s.interface_primitive = Some((InterfacePrimitive::Bytes, 0.95));
        let t = triage(&[s]).unwrap();
        assert_eq!(
            (t.layer.id(), t.primitive.id()),
            ("interface", "interface.bytes")
        );
        assert!(t.confidence >= 0.95);
    }

    #[test]
    fn a_lost_transport_is_interface_transport() {
        let s = StepOutcome {
            interface: vec!["transport: closed".into()],
            call_error: Some("transport: closed".into()),
            interface_primitive: Some((InterfacePrimitive::Transport, 0.95)),
            transport_lost: true,
            ..StepOutcome::default()
        };
        let t = triage(&[ok(), s]).unwrap();
        assert_eq!(t.primitive, Cause::Interface(InterfacePrimitive::Transport));
    }

    #[test]
    fn a_failure_hidden_by_a_pipeline_is_the_sandbox_cause() {
        let mut s = failing(ok());
        s.kernel.as_mut().unwrap()["hidden_failure"] = json!({"primitive": "fs.persistence", "confidence": 0.95, "explanation": "find failed"});
        let t = triage(&[ok(), s]).unwrap();
        assert_eq!(
            (t.layer.id(), t.primitive.id()),
            ("sandbox", "fs.persistence")
        );
        assert!(t.explanation.contains("exited 0, but find failed"));
    }

    #[test]
    fn a_tab_the_oom_killer_took_in_an_earlier_step_is_why_a_later_one_failed() {
        let mut died = ok();
        died.kernel.as_mut().unwrap()["hidden_failure"] = json!({"primitive": "mem.oom", "confidence": 0.9, "explanation": "chromium (pid 7) was killed by the OOM killer"});
        let t = triage(&[died.clone(), failing(ok())]).unwrap();
        assert_eq!((t.layer.id(), t.primitive.id()), ("sandbox", "mem.oom"));
        assert!(
            t.explanation.starts_with(
                "step 0 succeeded, but chromium (pid 7) was killed by the OOM killer; then step 1: expected"
            ),
            "{}",
            t.explanation
        );
        // a death of another kind, or none, leaves it the test's
        let mut other = ok();
        other.kernel.as_mut().unwrap()["hidden_failure"] =
            json!({"primitive": "fs.missing", "confidence": 0.5, "explanation": "x"});
        let t = triage(&[other, failing(ok())]).unwrap();
        assert_eq!(t.layer.id(), "test");
    }

    #[test]
    fn a_tab_the_oom_killer_took_between_two_calls_is_why_the_second_failed() {
        let mut s = failing(ok());
        s.kernel.as_mut().unwrap()["before_call"] = json!({"failed": true, "primitive": "mem.oom", "confidence": 0.97, "explanation": "chromium (pid 9) was killed by the OOM killer"});
        let t = triage(&[ok(), s]).unwrap();
        assert_eq!((t.layer.id(), t.primitive.id()), ("sandbox", "mem.oom"));
        assert!(
            t.explanation.starts_with(
                "step 1: before its call, chromium (pid 9) was killed by the OOM killer; then expected"
            ),
            "{}",
            t.explanation
        );
        // a span between calls with no cause named leaves it the test's
        let mut quiet = failing(ok());
        quiet.kernel.as_mut().unwrap()["before_call"] =
            json!({"failed": true, "primitive": "none", "explanation": "unknown status"});
        assert_eq!(triage(&[ok(), quiet]).unwrap().layer.id(), "test");
    }

    #[test]
    fn neither_evidence_means_the_test() {
        let t = triage(&[failing(StepOutcome::default())]).unwrap();
        assert_eq!((t.layer.id(), t.primitive.id()), ("test", "none"));
        assert!(t.explanation.contains("expected exit code 0"));
    }
}
