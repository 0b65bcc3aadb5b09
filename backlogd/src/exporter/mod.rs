//! What backlogd serves: Prometheus metrics, health, and the JSON API.
//!
//! - [`figures`]: one read of the live state's tables and kernel maps, joined per listener;
//!   the JSON snapshot is shaped there (its types are in `crate::api`).
//! - [`catalogue`]: every metric family, as data; [`page`] renders `/metrics` from it,
//!   one collector per file; [`text`] writes the exposition format.
//! - [`http`]: the routes; [`server`] the hardened HTTP/TLS server; [`webconfig`] the
//!   exporter-toolkit web config.
//!
//! Everything here reads the daemon's live state (`crate::state`); none of it is written
//! by the daemon's loops.

pub mod catalogue;
pub mod figures;
pub mod http;
pub mod page;
pub mod server;
pub mod text;
pub mod webconfig;
