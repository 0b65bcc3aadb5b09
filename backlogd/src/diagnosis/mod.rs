//! From numbers to the fix: the findings over a snapshot of the JSON API, pure (the same
//! snapshot always gives the same findings). `backlogd doctor` prints them, the JSON API
//! serves them (`/api/v1/findings`) and `top` shows them next to their listener: so they
//! live here, apart from any one of those.
//!
//! One rule per [`FindingKind`], each in the file of its topic:
//! - [`backlog`]: the somaxconn clamp, seen or known from the program, or possible;
//! - [`accept_queue`]: overflowing, or near full;
//! - [`syn_queue`]: overflowing with syncookies off, or sending syncookies;
//! - [`reuseport`]: a stalled member of a SO_REUSEPORT group;
//! - [`sysctls`]: tcp_abort_on_overflow turning overflows into resets;
//! - [`sources`]: who is being dropped: a flood or a burst.
//!
//! [`impact`] says what a listener's drops cost its clients, for the findings about its
//! drops. `tests.rs` has a test per kind, and a test that fails when a kind has none.

mod accept_queue;
mod backlog;
pub mod finding;
pub mod impact;
mod reuseport;
mod rule;
mod sources;
mod syn_queue;
mod sysctls;
#[cfg(test)]
pub mod tests;

use self::{
    finding::{Finding, FindingKind},
    rule::{Check, Context, Rule},
};
use crate::api::Snapshot;

/// Every rule: one per finding kind, run in this order (the findings are then sorted).
const RULES: [Rule; 10] = [
    Rule {
        kind: FindingKind::BacklogClamped,
        check: Check::Listener(backlog::clamped),
    },
    Rule {
        kind: FindingKind::BacklogMaybeClamped,
        check: Check::Listener(backlog::maybe_clamped),
    },
    Rule {
        kind: FindingKind::AcceptQueueOverflow,
        check: Check::Listener(accept_queue::overflow),
    },
    Rule {
        kind: FindingKind::AcceptQueueNearFull,
        check: Check::Listener(accept_queue::near_full),
    },
    Rule {
        kind: FindingKind::SynQueueOverflow,
        check: Check::Listener(syn_queue::overflow),
    },
    Rule {
        kind: FindingKind::SyncookiesSent,
        check: Check::Listener(syn_queue::syncookies),
    },
    Rule {
        kind: FindingKind::ReuseportImbalance,
        check: Check::Snapshot(reuseport::imbalance),
    },
    Rule {
        kind: FindingKind::AbortOnOverflow,
        check: Check::Snapshot(sysctls::abort_on_overflow),
    },
    Rule {
        kind: FindingKind::SynFlood,
        check: Check::Listener(sources::flood),
    },
    Rule {
        kind: FindingKind::ConnectionBurst,
        check: Check::Listener(sources::burst),
    },
];

/// Every finding of `snapshot`, the most severe first, then by kind (the findings of one
/// kind in snapshot order).
pub fn diagnose(snapshot: &Snapshot) -> Vec<Finding> {
    let cx = Context::new(snapshot);
    let mut out = Vec::new();
    for rule in &RULES {
        let found: Vec<Finding> = match rule.check {
            Check::Listener(check) => snapshot
                .listeners
                .iter()
                .filter_map(|l| check(l, &cx))
                .collect(),
            Check::Snapshot(check) => check(&cx),
        };
        debug_assert!(
            found.iter().all(|f| f.kind == rule.kind),
            "the {} rule reports only its own kind",
            rule.kind
        );
        out.extend(found);
    }
    out.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.kind.name().cmp(b.kind.name()))
    });
    out
}
