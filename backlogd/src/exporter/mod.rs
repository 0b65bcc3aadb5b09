//! What backlogd serves: Prometheus metrics, health, and the JSON API.

pub mod batch;
pub mod http;
pub mod metrics;
pub mod server;
pub mod text;
pub mod webconfig;
