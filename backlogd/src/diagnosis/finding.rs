//! What a diagnosis says about one subject: severity, a stable kind, evidence, the fix.
//! Its own module so that the checks (`findings.rs`, `backlog.rs`) share it without
//! depending on each other.

use serde::Serialize;

use crate::api::{ClientImpact, ListenerSnapshot, RecentImpact};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// Stable identifier for automation.
    pub kind: &'static str,
    /// `comm[pid] address:port (netns N)` the finding is about.
    pub subject: String,
    pub summary: String,
    pub evidence: Vec<String>,
    pub remedy: String,
    /// On findings about a listener's drops: what they cost its clients, as the JSON API
    /// has it (counted since the listener's counters started, like the drops), where any
    /// connection was delayed or abandoned. Its evidence lines quote these figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_impact: Option<ClientImpact>,
    /// The same over the last five minutes, where `client_impact` is given and the daemon
    /// has recent figures (`window_seconds` says how long; shorter since its start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recent_client_impact: Option<RecentImpact>,
}

/// How findings name a listener.
pub fn subject(l: &ListenerSnapshot) -> String {
    let l = &l.listener;
    let mut s = format!(
        "{}[{}] {}:{} (netns {})",
        l.comm, l.pid, l.addr, l.port, l.netns
    );
    if let Some(owner) = l.names.as_ref().and_then(|n| n.owner()) {
        s.push_str(&format!(" in {owner}"));
    }
    s
}
