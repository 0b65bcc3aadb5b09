//! Hook modes: which kernel mechanism the SYN path runs on.
//!
//! Order of preference on production kernels: fentry/fexit (BPF trampolines, cheapest),
//! then kprobes, then tracepoint mode (cgroup_skb + tracepoints, needs neither). This
//! version implements tracepoint mode, which reports every figure exactly on kernels that
//! have the tracepoints it uses; the other two are probed and reported so operators can
//! see what their kernel offers.

use std::path::Path;

use aya::programs::ProgramType;

/// `--hook-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HookModeArg {
    /// The best mode this kernel and this backlogd support.
    Auto,
    Fentry,
    Kprobe,
    Tracepoint,
}

/// The mode in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookMode {
    Tracepoint,
}

impl HookMode {
    pub fn name(self) -> &'static str {
        match self {
            HookMode::Tracepoint => "tracepoint",
        }
    }
}

/// What the running kernel allows, as found by trying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelSupport {
    /// A BPF_PROG_TYPE_TRACING program loads (BPF trampolines work).
    pub fentry: bool,
    /// The kprobe PMU exists (CONFIG_KPROBES), so kprobes can be attached.
    pub kprobe: bool,
}

impl KernelSupport {
    pub fn probe() -> Self {
        Self {
            fentry: matches!(
                aya::sys::is_program_supported(ProgramType::Tracing),
                Ok(true)
            ),
            kprobe: Path::new("/sys/bus/event_source/devices/kprobe").exists(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModeError {
    #[error(
        "--hook-mode {mode}: this kernel does not support it ({why}). Fix: use \
         `--hook-mode auto` (or `tracepoint`), which works on this kernel"
    )]
    KernelLacks {
        mode: &'static str,
        why: &'static str,
    },
    #[error(
        "--hook-mode {mode}: this kernel supports it, but this version of backlogd implements \
         only tracepoint mode, which reports the same figures exactly. Fix: use \
         `--hook-mode auto` (or `tracepoint`)"
    )]
    NotImplemented { mode: &'static str },
}

pub fn choose(requested: HookModeArg, kernel: KernelSupport) -> Result<HookMode, ModeError> {
    match requested {
        HookModeArg::Auto | HookModeArg::Tracepoint => Ok(HookMode::Tracepoint),
        HookModeArg::Fentry if !kernel.fentry => Err(ModeError::KernelLacks {
            mode: "fentry",
            why: "loading a BPF tracing program fails: no BPF trampoline support",
        }),
        HookModeArg::Kprobe if !kernel.kprobe => Err(ModeError::KernelLacks {
            mode: "kprobe",
            why: "no kprobe PMU in /sys/bus/event_source/devices: CONFIG_KPROBES is off",
        }),
        HookModeArg::Fentry => Err(ModeError::NotImplemented { mode: "fentry" }),
        HookModeArg::Kprobe => Err(ModeError::NotImplemented { mode: "kprobe" }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: KernelSupport = KernelSupport {
        fentry: false,
        kprobe: false,
    };
    const ALL: KernelSupport = KernelSupport {
        fentry: true,
        kprobe: true,
    };

    #[test]
    fn auto_and_tracepoint_always_work() {
        for k in [NONE, ALL] {
            assert_eq!(choose(HookModeArg::Auto, k), Ok(HookMode::Tracepoint));
            assert_eq!(choose(HookModeArg::Tracepoint, k), Ok(HookMode::Tracepoint));
        }
    }

    #[test]
    fn an_unsupported_request_names_the_kernel_and_the_fix() {
        let e = choose(HookModeArg::Kprobe, NONE).unwrap_err().to_string();
        assert!(
            e.contains("CONFIG_KPROBES") && e.contains("--hook-mode auto"),
            "{e}"
        );
        let e = choose(HookModeArg::Fentry, ALL).unwrap_err();
        assert_eq!(e, ModeError::NotImplemented { mode: "fentry" });
    }
}
