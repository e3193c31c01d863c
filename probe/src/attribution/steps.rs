//! A step made of several calls (a campaign step's tool calls, a browser
//! session's actions): which call's verdict is the step's. The probe's rule,
//! here, so nothing outside the probe ranks evidence.
//!
//! The call that failed in the kernel is the step's, else the call that
//! answered the error (even unattributed, its evidence may hold what died
//! before it), else the first (which ran the work). But a process the OOM
//! killer took in a call before the failing one is why that one failed (a
//! server that then waits on the dead tab runs into its time limit): that
//! call's memory death is the step's verdict. A death in a call that
//! "succeeded" is kept over a first call with none.

use crate::primitive::{Layer, Primitive};

/// What the step's rule reads of one call's verdict.
#[derive(Clone, Copy, Debug)]
pub struct CallView<'a> {
    pub failed: bool,
    /// Its hidden failure: (primitive, confidence, explanation).
    pub hidden: Option<(Primitive, f64, &'a str)>,
    pub label: Option<&'a str>,
    /// Its explanation, or why the probe could not attribute it.
    pub why: Option<&'a str>,
}

/// The step's verdict.
#[derive(Clone, Debug, PartialEq)]
pub enum StepPick {
    /// Call `i`'s verdict, as it is.
    Call(usize),
    /// Call `death`'s memory death is why call `failed` failed.
    DeathThen {
        death: usize,
        failed: usize,
        primitive: Primitive,
        layer: Layer,
        confidence: f64,
        explanation: String,
    },
}

/// The step's verdict among `calls`, in order; `answered_error`: the last
/// call answered an error (it failed, whatever the kernel said).
pub fn pick_for_step(calls: &[CallView], answered_error: bool) -> Option<StepPick> {
    let failed = calls
        .iter()
        .position(|c| c.failed)
        .or((answered_error && !calls.is_empty()).then(|| calls.len() - 1));
    let death = calls
        .iter()
        .position(|c| c.hidden.is_some_and(|(p, _, _)| p == Primitive::MemOom));
    Some(match (failed, death) {
        (Some(f), Some(d)) if d < f => {
            let (_, confidence, why) = calls[d].hidden?;
            let later = &calls[f];
            StepPick::DeathThen {
                death: d,
                failed: f,
                primitive: Primitive::MemOom,
                layer: Primitive::MemOom.layer(),
                confidence,
                explanation: format!(
                    "{why}; then {}: {}",
                    later.label.unwrap_or("the next call"),
                    later.why.unwrap_or_default()
                ),
            }
        }
        (Some(f), _) => StepPick::Call(f),
        (None, Some(d)) => StepPick::Call(d),
        (None, None) if calls.is_empty() => return None,
        (None, None) => StepPick::Call(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(failed: bool) -> CallView<'static> {
        CallView {
            failed,
            hidden: None,
            label: Some("next"),
            why: Some("it timed out"),
        }
    }

    #[test]
    fn a_death_before_a_failure_is_the_steps_cause() {
        let death = CallView {
            hidden: Some((
                Primitive::MemOom,
                0.9,
                "chrome (pid 7) was killed by the OOM killer",
            )),
            ..call(false)
        };
        let pick = pick_for_step(&[call(false), death, call(true)], false).unwrap();
        assert_eq!(
            pick,
            StepPick::DeathThen {
                death: 1,
                failed: 2,
                primitive: Primitive::MemOom,
                layer: Layer::Sandbox,
                confidence: 0.9,
                explanation: "chrome (pid 7) was killed by the OOM killer; then next: it timed out"
                    .into()
            }
        );
        // after the failure it is no cause; alone it is kept over the first
        assert_eq!(
            pick_for_step(&[call(true), death], false),
            Some(StepPick::Call(0))
        );
        assert_eq!(
            pick_for_step(&[call(false), death], false),
            Some(StepPick::Call(1))
        );
    }

    #[test]
    fn the_failed_call_else_the_one_that_answered_the_error_else_the_first() {
        assert_eq!(
            pick_for_step(&[call(false), call(true), call(true)], false),
            Some(StepPick::Call(1))
        );
        assert_eq!(
            pick_for_step(&[call(false), call(false)], true),
            Some(StepPick::Call(1))
        );
        assert_eq!(
            pick_for_step(&[call(false), call(false)], false),
            Some(StepPick::Call(0))
        );
        assert_eq!(pick_for_step(&[], false), None);
    }
}
