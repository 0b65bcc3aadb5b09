//! The event loop: the kernel's listener lifecycle events (ring buffer) applied to the
//! table as they come, and each new listener's owner looked up off the loop.

use std::sync::Arc;

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use backlogd_common::ListenerEvent;
use tokio::io::{Interest, unix::AsyncFd};

use super::identify::{identify_programs, name_containers};
use crate::{sampling::tcpext, state::Shared};

pub async fn follow_listener_events(
    ring: RingBuf<MapData>,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    // SAFETY: the RingBuf owns its map fd, which stays open and unchanged while the
    // AsyncFd owns the RingBuf.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
        .context("polling the listener event ring buffer")?;
    // One identification pass at a time: a burst of listen() events in many batches asks
    // for one more pass, not one per batch (each pass looks at every listener not yet
    // identified, so overlapping passes repeat each other's work: with 10k churned
    // listeners under TCG they ran for tens of minutes).
    let identify = Arc::new(tokio::sync::Notify::new());
    // A JoinSet aborts its tasks when dropped: the worker ends with this function.
    let mut worker = tokio::task::JoinSet::new();
    worker.spawn({
        let (shared, identify) = (shared.clone(), identify.clone());
        async move {
            loop {
                identify.notified().await;
                // A pass over every listener only when a new one is in a container: an
                // event batch must not cost O(listeners) (10k churned listeners).
                if identify_programs(shared.clone()).await {
                    name_containers(&shared).await;
                }
            }
        }
    });
    loop {
        let mut guard = fd.readable_mut().await?;
        let mut listened = false;
        {
            let ring = guard.get_inner_mut();
            let mut table = shared.write_listeners();
            while let Some(item) = ring.next() {
                match parse_event(&item) {
                    Some(event) => {
                        if event.kind == backlogd_common::event_kind::LISTEN {
                            listened = true;
                            // The listening thread is in the socket's namespace: a cheap
                            // way to read that namespace's counters until a scan.
                            shared.note_netns(
                                event.netns,
                                tcpext::Source::Task {
                                    pid: event.tgid,
                                    tid: event.pid,
                                },
                            );
                        }
                        table.apply(&event)
                    }
                    None => tracing::warn!(len = item.len(), "short listener event"),
                }
            }
        }
        guard.clear_ready();
        if listened {
            // Off the event loop: it reads /proc and configuration files.
            identify.notify_one();
        }
    }
}

fn parse_event(bytes: &[u8]) -> Option<ListenerEvent> {
    if bytes.len() < size_of::<ListenerEvent>() {
        return None;
    }
    // SAFETY: ListenerEvent is repr(C) plain data and `bytes` holds at least one.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ListenerEvent>()) })
}
