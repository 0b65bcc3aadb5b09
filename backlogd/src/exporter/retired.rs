//! What closed members contributed to the group and process counters (see [`Retired`]).

use std::collections::{HashMap, HashSet};

use backlogd_common::ListenerStats;

/// Group (netns, address, port) and process (pid, comm).
pub type GroupKey = (u32, std::net::IpAddr, u16);
pub type ProcessKey = (u32, String);

/// What closed members contributed to the group and process counters, so those
/// `_total`s never go down when a member closes (a decrease reads as a counter reset to
/// `rate()`: a spike the size of the whole counter). A member counts with the figures the
/// last render saw; anything it counted after that and before closing is not in the sums.
#[derive(Default)]
pub struct Retired {
    /// Every listener of the last render, with its aggregates and figures.
    pub last: HashMap<u64, (GroupKey, ProcessKey, ListenerStats)>,
    pub groups: HashMap<GroupKey, ListenerStats>,
    pub processes: HashMap<ProcessKey, ListenerStats>,
}

impl Retired {
    /// Takes this render's members (`now`; figures `None` when the kernel has no entry
    /// for the listener), retires the members of the last render that are gone, and
    /// forgets aggregates that have no member left (their series end). A member without
    /// figures keeps its last ones: a closing listener's kernel entry goes a moment before
    /// its close event reaches the table, and its counts must not vanish in between.
    pub fn update(&mut self, now: HashMap<u64, (GroupKey, ProcessKey, Option<ListenerStats>)>) {
        let now: HashMap<u64, (GroupKey, ProcessKey, ListenerStats)> = now
            .into_iter()
            .map(|(inode, (group, process, stats))| {
                let stats = stats
                    .or_else(|| self.last.get(&inode).map(|(_, _, s)| *s))
                    .unwrap_or_default();
                (inode, (group, process, stats))
            })
            .collect();
        for (inode, (group, process, stats)) in self.last.drain() {
            if !now.contains_key(&inode) {
                self.groups.entry(group).or_default().add(&stats);
                self.processes.entry(process).or_default().add(&stats);
            }
        }
        if !self.groups.is_empty() || !self.processes.is_empty() {
            let groups: HashSet<&GroupKey> = now.values().map(|(g, _, _)| g).collect();
            let processes: HashSet<&ProcessKey> = now.values().map(|(_, p, _)| p).collect();
            self.groups.retain(|g, _| groups.contains(g));
            self.processes.retain(|p, _| processes.contains(p));
        }
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(group: &str, drops: u64) -> (GroupKey, ProcessKey, Option<ListenerStats>) {
        let stats = ListenerStats {
            drop_accept_queue_full: drops,
            ..ListenerStats::default()
        };
        (
            (1, "127.0.0.1".parse().unwrap(), group.parse().unwrap()),
            (9, "nginx".into()),
            Some(stats),
        )
    }

    #[test]
    fn a_closed_member_keeps_its_counts_even_if_its_kernel_entry_went_first() {
        let mut r = Retired::default();
        r.update(HashMap::from([(1, member("80", 90)), (2, member("80", 5))]));
        // The kernel entry of 1 is gone, its close event not yet applied.
        let mut gone_entry = member("80", 0);
        gone_entry.2 = None;
        r.update(HashMap::from([(1, gone_entry), (2, member("80", 5))]));
        assert_eq!(r.last[&1].2.drop_accept_queue_full, 90);
        // Then it leaves the table: the group keeps its 90.
        r.update(HashMap::from([(2, member("80", 6))]));
        let group = (1, "127.0.0.1".parse().unwrap(), 80);
        assert_eq!(r.groups[&group].drop_accept_queue_full, 90);
        let process = (9, "nginx".to_owned());
        assert_eq!(r.processes[&process].drop_accept_queue_full, 90);
        // The last member goes too: the aggregates end.
        r.update(HashMap::new());
        assert!(r.groups.is_empty() && r.processes.is_empty());
    }
}
