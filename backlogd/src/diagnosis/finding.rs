//! What a diagnosis says about one subject: severity, a stable kind, evidence, the fix.
//! Its own module so that the rules (one per kind, a file per topic) share it without
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

macro_rules! kinds {
    ($($variant:ident: $name:literal, $doc:literal;)*) => {
        /// What a finding is about. Its name is a stable identifier for automation (the
        /// JSON's `kind`, the first word after the severity in `doctor`'s text).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum FindingKind {
            $(#[doc = $doc] $variant,)*
        }

        impl FindingKind {
            /// Every kind (each has one rule in `diagnosis/mod.rs` and a test).
            #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
            pub const ALL: &[FindingKind] = &[$(FindingKind::$variant,)*];

            pub const fn name(self) -> &'static str {
                match self {
                    $(FindingKind::$variant => $name,)*
                }
            }
        }
    };
}

kinds! {
    BacklogClamped: "backlog_clamped",
        "Granted less backlog than it asked for in a seen listen(), or than its program asks for.";
    BacklogMaybeClamped: "backlog_maybe_clamped",
        "Granted exactly net.core.somaxconn, its request unknown: it may have been cut.";
    AcceptQueueOverflow: "accept_queue_overflow",
        "SYNs or final ACKs dropped because the accept queue was full.";
    AcceptQueueNearFull: "accept_queue_near_full",
        "No drops, but the accept queue's peak reached 90% of its capacity.";
    SynQueueOverflow: "syn_queue_overflow",
        "SYNs dropped because the SYN queue was full and syncookies were off.";
    SyncookiesSent: "syncookies_sent",
        "SYNs answered with syncookies because the SYN queue was full.";
    ReuseportImbalance: "reuseport_imbalance",
        "One member of a SO_REUSEPORT group stalled while its siblings idle.";
    AbortOnOverflow: "abort_on_overflow",
        "net.ipv4.tcp_abort_on_overflow=1 turns accept-queue overflows into resets.";
    SynFlood: "syn_flood",
        "Dropped connection attempts that almost never connect: a flood, not clients.";
    ConnectionBurst: "connection_burst",
        "Dropped connection attempts that mostly connected on a retry: a burst of clients.";
}

impl std::fmt::Display for FindingKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for FindingKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub kind: FindingKind,
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
    let mut s = format!("{}[{}] {} (netns {})", l.comm, l.pid, l.endpoint(), l.netns);
    if let Some(owner) = l.names.as_ref().and_then(|n| n.owner()) {
        s.push_str(&format!(" in {owner}"));
    }
    s
}
