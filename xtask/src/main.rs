//! `cargo xtask`: setup, test, dist, image, demo, bench, docs.
//!
//! xtask does not depend on the probe crates, so `setup` runs before the
//! eBPF toolchain exists.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

mod apt;
mod arch;
mod background;
mod bench;
mod browser_demo;
mod campaign;
mod clients;
mod demo;
mod dist;
mod env_bench;
mod evidence;
mod foreign;
mod gvisor_bench;
mod hostd_bench;
mod image;
mod install_step;
mod kernels;
#[allow(dead_code)] // shared with the tests, which use all of it
mod pgcluster;
mod precision;
mod runtimes;
mod soak;
mod stages;
mod toolchain;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Project tasks: setup, test, dist, image, demo, bench, docs."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the build and tests need: the eBPF toolchain pinned in
    /// ebpf-toolchain.toml (a dated nightly with rust-src, and bpf-linker),
    /// Debian packages (iproute2, util-linux, strace, bpftrace, gcc,
    /// musl-tools, gcc-aarch64-linux-gnu and qemu-user-static for the
    /// aarch64 dist, Chromium with its fonts for the campaign's browser domain,
    /// and the sandbox runtimes: bubblewrap, socat, ripgrep, podman, runc,
    /// mmdebstrap), and QEMU (x86 and arm), busybox-static and runsc for the
    /// kernel matrix.
    Setup,
    /// Run every test: unit tests, the Python SDK and conformance clients,
    /// then the kernel, daemon, runtime (srt, podman, bubblewrap),
    /// precision corpus and bridge tests, the x86_64 and aarch64 dist, and
    /// the kernel matrix (amd64 5.10, 6.1, 6.12 and arm64 6.1, 6.12 under
    /// QEMU; gVisor) (as root).
    Test {
        /// Extra arguments for the kernel test binary (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Build probe, probe-fault and agent-bridge as static musl executables
    /// (release) for x86_64 and aarch64 (cross-built here) into
    /// <target dir>/dist/ARCH with SHA256SUMS, and a tarball per
    /// architecture (probe-VERSION-ARCH.tar.gz) with dist/SHA256SUMS.
    Dist {
        /// Only these architectures (x86_64/amd64, aarch64/arm64); default: both.
        #[arg(long, value_enum)]
        target: Vec<arch::Arch>,
    },
    /// The main job: start the probe daemon and bridges, run the generated
    /// campaign against the clean sandbox and a faulty one, print the reports
    /// and the comparison, write HTML (target/campaign/).
    Demo {
        /// Tests in the generated suite.
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// The built-in fault profile of the second run.
        #[arg(long, default_value = "ephemeral")]
        fault: String,
    },
    /// Inject real faults and show `probe trace` attributing each.
    ProbeDemo,
    /// Run the suite under every fault profile and interface fault; write
    /// the confusion matrix to docs/CONFUSION.md.
    Confusion {
        #[arg(long, default_value_t = 200)]
        count: usize,
        /// Do not rewrite docs/CONFUSION.md.
        #[arg(long)]
        no_write: bool,
    },
    /// Real programs failing by their own logic, and failures the sandbox
    /// caused, on the host and on Debian images built with mmdebstrap
    /// (bookworm with a German locale and numpy; trixie with gcc, make and
    /// Node.js): precision and recall per image into docs/CONFUSION.md.
    Precision {
        /// Do not rewrite docs/CONFUSION.md.
        #[arg(long)]
        no_write: bool,
    },
    /// The default campaign against desktop-commander (npm) behind
    /// `agent-bridge proxy`, clean, readonly and no-network, with every
    /// interface bug shrunk to its smallest input; writes docs/FOREIGN.md.
    Foreign {
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// Do not rewrite docs/FOREIGN.md.
        #[arg(long)]
        no_write: bool,
    },
    /// The browser suite against agent-bridge's own browser tools,
    /// @playwright/mcp and chrome-devtools-mcp (through the proxy), clean
    /// and under memory limits of 1024, 700 and 500 MiB with tab-heavy
    /// pages; writes docs/BROWSER-RUNS.md.
    BrowserDemo {
        #[arg(long, default_value_t = 24)]
        count: usize,
        /// Do not rewrite docs/BROWSER-RUNS.md.
        #[arg(long)]
        no_write: bool,
    },
    /// A month, compressed: the probe daemon, `agent-bridge serve` (HTTP,
    /// and stdio under every fault profile) and `agent-bridge proxy` under
    /// campaign loops and hostile clients for N minutes, each killed with
    /// SIGKILL once and restarted, the evidence DB's filesystem filled to
    /// its last megabyte once. Samples RSS, fds, threads, open spans, call
    /// cgroups, DB and WAL, events and drops; checks integrity, lost spans,
    /// orphans and every call's evidence; writes SOAK.md with a plot per
    /// series (as root). A soak stopped early takes its processes with it;
    /// the next one unmounts the tmpfs it left.
    Soak {
        /// How long the load runs.
        #[arg(long, default_value_t = 60.0)]
        minutes: f64,
        /// Seconds between samples.
        #[arg(long, default_value_t = 10)]
        interval: u64,
        /// Tests generated for the suite the loops run (the browser domain is left out).
        #[arg(long, default_value_t = 60)]
        count: usize,
        /// Use the `probe` and `agent-bridge` of this directory instead of
        /// a release build.
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Write SOAK.md and its plots to docs/ (else target/soak/).
        #[arg(long)]
        write: bool,
    },
    /// Measure the probe against unprobed, strace and bpftrace baselines,
    /// the daemon, and the MCP bridge; writes docs/BENCHMARKS.md.
    Bench {
        /// Syscalls per storm run.
        #[arg(long, default_value_t = 2_000_000)]
        n: u64,
        /// Repetitions per configuration (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Do not rewrite docs/BENCHMARKS.md.
        #[arg(long)]
        no_write: bool,
        /// Only this benchmark; its section of docs/BENCHMARKS.md is replaced
        /// and the others are kept.
        #[arg(long, value_parser = ["probe", "kernels", "daemon", "otlp", "bridge", "proxy", "campaign", "fleet", "evidence", "gvisor", "hostd", "env"])]
        only: Option<String>,
        /// Tests in the campaign benchmark.
        #[arg(long, default_value_t = 1000)]
        campaign_tests: usize,
    },
    /// Boot Debian's current cloud kernels of bullseye (5.10), bookworm
    /// (6.1) and trixie (6.12) for amd64, and of bookworm and trixie for
    /// arm64, under QEMU (TCG) with the static executables of `cargo xtask
    /// dist`, run `probe check`, the faults and the daemon inside each, and
    /// require every arm64 verdict to equal amd64's (root; part of `cargo
    /// xtask test`).
    Kernels {
        /// Put the executables of this directory in the guests (this
        /// machine's architecture only); default: `cargo xtask dist`.
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Only these architectures (x86_64/amd64, aarch64/arm64); default: both.
        #[arg(long, value_enum)]
        arch: Vec<arch::Arch>,
        /// Only these suites (bullseye, bookworm, trixie).
        suites: Vec<String>,
    },
    /// Build a microVM guest kernel from Debian's linux-source-6.1 with the
    /// given config plus docs/KERNELS.md's fragment, and boot the kernel
    /// matrix on it (root; the one-time check of the fragment, not CI).
    GuestKernel {
        /// The guest config, e.g. Firecracker's microvm-kernel-ci-x86_64-6.1.config.
        #[arg(long)]
        config: PathBuf,
        /// Put the executables of this directory in the guest;
        /// default: `cargo xtask dist`.
        #[arg(long)]
        bin_dir: Option<PathBuf>,
    },
    /// Regenerate docs/PRIMITIVES.md from the taxonomy in the code.
    Docs,
    /// Build the sandbox image (root): Debian bookworm from mmdebstrap,
    /// cached in target/image/, with probe, agent-bridge, sshd and
    /// sandbox-init installed (docs/IMAGE.md).
    Image {
        /// The image's architecture: aarch64 builds an arm64 image that
        /// boots as a VM under qemu-system-aarch64 (docs/IMAGE.md).
        #[arg(long, value_enum, default_value_t = arch::Arch::X86_64)]
        arch: arch::Arch,
        /// Install the binaries of this directory;
        /// default: the static ones of `cargo xtask dist` for --arch.
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Build the Debian base anew even when the cached one matches.
        #[arg(long)]
        rebuild: bool,
    },
    /// Build (cached) and boot the image under bubblewrap, run the campaign
    /// from the host against the bridge inside, inspect the sandbox over
    /// ssh, import the probe's export into the results DB (root).
    ImageDemo {
        /// Tests in the generated suite.
        #[arg(long, default_value_t = 1000)]
        count: usize,
        #[arg(long, default_value_t = 8)]
        workers: usize,
        /// The sandbox's sshd, on 127.0.0.1.
        #[arg(long, default_value_t = 2222)]
        ssh_port: u16,
        /// The sandbox's agent-bridge, on 127.0.0.1.
        #[arg(long, default_value_t = 8765)]
        bridge_port: u16,
        /// Install the binaries of this directory; default: `cargo xtask dist`.
        #[arg(long)]
        bin_dir: Option<PathBuf>,
    },
    /// Only the image's part of `cargo xtask test` (root); with --arch
    /// aarch64, the arm64 image booted under QEMU.
    ImageTest {
        #[arg(long, value_enum, default_value_t = arch::Arch::X86_64)]
        arch: arch::Arch,
        /// Install the binaries of this directory; default: `cargo xtask dist`.
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        #[arg(long, default_value_t = 30)]
        count: usize,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // before anything else: a user who is not root may not even enter the tree
    match cli.cmd {
        Cmd::Image { .. } => image::require_root("image")?,
        Cmd::ImageDemo { .. } => image::require_root("image-demo")?,
        Cmd::ImageTest { .. } => image::require_root("image-test")?,
        _ => {}
    }
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::Test { args } => {
            setup()?;
            test(&args)
        }
        Cmd::Dist { target } => {
            setup()?;
            let arches = if target.is_empty() {
                arch::Arch::ALL.to_vec()
            } else {
                target
            };
            dist::build_all(&arches).map(drop)
        }
        Cmd::Demo { count, fault } => {
            setup()?;
            campaign::main_job(count, &fault)
        }
        Cmd::ProbeDemo => {
            setup()?;
            demo::run(&build_probe()?)
        }
        Cmd::Precision { no_write } => {
            setup()?;
            precision::precision(!no_write)
        }
        Cmd::Confusion { count, no_write } => {
            setup()?;
            campaign::confusion(count, !no_write)
        }
        Cmd::Foreign { count, no_write } => {
            setup()?;
            foreign::foreign(count, !no_write)
        }
        Cmd::BrowserDemo { count, no_write } => {
            setup()?;
            browser_demo::browser_demo(count, !no_write)
        }
        Cmd::Soak {
            minutes,
            interval,
            count,
            bin_dir,
            write,
        } => {
            let bin = match bin_dir {
                Some(dir) => std::path::absolute(dir)?,
                None => {
                    setup()?;
                    build_release_binaries()?
                }
            };
            let dir = workspace_root().join("target/soak");
            soak::run(&soak::Options {
                minutes,
                interval_s: interval,
                bin,
                out: if write {
                    workspace_root().join("docs")
                } else {
                    dir.join("report")
                },
                dir: dir.join("work"),
                count,
            })
        }
        Cmd::Bench {
            n,
            runs,
            no_write,
            only,
            campaign_tests,
        } => {
            setup()?;
            let mut doc = std::fs::read_to_string("docs/BENCHMARKS.md").unwrap_or_default();
            let started = String::from_utf8_lossy(
                &Command::new("date")
                    .args(["-u", "+%Y-%m-%d %H:%M UTC"])
                    .output()?
                    .stdout,
            )
            .trim()
            .to_string();
            let (run_clock, run_ticks) = (std::time::Instant::now(), bench::cpu_ticks());
            let mut timings = Vec::new();
            for (section, _) in bench::SECTIONS {
                if only.as_deref().is_some_and(|o| o != section) || section == "run" {
                    continue;
                }
                let (clock, ticks) = (std::time::Instant::now(), bench::cpu_ticks());
                let text = match section {
                    "probe" => bench::probe_section(&build_probe_release()?, n, runs)?,
                    "kernels" => bench::kernels_section(
                        &build_probe_release()?,
                        &dist::build_all(&arch::Arch::ALL)?,
                        n,
                        runs,
                    )?,
                    "daemon" => bench::cargo_bench_section("probe", "daemon")?,
                    "otlp" => bench::cargo_bench_section("probe", "otlp")?,
                    "bridge" => bench::cargo_bench_section("agent-bridge", "bridge")?,
                    "proxy" => bench::cargo_bench_section("agent-bridge", "proxy")?,
                    "fleet" => format!(
                        "{}{}",
                        campaign::fleet_bench(campaign_tests)?,
                        bench::cargo_bench_section("agent-bridge-campaign", "ingest")?
                    ),
                    "evidence" => evidence::bench(campaign_tests)?,
                    "gvisor" => gvisor_bench::bench(&build_probe_release()?, runs)?,
                    "hostd" => hostd_bench::bench(campaign_tests)?,
                    "env" => env_bench::bench(&build_probe_release()?)?,
                    _ => campaign::bench(campaign_tests)?,
                };
                print!("{text}");
                doc = bench::splice(&doc, section, &text);
                timings.push((
                    section,
                    clock.elapsed().as_secs_f64(),
                    bench::steal_pct(ticks, bench::cpu_ticks()),
                ));
            }
            if only.is_none() {
                let total = (
                    run_clock.elapsed().as_secs_f64(),
                    bench::steal_pct(run_ticks, bench::cpu_ticks()),
                );
                let text = bench::run_section(&started, &timings, total);
                print!("{text}");
                doc = bench::splice(&doc, "run", &text);
            } else if let Some((section, _, steal)) = timings.first() {
                // the document no longer comes from one run: say so
                let text = format!(
                    "## This run\n\nThe `{section}` section was rerun alone (`cargo xtask bench \
                     --only {section}`, started {started}, CPU steal {steal:.1}%); the other \
                     sections come from an earlier run.\n"
                );
                doc = bench::splice(&doc, "run", &text);
            }
            if !no_write {
                std::fs::write("docs/BENCHMARKS.md", &doc)?;
                eprintln!("xtask: wrote docs/BENCHMARKS.md");
            }
            Ok(())
        }
        Cmd::Docs => docs(),
        Cmd::GuestKernel { config, bin_dir } => {
            kernels::guest_kernel(&config, &image::binaries(arch::Arch::X86_64, bin_dir)?)
        }
        Cmd::Kernels {
            bin_dir,
            arch,
            suites,
        } => {
            let dists = match bin_dir {
                Some(dir) => vec![(arch::Arch::host(), std::path::absolute(dir)?)],
                None => {
                    setup()?;
                    let arches = if arch.is_empty() {
                        arch::Arch::ALL.to_vec()
                    } else {
                        arch
                    };
                    dist::build_all(&arches)?
                }
            };
            kernels::run(&dists, &suites)
        }
        Cmd::Image {
            arch,
            bin_dir,
            rebuild,
        } => image::build(arch, &image::binaries(arch, bin_dir)?, rebuild).map(|_| ()),
        Cmd::ImageDemo {
            count,
            workers,
            ssh_port,
            bridge_port,
            bin_dir,
        } => image::demo(
            count,
            workers,
            image::Ports {
                ssh: ssh_port,
                bridge: bridge_port,
            },
            bin_dir,
        ),
        Cmd::ImageTest {
            arch: arch::Arch::X86_64,
            bin_dir,
            count,
        } => image::test(&image::binaries(arch::Arch::X86_64, bin_dir)?, count),
        Cmd::ImageTest {
            arch: arch::Arch::Aarch64,
            bin_dir,
            count,
        } => image::vm::test(
            &image::binaries(arch::Arch::Aarch64, bin_dir)?,
            &image::binaries(arch::Arch::X86_64, None)?,
            count,
        ),
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// A child process killed (and reaped) on drop.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs a command, failing with its name when it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout; its stderr is in the error.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
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

fn quiet_ok(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

/// (Debian package, shell check that it is installed).
const DEBIAN_PACKAGES: [(&str, &str); 20] = [
    ("bpftool", "command -v bpftool"),
    ("iproute2", "command -v ip"),
    ("util-linux", "command -v unshare"),
    ("strace", "command -v strace"),
    ("bpftrace", "command -v bpftrace"),
    ("gcc", "command -v gcc"),
    // the io_uring tests' workload is linked static (it starts under a
    // seccomp filter that denies openat) and includes <linux/io_uring.h>
    ("libc6-dev", "test -f /usr/lib/x86_64-linux-gnu/libc.a"),
    ("linux-libc-dev", "test -f /usr/include/linux/io_uring.h"),
    ("procps", "command -v ps"),
    // `cargo xtask dist` (musl-gcc for SQLite) and its test (readelf)
    ("musl-tools", "command -v musl-gcc"),
    ("binutils", "command -v readelf"),
    // the aarch64 dist: Debian's cross gcc links it (musl's arm64 headers
    // come unpacked from the archive); its test runs the CLIs in qemu-user
    ("gcc-aarch64-linux-gnu", "command -v aarch64-linux-gnu-gcc"),
    ("qemu-user-static", "command -v qemu-aarch64-static"),
    // the images' bases (both built at once in the test: installed here,
    // not by two threads' apt-get at once)
    ("mmdebstrap", "command -v mmdebstrap"),
    // the arm64 image: mmdebstrap asks arch-test whether qemu-user runs
    // arm64; the VM's disk is made by mkfs.ext4 -d, its ssh rides socat
    ("arch-test", "command -v arch-test"),
    ("e2fsprogs", "command -v mkfs.ext4"),
    ("socat", "command -v socat"),
    // the fleet tests start their own PostgreSQL cluster
    ("postgresql-15", "test -x /usr/lib/postgresql/15/bin/initdb"),
    // the campaign's browser domain, and fonts for its screenshots and PDFs
    ("chromium", "command -v chromium"),
    (
        "fonts-liberation",
        "test -d /usr/share/fonts/truetype/liberation",
    ),
];

fn setup() -> anyhow::Result<()> {
    toolchain::Pin::load(&workspace_root())?.ensure()?;
    ensure_debian(&DEBIAN_PACKAGES)?;
    ensure_debian(&runtimes::PACKAGES)?;
    ensure_debian(&kernels::PACKAGES)
}

/// Installs the Debian packages of `packages` whose check fails, with
/// apt-get (an `apt-get update` and a second try when the first fails).
pub fn ensure_debian(packages: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(_, check)| !quiet_ok(Command::new("sh").args(["-c", check])))
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(" ");
    let what = format!("installing Debian packages: {list}");
    let apt = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    };
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(&missing);
    if install_step::run(&what, &mut apt(&install)).is_ok() {
        return Ok(());
    }
    // the second try may work without it (a mirror that answers again)
    let _ = install_step::run("apt-get update", &mut apt(&["update"]));
    install_step::run(&what, &mut apt(&install)).with_context(|| {
        format!(
            "{list}: not installed, and `apt-get install {list}` failed: \
             install the Debian package(s) by hand or fix the apt sources"
        )
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// What a whole `cargo xtask test` leaves under target/ (the debug, lint,
/// release and two static builds, kernels, images, rootfs), measured on a
/// fresh clone: about 19 GiB.
const TEST_NEEDS_GIB: u64 = 20;

fn test(args: &[String]) -> anyhow::Result<()> {
    let mut stages = stages::Stages::new();
    let result = test_stages(&mut stages, args);
    eprintln!("xtask: where the time went\n{}", stages.table());
    result
}

/// `cargo test` over every package but probe-ebpf (which only builds for
/// BPF), with `targets` (`--lib`, `--test NAME`, ...). Every stage selects
/// the same packages, so cargo resolves the dependencies' features once and
/// builds each crate once; with `-p probe` here and `-p agent-bridge` there,
/// each resolved its own, and a run built the probe crate four times, the
/// bridge twice and the eBPF programs twice.
pub fn cargo_test(targets: &[&str]) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.args(["test", "--workspace", "--exclude", "probe-ebpf"])
        .args(targets);
    cmd
}

fn test_stages(stages: &mut stages::Stages, args: &[String]) -> anyhow::Result<()> {
    // a full disk shows up half an hour in as a linker error: say it now
    // (on a fresh clone, before the lints make target/no-ebpf; a second run
    // reuses most of what the first built)
    let free_gib = soak::sample::free_bytes(&workspace_root()) >> 30;
    if free_gib < TEST_NEEDS_GIB && !workspace_root().join("target/no-ebpf").exists() {
        bail!(
            "cargo xtask test needs about {TEST_NEEDS_GIB} GiB free on the filesystem of {} \
             (its builds, kernels and images go under target/); it has {free_gib} GiB. \
             Free some (old clones, other target/ directories) and run it again",
            workspace_root().display()
        );
    }
    // lints, on the build a machine without the eBPF toolchain gets
    // (AYA_BUILD_SKIP=1: no pinned nightly, no bpf-linker called)
    stages.run("lints (clippy, without eBPF)", || {
        run(Command::new("cargo")
            .args(["clippy", "--all-targets", "--", "-D", "warnings"])
            .env("AYA_BUILD_SKIP", "1")
            .env("CARGO_TARGET_DIR", workspace_root().join("target/no-ebpf")))
    })?;
    stages.run("unit tests, and every test built", || {
        run(&mut cargo_test(&["--lib", "--bins"]))?;
        run(&mut cargo_test(&["--test", "docs"]))?;
        // every test binary, and the executables they start, once
        run(&mut cargo_test(&["--no-run"]))
    })?;
    let bridge = workspace_root().join("target/debug/agent-bridge");
    // independent MCP clients against the real bridge binary
    stages.run("MCP clients (Python SDK, conformance)", || {
        clients::install()?;
        clients::python_sdk(&bridge)?;
        clients::conformance(&bridge)
    })?;
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if !is_root() {
        if ci {
            bail!("kernel tests need root and CI=true: refusing to skip them");
        }
        eprintln!("xtask: NOT ROOT — kernel tests skipped (run `sudo -E cargo xtask test`)");
        return Ok(());
    }
    // runsc: the bridge test under gVisor; QEMU and busybox: the kernel matrix
    stages.run("Debian packages", || ensure_debian(&kernels::PACKAGES))?;
    // the release executables the last stages test, built meanwhile on
    // the CPU the tests leave idle
    let dist_log = workspace_root().join("target/dist-build.log");
    eprintln!(
        "xtask: building the release executables in the background (nice 19; output: {})",
        dist_log.display()
    );
    let dists = dist::build_all_in_background(&arch::Arch::ALL, dist_log)?;
    // the images' Debian bases too (arm64's first: dpkg under qemu-user,
    // the longest), which the last stage boots
    let bases = image::bases_in_background(&[arch::Arch::Aarch64, arch::Arch::X86_64])?;
    // the bridge (and the proxy) through rmcp's client, and every profile on the real kernel
    stages.run(
        "bridge, campaign, proxy, foreign servers, fleet, fuzz",
        || {
            run(&mut cargo_test(&[
                "--test", "bridge", "--test", "profiles", "--test", "campaign",
                // foreign MCP servers behind `agent-bridge proxy`
                "--test", "proxy", "--test", "foreign",
                // runs over many targets; runners sharing a run in PostgreSQL
                "--test", "fleet",
                // mcp-fuzzer against serve (stdio, HTTP) and the proxy
                "--test", "fuzz",
            ]))
        },
    )?;
    stages.run("probe: kernel, daemon, pidns, otlp; gVisor", || {
        let mut cmd = cargo_test(&[
            "--test",
            "kernel",
            "--test",
            "daemon",
            // the probe inside a PID namespace (a container-like sandbox)
            "--test",
            "pidns",
            // spans exported over OTLP/HTTP to a local receiver
            "--test",
            "otlp",
            // gVisor sandboxes (runsc), the probe as their runtime monitor;
            // and the bridge inside gVisor, the host daemon its monitor
            // (both packages' `gvisor` tests)
            "--test",
            "gvisor",
            "--",
            "--test-threads=1",
        ]);
        run(cmd.args(args))
    })?;
    // the probe under the sandbox runtimes platforms ship: srt, podman,
    // bubblewrap with its own PID namespace
    stages.run("sandbox runtimes, one host daemon, environments", || {
        let installed = runtimes::install()?;
        run(cargo_test(&["--test", "runtimes", "--", "--test-threads=1"]).envs(installed.env()))?;
        // one host daemon serving bridges in a podman and a bubblewrap
        // container at once, each confined to its own sandbox; the
        // environment snapshot of a bubblewrap sandbox, and a compare that
        // ties the tests that broke there to the differences planted in it
        run(cargo_test(&[
            "--test",
            "hostd",
            "--test",
            "environment",
            "--",
            "--test-threads=1",
        ])
        .envs(installed.env()))?;
        run(&mut cargo_test(&["--test", "env"]))
    })?;
    // precision on images nobody tuned it for: own-logic failures are
    // `none`, sandbox-caused ones keep their primitive
    stages.run("precision corpus", || {
        let manifest = precision::images()?;
        if !precision::run_test(&manifest, None)? {
            bail!("the precision corpus failed");
        }
        Ok(())
    })?;
    // the static release executables, static by their ELF headers and
    // working in an empty root (no libc, no /bin/sh)
    let dists = stages.run("release executables (the rest of their build)", || {
        dists
            .join()
            .map_err(|_| anyhow::anyhow!("building the release executables panicked"))?
    })?;
    let dist = dists[0].1.clone();
    stages.run("release executables: tests", || {
        run(cargo_test(&["--test", "dist"])
            .env("DIST_DIR", &dist)
            .env("DIST_DIR_AARCH64", &dists[1].1))
    })?;
    // those executables on the kernels sandboxes boot (5.10, 6.1, 6.12
    // under QEMU, amd64 and arm64, both rungs) and under gVisor, where the
    // probe refuses
    stages.run("kernel matrix (QEMU) and gVisor", || {
        kernels::run(&dists, &[])
    })?;
    stages.run("image stage: soak, amd64 image, arm64 VM", || {
        image_stage(&dists, bases)
    })
}

/// A short soak of the release executables (kills, a full disk, hostile
/// clients) beside the image tests, which mostly wait on dpkg and QEMU: the
/// sandbox image with those executables installed, booted, then the arm64
/// image booted as a VM under qemu-system-aarch64.
fn image_stage(
    dists: &[(arch::Arch, PathBuf)],
    bases: std::thread::JoinHandle<anyhow::Result<Vec<PathBuf>>>,
) -> anyhow::Result<()> {
    let dist = dists[0].1.clone();
    let soak_dir = workspace_root().join("target/soak");
    let soak = {
        let options = soak::Options {
            minutes: 4.0,
            interval_s: 5,
            bin: dist.clone(),
            dir: soak_dir.join("work"),
            out: soak_dir.join("report"),
            count: 40,
        };
        std::thread::spawn(move || soak::run(&options))
    };
    // the tests wait on the images' bases now: what is left of their build
    // runs at the normal priority
    let raised = background::raise_to_normal();
    if raised > 0 {
        eprintln!("xtask: the images' bases still building: {raised} processes raised to nice 0");
    }
    let bases = bases
        .join()
        .map_err(|_| anyhow::anyhow!("building the images' bases panicked"))
        .and_then(|built| built);
    let images = bases.and_then(|_| {
        image::test(&dist, 30)?;
        image::vm::test(&dists[1].1, &dist, 20)
    });
    let soak = soak
        .join()
        .map_err(|_| anyhow::anyhow!("the soak panicked"))?
        .context("the short soak (report: target/soak/report/SOAK.md)");
    images.and(soak)
}

/// Builds probe and agent-bridge (release) and returns their directory.
pub fn build_release_binaries() -> anyhow::Result<PathBuf> {
    run(Command::new("cargo").args([
        "build",
        "--release",
        "-p",
        "probe",
        "-p",
        "agent-bridge",
        "--bins",
    ]))?;
    Ok(workspace_root().join("target/release"))
}

/// Builds the probe binaries (debug) and returns the target directory.
pub fn build_probe() -> anyhow::Result<PathBuf> {
    run(Command::new("cargo").args(["build", "-p", "probe", "--bins"]))?;
    Ok(workspace_root().join("target/debug"))
}

/// Builds the probe binaries (release) and returns the target directory.
pub fn build_probe_release() -> anyhow::Result<PathBuf> {
    run(Command::new("cargo").args(["build", "--release", "-p", "probe", "--bins"]))?;
    Ok(workspace_root().join("target/release"))
}

fn docs() -> anyhow::Result<()> {
    let out = Command::new("cargo")
        .args(["run", "-q", "-p", "probe", "--", "primitives"])
        .output()?;
    if !out.status.success() {
        bail!(
            "probe primitives failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::create_dir_all("docs")?;
    std::fs::write("docs/PRIMITIVES.md", &out.stdout)?;
    eprintln!("xtask: wrote docs/PRIMITIVES.md");
    Ok(())
}
