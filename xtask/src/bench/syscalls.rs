//! What every syscall on the host pays: the tp_btf `sys_exit` program of kprobe and
//! tracepoint modes.

use super::*;

/// ns per `getppid()` in a tight loop, best of three runs of `n`.
pub(super) fn ns_per_syscall(n: usize) -> f64 {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                // SAFETY: getppid takes no arguments and cannot fail.
                unsafe { libc::syscall(libc::SYS_getppid) };
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// In tracepoint and kprobe modes every syscall on the host pays for the tp_btf `sys_exit`
/// program that sees accept() and listen() return (the slow syscall path plus a run per
/// syscall); fentry mode enables no syscall tracepoint.
pub(super) fn syscall_overhead(p: &Params, r: &mut Report) -> Result<()> {
    r.line(format!(
        "`getppid()` in a tight loop on one thread, best of 3 runs of {} calls, without \
         backlogd and with it in each mode (measured before and after, to show drift).\n",
        p.syscalls
    ));
    let before = ns_per_syscall(p.syscalls);
    let mut rows = vec![vec![
        "none (before)".to_owned(),
        format!("{before:.1}"),
        String::new(),
    ]];
    for mode in MODES {
        match Daemon::start(mode, &[])? {
            // The reason is quoted in full in the per-event section.
            Err(_) => rows.push(vec![
                (*mode).to_owned(),
                "not supported by this kernel".to_owned(),
                String::new(),
            ]),
            Ok(d) => {
                let with = ns_per_syscall(p.syscalls);
                r.targets
                    .syscall_ns
                    .push((procs::labelled(mode), before, with));
                rows.push(vec![
                    procs::labelled(mode),
                    format!("{with:.1}"),
                    format!("{:+.1}", with - before),
                ]);
                drop(d);
            }
        }
    }
    let after = ns_per_syscall(p.syscalls);
    rows.push(vec![
        "none (after)".to_owned(),
        format!("{after:.1}"),
        format!("{:+.1}", after - before),
    ]);
    r.table(&["backlogd", "ns per syscall", "vs none"], &rows);
    Ok(())
}
