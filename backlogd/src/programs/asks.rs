//! What a program asks `listen()` for: the figure a row of the table and its readers
//! give.

use serde::{Deserialize, Serialize};

/// What a program passes to `listen()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Asks {
    /// The namespace's `net.core.somaxconn` itself (read from /proc, or "as many as the
    /// kernel allows"): never cut by it.
    Somaxconn,
    /// A fixed figure.
    Backlog(u32),
    /// A figure from its configuration (or its code) that backlogd could not read.
    Configured,
    /// A runtime's default, which holds only if the code it runs passes no backlog of its
    /// own (a JVM running unknown code): claimed only when the kernel granted exactly
    /// somaxconn, where it cannot be the code's own smaller figure.
    CodeDefault(u32),
    /// The namespace's `net.core.somaxconn` as it was when the runtime read it, once, at
    /// start, which holds only if the code it runs passes no backlog of its own (Netty's
    /// default SO_BACKLOG). Like [`Asks::Somaxconn`] it is never cut, and once somaxconn
    /// is raised the listener holds the old figure until the process starts again; unlike
    /// it, a listener holding less than somaxconn may be the code's own smaller figure, so
    /// what is said of it is said conditionally.
    CodeSomaxconn,
}
