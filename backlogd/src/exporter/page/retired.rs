//! What closed members contributed to the group and process counters (see [`Retired`]):
//! the page's own memory of what it served, written by each render. Not daemon state: a
//! member retires with the figures the last render showed, so a group's counter never
//! falls below what a scraper has seen; figures taken by the sampler at another moment
//! could be lower than the last render's, and would read as a counter reset.

// Keyed by kernel-made values (inodes, addresses): no adversary picks them, so a fast
// hash, rebuilt or probed 10k times per scrape, suits.
use foldhash::{HashMap, HashSet};

use backlogd_common::{DropReason, ListenerStats};

/// Group (netns, address, port) and process (pid, comm).
pub type GroupKey = (u32, std::net::IpAddr, u16);
pub type ProcessKey = (u32, String);

/// The counters the group and process families sum: 72 of a [`ListenerStats`]' 400
/// bytes, so the per-scrape bookkeeping of 10k listeners stays in cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    pub syns: u64,
    pub accepted: u64,
    /// By [`DropReason`].
    pub drops: [u64; DropReason::COUNT],
    /// Connections delayed by a drop, in `catalogue::DELAY_CAUSES` order.
    pub delayed: [u64; 2],
    pub abandoned: u64,
}

impl Counted {
    pub fn of(s: &ListenerStats) -> Self {
        Self {
            syns: s.syns,
            accepted: s.accepted,
            drops: s.drops,
            delayed: s.delayed,
            abandoned: s.abandoned,
        }
    }

    pub fn add(&mut self, o: &Self) {
        self.syns += o.syns;
        self.accepted += o.accepted;
        for (a, b) in self.drops.iter_mut().zip(o.drops) {
            *a += b;
        }
        for (a, b) in self.delayed.iter_mut().zip(o.delayed) {
            *a += b;
        }
        self.abandoned += o.abandoned;
    }
}

/// One listener of the last render.
struct Member {
    group: GroupKey,
    process: ProcessKey,
    counted: Counted,
    /// The render that last saw it.
    seen: u64,
}

/// What closed members contributed to the group and process counters, so those
/// `_total`s never go down when a member closes (a decrease reads as a counter reset to
/// `rate()`: a spike the size of the whole counter). A member counts with the figures the
/// last render saw; anything it counted after that and before closing is not in the sums.
#[derive(Default)]
pub struct Retired {
    /// Every listener of the last render, by socket inode.
    last: HashMap<u64, Member>,
    renders: u64,
    pub groups: HashMap<GroupKey, Counted>,
    pub processes: HashMap<ProcessKey, Counted>,
}

/// One listener of a render, as [`Retired::update`] takes it.
pub struct Now<'a> {
    pub inode: u64,
    pub group: GroupKey,
    pub pid: u32,
    pub comm: &'a str,
    /// `None` when the kernel has no entry for the listener.
    pub counted: Option<Counted>,
}

impl Retired {
    /// Takes this render's members, retires the members of the last render that are gone,
    /// and forgets aggregates that have no member left (their series end). A member without
    /// figures keeps its last ones: a closing listener's kernel entry goes a moment before
    /// its close event reaches the table, and its counts must not vanish in between.
    /// Updated in place: a steady table allocates nothing here.
    pub fn update<'a>(&mut self, now: impl IntoIterator<Item = Now<'a>>) {
        self.renders += 1;
        let render = self.renders;
        let mut members = 0;
        for n in now {
            members += 1;
            match self.last.get_mut(&n.inode) {
                Some(m) => {
                    m.group = n.group;
                    if m.process.0 != n.pid || m.process.1 != n.comm {
                        m.process = (n.pid, n.comm.to_owned());
                    }
                    if let Some(c) = n.counted {
                        m.counted = c;
                    }
                    m.seen = render;
                }
                None => {
                    self.last.insert(
                        n.inode,
                        Member {
                            group: n.group,
                            process: (n.pid, n.comm.to_owned()),
                            counted: n.counted.unwrap_or_default(),
                            seen: render,
                        },
                    );
                }
            }
        }
        if self.last.len() > members {
            let (groups, processes) = (&mut self.groups, &mut self.processes);
            self.last.retain(|_, m| {
                if m.seen == render {
                    return true;
                }
                groups.entry(m.group).or_default().add(&m.counted);
                processes
                    .entry(std::mem::take(&mut m.process))
                    .or_default()
                    .add(&m.counted);
                false
            });
        }
        if !self.groups.is_empty() || !self.processes.is_empty() {
            let groups: HashSet<&GroupKey> = self.last.values().map(|m| &m.group).collect();
            let processes: HashSet<&ProcessKey> = self.last.values().map(|m| &m.process).collect();
            self.groups.retain(|g, _| groups.contains(g));
            self.processes.retain(|p, _| processes.contains(p));
        }
    }

    /// What the last [`update`](Self::update) holds for a member.
    pub fn counted(&self, inode: u64) -> Option<&Counted> {
        self.last.get(&inode).map(|m| &m.counted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(inode: u64, port: u16, drops: u64) -> Now<'static> {
        Now {
            inode,
            group: (1, "127.0.0.1".parse().unwrap(), port),
            pid: 9,
            comm: "nginx",
            counted: Some(Counted {
                drops: [drops, 0, 0, 0],
                ..Counted::default()
            }),
        }
    }

    #[test]
    fn a_closed_member_keeps_its_counts_even_if_its_kernel_entry_went_first() {
        let mut r = Retired::default();
        r.update([member(1, 80, 90), member(2, 80, 5)]);
        // The kernel entry of 1 is gone, its close event not yet applied.
        let mut gone_entry = member(1, 80, 0);
        gone_entry.counted = None;
        r.update([gone_entry, member(2, 80, 5)]);
        assert_eq!(r.counted(1).unwrap().drops[0], 90);
        // Then it leaves the table: the group keeps its 90.
        r.update([member(2, 80, 6)]);
        let group = (1, "127.0.0.1".parse().unwrap(), 80);
        assert_eq!(r.groups[&group].drops[0], 90);
        let process = (9, "nginx".to_owned());
        assert_eq!(r.processes[&process].drops[0], 90);
        assert_eq!(r.counted(1), None);
        // The last member goes too: the aggregates end.
        r.update([]);
        assert!(r.groups.is_empty() && r.processes.is_empty());
    }

    #[test]
    fn a_member_that_changes_owner_retires_nothing() {
        let mut r = Retired::default();
        r.update([member(1, 80, 3)]);
        let mut moved = member(1, 80, 4);
        moved.pid = 10;
        moved.comm = "nginx2";
        r.update([moved]);
        assert!(r.groups.is_empty() && r.processes.is_empty());
        assert_eq!(r.counted(1).unwrap().drops[0], 4);
    }
}
