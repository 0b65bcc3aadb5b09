//! Per SO_REUSEPORT group (sockets sharing netns, address and port; a lone listener is a
//! group of one) and per owning process: sums of the per-socket figures, so a stalled
//! member or worker stands out against its siblings.

use std::collections::{BTreeMap, HashMap};

use backlogd_common::ListenerStats;

use super::{
    listeners::DROPS,
    rows::{Row, reason_suffixes},
};
use crate::{
    exporter::{
        catalogue::{GROUP_LABELS, Metric, PROCESS_LABELS},
        retired::{GroupKey, Retired},
        text::{Exposition, LabelSet},
    },
    queues::QueueFigures,
};

#[derive(Default)]
struct Sum {
    sockets: u64,
    stats: ListenerStats,
    accept_depth: u64,
}

/// The families of one kind of aggregate, in page order.
struct Families {
    listeners: Metric,
    accept_queue_length: Metric,
    syns_received: Metric,
    accepted: Metric,
    drops: Metric,
}

const GROUP: Families = Families {
    listeners: Metric::GroupListeners,
    accept_queue_length: Metric::GroupAcceptQueueLength,
    syns_received: Metric::GroupSynsReceived,
    accepted: Metric::GroupAccepted,
    drops: Metric::GroupDrops,
};

const PROCESS: Families = Families {
    listeners: Metric::ProcessListeners,
    accept_queue_length: Metric::ProcessAcceptQueueLength,
    syns_received: Metric::ProcessSynsReceived,
    accepted: Metric::ProcessAccepted,
    drops: Metric::ProcessDrops,
};

/// Renders the group and process families; `retired` learns this render's members first.
pub fn render(
    e: &mut Exposition<'_>,
    rows: &[Row<'_>],
    stats: &HashMap<u64, ListenerStats>,
    queues: &HashMap<u64, QueueFigures>,
    retired: &mut Retired,
) {
    retired.update(
        rows.iter()
            .map(|r| {
                let l = r.listener;
                let group = (l.netns, l.addr, l.port);
                let process = (l.pid, l.comm.clone());
                let figures = stats.get(&l.inode).copied();
                (l.inode, (group, process, figures))
            })
            .collect(),
    );
    // Keyed by typed values (no per-listener allocation); each aggregate's label set is
    // rendered once, when it is first seen.
    let mut groups: BTreeMap<GroupKey, (LabelSet, Sum)> = BTreeMap::new();
    let mut processes: BTreeMap<(u32, &str), (LabelSet, Sum)> = BTreeMap::new();
    for r in rows {
        let l = r.listener;
        let group = groups.entry((l.netns, l.addr, l.port)).or_insert_with(|| {
            let labels = GROUP_LABELS.map(|name| (name, r.value(name)));
            (LabelSet::new(&labels), Sum::default())
        });
        let mine = retired.last.get(&l.inode).map(|(_, _, s)| s);
        let depth = u64::from(queues.get(&l.inode).map_or(0, |q| q.accept_depth));
        let sum = &mut group.1;
        sum.sockets += 1;
        if let Some(s) = mine {
            sum.stats.add(s);
        }
        sum.accept_depth += depth;
        let process = processes
            .entry((l.pid, l.comm.as_str()))
            .or_insert_with(|| {
                let labels = PROCESS_LABELS.map(|name| (name, r.value(name)));
                (LabelSet::new(&labels), Sum::default())
            });
        process.1.sockets += 1;
        if let Some(s) = mine {
            process.1.stats.add(s);
        }
        process.1.accept_depth += depth;
    }
    if !retired.groups.is_empty() {
        for (key, (_, sum)) in &mut groups {
            if let Some(gone) = retired.groups.get(key) {
                sum.stats.add(gone);
            }
        }
    }
    if !retired.processes.is_empty() {
        for ((pid, comm), (_, sum)) in &mut processes {
            if let Some(gone) = retired.processes.get(&(*pid, (*comm).to_owned())) {
                sum.stats.add(gone);
            }
        }
    }
    let groups: Vec<&(LabelSet, Sum)> = groups.values().collect();
    let processes: Vec<&(LabelSet, Sum)> = processes.values().collect();
    for (families, sums) in [(GROUP, &groups), (PROCESS, &processes)] {
        type SumField = fn(&Sum) -> u64;
        let singles: [(Metric, SumField); 4] = [
            (families.listeners, |s| s.sockets),
            (families.accept_queue_length, |s| s.accept_depth),
            (families.syns_received, |s| s.stats.syns),
            (families.accepted, |s| s.stats.accepted),
        ];
        for (metric, value) in singles {
            metric.open(e);
            for (set, sum) in sums.iter().copied() {
                e.sample_with(metric.name(), set, &[], value(sum));
            }
        }
        families.drops.open(e);
        let reasons = reason_suffixes();
        for (set, sum) in sums.iter().copied() {
            for (suffix, field) in reasons.iter().zip(DROPS) {
                e.sample_suffix(families.drops.name(), set, suffix, field(&sum.stats));
            }
        }
    }
}
