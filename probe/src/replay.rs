//! `probe show --reattribute`: a stored span attributed again, by this
//! build, from its stored events and the facts captured when it closed,
//! and compared with the verdict stored then. The same evidence gets the
//! same verdict unless attribution changed (an upgrade): this says which
//! spans it changed and how.

use serde::Serialize;

use crate::attribution::{VerdictView, reattribute};
use crate::spans::Replay;
use crate::store::{Store, StoreError};

/// One span, attributed again.
#[derive(Debug, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Replayed {
    Same {
        span: u64,
        verdict: Box<VerdictView>,
    },
    Changed {
        span: u64,
        stored: Box<VerdictView>,
        now: Box<VerdictView>,
    },
    /// Why it cannot be attributed again.
    NotReplayable { span: u64, why: String },
}

/// Span `span` of `store` attributed again; None when it is not stored.
pub fn span(store: &Store, span: u64) -> Result<Option<Replayed>, StoreError> {
    let Some(stored) = store.show(span)? else {
        return Ok(None);
    };
    let not = |why: String| Ok(Some(Replayed::NotReplayable { span, why }));
    if stored.drops.not_kept > 0 {
        return not(format!(
            "{} of its events were not stored (keep_events = \"failed\"; \
             `keep_events = \"all\"` in [retention] stores every one)",
            stored.drops.not_kept
        ));
    }
    if stored.drops.retention > 0 {
        return not(format!(
            "{} of its events were evicted by the per-span cap while it ran",
            stored.drops.retention
        ));
    }
    let Some(replay) = store.replay_input(span)? else {
        return not(
            "no replay input was stored with it (a span with no stored events, or one \
             recorded before this version stored them)"
                .into(),
        );
    };
    if replay.version != Replay::VERSION {
        return not(format!(
            "its replay input is version {}, this build reads version {}",
            replay.version,
            Replay::VERSION
        ));
    }
    let now = VerdictView::from(&reattribute(&stored, &replay));
    let stored = VerdictView::from(&stored);
    Ok(Some(if now == stored {
        Replayed::Same {
            span,
            verdict: Box::new(now),
        }
    } else {
        Replayed::Changed {
            span,
            stored: Box::new(stored),
            now: Box::new(now),
        }
    }))
}

/// One line for a person.
pub fn line(r: &Replayed) -> String {
    let short = |v: &VerdictView| {
        format!(
            "{} ({}, {:.2})",
            v.primitive.id(),
            v.layer.map_or("no layer", |l| l.id()),
            v.confidence
        )
    };
    match r {
        Replayed::Same { span, verdict } => {
            format!("span {span}: same verdict, {}", short(verdict))
        }
        Replayed::Changed { span, stored, now } => format!(
            "span {span}: CHANGED\n  stored {}: {}\n  now    {}: {}",
            short(stored),
            stored.explanation,
            short(now),
            now.explanation
        ),
        Replayed::NotReplayable { span, why } => format!("span {span}: not replayable: {why}"),
    }
}
