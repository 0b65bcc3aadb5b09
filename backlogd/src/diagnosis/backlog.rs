//! The somaxconn clamp: a listener granted less than it wants, whether backlogd saw it
//! ask (`listen()` while the daemon ran) or knows what its program asks for
//! (`programs.rs`) (`backlog_clamped`), and the "may be clamped" case where neither is
//! known (`backlog_maybe_clamped`).

use super::{
    finding::{Finding, FindingKind, Severity, subject},
    rule::Context,
};
use crate::{
    api::{ListenerSnapshot, NamespaceSnapshot, Request},
    programs,
};

/// `net.core.somaxconn = 128 in netns N`, or that it is unknown.
fn somaxconn_line(l: &ListenerSnapshot, ns: Option<&NamespaceSnapshot>) -> String {
    match ns {
        Some(n) => format!(
            "net.core.somaxconn = {} in netns {}",
            n.sysctls.somaxconn, l.listener.netns
        ),
        None => format!("net.core.somaxconn of netns {} unknown", l.listener.netns),
    }
}

/// The program backlogd knows `l`'s owner to be, if any.
fn program(l: &ListenerSnapshot) -> Option<&'static programs::Program> {
    l.listener
        .program
        .as_ref()
        .and_then(|k| programs::by_id(&k.program))
}

/// A `backlog_clamped` warning about `l`.
fn clamped_finding(
    l: &ListenerSnapshot,
    summary: String,
    evidence: Vec<String>,
    remedy: String,
) -> Finding {
    Finding {
        severity: Severity::Warning,
        kind: FindingKind::BacklogClamped,
        subject: subject(l),
        summary,
        evidence,
        remedy,
        client_impact: None,
        recent_client_impact: None,
    }
}

/// `backlog_clamped`: granted less than it asked for (seen), or than its program asks for.
pub fn clamped(l: &ListenerSnapshot, cx: &Context<'_>) -> Option<Finding> {
    let granted = l.listener.granted;
    let comm = &l.listener.comm;
    let at = || l.listener.endpoint().to_string();
    let ns = cx.namespace(l);
    match &l.request {
        Request::Seen { backlog } => {
            let wanted = l.request.wanted().filter(|&w| w > granted)?;
            Some(clamped_finding(
                l,
                format!(
                    "{comm} asked for backlog {backlog} on {}, the kernel granted {granted}",
                    at()
                ),
                vec![
                    format!("listen() backlog {backlog}, sk_max_ack_backlog {granted}"),
                    somaxconn_line(l, ns),
                ],
                remedy(wanted, l, ns, program(l)),
            ))
        }
        Request::Program {
            program: id,
            backlog,
            source,
        } => {
            let wanted = Some(*backlog).filter(|&w| w > granted)?;
            let unless = unless(l);
            let mut evidence = vec![
                format!("{id} asks for {backlog}: {source}"),
                format!(
                    "sk_max_ack_backlog {granted} (it listened before backlogd started: \
                     the request is {id}'s, not a seen listen() call)"
                ),
                somaxconn_line(l, ns),
            ];
            evidence.extend(raised(l, ns));
            Some(clamped_finding(
                l,
                format!(
                    "{comm} asks for backlog {backlog}{unless} on {}, the kernel granted \
                     {granted}",
                    at()
                ),
                evidence,
                remedy(wanted, l, ns, program(l)),
            ))
        }
        // It asks for somaxconn, which was what it got when it listened: a namespace whose
        // somaxconn is above that now was raised since, and the socket kept the old one.
        Request::Somaxconn { program: id } => {
            let now = ns.map(|n| n.sysctls.somaxconn).filter(|&n| n > granted)?;
            let source = l
                .listener
                .program
                .as_ref()
                .map_or("", |k| k.source.as_str());
            let unless = unless(l);
            let mut evidence = vec![
                format!("{id} asks for net.core.somaxconn: {source}"),
                format!("sk_max_ack_backlog {granted}"),
                somaxconn_line(l, ns),
            ];
            evidence.extend(raised(l, ns));
            // A runtime's default (Netty's): the one own figure that leaves nothing to
            // gain is the one it holds (any larger was cut, and gets more too).
            if !unless.is_empty() {
                evidence.push(format!(
                    "unless its code passes a backlog of its own, and that is {granted}, \
                     which it then holds in full"
                ));
            }
            Some(clamped_finding(
                l,
                format!(
                    "{comm} asks for net.core.somaxconn{unless} on {}, {now} now, and holds \
                     the {granted} it was granted before it was raised: it must call \
                     listen() again to get {now}",
                    at()
                ),
                evidence,
                format!(
                    "net.core.somaxconn was raised to {now} after {comm} listened: {}{}",
                    reopen(l, program(l)),
                    program(l).map_or(String::new(), |p| format!(
                        ". {}'s own setting: {}",
                        p.id, p.knob
                    ))
                ),
            ))
        }
        Request::AtLeast { .. } | Request::Unknown => None,
    }
}

/// What qualifies a runtime's default (a JVM's 50, Netty's somaxconn), which holds only
/// if the code the runtime runs passes no backlog of its own.
fn unless(l: &ListenerSnapshot) -> &'static str {
    match l.listener.program.as_ref().map(|k| k.asks) {
        Some(programs::Asks::CodeDefault(_) | programs::Asks::CodeSomaxconn) => {
            " (if its code passes none)"
        }
        _ => "",
    }
}

/// The evidence that the namespace's somaxconn was raised after `l` listened: it is
/// above what the kernel granted, and a socket keeps the backlog granted at listen().
fn raised(l: &ListenerSnapshot, ns: Option<&NamespaceSnapshot>) -> Option<String> {
    let granted = l.listener.granted;
    let now = ns.map(|n| n.sysctls.somaxconn).filter(|&n| n > granted)?;
    Some(format!(
        "net.core.somaxconn is {now} now, above the {granted} granted: it was raised after \
         {} called listen(), which must be called again to get more",
        l.listener.comm
    ))
}

/// `backlog_maybe_clamped`: listening before backlogd, granted exactly somaxconn, its
/// request unknown.
pub fn maybe_clamped(l: &ListenerSnapshot, cx: &Context<'_>) -> Option<Finding> {
    let Request::AtLeast { .. } = l.request else {
        return None;
    };
    let granted = l.listener.granted;
    let comm = &l.listener.comm;
    let at = l.listener.endpoint().to_string();
    let program = program(l);
    let mut evidence = vec![
        format!(
            "sk_max_ack_backlog {granted} equals net.core.somaxconn: it asked for \
             {granted} or more"
        ),
        "it listened before backlogd started, so the request itself was not seen".to_owned(),
        somaxconn_line(l, cx.namespace(l)),
    ];
    if let Some(p) = program {
        evidence.push(format!(
            "{comm} is {}, which sets its request with {}; backlogd could not read \
             the figure",
            p.id, p.knob
        ));
    }
    let setting = program.map_or(String::new(), |p| {
        format!(" (or look at {} in its configuration)", p.knob)
    });
    Some(Finding {
        severity: Severity::Info,
        kind: FindingKind::BacklogMaybeClamped,
        subject: subject(l),
        summary: format!(
            "{comm} on {at} was granted {granted}, net.core.somaxconn: it may have \
             asked for more and been cut"
        ),
        evidence,
        remedy: format!(
            "to find out, restart {comm} while backlogd runs: its listen() call is \
             then seen and this becomes exact{setting}. If it asks for more than \
             {granted}, raise net.core.somaxconn in its namespace and restart it"
        ),
        client_impact: None,
        recent_client_impact: None,
    })
}

/// What makes `l`'s owner call listen() again, so that a changed somaxconn takes effect:
/// its own kind of restart.
fn reopen(l: &ListenerSnapshot, program: Option<&programs::Program>) -> String {
    let comm = &l.listener.comm;
    let pod = pod(l);
    let container = l.listener.names.as_ref().and_then(|n| n.container.as_ref());
    let keeps = "a socket keeps the backlog it was granted when it was opened";
    match (&pod, container) {
        (Some(pod), _) => format!(
            "recreate {pod} (`kubectl rollout restart` its workload; a container restart \
             keeps the pod's namespace and so its sysctls): {keeps}"
        ),
        (None, Some(c)) => format!("recreate the {} container ({comm}): {keeps}", c.runtime),
        (None, None) => match program.and_then(|p| p.relisten) {
            Some(how) => format!("{how}: {keeps}"),
            None => format!("restart {comm}: {keeps}"),
        },
    }
}

/// The pod `l` runs in, as `pod NAMESPACE/NAME` (or its uid).
fn pod(l: &ListenerSnapshot) -> Option<String> {
    let n = l.listener.names.as_ref()?;
    match (&n.pod_namespace, &n.pod_name, &n.pod_uid) {
        (Some(ns), Some(name), _) => Some(format!("pod {ns}/{name}")),
        (_, _, Some(uid)) => Some(format!("pod {uid}")),
        _ => None,
    }
}

/// What to change so that `l` gets `wanted`: the sysctl where it applies (the host's, or
/// the container's namespace), the restart that makes it take effect, and the program's
/// own setting.
fn remedy(
    wanted: u32,
    l: &ListenerSnapshot,
    ns: Option<&NamespaceSnapshot>,
    program: Option<&programs::Program>,
) -> String {
    let pod = pod(l);
    let container = l.listener.names.as_ref().and_then(|n| n.container.as_ref());
    let reopen = reopen(l, program);
    let mut out = match ns {
        Some(n) if n.sysctls.somaxconn >= wanted => format!(
            "net.core.somaxconn is already {} in that namespace, so {wanted} fits now: {reopen}",
            n.sysctls.somaxconn
        ),
        // A pod's namespace is made from its spec: that is the only place to set it.
        Some(n) if !n.host && pod.is_some() => format!(
            "net.core.somaxconn is per network namespace and the pod's is set by its spec: \
             add `net.core.somaxconn: \"{wanted}\"` to `spec.securityContext.sysctls` in \
             the pod template (the kubelet allows it with \
             `--allowed-unsafe-sysctls=net.core.somaxconn`), then {reopen}"
        ),
        Some(n) if !n.host && container.is_some() => format!(
            "net.core.somaxconn is per network namespace and this container has its own: \
             run it with `--sysctl net.core.somaxconn={wanted}` (compose: `sysctls:`), then \
             {reopen}"
        ),
        Some(n) if !n.host => format!(
            "net.core.somaxconn is per network namespace and this listener is not in the \
             host's, so the host's sysctl does not reach it: set it to at least {wanted} \
             in its namespace (docker/podman: `--sysctl net.core.somaxconn={wanted}` on \
             run; a Kubernetes pod: `securityContext.sysctls` in the pod spec, which the \
             kubelet allows with `--allowed-unsafe-sysctls=net.core.somaxconn`; a named \
             namespace: `ip netns exec NAME sysctl -w net.core.somaxconn={wanted}`), \
             then {reopen}"
        ),
        _ => format!(
            "raise net.core.somaxconn to at least {wanted} in that namespace (`sysctl -w \
             net.core.somaxconn={wanted}`, and persistently in \
             /etc/sysctl.d/90-listen-backlog.conf), then {reopen}"
        ),
    };
    if let Some(p) = program {
        out.push_str(&format!(". {}'s own setting: {}", p.id, p.knob));
    }
    out
}
