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
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::arch::Arch;
use crate::{output, workspace_root};

/// Debian suites whose current cloud kernel is tested, and for which
/// architectures: arm64 on the two lines arm64 sandboxes boot today
/// (bookworm 6.1, trixie 6.12); bullseye's 5.10 for amd64 only, since an
/// arm64 guest under TCG is several times slower and CI runs them all at once.
pub const MATRIX: [(&str, &[Arch]); 3] = [
    ("bullseye", &[Arch::X86_64]),
    ("bookworm", &[Arch::X86_64, Arch::Aarch64]),
    ("trixie", &[Arch::X86_64, Arch::Aarch64]),
];

/// What `cargo xtask kernels` needs on the host.
pub const PACKAGES: [(&str, &str); 4] = [
    ("qemu-system-x86", "command -v qemu-system-x86_64"),
    ("qemu-system-arm", "command -v qemu-system-aarch64"),
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
    pub arch: Arch,
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

/// The suite's current cloud kernel for `arch`: `linux-image-cloud-ARCH`'s
/// versioned dependency, downloaded (once per version) and unpacked. The
/// archive replaces a kernel at each point release, so no exact version is
/// pinned; apt checks the hashes against the signed release files.
pub fn fetch(suite: &'static str, arch: Arch) -> anyhow::Result<Kernel> {
    let apt = crate::apt::Private::open(suite, arch)?;
    let meta = format!("linux-image-cloud-{}", arch.debian());
    let package = apt
        .depends(&meta)?
        .into_iter()
        .find(|p| {
            p.starts_with("linux-image-") && p.ends_with(&format!("-cloud-{}", arch.debian()))
        })
        .with_context(|| format!("{suite}: {meta} depends on no kernel"))?;
    let version = apt.version(&package)?;
    let release = package
        .strip_prefix("linux-image-")
        .unwrap_or(&package)
        .to_string();
    // only /boot: the modules are not needed (the guest loads none)
    let unpacked = apt.unpack(&package, "./boot")?;
    let vmlinuz = unpacked.join(format!("boot/vmlinuz-{release}"));
    if !vmlinuz.is_file() {
        bail!("{package}: no {} in the package", vmlinuz.display());
    }
    Ok(Kernel {
        suite,
        arch,
        package,
        version,
        config: unpacked.join(format!("boot/config-{release}")),
        vmlinuz,
        release,
    })
}

/// One fault the guest runs under `probe trace --json`: its name, the
/// shell command (`{syscall}` stands for the decisive syscall), and the
/// primitive (and decisive syscall, as x86_64 names it) it must get on
/// every kernel and architecture, as on the host.
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
        script: "probe-fault --seccomp errno:{syscall} -- mkdir /tmp/made",
        primitive: "seccomp",
        syscall: Some("mkdir"),
        syscall_unseen_on: &[],
    },
    Case {
        name: "seccomp-kill",
        script: "probe-fault --seccomp kill:{syscall} -- mkdir /tmp/made",
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

/// The syscall a program makes on `arch` where x86_64's is `name`: arm64
/// has only the `*at` and newer forms (probe's `syscalls::X86_ONLY` holds
/// the full list; these are the ones the cases name).
pub fn syscall_on(arch: Arch, name: &str) -> &str {
    match (arch, name) {
        (Arch::Aarch64, "mkdir") => "mkdirat",
        (Arch::Aarch64, "open") => "openat",
        (Arch::Aarch64, "unlink") => "unlinkat",
        (Arch::Aarch64, "stat") => "newfstatat",
        _ => name,
    }
}

impl Case {
    /// The decisive syscall on `arch`.
    fn syscall_on(&self, arch: Arch) -> Option<&'static str> {
        self.syscall.map(|s| syscall_on(arch, s))
    }

    /// The shell command on `arch`.
    fn script_on(&self, arch: Arch) -> String {
        self.script
            .replace("{syscall}", self.syscall_on(arch).unwrap_or(""))
    }
}

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
fn init_script(arch: Arch, foreign: Option<Arch>) -> String {
    let mut s = String::from("#!/bin/sh\n");
    s.push_str(INIT_SETUP);
    // the other architecture's probe: the kernel refuses it (ENOEXEC),
    // said by the exec, before any program could load
    if let Some(other) = foreign.filter(|o| *o != arch) {
        s.push_str(&format!(
            "probe-fault -- /bin/probe-{other} check > /tmp/f.out 2>&1; \
             echo \"@@foreign - $? $(tr -d '\\n' < /tmp/f.out | head -c 400)\"\n"
        ));
    }
    for (rung, env) in [("check", ""), ("check-forced", "PROBE_BTF=none ")] {
        s.push_str(&format!(
            "{env}probe check --json > /tmp/check.json 2>/tmp/check.err; rc=$?\n\
             echo \"@@{rung} - $rc $(tr -d '\\n' < /tmp/check.json)\"\n"
        ));
    }
    for (rung, env) in [("kernel", ""), ("forced", "PROBE_BTF=none ")] {
        for case in CASES {
            let quoted = case.script_on(arch).replace('\'', r"'\''");
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

/// A static busybox for `arch`: the host's, or Debian's busybox-static of
/// the host's release for the other architecture (the same version, so the
/// host's applet list holds for it).
fn busybox(arch: Arch) -> anyhow::Result<PathBuf> {
    if arch == Arch::host() {
        return Ok(PathBuf::from("/bin/busybox"));
    }
    let apt = crate::apt::Private::open(&crate::apt::host_suite()?, arch)?;
    Ok(apt.unpack("busybox-static", "./bin")?.join("bin/busybox"))
}

/// Builds an initramfs for `arch`: busybox (every applet linked), the
/// executables of `dist` (with their libraries when dynamic), `extra`
/// files in `/bin`, each kernel's config under `/boot`, and `init`.
fn initramfs(
    arch: Arch,
    dist: &Path,
    configs: &[(&Path, &str)],
    name: &str,
    init: &str,
    extra: &[&Path],
) -> anyhow::Result<PathBuf> {
    let work = dir().join(name);
    let _ = std::fs::remove_dir_all(&work);
    for sub in ["bin", "boot", "etc", "proc", "sys", "dev", "tmp", "root"] {
        std::fs::create_dir_all(work.join(sub))?;
    }
    let busybox = busybox(arch)?;
    std::fs::copy(&busybox, work.join("bin/busybox"))
        .with_context(|| format!("copying {}", busybox.display()))?;
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
    for (config, release) in configs {
        if config.is_file() {
            std::fs::copy(config, work.join(format!("boot/config-{release}")))?;
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
    cmd.args(["--kill-after=10", "900"]);
    match kernel.arch {
        Arch::X86_64 => cmd.args(["qemu-system-x86_64", "-cpu", "max"]),
        // `virt` with its PL011 UART; pauth-impdef: QEMU's own pointer
        // authentication hash, several times cheaper under TCG than the
        // architected one (the guest cannot tell)
        Arch::Aarch64 => cmd.args([
            "qemu-system-aarch64",
            "-M",
            "virt",
            "-cpu",
            "max,pauth-impdef=on",
        ]),
    };
    let console = match kernel.arch {
        Arch::X86_64 => "ttyS0",
        Arch::Aarch64 => "ttyAMA0",
    };
    // one vCPU: with two, a guest once died of a stray int3 while the
    // kernel patched a jump label (TCG does not see the other vCPU's code
    // change in time); the host's own tests cover SMP
    cmd.args(["-accel", "tcg", "-m", "1024", "-smp", "1"])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        .args(["-serial", "stdio", "-no-reboot"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args([
            "-append",
            &format!("console={console} quiet panic=-1 psi=1"),
        ]);
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
/// `foreign`: the guest was given the other architecture's probe.
fn judge(kernel: &Kernel, console: &Console, foreign: bool) -> Vec<String> {
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
            let want = case.syscall_on(kernel.arch);
            let wrong_syscall = !unseen && want.is_some_and(|s| syscall != Some(s));
            if primitive != case.primitive || wrong_syscall {
                failures.push(format!(
                    "{rung} {}: {primitive} ({}), expected {} ({}): {}",
                    case.name,
                    syscall.unwrap_or("-"),
                    case.primitive,
                    want.unwrap_or("-"),
                    json["explanation"]
                ));
            }
        }
    }
    match console.lines.iter().find(|l| l.starts_with("foreign ")) {
        Some(line) if line.starts_with("foreign - 125 ") && line.contains("Exec format error") => {}
        Some(line) => failures.push(format!(
            "the other architecture's probe: expected the kernel's ENOEXEC, got: {line}"
        )),
        None if foreign => failures.push("the other architecture's probe: no result".into()),
        None => {}
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
/// case, and on any arm64 verdict that differs from amd64's on the same
/// suite. `dists` holds the executables per architecture (an architecture
/// without them is not booted); `only` limits the run to some suites.
pub fn run(dists: &[(Arch, PathBuf)], only: &[String]) -> anyhow::Result<()> {
    crate::ensure_debian(&PACKAGES)?;
    let started = std::time::Instant::now();
    let mut kernels = Vec::new();
    for (suite, arches) in MATRIX {
        if !(only.is_empty() || only.iter().any(|o| o == suite)) {
            continue;
        }
        for arch in arches.iter().filter(|a| dists.iter().any(|(d, _)| d == *a)) {
            kernels.push(fetch(suite, *arch)?);
        }
    }
    run_on(dists, &kernels, true)?;
    eprintln!("xtask: kernel matrix took {:.0?}", started.elapsed());
    Ok(())
}

/// The executables for `arch` among `dists`.
fn dist_for(dists: &[(Arch, PathBuf)], arch: Arch) -> anyhow::Result<&Path> {
    dists
        .iter()
        .find(|(a, _)| *a == arch)
        .map(|(_, d)| d.as_path())
        .with_context(|| format!("no {arch} executables"))
}

/// Boots `kernels` at once, judges each, and compares each arm64 guest's
/// verdicts with the amd64 guest's of the same suite; `gvisor`: also the
/// gVisor checks.
fn run_on(dists: &[(Arch, PathBuf)], kernels: &[Kernel], with_gvisor: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir())?;
    let mut initrds = Vec::new();
    for arch in Arch::ALL {
        let of_arch: Vec<&Kernel> = kernels.iter().filter(|k| k.arch == arch).collect();
        if of_arch.is_empty() {
            continue;
        }
        for k in &of_arch {
            eprintln!("xtask: kernel {:<9} {} {}", k.suite, k.package, k.version);
        }
        let configs: Vec<(&Path, &str)> = of_arch
            .iter()
            .map(|k| (k.config.as_path(), k.release.as_str()))
            .collect();
        // the other architecture's probe, if built, to see it refused
        let foreign = dists.iter().find(|(a, _)| *a != arch).map(|(a, d)| (*a, d));
        let mut extra = Vec::new();
        if let Some((other, d)) = foreign {
            let copy = dir().join(format!("probe-{other}"));
            std::fs::copy(d.join("probe"), &copy).with_context(|| {
                format!(
                    "copying {} to {}",
                    d.join("probe").display(),
                    copy.display()
                )
            })?;
            extra.push(copy);
        }
        let extra: Vec<&Path> = extra.iter().map(|p| p.as_path()).collect();
        let initrd = initramfs(
            arch,
            dist_for(dists, arch)?,
            &configs,
            &format!("initramfs-{arch}"),
            &init_script(arch, foreign.map(|(a, _)| a)),
            &extra,
        )?;
        initrds.push((arch, initrd));
    }
    eprintln!(
        "xtask: booting {} kernels under QEMU (TCG), {} cases each on two rungs",
        kernels.len(),
        CASES.len()
    );
    let guests: Vec<(&Kernel, &Path)> = kernels
        .iter()
        .map(|k| {
            let initrd = &initrds
                .iter()
                .find(|(a, _)| *a == k.arch)
                .expect("an initramfs per arch")
                .1;
            (k, initrd.as_path())
        })
        .collect();
    let consoles = boot_all(&guests);
    let mut failed = Vec::new();
    let mut judged = Vec::new();
    for (kernel, console) in kernels.iter().zip(consoles) {
        let console = match console {
            Ok(c) => c,
            Err(e) => {
                failed.push(format!("{e:#}"));
                continue;
            }
        };
        std::fs::write(
            dir().join(format!("{}-{}.console", kernel.suite, kernel.arch.debian())),
            &console.text,
        )?;
        let wrong = judge(kernel, &console, dists.len() > 1);
        eprintln!(
            "xtask: {:<9} {:<7} {:<26} {}",
            kernel.suite,
            kernel.arch.debian(),
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
        judged.push((kernel, verdicts(&console)));
    }
    let table = dir().join("matrix.md");
    std::fs::write(&table, matrix_table(&judged))?;
    eprintln!("xtask: the verdicts, case by case: {}", table.display());
    for (kernel, theirs) in judged.iter().filter(|(k, _)| k.arch != Arch::X86_64) {
        let Some((_, ours)) = judged
            .iter()
            .find(|(k, _)| k.arch == Arch::X86_64 && k.suite == kernel.suite)
        else {
            continue;
        };
        let differ = differences(ours, theirs, kernel.arch);
        eprintln!(
            "xtask: {:<9} {} against amd64: {}",
            kernel.suite,
            kernel.arch.debian(),
            if differ.is_empty() {
                format!("the same verdict in all {} results", theirs.len())
            } else {
                format!("{} differ", differ.len())
            }
        );
        for d in differ {
            failed.push(format!(
                "{} {} against amd64: {d}",
                kernel.suite,
                kernel.arch.debian()
            ));
        }
    }
    if with_gvisor && let Err(e) = gvisor(dist_for(dists, Arch::host())?) {
        failed.push(format!("gVisor: {e:#}"));
    }
    if !failed.is_empty() {
        bail!("the kernel matrix failed:\n  {}", failed.join("\n  "));
    }
    Ok(())
}

/// The verdicts as a Markdown table: a row per case, a column per guest
/// (the BTF rung's verdict, then the tracepoint rung's when it differs).
fn matrix_table(judged: &[(&Kernel, Verdicts)]) -> String {
    let mut out = String::from("| case |");
    for (k, _) in judged {
        out.push_str(&format!(
            " {} {} ({}) |",
            k.suite,
            k.arch.debian(),
            k.release
        ));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(judged.len()));
    out.push('\n');
    let cell = |v: &Verdicts, rung: &str, name: &str| {
        v.get(&(rung.to_string(), name.to_string()))
            .map(|(p, s)| match s {
                Some(s) => format!("{p} ({s})"),
                None => p.clone(),
            })
    };
    let names = CASES
        .iter()
        .map(|c| ("kernel", c.name))
        .chain([("daemon", "write"), ("daemon", "read")]);
    for (rung, name) in names {
        out.push_str(&format!("| {name} |"));
        for (_, v) in judged {
            let top = cell(v, rung, name).unwrap_or_else(|| "no result".into());
            let low = (rung == "kernel")
                .then(|| cell(v, "forced", name))
                .flatten();
            match low {
                Some(l) if l != top => out.push_str(&format!(" {top}; tracepoint rung: {l} |")),
                _ => out.push_str(&format!(" {top} |")),
            }
        }
        out.push('\n');
    }
    out
}

/// Boots every (kernel, initramfs) at once; their consoles in that order.
fn boot_all(guests: &[(&Kernel, &Path)]) -> Vec<anyhow::Result<Console>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = guests
            .iter()
            .map(|&(k, initrd)| scope.spawn(move || boot(k, initrd)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("boot thread panicked")))
            })
            .collect()
    })
}

/// One guest's verdicts: (rung, case) → (primitive, decisive syscall).
type Verdicts = std::collections::BTreeMap<(String, String), (String, Option<String>)>;

fn verdicts(console: &Console) -> Verdicts {
    console
        .lines
        .iter()
        .filter_map(|l| parse_line(l))
        .filter(|(rung, ..)| matches!(*rung, "kernel" | "forced" | "daemon"))
        .map(|(rung, name, _, json)| {
            let primitive = json["primitive"]
                .as_str()
                .unwrap_or("(no JSON)")
                .to_string();
            let syscall = json["decisive"]["syscall"].as_str().map(String::from);
            ((rung.to_string(), name.to_string()), (primitive, syscall))
        })
        .collect()
}

/// Where an `arch` guest's verdicts differ from the amd64 guest's: the
/// primitive, and the decisive syscall once x86_64's legacy name is read
/// as the call `arch` makes instead.
fn differences(amd64: &Verdicts, other: &Verdicts, arch: Arch) -> Vec<String> {
    let mut out = Vec::new();
    for (key, (primitive, syscall)) in amd64 {
        let want_syscall = syscall.as_deref().map(|s| syscall_on(arch, s).to_string());
        match other.get(key) {
            Some((p, s)) if p == primitive && *s == want_syscall => {}
            Some((p, s)) => out.push(format!(
                "{} {}: {p} ({}), amd64 {primitive} ({})",
                key.0,
                key.1,
                s.as_deref().unwrap_or("-"),
                syscall.as_deref().unwrap_or("-")
            )),
            None => out.push(format!("{} {}: no result, amd64 {primitive}", key.0, key.1)),
        }
    }
    out
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
            // runsc chowns its stdio to its sandbox's user: an empty pipe,
            // not output()'s default /dev/null (the whole host's)
            .stdin(Stdio::piped())
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
/// guest of each architecture (amd64 and arm64 at once) runs the syscall
/// storms unprobed, under `probe trace`, and with the programs attached but
/// the storm untraced (what every task of a guest pays), with the JIT on
/// and then off (`bpf_jit_enable=0`, as in a microVM guest built without
/// BPF_JIT). Ratios are to the unprobed run of the same guest and JIT
/// setting: TCG makes absolute times meaningless. `targets`: (arch, its
/// dist directory, its static storm executable).
pub fn jit_bench(targets: &[(Arch, &Path, &Path)], n: u64, runs: usize) -> anyhow::Result<String> {
    crate::ensure_debian(&PACKAGES)?;
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
    let mut guests = Vec::new();
    for &(arch, dist, storm) in targets {
        let kernel = fetch("bookworm", arch)?;
        let initrd = initramfs(
            arch,
            dist,
            &[(kernel.config.as_path(), kernel.release.as_str())],
            &format!("initramfs-bench-{arch}"),
            &init,
            &[storm],
        )?;
        eprintln!(
            "bench: the interpreter: {} {} under QEMU (TCG), {n} syscalls × {runs} rounds",
            kernel.package, kernel.version
        );
        guests.push((kernel, initrd));
    }
    let consoles = boot_all(
        &guests
            .iter()
            .map(|(k, initrd)| (k, initrd.as_path()))
            .collect::<Vec<_>>(),
    );
    let mut out = String::from(
        "## The interpreter (no JIT)\n\n\
         MicroVM guests are often built without BPF_JIT (and arm64 microVMs, like \
         the AgentCore sessions of the source article, are microVMs). The 6.1 guests of \
         the kernel matrix, amd64 and arm64 (QEMU TCG, so only ratios mean anything), run \
         each storm unprobed, traced, and untraced with the programs attached, with \
         `net.core.bpf_jit_enable` 1 and then 0 (`cargo xtask bench --only kernels`). ns \
         per syscall are medians of the rounds; ratios are to the unprobed run of the same \
         guest with the same setting.\n\n\
         | arch | storm | JIT | unprobed ns | traced ns (ratio) | untraced, attached ns (ratio) |\n\
         |---|---|---|---:|---:|---:|\n",
    );
    let mut kernels = Vec::new();
    for ((kernel, _), console) in guests.iter().zip(consoles) {
        let console = console?;
        for row in jit_rows(&console, n)? {
            out.push_str(&format!("| {} {row}\n", kernel.arch.debian()));
        }
        kernels.push(format!("`{}` {}", kernel.package, kernel.version));
    }
    out.push_str(&format!(
        "\nKernels: {}. The interpreter's extra cost is the difference between the two \
         JIT rows of each storm.\n\n",
        kernels.join(", ")
    ));
    Ok(out)
}

/// One guest's table rows (after the arch column): per storm and JIT
/// setting, the medians and their ratios to the unprobed run.
fn jit_rows(console: &Console, n: u64) -> anyhow::Result<Vec<String>> {
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
    let mut rows = Vec::new();
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
            rows.push(format!(
                "| {what} | {label} | {base:.0} | {traced:.0} ({:.2}×) | {untraced:.0} ({:.2}×) |",
                traced / base,
                untraced / base
            ));
        }
    }
    Ok(rows)
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
    let apt = crate::apt::Private::open("bookworm", Arch::X86_64)?;
    let work = dir().join("guest");
    std::fs::create_dir_all(&work)?;
    let version = apt.version("linux-source-6.1")?;
    let tree = work.join(format!("linux-source-6.1_{version}"));
    if !tree.join("Makefile").is_file() {
        let source = apt.unpack("linux-source-6.1", "./usr/src")?;
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(&tree)?;
        crate::run(Command::new("sh").arg("-c").arg(format!(
            "tar -xJ -f '{}/usr/src/linux-source-6.1.tar.xz' -C '{}' --strip-components=1",
            source.display(),
            tree.display()
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
        arch: Arch::X86_64,
        package: format!("linux-source-6.1 {version} + {}", config.display()),
        version,
        vmlinuz: tree.join("arch/x86/boot/bzImage"),
        config: tree.join(".config"),
        release,
    };
    run_on(
        &[(Arch::X86_64, dist.to_path_buf())],
        std::slice::from_ref(&kernel),
        false,
    )
}
