//! SIGHUP: the configuration read again and what can change applied without reattaching
//! (log filter, rescan interval, high-water-mark window, exported accept-wait buckets,
//! the HTTP settings and web config); the rest waits for a restart, and says so.

use std::{
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use tokio::sync::watch;

use crate::{
    config::{self, Config},
    exporter::server::HttpSettings,
    queues::QueueWindows,
    service::notify,
};

/// Applies a new log filter (the process's logging is the caller's).
pub type LogFilterFn = dyn Fn(&str) -> anyhow::Result<()> + Send + Sync;
pub type LogFilterSetter = Box<LogFilterFn>;

/// What a reload can change while running.
pub struct ReloadTargets<'a> {
    pub set_log_filter: Option<&'a LogFilterFn>,
    pub http: &'a watch::Sender<Arc<HttpSettings>>,
    pub rescan: &'a watch::Sender<Duration>,
    pub windows: &'a Arc<Mutex<QueueWindows>>,
    pub accept_wait_buckets: &'a Arc<RwLock<config::AcceptWaitBuckets>>,
}

/// SIGHUP: reads the config again and applies what can change without reattaching. Any
/// error keeps the running configuration whole (nothing is half-applied: everything is
/// checked before anything changes).
pub fn reload(source: Option<&config::Source>, current: &mut Config, to: &ReloadTargets<'_>) {
    notify::reloading();
    match source {
        None => tracing::info!("SIGHUP: no config file to reload"),
        Some(source) => match prepare_reload(source) {
            Err(e) => tracing::error!(
                "SIGHUP: config reload failed, keeping the running configuration: {e:#}"
            ),
            Ok((new, http)) => apply_reload(source, current, new, http, to),
        },
    }
    notify::ready();
}

fn prepare_reload(source: &config::Source) -> anyhow::Result<(Config, HttpSettings)> {
    let new = source.resolve()?;
    let http = HttpSettings::load(&new.http)?;
    Ok((new, http))
}

fn apply_reload(
    source: &config::Source,
    current: &mut Config,
    mut new: Config,
    http: HttpSettings,
    to: &ReloadTargets<'_>,
) {
    for (key, old, wanted) in current.restart_only_changes(&new) {
        tracing::warn!(
            "SIGHUP: `{key}` changed from {old} to {wanted}: it takes effect only after a \
             restart (`systemctl restart backlogd`); still using {old}"
        );
    }
    new.keep_restart_only(current);
    let mut changed = Vec::new();
    if new.log != current.log {
        match to.set_log_filter {
            Some(set) => match set(&new.log) {
                Ok(()) => changed.push(format!("log {:?} -> {:?}", current.log, new.log)),
                Err(e) => {
                    tracing::error!("SIGHUP: cannot apply log filter {:?}: {e:#}", new.log);
                    new.log = current.log.clone();
                }
            },
            None => new.log = current.log.clone(),
        }
    }
    if new.rescan_interval != current.rescan_interval {
        to.rescan
            .send_replace(Duration::from_secs(new.rescan_interval));
        changed.push(format!(
            "rescan_interval {} -> {}",
            current.rescan_interval, new.rescan_interval
        ));
    }
    if new.hwm_window != current.hwm_window {
        to.windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set_window(Duration::from_secs(new.hwm_window));
        changed.push(format!(
            "hwm_window {} -> {}",
            current.hwm_window, new.hwm_window
        ));
    }
    if new.accept_wait_buckets != current.accept_wait_buckets {
        *to.accept_wait_buckets
            .write()
            .unwrap_or_else(|e| e.into_inner()) = new.accept_wait_buckets.clone();
        let show = |b: &config::AcceptWaitBuckets| {
            if b.is_all() {
                "all".to_owned()
            } else {
                let bounds: Vec<String> = b.seconds().iter().map(f64::to_string).collect();
                format!("[{}]", bounds.join(", "))
            }
        };
        changed.push(format!(
            "accept_wait_buckets {} -> {} (the histogram's exported buckets)",
            show(&current.accept_wait_buckets),
            show(&new.accept_wait_buckets)
        ));
    }
    if new.http != current.http {
        changed.push("http (limits, TLS, users: for new connections)".into());
    }
    // The web config file can change under the same path (an emptied or truncated file
    // turns TLS and auth off): say what it now does, loudly if it dropped a protection.
    let (was_tls, was_auth, was) = {
        let old = &to.http.borrow().web;
        (old.tls.is_some(), old.auth.is_some(), old.describe())
    };
    let now = http.web.describe();
    if was != now {
        changed.push(format!("web config: {was} -> {now}"));
        if (was_tls && http.web.tls.is_none()) || (was_auth && http.web.auth.is_none()) {
            tracing::warn!(
                "SIGHUP: the web config now turns protection off ({was} -> {now}): /metrics \
                 and the API are served without it from now on. If that is not intended, \
                 restore the web config file and send SIGHUP again"
            );
        }
    }
    // Always replaced: the web config file may have changed even if its path did not
    // (new certificate, new users).
    to.http.send_replace(Arc::new(http));
    *current = new;
    let file = source
        .file_in_use()
        .map_or("defaults (no config file)".to_owned(), |p| {
            p.display().to_string()
        });
    tracing::info!(
        "SIGHUP: configuration reloaded from {file}; changed: {}",
        if changed.is_empty() {
            "nothing".to_owned()
        } else {
            changed.join(", ")
        }
    );
}
