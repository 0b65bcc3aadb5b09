//! backlogd as a service, each test with a real daemon process: systemd readiness and
//! watchdog over a notify socket the test binds, capabilities after readiness, SIGHUP
//! reload, SIGTERM exit time, the config file and check-config, the HTTP endpoint's
//! behaviour with abusive clients, basic auth and TLS, and the shipped systemd unit.
//!
//! One module per topic; `support` holds what several of them use.

mod auth;
mod capabilities;
mod config;
mod endpoint;
mod lifecycle;
mod reload;
mod support;
