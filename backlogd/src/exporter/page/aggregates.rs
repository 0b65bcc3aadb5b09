//! Per SO_REUSEPORT group (sockets sharing netns, address and port) and per owning
//! process: sums of the per-socket figures, so a stalled member or worker stands out
//! against its siblings, and totals that survive members closing. A group or process of
//! one listener that never lost a member is not exported: its sums are that listener's
//! own series, and they would add 11 series to each lone listener (31 instead of 20).

use backlogd_common::ListenerStats;

use super::{
    retired::{Counted, GroupKey, Now, Retired},
    rows::{Row, label_suffixes, reason_suffixes},
};
use crate::{
    exporter::{
        catalogue::{CAUSE, DELAY_CAUSES, Metric},
        figures::ByInode,
        text::Exposition,
    },
    queues::QueueFigures,
};

#[derive(Default)]
struct Sum {
    sockets: u64,
    /// Closed members' counts are in `counted`.
    retired: bool,
    counted: Counted,
    accept_depth: u64,
}

impl Sum {
    fn add_retired(&mut self, gone: &Counted) {
        self.counted.add(gone);
        self.retired = true;
    }
}

/// The group and process sums of one render, each with its labels (part of its first
/// listener's), in key order.
pub struct Sums<'r> {
    groups: Vec<(&'r str, Sum)>,
    processes: Vec<(&'r str, Sum)>,
}

/// The families of one kind of aggregate, in page order.
struct Families {
    listeners: Metric,
    accept_queue_length: Metric,
    syns_received: Metric,
    accepted: Metric,
    drops: Metric,
    delayed: Metric,
    abandoned: Metric,
}

const GROUP: Families = Families {
    listeners: Metric::GroupListeners,
    accept_queue_length: Metric::GroupAcceptQueueLength,
    syns_received: Metric::GroupSynsReceived,
    accepted: Metric::GroupAccepted,
    drops: Metric::GroupDrops,
    delayed: Metric::GroupConnectionsDelayed,
    abandoned: Metric::GroupConnectionsAbandoned,
};

const PROCESS: Families = Families {
    listeners: Metric::ProcessListeners,
    accept_queue_length: Metric::ProcessAcceptQueueLength,
    syns_received: Metric::ProcessSynsReceived,
    accepted: Metric::ProcessAccepted,
    drops: Metric::ProcessDrops,
    delayed: Metric::ProcessConnectionsDelayed,
    abandoned: Metric::ProcessConnectionsAbandoned,
};

/// Sums the listeners into their groups and processes; `retired` learns this render's
/// members first and adds what closed members counted. Apart from [`render`], so the
/// retired-counters lock is not held while a slow client takes the streamed page.
pub fn sum<'r>(
    rows: &'r [Row<'_>],
    stats: &ByInode<ListenerStats>,
    queues: &ByInode<QueueFigures>,
    retired: &mut Retired,
) -> Sums<'r> {
    retired.update(rows.iter().map(|r| {
        let l = r.listener;
        Now {
            inode: l.inode,
            group: (l.netns, l.addr, l.port),
            pid: l.pid,
            comm: &l.comm,
            counted: stats.get(&l.inode).map(Counted::of),
        }
    }));
    // Keyed by typed values, indexing into the sums, each with its first row.
    let mut group_of: foldhash::HashMap<GroupKey, usize> = foldhash::HashMap::default();
    let mut process_of: foldhash::HashMap<(u32, &str), usize> = foldhash::HashMap::default();
    let mut groups: Vec<(GroupKey, usize, Sum)> = Vec::new();
    let mut processes: Vec<((u32, &str), usize, Sum)> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let l = r.listener;
        let mine = retired.counted(l.inode);
        let depth = u64::from(queues.get(&l.inode).map_or(0, |q| q.accept_depth));
        let key = (l.netns, l.addr, l.port);
        let g = *group_of.entry(key).or_insert_with(|| {
            groups.push((key, i, Sum::default()));
            groups.len() - 1
        });
        let key = (l.pid, l.comm.as_str());
        let p = *process_of.entry(key).or_insert_with(|| {
            processes.push((key, i, Sum::default()));
            processes.len() - 1
        });
        for sum in [&mut groups[g].2, &mut processes[p].2] {
            sum.sockets += 1;
            if let Some(c) = mine {
                sum.counted.add(c);
            }
            sum.accept_depth += depth;
        }
    }
    // Closed members' counts: every retired aggregate still has a member (`Retired`
    // forgets the others), so each is found among this render's.
    for (key, gone) in &retired.groups {
        if let Some(&g) = group_of.get(key) {
            groups[g].2.add_retired(gone);
        }
    }
    for ((pid, comm), gone) in &retired.processes {
        if let Some(&p) = process_of.get(&(*pid, comm.as_str())) {
            processes[p].2.add_retired(gone);
        }
    }
    // Once exported, an aggregate stays while it has members: a group shrinking to one
    // member keeps the closed ones' counts.
    groups.retain(|(_, _, sum)| sum.sockets > 1 || sum.retired);
    processes.retain(|(_, _, sum)| sum.sockets > 1 || sum.retired);
    groups.sort_unstable_by_key(|g| g.0);
    processes.sort_unstable_by_key(|p| p.0);
    Sums {
        groups: groups
            .into_iter()
            .map(|(_, row, sum)| (rows[row].group_labels(), sum))
            .collect(),
        processes: processes
            .into_iter()
            .map(|(_, row, sum)| (rows[row].process_labels(), sum))
            .collect(),
    }
}

/// Renders the group and process families; `accepts`: as for the listeners' own.
pub fn render(e: &mut Exposition<'_>, sums: &Sums<'_>, accepts: bool) {
    for (families, sums) in [(GROUP, &sums.groups), (PROCESS, &sums.processes)] {
        type SumField = fn(&Sum) -> u64;
        let singles: [(Metric, SumField); 4] = [
            (families.listeners, |s| s.sockets),
            (families.accept_queue_length, |s| s.accept_depth),
            (families.syns_received, |s| s.counted.syns),
            (families.accepted, |s| s.counted.accepted),
        ];
        for (metric, value) in singles {
            if metric == families.accepted && !accepts {
                continue;
            }
            metric.open(e);
            for (set, sum) in sums {
                e.sample_with(metric.name(), set, &[], value(sum));
            }
        }
        families.drops.open(e);
        let reasons = reason_suffixes();
        for (set, sum) in sums {
            for (suffix, count) in reasons.iter().zip(sum.counted.drops) {
                e.sample_suffix(families.drops.name(), set, suffix, count);
            }
        }
        families.delayed.open(e);
        let causes = label_suffixes(CAUSE, DELAY_CAUSES);
        for (set, sum) in sums {
            for (suffix, count) in causes.iter().zip(sum.counted.delayed) {
                e.sample_suffix(families.delayed.name(), set, suffix, count);
            }
        }
        families.abandoned.open(e);
        for (set, sum) in sums {
            e.sample_with(families.abandoned.name(), set, &[], sum.counted.abandoned);
        }
    }
}
