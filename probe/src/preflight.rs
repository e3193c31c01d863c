//! What this kernel offers the probe, read without loading anything:
//! `probe check`'s items, and the one sentence the probe says instead of a
//! verifier dump when tracing is impossible here (a user-space kernel such
//! as gVisor, a kernel built without bpf(2), BPF_EVENTS or tracepoints).

use std::path::{Path, PathBuf};

use serde::Serialize;

/// What the tracepoint rung (no kernel BTF) cannot see.
pub const TRACEPOINT_RUNG_CANNOT_SEE: &str = "without kernel BTF the arguments of a syscall a seccomp filter stopped are not known \
     (its number and errno are): a seccomp denial names the syscall but not its path or address";

/// `PROBE_BTF=none` switches kernel BTF off, as on a kernel built without
/// it: the tracepoint rung, forced (how CI tests that rung on BTF kernels).
pub fn btf_switched_off() -> bool {
    std::env::var_os("PROBE_BTF").is_some_and(|v| v == "none")
}

/// Effective capabilities from /proc/self/status.
pub fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// One line of `probe check`.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    /// Short name: `bpf`, `btf`, `tracepoint raw_syscalls:sys_enter`…
    pub item: String,
    pub ok: bool,
    /// What was found.
    pub found: String,
    /// What to do about a miss (empty when ok), and what the miss costs.
    pub fix: String,
    /// A miss here stops the probe (otherwise it runs, seeing less).
    pub required: bool,
}

impl Item {
    fn new(item: impl Into<String>, ok: bool, found: impl Into<String>) -> Item {
        Item {
            item: item.into(),
            ok,
            found: found.into(),
            fix: String::new(),
            required: false,
        }
    }
    fn fix(mut self, fix: impl Into<String>) -> Item {
        if !self.ok {
            self.fix = fix.into();
        }
        self
    }
    fn required(mut self) -> Item {
        self.required = true;
        self
    }
}

/// The kernel's build configuration: `/proc/config.gz`, else
/// `/boot/config-$(uname -r)`. None when neither is readable.
pub struct KernelConfig {
    pub source: PathBuf,
    text: String,
}

impl KernelConfig {
    pub fn read() -> Option<KernelConfig> {
        use std::io::Read as _;
        let gz = Path::new("/proc/config.gz");
        if let Ok(file) = std::fs::File::open(gz) {
            let mut text = String::new();
            if flate2::read::GzDecoder::new(file)
                .read_to_string(&mut text)
                .is_ok()
            {
                return Some(KernelConfig {
                    source: gz.to_path_buf(),
                    text,
                });
            }
        }
        let boot = PathBuf::from(format!("/boot/config-{}", release()));
        let text = std::fs::read_to_string(&boot).ok()?;
        Some(KernelConfig { source: boot, text })
    }

    /// `y`, `m`, a value, or None when the option is not set.
    pub fn get(&self, option: &str) -> Option<&str> {
        self.text.lines().find_map(|l| {
            l.strip_prefix(option)
                .and_then(|rest| rest.strip_prefix('='))
        })
    }

    fn on(&self, option: &str) -> bool {
        matches!(self.get(option), Some("y") | Some("m"))
    }
}

/// `uname -r`.
pub fn release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The kernel's machine, as `uname -m` says it.
fn machine() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.machine().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The architecture this probe was built for (its eBPF programs read that
/// architecture's registers and syscall numbers) against the kernel's: an
/// x86_64 probe run by a user-mode emulator on arm64 would load programs
/// that read the wrong registers.
fn architecture_item(machine: &str) -> Item {
    let built = probe_abi::NATIVE.0;
    Item::new(
        "architecture",
        machine == built,
        format!("{built} probe, {machine} kernel"),
    )
    .fix(format!(
        "install the probe built for {machine} (`cargo xtask dist` makes x86_64 and aarch64)"
    ))
    .required()
}

/// gVisor's sentry: no bpf(2), and the kernel log it fakes begins with
/// "Starting gVisor..." (its /proc/version claims Linux 4.4.0).
fn is_gvisor() -> bool {
    !has_bpf_syscall() && kernel_log_head().contains("Starting gVisor")
}

/// The first few KiB of the kernel log, through syslog(2)
/// (SYSLOG_ACTION_READ_ALL), which gVisor implements; empty when denied.
fn kernel_log_head() -> String {
    let mut buf = vec![0u8; 4096];
    // SAFETY: buf is valid for its length.
    let n = unsafe { libc::klogctl(3, buf.as_mut_ptr().cast(), buf.len() as i32) };
    if n <= 0 {
        return String::new();
    }
    buf.truncate(n as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Whether the bpf(2) system call exists (ENOSYS: not in this kernel).
fn has_bpf_syscall() -> bool {
    // BPF_PROG_LOAD with a null attr: EFAULT/EINVAL/EPERM where bpf(2)
    // exists, ENOSYS where it does not
    // SAFETY: a null attr pointer of size 0 is never dereferenced.
    let r = unsafe { libc::syscall(libc::SYS_bpf, 5, std::ptr::null::<u8>(), 0) };
    !(r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
}

/// Why the probe cannot run on this kernel at all, in one sentence naming
/// what is missing, or None when it may. Read before loading, so the user
/// gets this instead of a tracefs or verifier error no root can fix.
pub fn cannot_run() -> Option<String> {
    const SEE: &str = "see docs/KERNELS.md for the kernels and sandboxes the probe runs on";
    if is_gvisor() {
        return Some(format!(
            "this is gVisor (runsc), a user-space kernel (it reports Linux {}): it has no \
             bpf(2) and no tracepoints, so no eBPF probe can run inside it; run the probe \
             on the host as gVisor's monitor instead: `probe trace --gvisor -- runsc … do CMD`, \
             or a host `probe run` this sandbox sends its points to (`probe gvisor-session`); {SEE}",
            release()
        ));
    }
    let config = KernelConfig::read();
    let off = |option: &str| config.as_ref().is_some_and(|c| !c.on(option));
    let from = config
        .as_ref()
        .map(|c| format!(" (read from {})", c.source.display()))
        .unwrap_or_default();
    if !has_bpf_syscall() {
        return Some(format!(
            "this kernel ({}) has no bpf(2) system call: it was built without \
             CONFIG_BPF_SYSCALL{from}; {SEE}",
            release()
        ));
    }
    if off("CONFIG_BPF_EVENTS") {
        return Some(format!(
            "this kernel ({}) was built without CONFIG_BPF_EVENTS{from} (which needs \
             KPROBE_EVENTS or UPROBE_EVENTS, and PERF_EVENTS), so it cannot run tracing \
             programs; {SEE}",
            release()
        ));
    }
    if off("CONFIG_TRACEPOINTS") || off("CONFIG_FTRACE") {
        return Some(format!(
            "this kernel ({}) was built without {}{from}: it has no tracepoints to attach \
             to; {SEE}",
            release(),
            if off("CONFIG_TRACEPOINTS") {
                "CONFIG_TRACEPOINTS"
            } else {
                "CONFIG_FTRACE"
            }
        ));
    }
    None
}

/// The JIT's state (`net.core.bpf_jit_enable`): "on", "off (interpreter)",
/// "always on", or "unknown".
pub fn jit() -> String {
    match std::fs::read_to_string("/proc/sys/net/core/bpf_jit_enable") {
        Ok(v) => match v.trim() {
            "0" => "off (programs run in the interpreter)".into(),
            "1" | "2" => "on".into(),
            other => other.to_string(),
        },
        Err(_) => "unknown (no /proc/sys/net/core/bpf_jit_enable: a kernel without BPF_JIT \
                   runs programs in the interpreter)"
            .into(),
    }
}

/// Every item `probe check` reports, before it tries to load.
pub fn items(tracepoints: &[(&str, &str, bool)]) -> Vec<Item> {
    let mut out = Vec::new();
    let config = KernelConfig::read();
    out.push(Item::new(
        "kernel",
        true,
        format!(
            "Linux {} ({})",
            release(),
            config
                .as_ref()
                .map(|c| format!("config from {}", c.source.display()))
                .unwrap_or_else(|| "no /proc/config.gz or /boot/config-*".into())
        ),
    ));
    out.push(architecture_item(&machine()));
    let gvisor = is_gvisor();
    out.push(
        Item::new(
            "user-space kernel",
            !gvisor,
            if gvisor { "gVisor (runsc)" } else { "no" },
        )
        .fix("run the probe on the host as gVisor's monitor: `probe trace --gvisor -- runsc … do CMD`, or `probe run` with the sandbox started by `runsc --pod-init-config` (`probe gvisor-session`)")
        .required(),
    );
    let bpf = has_bpf_syscall();
    out.push(
        Item::new("bpf(2)", bpf, if bpf { "present" } else { "ENOSYS" })
            .fix("a kernel built with CONFIG_BPF_SYSCALL=y")
            .required(),
    );
    if let Some(c) = &config {
        for (option, required, cost) in [
            (
                "CONFIG_BPF_EVENTS",
                true,
                "no tracing programs at all (needs KPROBE_EVENTS or UPROBE_EVENTS, and PERF_EVENTS)",
            ),
            ("CONFIG_TRACEPOINTS", true, "no tracepoints to attach to"),
            (
                "CONFIG_DEBUG_INFO_BTF",
                false,
                "the tracepoint rung: seccomp denials without their arguments (build with pahole)",
            ),
            (
                "CONFIG_BPF_JIT",
                false,
                "programs run in the interpreter (slower; see docs/BENCHMARKS.md)",
            ),
            ("CONFIG_PSI", false, "no memory-pressure stall figures"),
            (
                "CONFIG_MEMCG",
                false,
                "no memory-cgroup limits to attribute",
            ),
            (
                "CONFIG_IO_URING",
                false,
                "nothing (io_uring is then unavailable to workloads too)",
            ),
        ] {
            let on = c.on(option);
            let mut item = Item::new(option, on, c.get(option).unwrap_or("not set").to_string())
                .fix(format!(
                    "rebuild the kernel with {option}=y; without it: {cost}"
                ));
            if required {
                item = item.required();
            }
            out.push(item);
        }
    }
    let btf = Path::new("/sys/kernel/btf/vmlinux");
    let btf_ok = btf.is_file() && !btf_switched_off();
    out.push(
        Item::new(
            "btf",
            btf_ok,
            if btf_switched_off() {
                "switched off (PROBE_BTF=none)".to_string()
            } else if btf.is_file() {
                format!("{}", btf.display())
            } else {
                "no /sys/kernel/btf/vmlinux".to_string()
            },
        )
        .fix(format!(
            "the probe runs on the tracepoint rung: {TRACEPOINT_RUNG_CANNOT_SEE}"
        )),
    );
    match crate::tracefs::root() {
        Ok(root) => {
            out.push(Item::new("tracefs", true, root.display().to_string()));
            for &(cat, name, required) in tracepoints {
                let tp = format!("{cat}/{name}");
                let format = crate::tracefs::format(&root, &tp);
                let ok = format.is_ok();
                let mut item = Item::new(
                    format!("tracepoint {cat}:{name}"),
                    ok,
                    match &format {
                        Ok(fields) => format!("{} fields", fields.len()),
                        Err(_) if !root.join("events").join(&tp).is_dir() => {
                            "not in this kernel's tracefs events".to_string()
                        }
                        Err(e) => e.to_string(),
                    },
                )
                .fix(if required {
                    "a kernel with this tracepoint (CONFIG_FTRACE and the subsystem's tracepoints)"
                } else {
                    "optional: what it shows is not seen"
                });
                if required {
                    item = item.required();
                }
                out.push(item);
            }
            if let Err(e) = crate::tracefs::offsets(&root) {
                out.push(
                    Item::new("tracepoint formats", false, e.to_string())
                        .fix("a field the programs read is missing from this kernel's format files")
                        .required(),
                );
            } else {
                out.push(Item::new(
                    "tracepoint formats",
                    true,
                    "every field the programs read is there",
                ));
            }
        }
        Err(e) => out.push(
            Item::new("tracefs", false, e.to_string())
                .fix("mount tracefs (mount -t tracefs nodev /sys/kernel/tracing) on a kernel with CONFIG_FTRACE")
                .required(),
        ),
    }
    let jit = jit();
    out.push(
        Item::new("jit", jit == "on", jit)
            .fix("sysctl net.core.bpf_jit_enable=1 (a kernel with CONFIG_BPF_JIT); the interpreter works, slower"),
    );
    let psi = std::fs::read_to_string("/proc/pressure/memory").is_ok();
    out.push(
        Item::new(
            "psi",
            psi,
            if psi {
                "/proc/pressure/memory"
            } else {
                "no /proc/pressure/memory"
            },
        )
        .fix(
            "boot with psi=1 (kernels built with PSI_DEFAULT_DISABLED) for memory-pressure figures",
        ),
    );
    let controllers = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers");
    out.push(
        Item::new(
            "cgroup v2",
            controllers.is_ok(),
            match &controllers {
                Ok(c) => format!("controllers: {}", c.trim()),
                Err(_) => "no /sys/fs/cgroup/cgroup.controllers".into(),
            },
        )
        .fix("mount cgroup2 at /sys/fs/cgroup to follow cgroups (--cgroup) and read their limits"),
    );
    let caps = effective_caps();
    let enough = caps & (1 << 21) != 0 || caps & (3 << 38) == 3 << 38;
    out.push(
        Item::new("capabilities", enough, format!("CapEff {caps:016x}"))
            .fix("run as root, or with CAP_BPF+CAP_PERFMON+CAP_SYS_RESOURCE")
            .required(),
    );
    let uring = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|v| v.trim() == "0")
        .unwrap_or(true);
    out.push(
        Item::new(
            "io_uring",
            uring,
            if uring {
                "enabled"
            } else {
                "disabled by sysctl"
            },
        )
        .fix("nothing to do: workloads cannot use io_uring here either"),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_architecture_item_refuses_a_probe_built_for_another_machine() {
        let here = architecture_item(probe_abi::NATIVE.0);
        assert!(here.ok && here.required, "{}", here.found);
        let other = if probe_abi::NATIVE.0 == "x86_64" {
            "aarch64"
        } else {
            "x86_64"
        };
        let there = architecture_item(other);
        assert!(!there.ok && there.required);
        assert!(
            there.found.contains(other) && there.fix.contains(other),
            "{}",
            there.fix
        );
    }
}
