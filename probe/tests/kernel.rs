//! Kernel tests: each injects a real fault (seccomp filter, mount, cgroup
//! limit, network namespace, user), runs a workload under `probe trace
//! --json`, and asserts the attributed primitive and syscall.
//!
//! They need root. Without root they are skipped with a message, except
//! under CI=true, where a missing capability is a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{FAULT, PROBE, Traced, ci, parse, root, trace_env, trace_with};

fn trace(cmd: &[&str]) -> Traced {
    trace_with(&[], cmd)
}

fn sh(script: &str) -> Traced {
    trace(&["sh", "-c", script])
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("probe-kt-")
        .tempdir()
        .expect("tempdir")
}

// ------------------------------------------------------------------ seccomp

#[test]
fn seccomp_errno_is_attributed_with_path() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let target = dir.path().join("out");
    let t = trace(&[
        FAULT,
        "--seccomp",
        "errno:mkdir",
        "--",
        "mkdir",
        target.to_str().unwrap(),
    ]);
    t.expect("seccomp", Some("mkdir"));
    assert_eq!(t.decisive("kind"), Some("seccomp_denied"));
    assert_eq!(t.decisive("errno"), Some("EPERM"));
    assert_eq!(t.decisive("path"), target.to_str());
    assert!(
        t.json["explanation"]
            .as_str()
            .unwrap()
            .contains("seccomp filter"),
        "{}",
        t.context()
    );
    assert_eq!(t.code, Some(1));
}

#[test]
fn seccomp_kill_process_is_attributed() {
    if !root() {
        return;
    }
    let t = trace(&[
        FAULT,
        "--seccomp",
        "kill:socket",
        "--",
        "python3",
        "-c",
        "import socket; socket.socket()",
    ]);
    t.expect("seccomp", Some("socket"));
    assert_eq!(t.json["exit"]["signal"], "SIGSYS", "{}", t.context());
    assert_eq!(t.code, Some(128 + 31));
}

#[test]
fn seccomp_trap_is_attributed() {
    if !root() {
        return;
    }
    let t = trace(&[
        FAULT,
        "--seccomp",
        "trap:socket",
        "--",
        "python3",
        "-c",
        "import socket; socket.socket()",
    ]);
    t.expect("seccomp", Some("socket"));
    let events = t.json["events"].as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "signal" && e["signal"] == "SIGSYS" && e["si_code"] == 1),
        "no SIGSYS/SYS_SECCOMP signal event: {}",
        t.context()
    );
}

#[test]
fn seccomp_errno_with_custom_errno_in_a_child_process() {
    if !root() {
        return;
    }
    // the filter is installed in a child of the traced shell: inherited span
    let dir = tempdir();
    let f = dir.path().join("f");
    std::fs::write(&f, "x").unwrap();
    let script = format!(
        "{FAULT} --seccomp errno=EACCES:unlink,unlinkat -- rm {}; exit 4",
        f.display()
    );
    let t = sh(&script);
    t.expect("seccomp", Some("unlinkat"));
    assert_eq!(t.decisive("errno"), Some("EACCES"));
    assert_eq!(t.code, Some(4));
}

// ------------------------------------------------------------------ filesystem

#[test]
fn readonly_mount_is_fs_readonly() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let d = dir.path().display();
    let t = trace(&[
        "unshare",
        "-m",
        "sh",
        "-c",
        &format!("mount -t tmpfs -o ro tmpfs {d} && touch {d}/result.json"),
    ]);
    t.expect("fs.readonly", Some("openat"));
    assert_eq!(t.decisive("errno"), Some("EROFS"));
    assert_eq!(
        t.decisive("path"),
        Some(format!("{d}/result.json").as_str())
    );
}

#[test]
fn root_owned_0700_dir_is_fs_permission_for_nobody() {
    if !root() {
        return;
    }
    let dir = tempdir(); // 0700, owned by root
    let f = dir.path().join("f");
    let t = trace(&[
        "setpriv",
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "touch",
        f.to_str().unwrap(),
    ]);
    t.expect("fs.permission", Some("openat"));
    assert_eq!(t.decisive("errno"), Some("EACCES"));
}

#[test]
fn full_tmpfs_is_fs_space_and_names_the_file() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let d = dir.path().display();
    let t = trace(&[
        "unshare",
        "-m",
        "sh",
        "-c",
        &format!(
            "mount -t tmpfs -o size=1m tmpfs {d} && dd if=/dev/zero of={d}/blob bs=64k count=64 status=none"
        ),
    ]);
    t.expect("fs.space", Some("write"));
    assert_eq!(t.decisive("errno"), Some("ENOSPC"));
    assert_eq!(
        t.decisive("path"),
        Some(format!("{d}/blob").as_str()),
        "{}",
        t.context()
    );
}

#[test]
fn noexec_mount_is_fs_noexec() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let d = dir.path().display();
    let t = trace(&[
        "unshare",
        "-m",
        "sh",
        "-c",
        &format!("mount -t tmpfs -o noexec tmpfs {d} && cp /bin/true {d}/tool && {d}/tool"),
    ]);
    t.expect("fs.noexec", Some("execve"));
    assert_eq!(t.code, Some(126));
}

#[test]
fn noexec_of_a_long_lived_mount_is_found_in_mountinfo() {
    if !root() {
        return;
    }
    // the mount exists before the span (as a sandbox's /tmp would): no mount
    // event in the span, so mountinfo has to tell
    let dir = tempdir();
    let d = dir.path().display().to_string();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "noexec", "tmpfs", &d])
        .status()
        .unwrap();
    assert!(mounted.success());
    std::fs::copy("/bin/true", dir.path().join("tool")).unwrap();
    let t = trace(&[&format!("{d}/tool")]);
    let _ = Command::new("umount").arg(&d).status();
    t.expect("fs.noexec", Some("execve"));
}

#[test]
fn missing_command_is_exec_missing() {
    if !root() {
        return;
    }
    let t = trace(&["agentctl-not-installed", "--version"]);
    t.expect("exec.missing", Some("execve"));
    assert_eq!(t.code, Some(127));
    // through a shell, which searches PATH with stat
    let t = sh("agentctl-not-installed --version");
    t.expect("exec.missing", None);
    assert_eq!(t.code, Some(127));
}

/// A missing command the shell said was not found, then went on past
/// (`…; true`): exit 0, and the hidden failure is the missing command,
/// named from the shell's own words. Silenced, the script dealt with it.
#[test]
fn a_missing_command_the_shell_went_on_past_is_a_hidden_exec_missing() {
    if !root() {
        return;
    }
    for _ in 0..3 {
        let t = sh("agentctl-not-installed --version; true");
        assert_eq!(t.code, Some(0));
        assert_eq!(t.primitive(), "none", "{}", t.json);
        let hidden = &t.json["hidden_failure"];
        assert_eq!(hidden["primitive"], "exec.missing", "{}", t.json);
        assert!(
            hidden["explanation"]
                .as_str()
                .is_some_and(|e| e.contains("`agentctl-not-installed`")),
            "{hidden}"
        );
    }
    let t = sh("agentctl-not-installed --version 2>/dev/null; true");
    assert_eq!(t.primitive(), "none", "{}", t.json);
    assert!(t.json["hidden_failure"].is_null(), "{}", t.json);
}

#[test]
fn missing_data_file_is_fs_missing_not_module_search_noise() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let f = dir.path().join("input.csv");
    let t = trace(&[
        "python3",
        "-c",
        &format!("open({:?}).read()", f.to_str().unwrap()),
    ]);
    t.expect("fs.missing", Some("openat"));
    assert_eq!(t.decisive("path"), f.to_str());
    // the kernel sends failures without comm; the process is named from its exec
    assert_eq!(t.decisive("comm"), Some("python3"), "{}", t.context());
    let t = trace(&["cat", f.to_str().unwrap()]);
    t.expect("fs.missing", Some("openat"));
    assert_eq!(t.decisive("comm"), Some("cat"), "{}", t.context());
    assert!(
        t.json["explanation"]
            .as_str()
            .unwrap_or("")
            .contains("in cat (pid "),
        "{}",
        t.context()
    );
}

// ------------------------------------------------------------------ repeated failures

#[test]
fn identical_failures_are_one_event_with_a_count_and_distinct_ones_are_not() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let f = dir.path().join("input.csv");
    // a retry loop: the same failing open 1000 times on one thread
    let t = trace(&[
        "python3",
        "-c",
        &format!(
            "import sys\nfor _ in range(1000):\n    try: open({:?})\n    except OSError as e: err = e\nsys.exit(str(err))",
            f.to_str().unwrap()
        ),
    ]);
    t.expect("fs.missing", Some("openat"));
    assert_eq!(t.decisive("path"), f.to_str(), "{}", t.context());
    assert_eq!(t.json["decisive"]["repeats"], 999, "{}", t.context());
    assert!(
        t.json["counts"]["repeated"].as_u64().unwrap_or(0) >= 999,
        "{}",
        t.json["counts"]
    );
    assert_eq!(t.json["drops"]["kernel"], 0);
    // no two alike: every one is its own event, with its own path
    let t = trace(&[
        "python3",
        "-c",
        &format!(
            "import sys\nfor i in range(300):\n    try: open({:?} + str(i))\n    except OSError as e: err = e\nsys.exit(str(err))",
            f.to_str().unwrap()
        ),
    ]);
    t.expect("fs.missing", Some("openat"));
    assert_eq!(
        t.decisive("path").map(String::from),
        Some(format!("{}299", f.to_str().unwrap())),
        "{}",
        t.context()
    );
    t.expect_distinct_failures(300);
}

#[test]
fn paths_of_every_length_arrive_whole_long_and_short_in_any_order() {
    if !root() {
        return;
    }
    // word boundaries of the 8-byte copy, and short paths right after long
    // ones (nothing of the longer one may show in the shorter's tail)
    let lengths = [240, 1, 17, 9, 8, 7, 16, 15, 241, 2, 242];
    let t = trace(&[
        "python3",
        "-c",
        &format!(
            "import sys\nfor k in {lengths:?}:\n    try: open('/nonexistent/' + 'p' * k)\n    except OSError as e: err = e\nsys.exit(str(err))"
        ),
    ]);
    t.expect("fs.missing", Some("openat"));
    let got: Vec<&str> = t.json["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["path"].as_str())
        .filter(|p| p.starts_with("/nonexistent/"))
        .collect();
    let want: Vec<String> = lengths
        .iter()
        .map(|&k| format!("/nonexistent/{}", "p".repeat(k)))
        .collect();
    assert_eq!(got, want, "{}", t.context());
    assert_eq!(t.json["drops"]["kernel"], 0);
}

#[test]
fn a_path_longer_than_the_record_arrives_cut_and_says_so() {
    if !root() {
        return;
    }
    // the record holds 255 bytes of path: one of exactly 255 is whole, one
    // of 256 and one of 600 (three components) are cut and flagged, and so
    // is a program executed by a 300-byte path
    let dir = tempdir();
    let prefix = "/nonexistent/";
    let long = format!(
        "{prefix}{}/{}/{}",
        "q".repeat(200),
        "r".repeat(200),
        "s".repeat(185)
    );
    let paths = [
        format!("{prefix}{}", "p".repeat(255 - prefix.len())),
        format!("{prefix}{}", "p".repeat(256 - prefix.len())),
        long,
    ];
    let base = dir.path().to_str().unwrap();
    let deep = format!("{base}/{}", "d".repeat(250));
    std::fs::create_dir(&deep).unwrap();
    let program = format!("{deep}/{}", "t".repeat(300 - deep.len() - 1));
    std::os::unix::fs::symlink("/bin/true", &program).unwrap();
    assert_eq!(program.len(), 300);
    let t = trace_with(
        &["--events"],
        &[
            "python3",
            "-c",
            &format!(
                "import os, subprocess, sys\nfor p in {paths:?}:\n    try: open(p)\n    except OSError: pass\nsubprocess.run([{program:?}])\nsys.exit(1)"
            ),
        ],
    );
    let events = t.json["events"].as_array().expect("events");
    // (kind, path, flagged) of every event with a path
    let seen: Vec<(&str, &str, bool)> = events
        .iter()
        .filter_map(|e| {
            let flagged = match e.get("path_truncated") {
                None => false,
                Some(v) => v.as_bool().expect("a bool"),
            };
            Some((e["kind"].as_str()?, e["path"].as_str()?, flagged))
        })
        .collect();
    let has = |kind: &str, whole: &str, flagged: bool| {
        let cut = &whole[..whole.len().min(255)];
        assert!(
            seen.contains(&(kind, cut, flagged)),
            "no {kind} event with {cut} (cut: {flagged}): {}",
            t.context()
        );
    };
    // the first two share their 255 bytes: the flag tells them apart
    has("syscall_failed", &paths[0], false);
    has("syscall_failed", &paths[1], true);
    has("syscall_failed", &paths[2], true);
    has("exec", &program, true);
    assert_eq!(t.json["drops"]["kernel"], 0);
}

#[test]
fn cut_paths_that_differ_past_the_cut_are_each_their_own_failure() {
    if !root() {
        return;
    }
    // 300 failing opens whose paths share their first 300 bytes: cut at
    // 255, they look alike, but they are 300 different files, not one
    // failure repeated
    let stem = format!("/nonexistent/{}", "m".repeat(300));
    let t = trace(&[
        "python3",
        "-c",
        &format!(
            "import sys\nfor i in range(300):\n    try: open({stem:?} + str(i))\n    except OSError as e: err = e\nsys.exit(str(err))"
        ),
    ]);
    t.expect("fs.missing", Some("openat"));
    assert_eq!(t.decisive("path"), Some(&stem[..255]), "{}", t.context());
    assert_eq!(
        t.json["decisive"]["path_truncated"],
        true,
        "{}",
        t.context()
    );
    t.expect_distinct_failures(300);
    assert_eq!(t.json["drops"]["kernel"], 0);
}

#[test]
fn short_lived_processes_one_after_another_are_each_traced_as_themselves() {
    if !root() {
        return;
    }
    // each cat often runs on the kernel stack the previous one just gave
    // back: the syscall programs' per-CPU task cache must not take it for
    // the dead one
    let n = 60;
    let t = trace_with(
        &["--events"],
        &[
            "sh",
            "-c",
            &format!(
                "for i in $(seq 1 {n}); do cat /nonexistent/child-$i 2>/dev/null; done; exit 1"
            ),
        ],
    );
    let events = t.json["events"].as_array().expect("events");
    let cats: std::collections::HashSet<u64> = events
        .iter()
        .filter(|e| e["kind"] == "exec" && e["comm"] == "cat")
        .filter_map(|e| e["pid"].as_u64())
        .collect();
    let mut by_path = std::collections::HashMap::new();
    for e in events {
        if let Some(p) = e["path"]
            .as_str()
            .filter(|p| p.starts_with("/nonexistent/child-"))
        {
            by_path.insert(
                p.to_string(),
                (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()),
            );
        }
    }
    assert_eq!(cats.len(), n, "one exec per cat: {}", t.context());
    assert_eq!(by_path.len(), n, "every cat's failure: {}", t.context());
    let pids: std::collections::HashSet<u64> = by_path.values().map(|&(p, _)| p).collect();
    assert_eq!(
        pids, cats,
        "each failure under the pid of the cat that made it"
    );
    assert!(by_path.values().all(|&(p, tid)| p == tid));
    assert_eq!(t.json["drops"]["kernel"], 0);
}

#[test]
fn a_child_on_the_kernel_stack_of_one_that_died_on_another_cpu_is_traced_as_itself() {
    if !root() {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2 || !ci(),
        "this test needs two CPUs, and CI=true forbids skipping it"
    );
    if cpus < 2 {
        eprintln!("SKIPPED: needs two CPUs");
        return;
    }
    // The parent forks on CPU 1; each child moves to CPU 0, fails an open
    // there, and goes back to CPU 1 to exit, so its kernel stack returns to
    // CPU 1's cache for the next child, while CPU 0's task cache still holds
    // that stack's last syscall. Only the exit's invalidation keeps CPU 0
    // from naming the dead child when the next one arrives on its stack.
    let dir = tempdir();
    let pids = dir.path().join("pids");
    let n = 200;
    let script = format!(
        "import os\nos.sched_setaffinity(0, {{1}})\nout = []\nfor i in range({n}):\n    pid = os.fork()\n    if pid == 0:\n        os.sched_setaffinity(0, {{0}})\n        try: os.open('/nonexistent/pinned-%d' % i, os.O_RDONLY)\n        except OSError: pass\n        os.sched_setaffinity(0, {{1}})\n        os._exit(0)\n    os.waitpid(pid, 0)\n    out.append(str(pid))\nopen({:?}, 'w').write(' '.join(out))\nraise SystemExit(1)",
        pids.to_str().unwrap()
    );
    let t = trace_with(&["--events"], &["python3", "-c", &script]);
    let forked: Vec<u64> = std::fs::read_to_string(&pids)
        .expect("the parent's list of children")
        .split(' ')
        .map(|p| p.parse().unwrap())
        .collect();
    let mut seen = std::collections::HashMap::new();
    for e in t.json["events"].as_array().expect("events") {
        if let Some(i) = e["path"]
            .as_str()
            .and_then(|p| p.strip_prefix("/nonexistent/pinned-"))
        {
            seen.insert(i.parse::<usize>().unwrap(), e["pid"].as_u64().unwrap());
        }
    }
    let wrong: Vec<String> = (0..n)
        .filter(|&i| seen.get(&i) != Some(&forked[i]))
        .map(|i| format!("child {i} (pid {}): {:?}", forked[i], seen.get(&i)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {n} children: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    assert_eq!(t.json["drops"]["kernel"], 0);
}

#[test]
fn repeats_of_a_process_still_running_at_the_end_are_counted() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let f = dir.path().join("lock");
    // the root exits while its child is inside a run of identical failures:
    // the run is still pending in the kernel when tracing stops
    let script = format!(
        "python3 -c 'import time\nend = time.time() + 3\nwhile time.time() < end:\n    try: open(\"{}\")\n    except OSError: pass' &\nsleep 1; exit 0",
        f.to_str().unwrap()
    );
    let t = sh(&script);
    let repeated = t.json["counts"]["repeated"].as_u64().unwrap_or(0);
    assert!(
        repeated > 100,
        "pending repeats were lost: {}",
        t.json["counts"]
    );
    assert_eq!(t.json["drops"]["kernel"], 0);
}

// ------------------------------------------------------------------ privileges, limits

#[test]
fn unprivileged_unshare_is_caps() {
    if !root() {
        return;
    }
    let t = trace(&[
        "setpriv",
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "unshare",
        "-m",
        "true",
    ]);
    t.expect("caps", Some("unshare"));
    assert_eq!(t.decisive("errno"), Some("EPERM"));
}

/// A cgroup of one controller, v1 or v2, removed on drop (after killing
/// whatever is left in it).
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// `settings` are (v1 file, v2 file, value).
    fn new(controller: &str, settings: &[(&str, &str, &str)]) -> Cgroup {
        let name = format!("probe-test-{}-{controller}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup").join(controller);
        if v1.join("cgroup.procs").exists() && !v1.join("cgroup.controllers").exists() {
            let dir = v1.join(&name);
            std::fs::create_dir_all(&dir).unwrap();
            for (file, _, value) in settings {
                std::fs::write(dir.join(file), value).unwrap_or_else(|e| panic!("{file}: {e}"));
            }
            return Cgroup { dir };
        }
        for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            let root = Path::new(root);
            let controllers =
                std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            if controllers.split_whitespace().any(|c| c == controller) {
                let _ = std::fs::write(
                    root.join("cgroup.subtree_control"),
                    format!("+{controller}"),
                );
                let dir = root.join(&name);
                std::fs::create_dir_all(&dir).unwrap();
                for (_, file, value) in settings {
                    std::fs::write(dir.join(file), value).unwrap_or_else(|e| panic!("{file}: {e}"));
                }
                return Cgroup { dir };
            }
        }
        panic!("no cgroup v1 or v2 hierarchy with the {controller} controller");
    }

    fn procs(&self) -> String {
        self.dir.join("cgroup.procs").display().to_string()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
            if std::fs::remove_dir(&self.dir).is_ok() || Instant::now() > deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn forking_past_pids_limit_is_proc_limit() {
    if !root() {
        return;
    }
    let cg = Cgroup::new("pids", &[("pids.max", "pids.max", "6")]);
    let t = sh(&format!(
        "echo $$ > {} && for i in $(seq 30); do sleep 3 & done; wait",
        cg.procs()
    ));
    t.expect("proc.limit", None);
    let syscall = t.decisive("syscall").unwrap_or("");
    assert!(
        ["clone", "clone3", "fork", "vfork"].contains(&syscall),
        "{}",
        t.context()
    );
    assert_eq!(t.decisive("errno"), Some("EAGAIN"));
}

#[test]
fn allocating_past_memory_limit_is_mem_oom() {
    if !root() {
        return;
    }
    let cg = Cgroup::new("memory", &[("memory.limit_in_bytes", "memory.max", "64M")]);
    // no swap escape hatch where the knob exists
    let _ = std::fs::write(cg.dir.join("memory.memsw.limit_in_bytes"), "64M");
    let _ = std::fs::write(cg.dir.join("memory.swap.max"), "0");
    let t = sh(&format!(
        "echo $$ > {} && exec python3 -c \"x = b'a' * (400 << 20)\"",
        cg.procs()
    ));
    t.expect("mem.oom", None);
    assert_eq!(t.decisive("kind"), Some("oom_victim"));
    assert_eq!(t.json["exit"]["signal"], "SIGKILL", "{}", t.context());
}

#[test]
fn page_cache_churn_at_a_memory_cgroup_limit_is_a_reclaim_stall() {
    if !root() {
        return;
    }
    // on the build's disk, not a tmpfs: tmpfs pages cannot be reclaimed
    // without swap, so the workload would be OOM-killed instead
    let dir = tempfile::Builder::new()
        .prefix("probe-kt-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("tempdir");
    let file = dir.path().join("churn.bin");
    let cg = Cgroup::new("memory", &[("memory.limit_in_bytes", "memory.max", "64M")]);
    let _ = std::fs::write(cg.dir.join("memory.memsw.limit_in_bytes"), "64M");
    let _ = std::fs::write(cg.dir.join("memory.swap.max"), "0");
    // 200 MiB of page cache through a 64 MiB cgroup: every read past the
    // limit charges a page the cgroup must first reclaim one for. Written
    // in synced 8 MiB steps so reclaim finds clean pages, not an OOM.
    let script = format!(
        "import os\n\
         chunk = b'x' * (1 << 20)\n\
         with open({file:?}, 'wb') as f:\n    \
             for i in range(200):\n        \
                 f.write(chunk)\n        \
                 if i % 8 == 7:\n            \
                     f.flush(); os.fsync(f.fileno())\n\
         for _ in range(2):\n    \
             with open({file:?}, 'rb') as f:\n        \
                 while f.read(1 << 20): pass\n",
        file = file.to_str().unwrap()
    );
    let t = trace_with(
        &["--events"],
        &[
            "sh",
            "-c",
            &format!("echo $$ > {} && exec python3 -c \"$0\"", cg.procs()),
            &script,
        ],
    );
    assert_eq!(t.json["exit"]["code"], 0, "{}", t.context());
    let reclaim_ms = t.json["memory"]["reclaim_ms"].as_f64().unwrap_or(0.0);
    assert!(reclaim_ms > 0.0, "no reclaim measured: {}", t.context());
    let events = t.json["events"].as_array().cloned().unwrap_or_default();
    let stalls: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "reclaim_stall")
        .collect();
    assert!(
        stalls
            .iter()
            .any(|e| e["memcg"] == true && e["duration_ns"].as_u64() > Some(0)),
        "no memory-cgroup reclaim_stall among {} events ({} stalls): {}",
        events.len(),
        stalls.len(),
        t.context()
    );
}

#[test]
fn connect_without_route_in_netns_is_net_egress() {
    if !root() {
        return;
    }
    let t = trace(&[
        "unshare",
        "-n",
        "bash",
        "-c",
        "echo hi > /dev/tcp/10.1.2.3/80",
    ]);
    t.expect("net.egress", Some("connect"));
    assert_eq!(t.decisive("errno"), Some("ENETUNREACH"));
    assert_eq!(t.decisive("addr"), Some("10.1.2.3:80"));
}

#[test]
fn a_connect_that_hangs_until_the_callers_timeout_is_net_egress() {
    if !root() {
        return;
    }
    // a namespace whose default route leads into a veth with nothing behind
    // it: the SYN goes nowhere, connect stays pending, python's own timeout
    // gives up
    let t = trace(&[
        "unshare",
        "-n",
        "sh",
        "-c",
        "ip link add v0 type veth peer name v1 && ip addr add 10.9.0.1/24 dev v0 \
         && ip link set v0 up && ip link set v1 up && ip route add default dev v0 \
         && python3 -c \"import socket; socket.create_connection(('10.1.2.3', 80), timeout=0.5)\"",
    ]);
    t.expect("net.egress", Some("connect"));
    assert_eq!(t.decisive("errno"), Some("EINPROGRESS"));
    assert_eq!(t.decisive("addr"), Some("10.1.2.3:80"));
    // the failure is the silence, not the EINPROGRESS the call returned
    let why = t.json["explanation"].as_str().unwrap();
    assert!(
        why.contains("got no answer") && why.contains("gave up on it"),
        "{why}"
    );
}

#[test]
fn a_refused_non_blocking_connect_is_named_by_its_socket_error_not_einprogress() {
    if !root() {
        return;
    }
    // python's create_connection(timeout=…) connects non-blocking: connect
    // returns EINPROGRESS, and the refusal comes back through
    // getsockopt(SO_ERROR), which itself succeeds
    let t = trace(&[
        "unshare",
        "-n",
        "sh",
        "-c",
        "ip link set lo up && python3 -c \"import socket; socket.create_connection(('127.66.0.1', 9), timeout=5)\"",
    ]);
    t.expect("net.egress", Some("connect"));
    assert_eq!(t.decisive("errno"), Some("ECONNREFUSED"), "{}", t.context());
    assert_eq!(t.decisive("addr"), Some("127.66.0.1:9"));
    assert_eq!(t.decisive("via"), Some("getsockopt(SO_ERROR)"));
    let why = t.json["explanation"].as_str().unwrap();
    assert!(
        why.contains("failed with ECONNREFUSED")
            && why.contains("reported by getsockopt(SO_ERROR)"),
        "{why}"
    );
}

#[test]
fn segfault_is_signal() {
    if !root() {
        return;
    }
    let t = trace(&["python3", "-c", "import ctypes; ctypes.string_at(0)"]);
    t.expect("signal", None);
    assert_eq!(t.json["exit"]["signal"], "SIGSEGV");
    assert!(
        t.json["explanation"]
            .as_str()
            .unwrap()
            .contains("crashed with SIGSEGV"),
        "{}",
        t.context()
    );
    assert_eq!(t.code, Some(128 + 11));
}

/// Compiles the C program `source` with gcc into `dir/name`: a workload
/// that does exactly what the test says, with no interpreter in between.
fn compile_c(dir: &Path, name: &str, source: &str) -> PathBuf {
    compile_c_with(dir, name, source, &[])
}

/// [`compile_c`] with more gcc flags (`-static`: a program that starts
/// under a seccomp filter denying openat, which the dynamic loader needs).
fn compile_c_with(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write the C source");
    let bin = dir.join(name);
    let out = Command::new("gcc")
        .args(["-O1", "-pthread"])
        .args(flags)
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("gcc builds this test's workload: install gcc");
    assert!(
        out.status.success(),
        "gcc {name}.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// Chromium's shape: one thread maps memory until RLIMIT_AS refuses it
/// four times, then another thread traps (int3, as IMMEDIATE_CRASH does).
const MMAP_THEN_TRAP_C: &str = r#"
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

static int go[2];

static void *trapper(void *unused) {
    char c;
    (void)unused;
    if (read(go[0], &c, 1) == 1)
        __asm__ volatile("int3");
    return NULL;
}

int main(void) {
    pthread_t t;
    int refused = 0;
    if (pipe(go) != 0 || pthread_create(&t, NULL, trapper, NULL) != 0)
        return 2;
    while (refused < 4)
        if (mmap(NULL, 16 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
            refused++;
    if (write(go[1], "x", 1) != 1)
        return 3;
    pthread_join(t, NULL);
    return 4;
}
"#;

#[test]
fn mmap_enomem_then_its_own_sigtrap_is_mem_limit() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let bin = compile_c(dir.path(), "selftrap", MMAP_THEN_TRAP_C);
    let t = trace(&[
        FAULT,
        "--rlimit",
        "as=134217728",
        "--rlimit",
        "core=0",
        "--",
        bin.to_str().unwrap(),
    ]);
    t.expect("mem.limit", Some("mmap"));
    assert_eq!(t.decisive("errno"), Some("ENOMEM"), "{}", t.context());
    assert_eq!(t.json["exit"]["signal"], "SIGTRAP", "{}", t.context());
    let explanation = t.json["explanation"].as_str().unwrap_or("");
    assert!(
        explanation.starts_with("mmap failed with ENOMEM ×4")
            && explanation.contains("then selftrap (pid ")
            && explanation.ends_with("aborted with SIGTRAP"),
        "{}",
        t.context()
    );
}

/// Forks until the pids cgroup refuses four times, then gives up with abort().
const FORK_THEN_ABORT_C: &str = r#"
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

int main(void) {
    int refused = 0;
    while (refused < 4) {
        pid_t pid = fork();
        if (pid == 0) {
            /* let go of the tracer's output pipes; the cgroup's cleanup kills us */
            close(1);
            close(2);
            sleep(30);
            _exit(0);
        }
        if (pid < 0) {
            if (errno != EAGAIN)
                return 2;
            refused++;
        }
    }
    abort();
}
"#;

#[test]
fn fork_eagain_then_its_own_sigabrt_is_proc_limit() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let bin = compile_c(dir.path(), "forkabort", FORK_THEN_ABORT_C);
    let cg = Cgroup::new("pids", &[("pids.max", "pids.max", "6")]);
    let t = sh(&format!(
        "echo $$ > {} && exec {FAULT} --rlimit core=0 -- {}",
        cg.procs(),
        bin.display()
    ));
    t.expect("proc.limit", None);
    let syscall = t.decisive("syscall").unwrap_or("");
    assert!(
        ["clone", "clone3", "fork", "vfork"].contains(&syscall),
        "{}",
        t.context()
    );
    assert_eq!(t.decisive("errno"), Some("EAGAIN"), "{}", t.context());
    assert_eq!(t.json["exit"]["signal"], "SIGABRT", "{}", t.context());
    let explanation = t.json["explanation"].as_str().unwrap_or("");
    assert!(
        explanation.contains("failed with EAGAIN ×4")
            && explanation.contains("then forkabort (pid ")
            && explanation.ends_with("aborted with SIGABRT"),
        "{}",
        t.context()
    );
}

// ------------------------------------------------------------------ clean runs

#[test]
fn clean_python_import_blames_nothing() {
    if !root() {
        return;
    }
    let t = trace(&["python3", "-c", "import json, csv, email, http.client"]);
    t.expect("none", None);
    assert_eq!(t.json["layer"], Value::Null);
    assert_eq!(t.json["failed"], false);
    // the benign failures were seen, just not blamed
    let failed = t.json["counts"]["syscall_failed"].as_u64().unwrap_or(0);
    assert!(
        failed >= 10,
        "expected benign failing syscalls to be observed, got {failed}"
    );
    assert_eq!(t.code, Some(0));
}

#[test]
fn clean_shell_workload_blames_nothing() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let t = sh(&format!(
        "cd {} && ls -la / > listing && sort listing | uniq -c > /dev/null",
        dir.path().display()
    ));
    t.expect("none", None);
    assert_eq!(t.code, Some(0));
}

#[test]
fn plain_exit_3_is_none_in_the_test_layer() {
    if !root() {
        return;
    }
    let t = sh("echo some output; exit 3");
    t.expect("none", None);
    assert_eq!(t.json["layer"], "test");
    assert_eq!(t.code, Some(3));
    // the workload's stdout went to stderr so stdout is pure JSON
    assert!(t.stderr.contains("some output"));
    let t = trace(&["python3", "-c", "import sys; sys.exit(3)"]);
    t.expect("none", None);
}

// ------------------------------------------------------------------ contract and bad input

#[test]
fn json_has_the_contract_fields() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let t = trace(&[
        FAULT,
        "--seccomp",
        "errno:mkdir",
        "--",
        "mkdir",
        dir.path().join("x").to_str().unwrap(),
    ]);
    for key in [
        "span",
        "label",
        "exit",
        "primitive",
        "layer",
        "confidence",
        "explanation",
        "decisive",
        "events",
        "drops",
    ] {
        assert!(t.json.get(key).is_some(), "missing `{key}`: {}", t.json);
    }
    for key in ["kind", "syscall", "errno", "path", "pid", "ts_ns"] {
        assert!(
            t.json["decisive"].get(key).is_some(),
            "decisive lacks `{key}`: {}",
            t.json["decisive"]
        );
    }
    assert!(t.json["exit"].get("code").is_some() && t.json["exit"].get("signal").is_some());
    assert_eq!(t.json["drops"]["kernel"], 0);
    let c = t.json["confidence"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&c));
}

#[test]
fn untracked_processes_emit_nothing() {
    if !root() {
        return;
    }
    // a busy, failing process outside the span
    let mut noise = Command::new("sh")
        .args(["-c", "while :; do cat /nonexistent/x 2>/dev/null; done"])
        .spawn()
        .unwrap();
    let t = trace_with(
        &["--events"],
        &["sh", "-c", "sleep 0.3; cat /nonexistent/y; true"],
    );
    let _ = noise.kill();
    let _ = noise.wait();
    let events = t.json["events"].as_array().unwrap();
    assert!(!events.is_empty());
    for e in events {
        assert_ne!(
            e["path"], "/nonexistent/x",
            "an untracked process leaked into the span: {e}"
        );
    }
    assert!(
        events.iter().any(|e| e["path"] == "/nonexistent/y"),
        "the traced child's failure is missing"
    );
}

#[test]
fn timeout_kills_and_is_attributed() {
    if !root() {
        return;
    }
    let started = Instant::now();
    let t = trace_with(&["--timeout", "0.5"], &["sleep", "30"]);
    assert!(started.elapsed() < Duration::from_secs(10));
    t.expect("timeout", None);
    assert_eq!(t.json["exit"]["signal"], "SIGKILL");
}

#[test]
fn sigterm_stops_the_child_and_still_reports() {
    if !root() {
        return;
    }
    let child = Command::new(PROBE)
        .args(["trace", "--json", "--", "sleep", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let started = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    let t = parse(out);
    assert_eq!(t.json["exit"]["signal"], "SIGTERM", "{}", t.context());
    t.expect("signal", None);
    assert_eq!(t.code, Some(128 + 15));
    assert!(t.stderr.contains("interrupted"));
}

#[test]
fn not_root_is_one_clear_line() {
    if !root() {
        return;
    }
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            PROBE,
            "trace",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "stderr: {stderr}");
    assert!(
        stderr.contains("permission denied") && stderr.contains("run as root"),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "stderr: {stderr}");
}

#[test]
fn no_command_is_a_usage_error() {
    let out = Command::new(PROBE).args(["trace"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CMD"));
}

#[test]
fn a_crash_after_a_thread_exited_is_still_a_crash() {
    if !root() {
        return;
    }
    // glibc ends each pthread with exit(0): that must not become the
    // process's status when the process later dies by SIGSEGV
    let t = sh(
        "python3 -c 'import threading, ctypes; t = threading.Thread(target=len, args=([],)); t.start(); t.join(); ctypes.string_at(0)'; exit 1",
    );
    t.expect("signal", None);
    assert!(
        t.json["explanation"].as_str().unwrap().contains("SIGSEGV"),
        "{}",
        t.context()
    );
}

#[test]
fn exec_from_a_non_leader_thread_stays_traced() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let missing = dir.path().join("after-exec.csv");
    let script = format!(
        "import threading, os, time\nthreading.Thread(target=lambda: os.execv('/bin/cat', ['cat', {:?}])).start()\ntime.sleep(10)",
        missing.to_str().unwrap()
    );
    let t = trace(&["python3", "-c", &script]);
    t.expect("fs.missing", Some("openat"));
    assert_eq!(t.decisive("path"), missing.to_str());
}

// ------------------------------------------------------------------ io_uring

/// The io_uring workload (tests/workloads/uring.c), built static.
fn uring_workload(dir: &Path) -> PathBuf {
    compile_c_with(
        dir,
        "uring",
        include_str!("workloads/uring.c"),
        &["-static"],
    )
}

impl Traced {
    fn events_of(&self, kind: &str) -> Vec<Value> {
        self.json["events"]
            .as_array()
            .map(|a| a.iter().filter(|e| e["kind"] == kind).cloned().collect())
            .unwrap_or_default()
    }
}

#[test]
fn io_uring_openat_of_a_missing_path_is_fs_missing_through_io_uring() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let bin = uring_workload(dir.path());
    let missing = dir.path().join("no-such-input.csv");
    let t = trace(&[bin.to_str().unwrap(), "open", missing.to_str().unwrap()]);
    assert_eq!(t.code, Some(1), "{}", t.context());
    t.expect("fs.missing", Some("openat"));
    assert_eq!(t.decisive("kind"), Some("uring_failed"), "{}", t.context());
    assert_eq!(t.decisive("errno"), Some("ENOENT"));
    assert_eq!(t.decisive("path"), missing.to_str());
    assert_eq!(t.decisive("io_uring_op"), Some("IORING_OP_OPENAT"));
    let why = t.json["explanation"].as_str().unwrap();
    assert!(why.contains("io_uring openat("), "{why}");
    assert!(why.contains("no syscall failed"), "{why}");
    // no failing openat syscall exists to be seen: only the request's completion
    assert!(t.events_of("syscall_failed").is_empty(), "{}", t.json);
}

#[test]
fn io_uring_paths_longer_than_the_record_arrive_cut_and_say_so() {
    if !root() {
        return;
    }
    // inline, the path is read from the submitter's memory at completion;
    // on an io-wq worker, from the kernel's copy at submission
    let dir = tempdir();
    let bin = uring_workload(dir.path());
    let missing = format!("/nonexistent/{}/{}", "u".repeat(200), "v".repeat(100));
    for mode in ["open", "open-async"] {
        let t = trace(&[bin.to_str().unwrap(), mode, &missing]);
        assert_eq!(t.code, Some(1), "{mode}: {}", t.context());
        let failed = t.events_of("uring_failed");
        let cut = failed
            .iter()
            .find(|e| e["path"] == missing[..255])
            .unwrap_or_else(|| panic!("{mode}: no cut path: {}", t.context()));
        assert_eq!(cut["path_truncated"], true, "{mode}: {cut}");
    }
}

#[test]
fn io_uring_request_completed_on_an_io_wq_worker_belongs_to_its_submitter() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let bin = uring_workload(dir.path());
    let missing = dir.path().join("async-missing");
    // IOSQE_ASYNC: the open runs on an iou-wrk thread, which no fork event
    // announced and which is not the submitting thread
    let t = trace(&[
        bin.to_str().unwrap(),
        "open-async",
        missing.to_str().unwrap(),
    ]);
    t.expect("fs.missing", Some("openat"));
    assert_eq!(t.decisive("kind"), Some("uring_failed"));
    assert_eq!(t.decisive("path"), missing.to_str());
    let d = &t.json["decisive"];
    // the submitter: a single-threaded process, so its tid is its pid
    assert_eq!(d["pid"], d["tid"], "{}", t.context());
    let exit_pid = t.events_of("exit").first().map(|e| e["pid"].clone());
    assert_eq!(exit_pid.as_ref(), Some(&d["pid"]), "{}", t.json);
}

#[test]
fn io_uring_create_on_a_readonly_mount_is_fs_readonly() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let bin = uring_workload(dir.path());
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let target = ro.join("result.json");
    let t = trace(&[
        "unshare",
        "-m",
        "sh",
        "-c",
        &format!(
            "mount -t tmpfs -o ro tmpfs {} && {} create {}",
            ro.display(),
            bin.display(),
            target.display()
        ),
    ]);
    t.expect("fs.readonly", Some("openat"));
    assert_eq!(t.decisive("kind"), Some("uring_failed"), "{}", t.context());
    assert_eq!(t.decisive("errno"), Some("EROFS"));
    assert_eq!(t.decisive("path"), target.to_str());
}

#[test]
fn io_uring_connect_to_a_closed_port_in_a_fresh_netns_is_net_egress() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let bin = uring_workload(dir.path());
    let t = trace(&[
        "unshare",
        "-n",
        "sh",
        "-c",
        &format!("ip link set lo up && {} connect 127.0.0.1 9", bin.display()),
    ]);
    t.expect("net.egress", Some("connect"));
    assert_eq!(t.decisive("kind"), Some("uring_failed"), "{}", t.context());
    assert_eq!(t.decisive("errno"), Some("ECONNREFUSED"));
    assert_eq!(t.decisive("addr"), Some("127.0.0.1:9"));
    assert_eq!(t.decisive("io_uring_op"), Some("IORING_OP_CONNECT"));
}

#[test]
fn a_clean_io_uring_read_blames_nothing() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let bin = uring_workload(dir.path());
    let file = dir.path().join("data.txt");
    std::fs::write(&file, "hello from io_uring\n").unwrap();
    let t = trace_with(
        &["--events"],
        &[bin.to_str().unwrap(), "read", file.to_str().unwrap()],
    );
    assert_eq!(t.code, Some(0), "{}", t.context());
    t.expect("none", None);
    assert_eq!(t.json["failed"], false);
    assert!(t.events_of("uring_failed").is_empty(), "{}", t.json);
    assert!(t.events_of("uring_under_seccomp").is_empty(), "{}", t.json);
    assert!(
        !t.json["explanation"].as_str().unwrap().contains("io_uring"),
        "{}",
        t.context()
    );
}

#[test]
fn io_uring_past_a_seccomp_filter_that_denies_openat_is_called_a_bypass() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let bin = uring_workload(dir.path());
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "not for this sandbox\n").unwrap();
    // open(2) is refused by the filter; the same open through io_uring is not
    let t = trace(&[
        FAULT,
        "--seccomp",
        "errno:openat",
        "--",
        bin.to_str().unwrap(),
        "sneak",
        secret.to_str().unwrap(),
    ]);
    assert_eq!(
        t.code,
        Some(0),
        "the io_uring open should succeed: {}",
        t.context()
    );
    let why = t.json["explanation"].as_str().unwrap();
    assert!(
        why.contains("io_uring bypassed the seccomp filter"),
        "{why}"
    );
    assert!(
        why.contains(&format!("io_uring openat(\"{}\")", secret.display())),
        "{why}"
    );
    let sneaked = t.events_of("uring_under_seccomp");
    assert_eq!(sneaked.len(), 1, "{}", t.json);
    assert_eq!(sneaked[0]["path"], secret.to_str().unwrap());
    assert_eq!(sneaked[0]["syscall"], "openat");
    assert!(
        t.events_of("seccomp_denied")
            .iter()
            .any(|e| e["syscall"] == "openat" && e["path"] == secret.to_str().unwrap()),
        "{}",
        t.json
    );
}

// ------------------------------------------------------------------ cgroups

/// A cgroup of the v2 hierarchy (no controller needed), removed on drop.
struct CgroupV2(PathBuf);

impl CgroupV2 {
    fn new() -> CgroupV2 {
        let root = probe::cgroup::v2_root().expect("a cgroup2 mount (the unified hierarchy)");
        let dir = root.join(format!("probe-kt-follow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        CgroupV2(dir)
    }
}

impl Drop for CgroupV2 {
    fn drop(&mut self) {
        // its processes have exited by now; a zombie may take a moment
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn a_process_that_joins_a_followed_cgroup_is_the_spans_though_nobody_traced_started_it() {
    if !root() {
        return;
    }
    // Docker's shape: the traced command (the CLI) waits for a status that
    // a process it did not start (containerd-shim's child) produces in the
    // container's cgroup; only following the cgroup shows why it failed
    for follow in [true, false] {
        let cg = CgroupV2::new();
        let dir = tempdir();
        let (ready, status) = (dir.path().join("ready"), dir.path().join("status"));
        let outside = format!(
            "while [ ! -e {r} ]; do sleep 0.02; done; echo $$ > {cg}/cgroup.procs; \
             exec sh -c 'cat /nonexistent-probe-cgroup 2> {s}.said; echo $? > {s}.tmp; mv {s}.tmp {s}'",
            r = ready.display(),
            s = status.display(),
            cg = cg.0.display(),
        );
        let mut container = Command::new("sh").args(["-c", &outside]).spawn().unwrap();
        let cli = format!(
            // the CLI passes on what the container said, as docker does: the
            // words that corroborate the container's failed open
            "touch {r}; while [ ! -e {s} ]; do sleep 0.02; done; cat {s}.said >&2; exit $(cat {s})",
            r = ready.display(),
            s = status.display()
        );
        let cg_arg = cg.0.display().to_string();
        let extra: &[&str] = if follow { &["--cgroup", &cg_arg] } else { &[] };
        let t = trace_with(extra, &["sh", "-c", &cli]);
        container.wait().unwrap();
        assert_eq!(t.code, Some(1), "{}", t.context());
        if follow {
            t.expect("fs.missing", Some("openat"));
            assert_eq!(
                t.decisive("path"),
                Some("/nonexistent-probe-cgroup"),
                "{}",
                t.context()
            );
        } else {
            t.expect("none", None);
        }
    }
}

#[test]
fn following_a_directory_that_is_no_cgroup_is_a_clear_usage_error() {
    if !root() {
        return;
    }
    let out = Command::new(PROBE)
        .args(["trace", "--cgroup", "/tmp", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr.contains("/tmp is not a cgroup v2 directory") && stderr.contains("0::"),
        "{stderr}"
    );
}

// ------------------------------------------------------------ the rungs

/// `probe trace --json` with kernel BTF switched off (`PROBE_BTF=none`):
/// the tracepoint rung, as on a kernel built without BTF.
fn trace_without_btf(cmd: &[&str]) -> Traced {
    let t = trace_env(&[("PROBE_BTF", "none")], cmd);
    assert!(
        t.stderr.contains("on the tracepoint rung"),
        "the lower rung is said on stderr: {}",
        t.stderr
    );
    t
}

#[test]
fn the_tracepoint_rung_names_the_same_primitives_with_their_paths() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let missing = dir.path().join("input.csv");
    let t = trace_without_btf(&["cat", missing.to_str().unwrap()]);
    t.expect("fs.missing", Some("openat"));
    assert_eq!(t.decisive("path"), missing.to_str(), "{}", t.context());

    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let script = format!(
        "mount -t tmpfs -o ro tmpfs {0} && echo x > {0}/out.json",
        ro.display()
    );
    let t = trace_without_btf(&["unshare", "-m", "sh", "-c", &script]);
    t.expect("fs.readonly", Some("openat"));
    assert_eq!(
        t.decisive("path"),
        Some(format!("{}/out.json", ro.display()).as_str()),
        "{}",
        t.context()
    );

    let t = trace_without_btf(&[
        "unshare",
        "-n",
        "bash",
        "-c",
        "echo hi > /dev/tcp/10.1.2.3/80",
    ]);
    t.expect("net.egress", Some("connect"));
    assert_eq!(t.decisive("addr"), Some("10.1.2.3:80"), "{}", t.context());
}

#[test]
fn the_tracepoint_rung_names_a_seccomp_denial_without_its_arguments() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let target = dir.path().join("out");
    let t = trace_without_btf(&[
        FAULT,
        "--seccomp",
        "errno:mkdir",
        "--",
        "mkdir",
        target.to_str().unwrap(),
    ]);
    t.expect("seccomp", Some("mkdir"));
    assert_eq!(t.decisive("errno"), Some("EPERM"));
    // what this rung cannot see (docs/KERNELS.md): the path of a syscall
    // that never reached sys_enter
    assert_eq!(t.decisive("path"), None, "{}", t.context());
}

#[test]
fn probe_check_names_the_rung_and_exits_by_it() {
    if !root() {
        return;
    }
    let check = |btf_off: bool| {
        let mut cmd = Command::new(PROBE);
        cmd.args(["check", "--json"]);
        if btf_off {
            cmd.env("PROBE_BTF", "none");
        }
        let out = cmd.output().expect("run probe check");
        let json: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        (out.status.code(), json)
    };
    let (code, json) = check(false);
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["runs"], true);
    assert_eq!(json["rung"], "btf");
    let items = json["items"].as_array().unwrap();
    for name in [
        "bpf(2)",
        "btf",
        "tracefs",
        "tracepoint raw_syscalls:sys_exit",
        "jit",
        "load",
    ] {
        let item = items
            .iter()
            .find(|i| i["item"] == name)
            .unwrap_or_else(|| panic!("no item {name}: {json}"));
        assert_eq!(item["ok"], true, "{item}");
    }
    let (code, json) = check(true);
    assert_eq!(code, Some(2), "{json}");
    assert_eq!(json["rung"], "tracepoint");
    assert!(
        json["cannot_see"].as_str().unwrap().contains("seccomp"),
        "{json}"
    );
}
