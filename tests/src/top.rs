//! `backlogd top --once` against a test daemon, and its rows read back.

use std::fmt::Display;

use crate::Daemon;

/// One `backlogd top --once` screen.
pub struct Top {
    pub text: String,
}

impl Top {
    /// `backlogd top --once --api DAEMON`.
    pub fn once(daemon: &Daemon) -> Self {
        Self {
            text: daemon.cli(&["top", "--once"]),
        }
    }

    /// The row of the listener at `addr` (`127.0.0.1:8080`): the line that begins with
    /// it; panics with the screen if there is none.
    pub fn row(&self, addr: impl Display) -> &str {
        let start = format!("{addr} ");
        self.text
            .lines()
            .find(|l| l.starts_with(&start))
            .unwrap_or_else(|| panic!("no row for {addr}:\n{}", self.text))
    }
}
