//! The JSON API (`/api/v1/*`): the types the daemon serves and its clients (`top`,
//! `doctor`, `client.rs`) read. Plain data, no map handles: a client links none of the
//! daemon's kernel side.

use backlogd_common::{
    ACCEPT_WAIT_BUCKETS, DELAY_BOUNDS_MS, DELAY_BUCKETS, DropReason, ListenerStats,
};
use serde::{Deserialize, Serialize};

use crate::{
    listeners::Listener,
    programs::{Asks, Known},
    queues::QueueFigures,
    sampling::tcpext::ListenSysctls,
    sources::DropSources,
};

/// `GET /api/v1/snapshot`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: String,
    pub hook_mode: String,
    pub kernel: KernelSupport,
    pub events_lost: u64,
    pub stats_full: u64,
    pub listeners: Vec<ListenerSnapshot>,
    /// What the listeners' `recent_impact` covers (absent from older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact_window: Option<ImpactWindow>,
    /// Seconds since the scan pass that read each listener's `queues.syn_depth`; absent
    /// where no pass ran (a kernel without BPF iterators, an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_queue_read_age_seconds: Option<f64>,
    /// Whether the programs see accept() return. False with `syscall_hook = false` in
    /// tracepoint and kprobe modes: every listener's `accepted` and `accept_wait` are then
    /// zeros that say nothing (absent from older daemons, which always saw them).
    #[serde(default = "seen")]
    pub accepts_counted: bool,
    /// Listen sysctls of each namespace that has listeners.
    pub namespaces: Vec<NamespaceSnapshot>,
}

fn seen() -> bool {
    true
}

/// What the daemon's kernel supports, as it found by trying at startup: the figures of the
/// loader's `modes::KernelSupport`, in a type of the API's own so that a client links no
/// kernel side (and the loader's type can change without changing what is served).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelSupport {
    /// fentry mode can run (BPF trampolines: Linux 5.5; arm64 6.0).
    pub fentry: bool,
    /// kprobes can be attached (CONFIG_KPROBES).
    pub kprobe: bool,
    /// BPF trampolines work (Linux 5.5).
    #[serde(default)]
    pub trampolines: bool,
    /// kprobe links can be pinned (Linux 5.15): kprobe mode keeps counting across a
    /// restart.
    #[serde(default)]
    pub perf_link_pinning: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NamespaceSnapshot {
    pub netns: u32,
    /// Whether this is the host's namespace (PID 1's): elsewhere a sysctl is set in the
    /// container or pod, not on the host.
    #[serde(default)]
    pub host: bool,
    /// Its name, where it has one (`ip netns`, CNI: /run/netns/NAME).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(flatten)]
    pub sysctls: ListenSysctls,
    /// Its syncookies over the snapshot's `impact_window`, from its own TcpExt counters;
    /// absent when it sent and got back none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syncookies: Option<Syncookies>,
}

/// A network namespace's syncookies: SYNs answered with one because a SYN queue was full
/// or syncookies are forced (TcpExt `TCPReqQFullDoCookies`), and ACKs that returned a
/// valid one, each a connection a cookie completed (`SyncookiesRecv`). Real clients return
/// their cookies; spoofed sources never do. A namespace's figures: its listeners' cookies
/// are `syncookies_sent` of each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Syncookies {
    pub sent: u64,
    pub returned: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListenerSnapshot {
    #[serde(flatten)]
    pub listener: Listener,
    /// What is known of the backlog it asked for (see [`Request`]).
    #[serde(default)]
    pub request: Request,
    /// SYNs (without ACK) that reached it, retransmitted ones included: segments, not
    /// connections.
    pub syns_received: u64,
    /// SYNs and final ACKs it dropped, by reason: segments too (a client's SYN dropped
    /// three times counts three); what the drops cost in connections is `impact`.
    pub drops: Drops,
    /// SYNs answered with a syncookie.
    pub syncookies_sent: u64,
    /// SYN-ACKs retransmitted for its pending handshakes.
    pub synack_retransmits: u64,
    /// Connections put on its accept queue.
    pub queued: u64,
    /// Connections taken off it by accept().
    pub accepted: u64,
    /// Queue lengths: connections (accept queue), pending handshakes (SYN queue).
    pub queues: QueueFigures,
    pub accept_wait: AcceptWait,
    /// What its clients paid for its drops (absent from older daemons: zero).
    #[serde(default)]
    pub impact: ClientImpact,
    /// The same over the snapshot's `impact_window`: absent when nothing (or from an
    /// older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_impact: Option<ClientImpact>,
    /// Who it dropped: its drops and syncookies by source prefix (`sources.rs`); absent
    /// until it drops a segment or sends a cookie.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_sources: Option<DropSources>,
}

/// The span the recent client-impact figures cover (see `state/recent.rs`): the last
/// five minutes, or less since the daemon started. At least 300 s once the daemon has run
/// that long, normally under 310 s. Abandoned attempts are those the daemon counted in it
/// (when a sweep found their horizon passed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ImpactWindow {
    pub window_seconds: f64,
    /// The window runs from the daemon's start: it has run less than five minutes.
    pub since_start: bool,
}

/// A listener's [`ClientImpact`] over an [`ImpactWindow`], as `doctor` quotes it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RecentImpact {
    #[serde(flatten)]
    pub window: ImpactWindow,
    #[serde(flatten)]
    pub impact: ClientImpact,
}

/// Connection attempts a listener dropped a segment of, and what became of them (see
/// `backlogd-ebpf/src/impact.rs`): each counted once however many of its segments were
/// dropped, as connections (delayed) or attempts (abandoned).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClientImpact {
    /// Connections queued for accept after the attempt's first drop was a SYN.
    pub delayed_syn_drop: u64,
    /// Connections queued for accept after the attempt's first drop was its final ACK.
    pub delayed_final_ack_overflow: u64,
    /// Connection attempts not queued within the horizon (`client_impact_horizon`).
    pub abandoned: u64,
    /// Delays of the delayed connections, first drop to queued: per-bucket (not
    /// cumulative) counts, `le` in seconds, null for the last bucket.
    pub delay: Vec<Bucket>,
    pub delay_sum_seconds: f64,
}

impl ClientImpact {
    /// From the kernel's counters: `delayed` by cause ([`backlogd_common::cause`]), the
    /// per-bucket `delay` counts and their sum, `abandoned` attempts.
    pub fn of(
        delayed: [u64; backlogd_common::cause::COUNT],
        delay: [u64; DELAY_BUCKETS + 1],
        delay_sum_ns: u64,
        abandoned: u64,
    ) -> Self {
        use backlogd_common::cause;
        Self {
            delayed_syn_drop: delayed[cause::SYN_DROP as usize],
            delayed_final_ack_overflow: delayed[cause::FINAL_ACK_OVERFLOW as usize],
            abandoned,
            delay: Bucket::list(&Self::bounds(), delay),
            delay_sum_seconds: delay_sum_ns as f64 / 1e9,
        }
    }

    /// Upper bounds of the delay buckets in seconds, the last (infinite) one left out.
    pub fn bounds() -> [f64; DELAY_BUCKETS] {
        DELAY_BOUNDS_MS.map(|ms| ms as f64 / 1e3)
    }

    /// Nothing delayed or abandoned, with every bucket.
    pub fn none() -> Self {
        Self::of(Default::default(), Default::default(), 0, 0)
    }

    pub fn delayed(&self) -> u64 {
        self.delayed_syn_drop + self.delayed_final_ack_overflow
    }

    /// Delayed connections whose delay's bucket lies above `seconds` (a bucket bound):
    /// `delayed_at_least(0.5)` counts every delay over 0.5 s, i.e. every connection that
    /// waited for a retry.
    pub fn delayed_at_least(&self, seconds: f64) -> u64 {
        self.delay
            .iter()
            .filter(|b| b.le.is_none_or(|le| le > seconds))
            .map(|b| b.count)
            .sum()
    }
}

/// What is known of the backlog a listener passed to `listen()`. The kernel keeps only
/// what it granted, `min(request, net.core.somaxconn)` at the time of the call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "known", rename_all = "snake_case")]
pub enum Request {
    /// backlogd saw the `listen()` call.
    Seen { backlog: i32 },
    /// Not seen, but its program asks for this figure (`programs.rs`); `source` says
    /// where the figure comes from (a configuration line, the command line, the default).
    Program {
        program: String,
        backlog: u32,
        source: String,
    },
    /// Not seen; its program asks for net.core.somaxconn itself, so it is never cut (or,
    /// a runtime's default such as Netty's, does so if its code passes no backlog: the
    /// listener's `program.asks` is then `code_somaxconn`).
    Somaxconn { program: String },
    /// Not seen, and granted exactly the namespace's net.core.somaxconn: it asked for at
    /// least that, and may have been cut.
    AtLeast { backlog: u32 },
    /// Not seen, and granted less than net.core.somaxconn (or that is unknown): most
    /// likely what it asked for, unless somaxconn was lower when it listened.
    #[default]
    Unknown,
}

impl Request {
    /// What is known of `l`'s request, in a namespace whose somaxconn is `somaxconn`.
    pub fn of(l: &Listener, somaxconn: Option<u32>) -> Self {
        if let Some(backlog) = l.requested {
            return Request::Seen { backlog };
        }
        let at_cap = somaxconn.is_some_and(|m| m > 0 && l.granted == m);
        match &l.program {
            Some(Known {
                program,
                asks: Asks::Backlog(backlog),
                source,
            }) => Request::Program {
                program: program.clone(),
                backlog: *backlog,
                source: source.clone(),
            },
            // Netty's default is somaxconn too, if its code sets none: the listener's
            // `program.asks` says which, for the findings to say it conditionally.
            Some(Known {
                program,
                asks: Asks::Somaxconn | Asks::CodeSomaxconn,
                ..
            }) => Request::Somaxconn {
                program: program.clone(),
            },
            // A runtime's default holds only if the code passed none: granted exactly
            // somaxconn, it asked for at least that, which the default is consistent with;
            // granted less, the code may well have asked for that itself.
            Some(Known {
                program,
                asks: Asks::CodeDefault(backlog),
                source,
            }) if at_cap && *backlog > l.granted => Request::Program {
                program: program.clone(),
                backlog: *backlog,
                source: source.clone(),
            },
            _ if at_cap => Request::AtLeast { backlog: l.granted },
            _ => Request::Unknown,
        }
    }

    /// The figure the listener is known to want, if any: what it asked for, or what its
    /// program asks for.
    pub fn wanted(&self) -> Option<u32> {
        match self {
            Request::Seen { backlog } => u32::try_from(*backlog).ok().filter(|&b| b > 0),
            Request::Program { backlog, .. } => Some(*backlog),
            _ => None,
        }
    }

    /// For a table cell: `511` (seen), `511*` (its program's figure), `=max` (asks for
    /// somaxconn), `>=128` (at least), `?`.
    pub fn short(&self) -> String {
        match self {
            Request::Seen { backlog } => backlog.to_string(),
            Request::Program { backlog, .. } => format!("{backlog}*"),
            Request::Somaxconn { .. } => "=max".to_owned(),
            Request::AtLeast { backlog } => format!(">={backlog}"),
            Request::Unknown => "?".to_owned(),
        }
    }
}

/// A listener's drops by [`DropReason`] (`drops[DropReason::Other]`), served as an object
/// with one key per reason, its name, in the reasons' order:
/// `{"accept_queue_full": 3, "syn_queue_full": 0, "final_ack_overflow": 1, "other": 0}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drops(pub [u64; DropReason::COUNT]);

impl Drops {
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

impl std::ops::Index<DropReason> for Drops {
    type Output = u64;

    fn index(&self, reason: DropReason) -> &u64 {
        &self.0[reason]
    }
}

impl std::ops::IndexMut<DropReason> for Drops {
    fn index_mut(&mut self, reason: DropReason) -> &mut u64 {
        &mut self.0[reason]
    }
}

impl Serialize for Drops {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(Some(DropReason::COUNT))?;
        for reason in DropReason::ALL {
            map.serialize_entry(reason.name(), &self[reason])?;
        }
        map.end()
    }
}

/// Every reason's key is required (as every daemon serves them all); other keys are
/// skipped, as serde does for a struct's unknown fields.
impl<'de> Deserialize<'de> for Drops {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ByName;
        impl<'de> serde::de::Visitor<'de> for ByName {
            type Value = Drops;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("drops by reason")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Drops, A::Error> {
                let mut found = [None; DropReason::COUNT];
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match DropReason::ALL.into_iter().find(|r| r.name() == key) {
                        Some(reason) => found[reason] = Some(map.next_value()?),
                        None => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                let mut drops = Drops::default();
                for reason in DropReason::ALL {
                    drops[reason] = found[reason]
                        .ok_or_else(|| serde::de::Error::missing_field(reason.name()))?;
                }
                Ok(drops)
            }
        }
        d.deserialize_map(ByName)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AcceptWait {
    pub count: u64,
    pub sum_seconds: f64,
    /// Per-bucket (not cumulative) counts; `le` in seconds, null for the last bucket.
    pub buckets: Vec<Bucket>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Bucket {
    pub le: Option<f64>,
    pub count: u64,
}

impl Bucket {
    /// Per-bucket `counts` under their finite `bounds`, the last count the +Inf bucket's.
    fn list(bounds: &[f64], counts: impl IntoIterator<Item = u64>) -> Vec<Bucket> {
        bounds
            .iter()
            .copied()
            .map(Some)
            .chain([None])
            .zip(counts)
            .map(|(le, count)| Bucket { le, count })
            .collect()
    }
}

impl AcceptWait {
    /// Upper bounds of the buckets in seconds, the last (infinite) one left out: 2^i
    /// microseconds.
    pub fn bounds() -> [f64; ACCEPT_WAIT_BUCKETS] {
        std::array::from_fn(|i| (1u64 << i) as f64 / 1e6)
    }

    /// Upper bound (seconds; infinite for the last bucket) below which fraction `q` of
    /// the waits fall, for per-bucket `counts` over these buckets (e.g. the increase over
    /// an interval). None without waits.
    pub fn quantile(&self, counts: &[u64], q: f64) -> Option<f64> {
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let mut seen = 0;
        for (c, b) in counts.iter().zip(&self.buckets) {
            seen += c;
            if seen as f64 >= q * total as f64 {
                return Some(b.le.unwrap_or(f64::INFINITY));
            }
        }
        None
    }
}

impl ListenerSnapshot {
    /// A listener with its counters (zero when the kernel has no entry for it yet), queue
    /// figures, and its namespace's net.core.somaxconn (if known).
    pub fn new(
        listener: Listener,
        s: ListenerStats,
        queues: QueueFigures,
        somaxconn: Option<u32>,
    ) -> Self {
        Self {
            request: Request::of(&listener, somaxconn),
            listener,
            syns_received: s.syns,
            drops: Drops(s.drops),
            syncookies_sent: s.syncookies,
            synack_retransmits: s.synack_retransmits,
            queued: s.queued,
            accepted: s.accepted,
            queues,
            accept_wait: AcceptWait {
                count: s.accept_wait.iter().sum(),
                sum_seconds: s.accept_wait_sum_ns as f64 / 1e9,
                buckets: Bucket::list(&AcceptWait::bounds(), s.accept_wait),
            },
            impact: ClientImpact::of(s.delayed, s.delay, s.delay_sum_ns, s.abandoned),
            recent_impact: None,
            drop_sources: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_served_by_reason_name_in_reason_order() {
        let mut drops = Drops::default();
        drops[DropReason::AcceptQueueFull] = 3;
        drops[DropReason::FinalAckOverflow] = 1;
        // The JSON the four named fields made before DropReason.
        let served =
            r#"{"accept_queue_full":3,"syn_queue_full":0,"final_ack_overflow":1,"other":0}"#;
        assert_eq!(serde_json::to_string(&drops).unwrap(), served);
        assert_eq!(serde_json::from_str::<Drops>(served).unwrap(), drops);
        // Any order; a key of a newer daemon is skipped; a missing reason is an error.
        let shuffled = r#"{"other":0,"newer":[1],"final_ack_overflow":1,"syn_queue_full":0,"accept_queue_full":3}"#;
        assert_eq!(serde_json::from_str::<Drops>(shuffled).unwrap(), drops);
        let e = serde_json::from_str::<Drops>(r#"{"accept_queue_full":3}"#).unwrap_err();
        assert!(
            e.to_string().contains("missing field `syn_queue_full`"),
            "{e}"
        );
        // Inside a listener's snapshot (flattened fields around it), both ways.
        let mut l = fixtures::listener(1, 80, "nginx", Some(511), 128);
        l.drops = drops;
        let json = serde_json::to_value(&l).unwrap();
        assert_eq!(
            json["drops"],
            serde_json::from_str::<serde_json::Value>(served).unwrap()
        );
        let back: ListenerSnapshot = serde_json::from_value(json).unwrap();
        assert_eq!(back.drops, drops);
    }
}

/// Snapshots for unit tests of the clients (`doctor`, `top`): no kernel involved.
#[cfg(test)]
pub mod fixtures {
    use super::*;

    /// The host's namespace in the fixtures.
    pub const NETNS: u32 = 4026531840;

    /// A quiet listener on 0.0.0.0:`port` in [`NETNS`], owned by `comm`[100 + inode].
    pub fn listener(
        inode: u64,
        port: u16,
        comm: &str,
        requested: Option<i32>,
        granted: u32,
    ) -> ListenerSnapshot {
        // Through serde: the table's bookkeeping fields are not for outsiders to set.
        let json = serde_json::json!({
            "inode": inode, "netns": NETNS, "addr": "0.0.0.0", "port": port,
            "pid": 100 + inode, "comm": comm, "requested": requested, "granted": granted
        });
        let listener = serde_json::from_value::<Listener>(json).expect("a valid listener");
        ListenerSnapshot::new(
            listener,
            ListenerStats::default(),
            QueueFigures::default(),
            None,
        )
    }

    /// `l` in a namespace whose net.core.somaxconn is `somaxconn`, owned by `program`
    /// (`None`: not one backlogd knows).
    pub fn owned_by(
        mut l: ListenerSnapshot,
        somaxconn: u32,
        program: Option<crate::programs::Known>,
    ) -> ListenerSnapshot {
        l.listener.program = program;
        l.request = Request::of(&l.listener, Some(somaxconn));
        l
    }

    /// A tracepoint-mode snapshot of `listeners` and the listen sysctls of `namespaces`.
    pub fn snapshot(
        listeners: Vec<ListenerSnapshot>,
        namespaces: Vec<NamespaceSnapshot>,
    ) -> Snapshot {
        Snapshot {
            version: "test".into(),
            hook_mode: "tracepoint".into(),
            kernel: KernelSupport::default(),
            events_lost: 0,
            stats_full: 0,
            listeners,
            impact_window: None,
            syn_queue_read_age_seconds: None,
            accepts_counted: true,
            namespaces,
        }
    }

    /// Client impact: `syn_drop` and `final_ack` connections delayed (after a SYN, a final
    /// ACK dropped first), their delays per bucket from the first (`delays`, as many
    /// buckets as given; they add up to the delayed), each summed at its bucket's lower
    /// edge, and `abandoned` attempts.
    pub fn impact(syn_drop: u64, final_ack: u64, delays: &[u64], abandoned: u64) -> ClientImpact {
        assert_eq!(
            delays.iter().sum::<u64>(),
            syn_drop + final_ack,
            "every delayed connection has a delay"
        );
        let bounds = ClientImpact::bounds();
        let lower = [0.0].into_iter().chain(bounds);
        ClientImpact {
            delayed_syn_drop: syn_drop,
            delayed_final_ack_overflow: final_ack,
            abandoned,
            delay: bounds
                .into_iter()
                .map(Some)
                .chain([None])
                .enumerate()
                .map(|(i, le)| Bucket {
                    le,
                    count: delays.get(i).copied().unwrap_or(0),
                })
                .collect(),
            delay_sum_seconds: delays
                .iter()
                .zip(lower)
                .map(|(&n, from)| n as f64 * from)
                .sum(),
        }
    }

    /// Listen sysctls of a namespace: Debian's defaults with `somaxconn`.
    pub fn namespace(netns: u32, somaxconn: u32) -> NamespaceSnapshot {
        NamespaceSnapshot {
            netns,
            host: netns == NETNS,
            name: None,
            sysctls: ListenSysctls {
                somaxconn,
                tcp_max_syn_backlog: 512,
                tcp_syncookies: 1,
                tcp_abort_on_overflow: 0,
            },
            syncookies: None,
        }
    }
}
