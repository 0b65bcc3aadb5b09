//! `backlogd top` state: rows computed from two daemon snapshots, sorting, filtering,
//! grouping and keys. No terminal here: tested directly and through a TestBackend.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    time::Duration,
};

use backlogd_common::DropReason;
use ratatui::crossterm::event::KeyCode;
use serde::Serialize;

use crate::api::{ClientImpact, ListenerSnapshot, Request, Snapshot};

/// One listener with its rates over the last refresh.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub l: ListenerSnapshot,
    /// Drops per second, by [`DropReason`].
    pub drops_per_s: [f64; DropReason::COUNT],
    pub syncookies_per_s: f64,
    pub synack_retransmits_per_s: f64,
    pub syns_per_s: f64,
    /// Accept-wait quantiles over the last refresh (bucket upper bounds, seconds).
    pub wait_p50: Option<f64>,
    pub wait_p99: Option<f64>,
    /// Client impact per second: connections queued for accept after a drop of their
    /// handshake (`ClientImpact::delayed`) ...
    pub delayed_per_s: f64,
    /// ... those of them that waited longer than the first delay bucket's bound
    /// ([`ClientImpact::bounds`], 0.5 s: halfway to a client's first retry) from that
    /// drop ...
    pub delayed_long_per_s: f64,
    /// ... and attempts with a drop not queued within the daemon's horizon
    /// (`client_impact_horizon`), counted when it passes.
    pub abandoned_per_s: f64,
    /// Calling listen() again (a restart or reload) would get it a larger backlog: its
    /// namespace's net.core.somaxconn was raised above what it was granted, and it asks
    /// for more than that (or for somaxconn itself). `doctor` says the same.
    pub relisten: bool,
}

impl Row {
    pub fn drops_total_per_s(&self) -> f64 {
        self.drops_per_s.iter().sum()
    }

    /// Delayed and abandoned connections per second, for the `DLY/ABN/s` column.
    pub fn impact_per_s(&self) -> (f64, f64) {
        (self.delayed_per_s, self.abandoned_per_s)
    }

    /// Granted less than it asked for (seen), or than its program asks for.
    pub fn clamped(&self) -> bool {
        self.l
            .request
            .wanted()
            .is_some_and(|w| w > self.l.listener.granted)
    }

    pub fn group(&self) -> (u32, String, u16) {
        (
            self.l.listener.netns,
            self.l.listener.addr.to_string(),
            self.l.listener.port,
        )
    }
}

/// Whether `l`, in a namespace whose somaxconn is `somaxconn` now, would be granted more
/// by calling listen() again ([`Row::relisten`]).
fn relisten_gets_more(l: &ListenerSnapshot, somaxconn: Option<u32>) -> bool {
    let granted = l.listener.granted;
    let asks_more = match l.request {
        Request::Somaxconn { .. } => true,
        ref r => r.wanted().is_some_and(|w| w > granted),
    };
    asks_more && somaxconn.is_some_and(|now| now > granted)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    Drops,
    Queue,
    Syns,
    Port,
    Process,
}

impl SortBy {
    pub fn name(self) -> &'static str {
        match self {
            SortBy::Drops => "drops/s",
            SortBy::Queue => "accept queue",
            SortBy::Syns => "SYNs/s",
            SortBy::Port => "port",
            SortBy::Process => "process",
        }
    }

    fn next(self) -> Self {
        match self {
            SortBy::Drops => SortBy::Queue,
            SortBy::Queue => SortBy::Syns,
            SortBy::Syns => SortBy::Port,
            SortBy::Port => SortBy::Process,
            SortBy::Process => SortBy::Drops,
        }
    }
}

/// A line of the table: a group header (SO_REUSEPORT groups of 2+) or a listener.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Group {
        key: (u32, String, u16),
        members: usize,
        collapsed: bool,
        drops_per_s: f64,
        /// Its members' delayed and abandoned connections per second.
        impact_per_s: (f64, f64),
    },
    Listener(usize),
}

const HISTORY: usize = 60;

/// A group's members, and their drops, delayed and abandoned connections per second.
#[derive(Debug, Default, Clone, Copy)]
struct GroupSums {
    members: usize,
    drops: f64,
    delayed: f64,
    abandoned: f64,
}

#[derive(Debug)]
pub struct App {
    pub hook_mode: String,
    /// The daemon sees accepts (`Snapshot::accepts_counted`).
    pub accepts_counted: bool,
    /// What the listeners' recent client impact covers (None from an older daemon).
    pub impact_window: Option<crate::api::ImpactWindow>,
    pub rows: Vec<Row>,
    pub sort: SortBy,
    pub filter: String,
    pub typing_filter: bool,
    pub paused: bool,
    pub interval: Duration,
    pub selected: usize,
    pub detail: bool,
    pub help: bool,
    pub collapsed: BTreeSet<(u32, String, u16)>,
    /// Drops per second per socket inode, newest last, for the sparkline.
    pub history: HashMap<u64, VecDeque<u64>>,
    /// Why the view is stale, if it is.
    pub status: Option<String>,
    /// `backlogd doctor`'s findings on the latest snapshot.
    pub findings: Vec<crate::diagnosis::finding::Finding>,
    previous: Option<Snapshot>,
}

impl App {
    pub fn new(interval: Duration) -> Self {
        Self {
            hook_mode: String::new(),
            accepts_counted: true,
            impact_window: None,
            rows: Vec::new(),
            sort: SortBy::Drops,
            filter: String::new(),
            typing_filter: false,
            paused: false,
            interval,
            selected: 0,
            detail: false,
            help: false,
            collapsed: BTreeSet::new(),
            history: HashMap::new(),
            status: None,
            findings: Vec::new(),
            previous: None,
        }
    }

    /// Takes a new snapshot `elapsed` after the previous one.
    pub fn update(&mut self, snapshot: Snapshot, elapsed: Duration) {
        let secs = elapsed.as_secs_f64().max(1e-3);
        let long = ClientImpact::bounds()[0];
        let before: HashMap<u64, &ListenerSnapshot> = self
            .previous
            .iter()
            .flat_map(|s| s.listeners.iter())
            .map(|l| (l.listener.inode, l))
            .collect();
        self.hook_mode = snapshot.hook_mode.clone();
        self.accepts_counted = snapshot.accepts_counted;
        let somaxconn: HashMap<u32, u32> = snapshot
            .namespaces
            .iter()
            .map(|n| (n.netns, n.sysctls.somaxconn))
            .collect();
        self.impact_window = snapshot.impact_window;
        self.rows = snapshot
            .listeners
            .iter()
            .map(|l| {
                let p = before.get(&l.listener.inode);
                let rate = |now: u64, then: Option<u64>| match then {
                    Some(t) => now.saturating_sub(t) as f64 / secs,
                    None => 0.0,
                };
                let d = &l.drops;
                let pd = p.map(|p| &p.drops);
                let waits: Vec<u64> = l
                    .accept_wait
                    .buckets
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        b.count
                            - p.and_then(|p| p.accept_wait.buckets.get(i))
                                .map_or(0, |pb| pb.count)
                    })
                    .collect();
                Row {
                    drops_per_s: DropReason::ALL.map(|r| rate(d[r], pd.map(|d| d[r]))),
                    syncookies_per_s: rate(l.syncookies_sent, p.map(|p| p.syncookies_sent)),
                    synack_retransmits_per_s: rate(
                        l.synack_retransmits,
                        p.map(|p| p.synack_retransmits),
                    ),
                    syns_per_s: rate(l.syns_received, p.map(|p| p.syns_received)),
                    wait_p50: l.accept_wait.quantile(&waits, 0.5),
                    wait_p99: l.accept_wait.quantile(&waits, 0.99),
                    delayed_per_s: rate(l.impact.delayed(), p.map(|p| p.impact.delayed())),
                    delayed_long_per_s: rate(
                        l.impact.delayed_at_least(long),
                        p.map(|p| p.impact.delayed_at_least(long)),
                    ),
                    abandoned_per_s: rate(l.impact.abandoned, p.map(|p| p.impact.abandoned)),
                    relisten: relisten_gets_more(l, somaxconn.get(&l.listener.netns).copied()),
                    l: l.clone(),
                }
            })
            .collect();
        for r in &self.rows {
            let h = self.history.entry(r.l.listener.inode).or_default();
            h.push_back(r.drops_total_per_s().round() as u64);
            while h.len() > HISTORY {
                h.pop_front();
            }
        }
        let live: BTreeSet<u64> = self.rows.iter().map(|r| r.l.listener.inode).collect();
        self.history.retain(|k, _| live.contains(k));
        self.sort_rows();
        self.findings = crate::diagnosis::diagnose(&snapshot);
        self.previous = Some(snapshot);
        self.status = None;
    }

    fn sort_rows(&mut self) {
        let by = self.sort;
        self.rows.sort_by(|a, b| {
            let desc = |x: f64, y: f64| y.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal);
            match by {
                SortBy::Drops => desc(a.drops_total_per_s(), b.drops_total_per_s()),
                SortBy::Queue => b.l.queues.accept_depth.cmp(&a.l.queues.accept_depth),
                SortBy::Syns => desc(a.syns_per_s, b.syns_per_s),
                SortBy::Port => a.l.listener.port.cmp(&b.l.listener.port),
                SortBy::Process => a.l.listener.comm.cmp(&b.l.listener.comm),
            }
            .then(a.l.listener.port.cmp(&b.l.listener.port))
            .then(a.l.listener.inode.cmp(&b.l.listener.inode))
        });
    }

    fn matches(&self, r: &Row) -> bool {
        if self.filter.is_empty() {
            return true;
        }
        let l = &r.l.listener;
        [
            l.port.to_string(),
            l.comm.clone(),
            l.pid.to_string(),
            l.netns.to_string(),
            l.names.as_ref().and_then(|n| n.owner()).unwrap_or_default(),
        ]
        .iter()
        .any(|field| field.contains(self.filter.as_str()))
    }

    /// The table's lines: groups of 2+ sockets get a header (collapsible), in row order.
    pub fn lines(&self) -> Vec<Line> {
        let mut sizes: HashMap<(u32, String, u16), GroupSums> = HashMap::new();
        for r in self.rows.iter().filter(|r| self.matches(r)) {
            let e = sizes.entry(r.group()).or_default();
            let (delayed, abandoned) = r.impact_per_s();
            e.members += 1;
            e.drops += r.drops_total_per_s();
            e.delayed += delayed;
            e.abandoned += abandoned;
        }
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, r) in self
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| self.matches(r))
        {
            let key = r.group();
            let GroupSums {
                members,
                drops,
                delayed,
                abandoned,
            } = sizes[&key];
            if members > 1 {
                if !seen.insert(key.clone()) {
                    continue; // members are listed under their group's header
                }
                let collapsed = self.collapsed.contains(&key);
                out.push(Line::Group {
                    key: key.clone(),
                    members,
                    collapsed,
                    drops_per_s: drops,
                    impact_per_s: (delayed, abandoned),
                });
                if !collapsed {
                    for (j, m) in self.rows.iter().enumerate() {
                        if m.group() == key && self.matches(m) {
                            out.push(Line::Listener(j));
                        }
                    }
                }
            } else {
                out.push(Line::Listener(i));
            }
        }
        out
    }

    pub fn selected_row(&self) -> Option<&Row> {
        match self.lines().get(self.selected)? {
            Line::Listener(i) => self.rows.get(*i),
            Line::Group { .. } => None,
        }
    }

    /// Handles a key; returns true to quit.
    pub fn on_key(&mut self, key: KeyCode) -> bool {
        if self.typing_filter {
            match key {
                KeyCode::Enter | KeyCode::Esc => self.typing_filter = false,
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) => self.filter.push(c),
                _ => {}
            }
            self.selected = 0;
            return false;
        }
        let lines = self.lines().len();
        match key {
            KeyCode::Char('q') | KeyCode::Esc if !self.help => return true,
            KeyCode::Esc | KeyCode::Char('?') | KeyCode::Char('h') => self.help = !self.help,
            KeyCode::Char('s') => {
                self.sort = self.sort.next();
                self.sort_rows();
            }
            KeyCode::Char('/') => {
                self.typing_filter = true;
                self.filter.clear();
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => self.paused = !self.paused,
            KeyCode::Char('+') => self.interval = (self.interval * 2).min(Duration::from_secs(60)),
            KeyCode::Char('-') => {
                self.interval = (self.interval / 2).max(Duration::from_millis(250))
            }
            KeyCode::Down | KeyCode::Char('j') => {
                self.selected = (self.selected + 1).min(lines.saturating_sub(1))
            }
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Enter | KeyCode::Char('d') => {
                if let Some(Line::Group { key, .. }) = self.lines().get(self.selected) {
                    if !self.collapsed.remove(key) {
                        self.collapsed.insert(key.clone());
                    }
                } else {
                    self.detail = !self.detail;
                }
            }
            _ => {}
        }
        false
    }
}
