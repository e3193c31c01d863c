//! The `runtime` facet: what kind of sandbox this is, its kernel, and the
//! sysctls that decide what an unprivileged workload may do.

use std::path::Path;

use super::util::read_value;
use crate::env::Facet;

/// The sysctls a workload's failures most often come down to.
const SYSCTLS: &[&str] = &[
    "kernel.unprivileged_userns_clone",
    "user.max_user_namespaces",
    "kernel.unprivileged_bpf_disabled",
    "kernel.yama.ptrace_scope",
    "kernel.perf_event_paranoid",
    "vm.overcommit_memory",
    "net.ipv4.ip_unprivileged_port_start",
    "fs.file-max",
];

/// gVisor's uname version: the same fixed string in every release.
const GVISOR_UNAME_VERSION: &str = "#1 SMP Sun Jan 10 15:06:54 PST 2016";

pub fn facet() -> Facet {
    let mut f = Facet::new(
        "Marker files, gVisor's kernel log and uname, DMI and the CPU's hypervisor flag; \
         uname; sysctls read from /proc/sys.",
    );
    match nix::sys::utsname::uname() {
        Ok(u) => {
            f.set("kernel", u.release().to_string_lossy().into_owned());
            f.set("arch", u.machine().to_string_lossy().into_owned());
            let (kind, told_by) = kind(&u.version().to_string_lossy());
            f.set("kind", kind);
            f.set("told_by", told_by);
        }
        Err(e) => {
            f.cannot(
                "kernel",
                format!("uname: {}", super::util::errno_name(e as i32)),
            );
            let (kind, told_by) = kind("");
            f.set("kind", kind);
            f.set("told_by", told_by);
        }
    }
    for name in SYSCTLS {
        let path = format!("/proc/sys/{}", name.replace('.', "/"));
        match read_value(&path) {
            Ok(v) => f.set(format!("sysctl.{name}"), v),
            Err(why) => f.cannot(format!("sysctl.{name}"), why),
        }
    }
    f
}

/// The runtime kind and the evidence that decided it. A container's own
/// marker beats the VM it may run in; gVisor beats both (its sentry is
/// the kernel the workload talks to).
fn kind(uname_version: &str) -> (&'static str, String) {
    if uname_version == GVISOR_UNAME_VERSION {
        return ("gvisor", "gVisor's fixed uname version".into());
    }
    if kernel_log_head().contains("Starting gVisor") {
        return (
            "gvisor",
            "gVisor's kernel log (\"Starting gVisor...\")".into(),
        );
    }
    if let Some(told_by) = container_marker() {
        return ("container", told_by);
    }
    if let Some((kind, told_by)) = virtual_machine() {
        return (kind, told_by);
    }
    let docker = if Path::new("/.dockerenv").exists() {
        " (/.dockerenv is present, but / is not an overlay)"
    } else {
        ""
    };
    (
        "bare",
        format!("no container marker, no gVisor, no hypervisor flag or DMI vendor{docker}"),
    )
}

fn container_marker() -> Option<String> {
    if Path::new("/run/.containerenv").exists() {
        return Some("/run/.containerenv".into());
    }
    if super::util::env_nonempty("container").is_some() {
        return Some("container env var".into());
    }
    // Kubernetes (containerd, CRI-O) leaves no marker file, but names itself
    if super::util::env_nonempty("KUBERNETES_SERVICE_HOST").is_some() {
        return Some("Kubernetes env var (KUBERNETES_SERVICE_HOST)".into());
    }
    if Path::new("/var/run/secrets/kubernetes.io").exists() {
        return Some("/var/run/secrets/kubernetes.io".into());
    }
    // pid 1's environment names it for systemd-nspawn, LXC, podman
    if let Ok(env) = std::fs::read("/proc/1/environ")
        && env.split(|b| *b == 0).any(|v| v.starts_with(b"container="))
    {
        return Some("container env var of pid 1".into());
    }
    if let Ok(cg) = std::fs::read_to_string("/proc/1/cgroup")
        && ["docker", "kubepods", "containerd", "libpod", "lxc"]
            .iter()
            .any(|w| cg.contains(w))
    {
        return Some("pid 1's cgroup names a container runtime".into());
    }
    // /.dockerenv also comes along in root filesystems exported from an
    // image (a Firecracker VM booted from one): trust it on an overlay root
    if Path::new("/.dockerenv").exists() && root_fstype().as_deref() == Some("overlay") {
        return Some("/.dockerenv, on an overlay root".into());
    }
    None
}

/// The filesystem type of `/` from our mountinfo.
fn root_fstype() -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // the last mount on / covers the earlier ones
    info.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (left.split(' ').nth(4)? == "/").then(|| right.split(' ').next().map(String::from))?
    })
}

fn virtual_machine() -> Option<(&'static str, String)> {
    let dmi = |f: &str| read_value(format!("/sys/class/dmi/id/{f}")).ok();
    let vendor = dmi("sys_vendor").unwrap_or_default();
    let product = dmi("product_name").unwrap_or_default();
    for micro in ["Firecracker", "Cloud Hypervisor"] {
        if vendor.contains(micro) || product.contains(micro) {
            return Some(("microvm", format!("DMI sys_vendor {vendor:?} ({micro})")));
        }
    }
    if product.contains("microvm") {
        return Some(("microvm", format!("DMI product_name {product:?}")));
    }
    let flag = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
        c.lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|w| w == "hypervisor"))
    });
    let no_dmi = !Path::new("/sys/class/dmi/id").exists();
    if flag && no_dmi {
        // Firecracker and QEMU's microvm machine offer no DMI table
        return Some((
            "microvm",
            "hypervisor flag in /proc/cpuinfo and no DMI table (as Firecracker)".into(),
        ));
    }
    for vm in [
        "QEMU",
        "KVM",
        "VMware",
        "Microsoft",
        "Xen",
        "Amazon EC2",
        "Google",
        "innotek",
        "Parallels",
    ] {
        if vendor.contains(vm) || product.contains(vm) {
            return Some(("vm", format!("DMI sys_vendor {vendor:?}")));
        }
    }
    if flag {
        return Some(("vm", "hypervisor flag in /proc/cpuinfo".into()));
    }
    if let Ok(t) = read_value("/sys/hypervisor/type") {
        return Some(("vm", format!("/sys/hypervisor/type {t:?}")));
    }
    None
}

/// The first KiB of the kernel log, through syslog(2)
/// (SYSLOG_ACTION_READ_ALL), which gVisor implements; empty when denied.
/// Only searched for gVisor's banner, never recorded.
fn kernel_log_head() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: buf is valid for its length.
    let n = unsafe { libc::klogctl(3, buf.as_mut_ptr().cast(), buf.len() as i32) };
    if n <= 0 {
        return String::new();
    }
    buf.truncate(n as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_facet_names_a_kind_and_the_kernel() {
        let f = super::facet();
        let kind = f.items["kind"].as_str().unwrap();
        assert!(
            ["bare", "container", "gvisor", "microvm", "vm"].contains(&kind),
            "{kind}"
        );
        assert!(!f.items["told_by"].as_str().unwrap().is_empty());
        assert!(f.items.contains_key("kernel"));
        for name in super::SYSCTLS {
            let key = format!("sysctl.{name}");
            assert!(
                f.items.contains_key(&key) || f.unreadable.contains_key(&key),
                "{key}"
            );
        }
    }
}
