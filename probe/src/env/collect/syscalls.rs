//! The `syscalls` facet: the seccomp mode, capabilities and LSM this
//! process runs under, and trials of the system calls sandboxes most often
//! deny.

use super::util::{io_name, read_text};
use crate::env::Facet;

/// Capability names by bit (linux/capability.h).
const CAPS: &[&str] = &[
    "cap_chown",
    "cap_dac_override",
    "cap_dac_read_search",
    "cap_fowner",
    "cap_fsetid",
    "cap_kill",
    "cap_setgid",
    "cap_setuid",
    "cap_setpcap",
    "cap_linux_immutable",
    "cap_net_bind_service",
    "cap_net_broadcast",
    "cap_net_admin",
    "cap_net_raw",
    "cap_ipc_lock",
    "cap_ipc_owner",
    "cap_sys_module",
    "cap_sys_rawio",
    "cap_sys_chroot",
    "cap_sys_ptrace",
    "cap_sys_pacct",
    "cap_sys_admin",
    "cap_sys_boot",
    "cap_sys_nice",
    "cap_sys_resource",
    "cap_sys_time",
    "cap_sys_tty_config",
    "cap_mknod",
    "cap_lease",
    "cap_audit_write",
    "cap_audit_control",
    "cap_setfcap",
    "cap_mac_override",
    "cap_mac_admin",
    "cap_syslog",
    "cap_wake_alarm",
    "cap_block_suspend",
    "cap_audit_read",
    "cap_perfmon",
    "cap_bpf",
    "cap_checkpoint_restore",
];

/// The names of the bits set in a capability mask (`cap_N` for bits this
/// probe does not know).
pub fn cap_names(mask: u64) -> Vec<String> {
    (0..64)
        .filter(|bit| mask & (1u64 << bit) != 0)
        .map(|bit| match CAPS.get(bit) {
            Some(name) => name.to_string(),
            None => format!("cap_{bit}"),
        })
        .collect()
}

/// `trials`: what [`super::trials::run_all`] found (run before any thread
/// was started).
pub fn facet(trials: &[(&str, String)]) -> Facet {
    let mut f = Facet::new(
        "Seccomp, NoNewPrivs and capabilities from /proc/self/status, the LSM label \
         from /proc/self/attr/current; each try.* is the call made in a forked child \
         (ok, or the errno it got).",
    );
    match read_text("/proc/self/status") {
        Ok(status) => from_status(&status, &mut f),
        Err(why) => {
            for key in ["seccomp", "no_new_privs", "caps.effective", "caps.bounding"] {
                f.cannot(key, &why);
            }
        }
    }
    match std::fs::read("/proc/self/attr/current") {
        Ok(label) => {
            let label = String::from_utf8_lossy(&label);
            f.set(
                "lsm",
                label.trim_matches(|c: char| c == '\0' || c.is_whitespace()),
            );
        }
        // EINVAL: no LSM that keeps a label is active
        Err(e) => f.cannot(
            "lsm",
            format!("{} reading /proc/self/attr/current", io_name(&e)),
        ),
    }
    for (key, outcome) in trials {
        f.set(*key, outcome.as_str());
    }
    f
}

fn from_status(status: &str, f: &mut Facet) {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    match field("Seccomp") {
        Some("0") => f.set("seccomp", "disabled"),
        Some("1") => f.set("seccomp", "strict"),
        Some("2") => f.set("seccomp", "filter"),
        Some(other) => f.set("seccomp", other),
        None => f.cannot("seccomp", "no Seccomp line in /proc/self/status"),
    }
    if let Some(n) = field("Seccomp_filters").and_then(|n| n.parse::<u64>().ok()) {
        f.set("seccomp_filters", n);
    }
    match field("NoNewPrivs") {
        Some(v) => f.set("no_new_privs", v == "1"),
        None => f.cannot("no_new_privs", "no NoNewPrivs line in /proc/self/status"),
    }
    for (key, line) in [("caps.effective", "CapEff"), ("caps.bounding", "CapBnd")] {
        match field(line).and_then(|hex| u64::from_str_radix(hex, 16).ok()) {
            Some(mask) => f.set(key, cap_names(mask)),
            None => f.cannot(key, format!("no {line} line in /proc/self/status")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_masks_decode() {
        assert_eq!(cap_names(0), Vec::<String>::new());
        assert_eq!(cap_names(1 << 21), ["cap_sys_admin"]);
        assert_eq!(
            cap_names(0x0000_0000_a804_25fb).len(),
            0xa80425fbu64.count_ones() as usize
        );
        // docker's default set includes chown and net_bind_service
        let docker = cap_names(0x0000_0000_a804_25fb);
        assert!(docker.contains(&"cap_chown".to_string()));
        assert!(docker.contains(&"cap_net_bind_service".to_string()));
        assert!(!docker.contains(&"cap_sys_admin".to_string()));
        assert_eq!(cap_names(1 << 40), ["cap_checkpoint_restore"]);
        assert_eq!(cap_names(1 << 45), ["cap_45"]);
    }

    #[test]
    fn status_lines_decode() {
        let mut f = Facet::new("");
        from_status(
            "Name:\tx\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t3\n\
             CapEff:\t0000000000000000\nCapBnd:\t000001ffffffffff\n",
            &mut f,
        );
        assert_eq!(f.items["seccomp"], "filter");
        assert_eq!(f.items["seccomp_filters"], 3);
        assert_eq!(f.items["no_new_privs"], true);
        assert_eq!(f.items["caps.effective"], serde_json::json!([]));
        assert_eq!(f.items["caps.bounding"].as_array().unwrap().len(), 41);
    }
}
