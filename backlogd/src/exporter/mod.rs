//! What backlogd serves: Prometheus metrics, health, and the JSON API.

pub mod http;
pub mod metrics;
pub mod text;
