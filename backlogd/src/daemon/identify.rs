//! Who owns each listener: the program behind it (`programs/`) and its owner's unit,
//! container and pod (`names/`, container names from the runtimes' APIs). Run by the
//! event loop for new listeners and by every rescan.

use std::sync::Arc;

use crate::{names, programs, state::Shared};

/// Looks up the program behind each listener not looked up yet (`programs/`) and its
/// owner's unit, container and pod (`names/`), one /proc read per process.
/// Whether a listener it identified is in a container.
pub async fn identify_programs(shared: Arc<Shared>) -> bool {
    let wanted = shared.listeners().unidentified();
    let mut in_container = false;
    if !wanted.is_empty() {
        let found = tokio::task::spawn_blocking(move || {
            let mut processes = std::collections::HashMap::new();
            // A process's program and configuration answer the same for every listener of
            // it on one port (a server can own thousands of sockets).
            let mut by_port = std::collections::HashMap::new();
            wanted
                .into_iter()
                .map(|(inode, pid, port)| {
                    let (process, names) = processes
                        .entry(pid)
                        .or_insert_with(|| (programs::Process::of(pid), names::of_process(pid)));
                    let known = by_port
                        .entry((pid, port))
                        .or_insert_with(|| {
                            process.as_ref().and_then(|p| programs::identify(p, port))
                        })
                        .clone();
                    (inode, pid, known, names.clone())
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let mut table = shared.write_listeners();
        for (inode, pid, known, names) in found {
            in_container |= names.as_ref().is_some_and(|n| n.container.is_some());
            table.set_owner(inode, pid, known, names);
        }
    }
    in_container
}

/// Container and pod names from the runtimes (`names/runtime.rs`), for every listener in
/// a container; runs at each rescan and when an event brings a listener in a container.
pub async fn name_containers(shared: &Arc<Shared>) {
    let Ok(mut resolver) = shared.runtime_names.try_lock() else {
        return;
    };
    let wanted = shared.listeners().containers();
    resolver.refresh(&wanted).await;
    shared
        .write_listeners()
        .set_runtime_names(|id| resolver.get(id));
}
