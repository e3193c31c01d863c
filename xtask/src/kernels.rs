//! The kernel matrix (`cargo xtask kernels`, and a step of `cargo xtask
//! test`): Debian's cloud kernels of the LTS lines agent sandboxes boot —
//! bullseye 5.10, bookworm 6.1, trixie 6.12 — fetched without installing
//! them, each booted under QEMU (TCG: nested KVM fails on these machines)
//! with an initramfs of busybox and the static executables of `cargo xtask
//! dist`. Inside, `/init` runs `probe check` and the faults of
//! [`CASES`] under `probe trace --json`, and the daemon with two spans;
//! the host reads the serial console and asserts the same primitive the
//! host kernel gives. No disk and no network device: the guest has none.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::workspace_root;

/// Debian suites whose current cloud kernel is tested.
pub const SUITES: [&str; 3] = ["bullseye", "bookworm", "trixie"];

/// What `cargo xtask kernels` needs on the host.
pub const PACKAGES: [(&str, &str); 3] = [
    ("qemu-system-x86", "command -v qemu-system-x86_64"),
    // gVisor: where the probe must refuse in one sentence, and whose
    // runtime monitoring `probe trace --gvisor` reads; pinned (bookworm's
    // package: the gVisor tests know this release's gaps, its statx EINVAL)
    (
        "runsc=0.0~20221219.0-2+b3",
        "test \"$(dpkg-query -W -f='${Version}' runsc 2>/dev/null)\" = '0.0~20221219.0-2+b3'",
    ),
    (
        "busybox-static",
        "test -x /bin/busybox && /bin/busybox --list | grep -qx cpio",
    ),
];

/// A fetched kernel.
pub struct Kernel {
    pub suite: &'static str,
    /// `linux-image-6.1.0-41-cloud-amd64`
    pub package: String,
    /// `6.1.158-1`
    pub version: String,
    pub vmlinuz: PathBuf,
    /// Its `config-*`, copied into the guest as `/boot/config-$(uname -r)`.
    pub config: PathBuf,
    /// `uname -r` of the kernel (`6.1.0-41-cloud-amd64`).
    pub release: String,
}

fn dir() -> PathBuf {
    workspace_root().join("target/kernels")
}

/// apt-get/apt-cache with a private sources list and state under `at`: the
/// host's own apt state and its installed kernels are never touched.
fn apt(tool: &str, at: &Path) -> Command {
    let mut cmd = Command::new(tool);
    for (opt, path) in [
        ("Dir::Etc::sourcelist", at.join("sources.list")),
        ("Dir::State::Lists", at.join("lists")),
        ("Dir::Cache", at.join("cache")),
        ("Dir::Cache::Archives", at.join("archives")),
    ] {
        cmd.arg("-o").arg(format!("{opt}={}", path.display()));
    }
    cmd.args(["-o", "Dir::Etc::sourceparts=-", "-o", "Debug::NoLocking=1"])
        .current_dir(at)
        .env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A private apt state for `suite` in `target/kernels/SUITE`, updated.
fn private_apt(suite: &str) -> anyhow::Result<PathBuf> {
    let at = dir().join(suite);
    for sub in ["lists/partial", "cache", "archives/partial"] {
        std::fs::create_dir_all(at.join(sub))?;
    }
    let sources = crate::apt::mirrors(suite)?.join("\n") + "\n";
    std::fs::write(at.join("sources.list"), sources)?;
    output(apt("apt-get", &at).args(["-q", "update"]))
        .with_context(|| format!("apt-get update for {suite}"))?;
    Ok(at)
}

/// The suite's current cloud kernel: `linux-image-cloud-amd64`'s versioned
/// dependency, downloaded (once per version) and unpacked. The archive
/// replaces a kernel at each point release, so no exact version is pinned;
/// apt checks the hashes against the signed release files.
pub fn fetch(suite: &'static str) -> anyhow::Result<Kernel> {
    let at = private_apt(suite)?;
    let depends = output(apt("apt-cache", &at).args(["depends", "linux-image-cloud-amd64"]))?;
    let package = depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(|p| p.split_whitespace().next().unwrap_or(p).to_string())
        .find(|p| p.starts_with("linux-image-") && p.ends_with("-cloud-amd64"))
        .with_context(|| {
            format!("{suite}: linux-image-cloud-amd64 depends on no kernel:\n{depends}")
        })?;
    let policy = output(apt("apt-cache", &at).args(["show", "--no-all-versions", &package]))?;
    let version = policy
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .with_context(|| format!("{suite}: no version of {package}"))?
        .trim()
        .to_string();
    let release = package
        .strip_prefix("linux-image-")
        .unwrap_or(&package)
        .to_string();
    let unpacked = at.join(format!("{package}_{version}"));
    let vmlinuz = unpacked.join(format!("boot/vmlinuz-{release}"));
    let config = unpacked.join(format!("boot/config-{release}"));
    if !vmlinuz.is_file() {
        let debs = at.join("debs");
        std::fs::create_dir_all(&debs)?;
        output(
            apt("apt-get", &at)
                .current_dir(&debs)
                .args(["-q", "download", &package]),
        )
        .with_context(|| format!("downloading {package} {version}"))?;
        let deb = std::fs::read_dir(&debs)?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")))
            })
            .with_context(|| format!("{package}: apt-get download left no .deb"))?;
        let _ = std::fs::remove_dir_all(&unpacked);
        // only /boot: the modules are not needed (the guest loads none)
        std::fs::create_dir_all(&unpacked)?;
        crate::run(Command::new("sh").arg("-c").arg(format!(
            "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' ./boot",
            deb.display(),
            unpacked.display()
        )))?;
        std::fs::remove_file(&deb)?;
        if !vmlinuz.is_file() {
            bail!("{package}: no {} in the package", vmlinuz.display());
        }
    }
    Ok(Kernel {
        suite,
        package,
        version,
        vmlinuz,
        config,
        release,
    })
}

/// One fault the guest runs under `probe trace --json`: its name, the
/// shell command, and the primitive (and decisive syscall) it must get on
/// every kernel, as on the host.
pub struct Case {
    pub name: &'static str,
    pub script: &'static str,
    pub primitive: &'static str,
    pub syscall: Option<&'static str>,
    /// Suites whose kernel cannot show the decisive syscall for this case
    /// (the primitive must still be right), and why.
    pub syscall_unseen_on: &'static [&'static str],
}

/// The faults of the matrix. The guest's `/init` prepares what they need
/// (see [`INIT_SETUP`]): a read-only and a full tmpfs, a 0700 directory,
/// pids and memory cgroups, an unprivileged user `nobody`.
pub const CASES: &[Case] = &[
    Case {
        name: "seccomp-errno",
        script: "probe-fault --seccomp errno:mkdir -- mkdir /tmp/made",
        primitive: "seccomp",
        syscall: Some("mkdir"),
        syscall_unseen_on: &[],
    },
    Case {
        name: "seccomp-kill",
        script: "probe-fault --seccomp kill:mkdir -- mkdir /tmp/made",
        primitive: "seccomp",
        syscall: Some("mkdir"),
        // 5.10 kills the task inside seccomp, before raw_syscalls:sys_exit
        // fires; the SIGSYS it raises names no syscall
        syscall_unseen_on: &["bullseye"],
    },
    Case {
        name: "readonly",
        script: "echo result > /ro/out.json",
        primitive: "fs.readonly",
        syscall: Some("openat"),
        syscall_unseen_on: &[],
    },
    Case {
        name: "disk-full",
        script: "dd if=/dev/zero of=/full/big.bin bs=4096 count=64",
        primitive: "fs.space",
        syscall: Some("write"),
        syscall_unseen_on: &[],
    },
    Case {
        name: "permission-as-nobody",
        script: "su -s /bin/sh nobody -c 'cat /secret/key'",
        primitive: "fs.permission",
        syscall: Some("openat"),
        syscall_unseen_on: &[],
    },
    Case {
        name: "pids-limit",
        script: "echo $$ > /sys/fs/cgroup/pids6/cgroup.procs && \
                 for i in 1 2 3 4 5 6 7 8 9 10; do sleep 2 & done; wait",
        primitive: "proc.limit",
        syscall: None,
        syscall_unseen_on: &[],
    },
    Case {
        name: "memory-limit",
        script: "echo $$ > /sys/fs/cgroup/mem32/cgroup.procs && \
                 exec dd if=/dev/zero of=/dev/null bs=96M count=1",
        primitive: "mem.oom",
        syscall: None,
        syscall_unseen_on: &[],
    },
    Case {
        name: "netns-no-route",
        script: "unshare -n sh -c 'echo hi | nc 10.1.2.3 80'",
        primitive: "net.egress",
        syscall: Some("connect"),
        syscall_unseen_on: &[],
    },
    Case {
        name: "missing-command",
        script: "nosuchtool --version",
        primitive: "exec.missing",
        syscall: None,
        syscall_unseen_on: &[],
    },
    Case {
        name: "missing-file",
        script: "cat /data/input.csv",
        primitive: "fs.missing",
        syscall: Some("openat"),
        syscall_unseen_on: &[],
    },
    Case {
        name: "privileged-as-nobody",
        script: "su -s /bin/sh nobody -c 'unshare -m true'",
        primitive: "caps",
        syscall: Some("unshare"),
        syscall_unseen_on: &[],
    },
    Case {
        name: "clean",
        script: "echo ok > /tmp/ok.txt && cat /tmp/ok.txt",
        primitive: "none",
        syscall: None,
        syscall_unseen_on: &[],
    },
    Case {
        name: "coped-with",
        script: "cat /etc/app.conf 2>/dev/null || echo 'no config: defaults'",
        primitive: "none",
        syscall: None,
        syscall_unseen_on: &[],
    },
    Case {
        name: "own-logic",
        script: "ls /etc/app.d >/dev/null 2>&1; echo 'assertion failed: 2 != 3' >&2; exit 3",
        primitive: "none",
        syscall: None,
        syscall_unseen_on: &[],
    },
];

/// What `/init` prepares before the cases.
const INIT_SETUP: &str = r#"
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mkdir -p /sys/fs/cgroup /ro /full /secret /data
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs -o ro tmpfs /ro
mount -t tmpfs -o size=64k tmpfs /full
echo secret > /secret/key && chmod 700 /secret
echo '+pids +memory' > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/pids6 /sys/fs/cgroup/mem32
echo 6 > /sys/fs/cgroup/pids6/pids.max
echo 32M > /sys/fs/cgroup/mem32/memory.max
echo 0 > /sys/fs/cgroup/mem32/memory.swap.max 2>/dev/null
export PATH=/bin HOME=/root
cd /tmp
"#;

/// The guest's `/init`: setup, `probe check`, every case on the rung the
/// kernel offers and again with kernel BTF switched off (`PROBE_BTF=none`),
/// then the daemon with two spans of one session. Each result is one
/// console line `@@RUNG NAME EXIT JSON` (JSON has no raw newlines, so
/// they are removed).
fn init_script() -> String {
    let mut s = String::from("#!/bin/sh\n");
    s.push_str(INIT_SETUP);
    for (rung, env) in [("check", ""), ("check-forced", "PROBE_BTF=none ")] {
        s.push_str(&format!(
            "{env}probe check --json > /tmp/check.json 2>/tmp/check.err; rc=$?\n\
             echo \"@@{rung} - $rc $(tr -d '\\n' < /tmp/check.json)\"\n"
        ));
    }
    for (rung, env) in [("kernel", ""), ("forced", "PROBE_BTF=none ")] {
        for case in CASES {
            let quoted = case.script.replace('\'', r"'\''");
            s.push_str(&format!(
                "{env}probe trace --json -- sh -c '{quoted}' > /tmp/out.json 2>/tmp/err.txt; rc=$?\n\
                 echo \"@@{rung} {} $rc $(tr -d '\\n' < /tmp/out.json)\"\n\
                 [ -s /tmp/out.json ] || sed 's/^/@@err /' /tmp/err.txt | tail -30\n",
                case.name
            ));
        }
    }
    s.push_str(
        r#"probe run --socket /tmp/p.sock --db /tmp/p.db 2>/tmp/daemon.err &
for i in $(seq 100); do [ -S /tmp/p.sock ] && break; sleep 0.1; done
mkdir -p /work
probe span --socket /tmp/p.sock --session t-1 --json -- unshare -m sh -c 'mount -t tmpfs tmpfs /work && echo 1,2 > /work/out.csv' > /tmp/s1.json 2>/dev/null
echo "@@daemon write $? $(tr -d '\n' < /tmp/s1.json)"
probe span --socket /tmp/p.sock --session t-1 --json -- cat /work/out.csv > /tmp/s2.json 2>/dev/null
echo "@@daemon read $? $(tr -d '\n' < /tmp/s2.json)"
[ -s /tmp/s2.json ] || sed 's/^/@@err /' /tmp/daemon.err | tail -5
echo "@@done"
reboot -f
"#,
    );
    s
}

/// Builds an initramfs: busybox (every applet linked), the executables of
/// `dist` (with their libraries when dynamic), `extra` files in `/bin`,
/// each kernel's config under `/boot`, and `init`.
fn initramfs(
    dist: &Path,
    kernels: &[Kernel],
    name: &str,
    init: &str,
    extra: &[&Path],
) -> anyhow::Result<PathBuf> {
    let work = dir().join(name);
    let _ = std::fs::remove_dir_all(&work);
    for sub in ["bin", "boot", "etc", "proc", "sys", "dev", "tmp", "root"] {
        std::fs::create_dir_all(work.join(sub))?;
    }
    std::fs::copy("/bin/busybox", work.join("bin/busybox")).context("copying /bin/busybox")?;
    let list = output(Command::new("/bin/busybox").arg("--list"))?;
    for applet in list.lines().filter(|a| !a.is_empty() && *a != "busybox") {
        std::os::unix::fs::symlink("busybox", work.join("bin").join(applet))?;
    }
    for bin in ["probe", "probe-fault"] {
        let from = dist.join(bin);
        std::fs::copy(&from, work.join("bin").join(bin))
            .with_context(|| format!("copying {bin} from {}", dist.display()))?;
        // a dynamic build (`--bin-dir target/debug`) brings its libraries
        let ldd = Command::new("ldd").arg(&from).output()?;
        for lib in String::from_utf8_lossy(&ldd.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
        {
            let to = work.join(lib.trim_start_matches('/'));
            std::fs::create_dir_all(to.parent().expect("a library path has a parent"))?;
            std::fs::copy(lib, &to).with_context(|| format!("copying {lib}"))?;
        }
    }
    for k in kernels {
        if k.config.is_file() {
            std::fs::copy(&k.config, work.join(format!("boot/config-{}", k.release)))?;
        }
    }
    std::fs::write(
        work.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
    )?;
    std::fs::write(work.join("etc/shadow"), "root::1::::::\nnobody:*:1::::::\n")?;
    std::fs::write(work.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    for file in extra {
        let to = work
            .join("bin")
            .join(file.file_name().context("a file name")?);
        std::fs::copy(file, &to).with_context(|| format!("copying {}", file.display()))?;
    }
    let init_path = work.join("init");
    std::fs::write(&init_path, init)?;
    let init = init_path;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
    let image = dir().join(format!("{name}.cpio.gz"));
    crate::run(Command::new("sh").arg("-c").arg(format!(
        "cd {} && find . | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -1 > {}",
        work.display(),
        image.display()
    )))?;
    Ok(image)
}

/// What one guest printed: its `@@` lines, and the whole console for the
/// failure message.
struct Console {
    lines: Vec<String>,
    text: String,
}

/// Boots `kernel` with `initrd` under QEMU TCG, no disk, no network
/// device, and returns its console once `/init` powered it off.
fn boot(kernel: &Kernel, initrd: &Path) -> anyhow::Result<Console> {
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=10", "600", "qemu-system-x86_64"])
        // one vCPU: with two, a guest once died of a stray int3 while the
        // kernel patched a jump label (TCG does not see the other vCPU's
        // code change in time); the host's own tests cover SMP
        .args(["-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "1"])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        .args(["-serial", "stdio", "-no-reboot"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 quiet panic=-1 psi=1"]);
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    let lines: Vec<String> = text
        .lines()
        .filter_map(|l| l.find("@@").map(|at| l[at + 2..].to_string()))
        .collect();
    if !lines.iter().any(|l| l == "done") {
        bail!(
            "{} {}: the guest did not finish ({}):\n{}",
            kernel.suite,
            kernel.release,
            out.status,
            tail(&text, 60)
        );
    }
    Ok(Console { lines, text })
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// One result line: (rung, name, exit, JSON).
fn parse_line(line: &str) -> Option<(&str, &str, i32, Value)> {
    let mut parts = line.splitn(4, ' ');
    let rung = parts.next()?;
    let name = parts.next()?;
    let rc = parts.next()?.parse().ok()?;
    let json = serde_json::from_str(parts.next().unwrap_or("")).unwrap_or(Value::Null);
    Some((rung, name, rc, json))
}

/// Checks one guest's results; returns the failures, one line each.
fn judge(kernel: &Kernel, console: &Console) -> Vec<String> {
    let mut failures = Vec::new();
    let results: Vec<_> = console.lines.iter().filter_map(|l| parse_line(l)).collect();
    let find = |rung: &str, name: &str| {
        results
            .iter()
            .find(|(r, n, _, _)| *r == rung && *n == name)
            .map(|(_, _, rc, json)| (*rc, json))
    };
    // every one of these kernels has BTF: the top rung, and the lower one
    // when BTF is switched off
    for (what, want_rc, want_rung) in [("check", 0, "btf"), ("check-forced", 2, "tracepoint")] {
        match find(what, "-") {
            Some((rc, json)) if rc == want_rc && json["rung"] == want_rung => {}
            Some((rc, json)) => failures.push(format!(
                "probe {what}: exit {rc}, rung {}, expected exit {want_rc} on the {want_rung} rung: {}",
                json["rung"], json["reason"]
            )),
            None => failures.push(format!("probe {what}: no result")),
        }
    }
    for rung in ["kernel", "forced"] {
        for case in CASES {
            let Some((_, json)) = find(rung, case.name) else {
                failures.push(format!("{rung} {}: no result", case.name));
                continue;
            };
            let primitive = json["primitive"].as_str().unwrap_or("(no JSON)");
            let syscall = json["decisive"]["syscall"].as_str();
            let unseen = case.syscall_unseen_on.contains(&kernel.suite);
            let wrong_syscall = !unseen && case.syscall.is_some_and(|s| syscall != Some(s));
            if primitive != case.primitive || wrong_syscall {
                failures.push(format!(
                    "{rung} {}: {primitive} ({}), expected {} ({}): {}",
                    case.name,
                    syscall.unwrap_or("-"),
                    case.primitive,
                    case.syscall.unwrap_or("-"),
                    json["explanation"]
                ));
            }
        }
    }
    match (find("daemon", "write"), find("daemon", "read")) {
        (Some((_, w)), Some((_, r)))
            if w["failed"] == false && r["primitive"] == "fs.persistence" => {}
        (w, r) => failures.push(format!(
            "daemon: two spans of one session, expected none then fs.persistence: {:?} / {:?}",
            w.map(|(_, j)| j["primitive"].clone()),
            r.map(|(_, j)| j["primitive"].clone())
        )),
    }
    let mut errors: Vec<&String> = Vec::new();
    for line in console.lines.iter().filter(|l| l.starts_with("err ")) {
        if !errors.contains(&line) && !line.contains("verification time") {
            errors.push(line);
        }
    }
    if !failures.is_empty() && !errors.is_empty() {
        failures.push(format!(
            "stderr: {}",
            errors
                .iter()
                .map(|e| &e[4..])
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    failures
}

/// `cargo xtask kernels`: fetch, boot all kernels at once, judge. Prints
/// the exact packages used and one line per kernel; fails on any wrong
/// case. `only` limits the run to some suites.
pub fn run(dist: &Path, only: &[String]) -> anyhow::Result<()> {
    crate::ensure_debian(&PACKAGES)?;
    let suites: Vec<&'static str> = SUITES
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s))
        .collect();
    let started = std::time::Instant::now();
    let kernels = suites
        .iter()
        .map(|s| fetch(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    run_on(dist, &kernels, true)?;
    eprintln!("xtask: kernel matrix took {:.0?}", started.elapsed());
    Ok(())
}

/// Boots `kernels` at once, judges each; `gvisor`: also the gVisor checks.
fn run_on(dist: &Path, kernels: &[Kernel], with_gvisor: bool) -> anyhow::Result<()> {
    for k in kernels {
        eprintln!("xtask: kernel {:<9} {} {}", k.suite, k.package, k.version);
    }
    let initrd = initramfs(dist, kernels, "initramfs", &init_script(), &[])?;
    eprintln!(
        "xtask: booting {} kernels under QEMU (TCG), {} cases each on two rungs",
        kernels.len(),
        CASES.len()
    );
    let consoles: Vec<anyhow::Result<Console>> = std::thread::scope(|scope| {
        let handles: Vec<_> = kernels
            .iter()
            .map(|k| scope.spawn(|| boot(k, &initrd)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("boot thread panicked")))
            })
            .collect()
    });
    let mut failed = Vec::new();
    for (kernel, console) in kernels.iter().zip(consoles) {
        let console = match console {
            Ok(c) => c,
            Err(e) => {
                failed.push(format!("{e:#}"));
                continue;
            }
        };
        std::fs::write(
            dir().join(format!("{}.console", kernel.suite)),
            &console.text,
        )?;
        let wrong = judge(kernel, &console);
        eprintln!(
            "xtask: {:<9} {:<22} {}",
            kernel.suite,
            kernel.release,
            if wrong.is_empty() {
                format!(
                    "all {} cases right on both rungs, daemon fs.persistence",
                    CASES.len()
                )
            } else {
                format!("{} wrong", wrong.len())
            }
        );
        for w in &wrong {
            failed.push(format!("{} {}: {w}", kernel.suite, kernel.release));
        }
    }
    if with_gvisor && let Err(e) = gvisor(dist) {
        failed.push(format!("gVisor: {e:#}"));
    }
    if !failed.is_empty() {
        bail!("the kernel matrix failed:\n  {}", failed.join("\n  "));
    }
    Ok(())
}

/// Under gVisor (`runsc do`, no network) `probe check` and `probe trace`
/// must refuse with exit 125 and one sentence that names gVisor.
fn gvisor(dist: &Path) -> anyhow::Result<()> {
    let probe = dist.join("probe");
    for args in [vec!["check"], vec!["trace", "--", "true"]] {
        let out = Command::new("timeout")
            .args(["120", "runsc", "--network=none", "do"])
            .arg(&probe)
            .args(&args)
            .output()
            .context("running runsc")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said = format!("{stdout}{stderr}");
        if out.status.code() != Some(125) || !said.contains("gVisor") || !said.contains("--gvisor")
        {
            bail!(
                "probe {} under runsc: {}, expected exit 125 naming gVisor and `--gvisor`:\n{}",
                args.join(" "),
                out.status,
                tail(&said, 10)
            );
        }
        let sentence = said.lines().rfind(|l| l.contains("gVisor")).unwrap_or("");
        eprintln!(
            "xtask: runsc  probe {:<12} exit 125: {}",
            args.join(" "),
            sentence.trim()
        );
    }
    Ok(())
}

/// The interpreter's cost, for `cargo xtask bench`: the bookworm (6.1)
/// guest runs the syscall storms unprobed, under `probe trace`, and with
/// the programs attached but the storm untraced (what every task of a
/// guest pays), with the JIT on and then off (`bpf_jit_enable=0`, as in a
/// microVM guest built without BPF_JIT). Ratios are to the unprobed run of
/// the same guest and JIT setting: TCG makes absolute times meaningless.
pub fn jit_bench(dist: &Path, storm: &Path, n: u64, runs: usize) -> anyhow::Result<String> {
    crate::ensure_debian(&PACKAGES)?;
    let kernel = fetch("bookworm")?;
    let mut init = String::from("#!/bin/sh\n");
    init.push_str(INIT_SETUP);
    init.push_str(&format!(
        r#"
one() {{ echo "@@bench $1 $2 $3 $(cat /tmp/e)"; }}
for jit in 1 0; do
  echo $jit > /proc/sys/net/core/bpf_jit_enable
  for round in $(seq {runs}); do
    for what in getppid open-distinct; do
      storm $what {n} /tmp/e; one $jit unprobed $what
      probe trace -- storm $what {n} /tmp/e >/dev/null 2>&1; one $jit traced $what
      probe trace -- sleep 600 >/dev/null 2>&1 &
      p=$!
      sleep 3
      storm $what {n} /tmp/e; one $jit untraced $what
      kill $p; wait $p
    done
  done
done
echo "@@done"
reboot -f
"#
    ));
    let initrd = initramfs(
        dist,
        std::slice::from_ref(&kernel),
        "initramfs-bench",
        &init,
        &[storm],
    )?;
    eprintln!(
        "bench: the interpreter: {} {} under QEMU (TCG), {n} syscalls × {runs} rounds",
        kernel.package, kernel.version
    );
    let console = boot(&kernel, &initrd)?;
    // (jit, mode, storm) -> ns per syscall, one per round
    let mut got: std::collections::BTreeMap<(String, String, String), Vec<f64>> =
        Default::default();
    for line in console
        .lines
        .iter()
        .filter_map(|l| l.strip_prefix("bench "))
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let [jit, mode, what, ns] = w.as_slice()
            && let Ok(ns) = ns.parse::<f64>()
        {
            got.entry((jit.to_string(), mode.to_string(), what.to_string()))
                .or_default()
                .push(ns / n as f64);
        }
    }
    let median = |k: (&str, &str, &str)| {
        let mut v = got
            .get(&(k.0.to_string(), k.1.to_string(), k.2.to_string()))
            .cloned()
            .unwrap_or_default();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let mut out = String::from(
        "## The interpreter (no JIT)\n\n\
         MicroVM guests are often built without BPF_JIT. The 6.1 guest of the kernel \
         matrix (QEMU TCG, so only ratios mean anything) runs each storm unprobed, \
         traced, and untraced with the programs attached, with `net.core.bpf_jit_enable` \
         1 and then 0 (`cargo xtask bench --only kernels`). ns per syscall are medians \
         of the rounds; ratios are to the unprobed run with the same setting.\n\n\
         | storm | JIT | unprobed ns | traced ns (ratio) | untraced, attached ns (ratio) |\n\
         |---|---|---:|---:|---:|\n",
    );
    for what in ["getppid", "open-distinct"] {
        for (jit, label) in [("1", "on"), ("0", "off (interpreter)")] {
            let (Some(base), Some(traced), Some(untraced)) = (
                median((jit, "unprobed", what)),
                median((jit, "traced", what)),
                median((jit, "untraced", what)),
            ) else {
                bail!(
                    "the guest gave no {what} figures with bpf_jit_enable={jit}:\n{}",
                    tail(&console.text, 30)
                );
            };
            out.push_str(&format!(
                "| {what} | {label} | {base:.0} | {traced:.0} ({:.2}×) | {untraced:.0} ({:.2}×) |\n",
                traced / base,
                untraced / base
            ));
        }
    }
    out.push_str(&format!(
        "\nKernel: `{}` {}. The interpreter's extra cost is the difference between the two \
         JIT rows of each storm.\n\n",
        kernel.package, kernel.version
    ));
    Ok(out)
}

/// The kernel config fragment docs/KERNELS.md gives for microVM guests.
pub const GUEST_FRAGMENT: &[&str] = &[
    "CONFIG_BPF_SYSCALL=y",
    "CONFIG_PERF_EVENTS=y",
    "CONFIG_UPROBE_EVENTS=y",
    "CONFIG_BPF_EVENTS=y",
    "CONFIG_FTRACE=y",
    "CONFIG_TRACEPOINTS=y",
    "CONFIG_DEBUG_INFO=y",
    "CONFIG_DEBUG_INFO_DWARF_TOOLCHAIN_DEFAULT=y",
    "CONFIG_DEBUG_INFO_BTF=y",
    // 6.1's BPF_JIT depends on MODULES, which microVM guest configs turn off
    "CONFIG_MODULES=y",
    "CONFIG_BPF_JIT=y",
    "CONFIG_PSI=y",
    "CONFIG_MEMCG=y",
    "CONFIG_IO_URING=y",
];

/// What building a kernel needs (pahole, from dwarves, for BTF).
const BUILD_PACKAGES: [(&str, &str); 7] = [
    ("make", "command -v make"),
    ("gcc", "command -v gcc"),
    ("flex", "command -v flex"),
    ("bison", "command -v bison"),
    ("bc", "command -v bc"),
    ("libelf-dev", "test -f /usr/include/libelf.h"),
    ("dwarves", "command -v pahole"),
];

/// `cargo xtask guest-kernel --config FILE`: the one-time check of the
/// fragment. Builds Debian bookworm's `linux-source-6.1` with a microVM
/// guest config (e.g. Firecracker's microvm-kernel-ci-x86_64-6.1.config,
/// which has no FTRACE, BTF or JIT) plus [`GUEST_FRAGMENT`], then boots
/// the matrix on it. Not part of CI: the build takes most of an hour on
/// two cores.
pub fn guest_kernel(config: &Path, dist: &Path) -> anyhow::Result<()> {
    crate::ensure_debian(&PACKAGES)?;
    crate::ensure_debian(&BUILD_PACKAGES)?;
    crate::ensure_debian(&[("libssl-dev", "test -f /usr/include/openssl/ssl.h")])?;
    let at = private_apt("bookworm")?;
    let work = dir().join("guest");
    std::fs::create_dir_all(&work)?;
    let show =
        output(apt("apt-cache", &at).args(["show", "--no-all-versions", "linux-source-6.1"]))?;
    let version = show
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .context("no version of linux-source-6.1")?
        .trim()
        .to_string();
    let tree = work.join(format!("linux-source-6.1_{version}"));
    if !tree.join("Makefile").is_file() {
        let debs = work.join("debs");
        std::fs::create_dir_all(&debs)?;
        output(apt("apt-get", &at).current_dir(&debs).args([
            "-q",
            "download",
            "linux-source-6.1",
        ]))?;
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(&tree)?;
        crate::run(Command::new("sh").arg("-c").arg(format!(
            "dpkg-deb --fsys-tarfile {debs}/linux-source-6.1_*.deb | tar -xO --wildcards './usr/src/linux-source-6.1.tar.xz' \
             | tar -xJ -C '{tree}' --strip-components=1 && rm -f {debs}/linux-source-6.1_*.deb",
            debs = debs.display(),
            tree = tree.display()
        )))?;
    }
    let mut text =
        std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    text.push_str("\n# docs/KERNELS.md fragment\n");
    for line in GUEST_FRAGMENT {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(tree.join(".config"), text)?;
    crate::run(Command::new("make").current_dir(&tree).arg("olddefconfig"))?;
    let resolved = std::fs::read_to_string(tree.join(".config"))?;
    let lost: Vec<&&str> = GUEST_FRAGMENT
        .iter()
        .filter(|l| !resolved.lines().any(|r| r == **l))
        .collect();
    if !lost.is_empty() {
        bail!(
            "olddefconfig dropped {lost:?}: their dependencies are off in {}",
            config.display()
        );
    }
    let jobs = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .to_string();
    let log = work.join("build.log");
    eprintln!(
        "xtask: building linux-source-6.1 {version} with {} + the fragment ({jobs} jobs; log {})",
        config.display(),
        log.display()
    );
    let started = std::time::Instant::now();
    let status = Command::new("sh")
        .current_dir(&tree)
        .arg("-c")
        .arg(format!("make -j{jobs} bzImage > '{}' 2>&1", log.display()))
        .status()?;
    if !status.success() {
        bail!(
            "the kernel build failed:\n{}",
            tail(&std::fs::read_to_string(&log)?, 30)
        );
    }
    eprintln!("xtask: built in {:.0?}", started.elapsed());
    let release = output(
        Command::new("make")
            .current_dir(&tree)
            .args(["-s", "kernelrelease"]),
    )?
    .trim()
    .to_string();
    let kernel = Kernel {
        suite: "guest",
        package: format!("linux-source-6.1 {version} + {}", config.display()),
        version,
        vmlinuz: tree.join("arch/x86/boot/bzImage"),
        config: tree.join(".config"),
        release,
    };
    run_on(dist, std::slice::from_ref(&kernel), false)
}
