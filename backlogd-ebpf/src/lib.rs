// Empty library target: lets backlogd/build.rs name this crate as a build dependency so
// cargo rebuilds the eBPF object when it changes (artifact dependencies are unstable).
#![no_std]
