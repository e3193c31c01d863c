//! The `resources` facet: cgroup limits (the tightest on the way up to the
//! root), CPUs, memory, rlimits and inotify limits.

use std::path::{Path, PathBuf};

use nix::sys::resource::{Resource, getrlimit};
use serde_json::json;

use super::util::{read_text, read_value};
use crate::env::Facet;

/// The cgroup v2 limits reported, in the files' own format.
const LIMITS: &[&str] = &[
    "memory.max",
    "memory.high",
    "memory.swap.max",
    "pids.max",
    "cpu.max",
];

pub fn facet() -> Facet {
    let mut f = Facet::new(
        "The process's cgroup (v2, else v1 for memory/pids/cpu) walked up to the root for \
         the tightest limits; sched_getaffinity, /proc/meminfo, getrlimit and \
         /proc/sys/fs/inotify.",
    );
    cgroup_limits(&mut f);
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => {
            let n = (0..nix::sched::CpuSet::count())
                .filter(|&i| set.is_set(i).unwrap_or(false))
                .count();
            f.set("cpus", n);
        }
        Err(e) => f.cannot("cpus", format!("sched_getaffinity: {e:?}")),
    }
    match read_value("/sys/devices/system/cpu/online") {
        Ok(v) => f.set("cpus.online", v),
        Err(why) => f.cannot("cpus.online", why),
    }
    match read_text("/proc/meminfo") {
        Ok(info) => match mem_total(&info) {
            Some(bytes) => f.set("mem_total_bytes", bytes),
            None => f.cannot("mem_total_bytes", "no MemTotal line in /proc/meminfo"),
        },
        Err(why) => f.cannot("mem_total_bytes", why),
    }
    for (name, res) in RLIMITS {
        match getrlimit(*res) {
            Ok((soft, hard)) => f.set(format!("rlimit.{name}"), rlimit_text(soft, hard)),
            Err(e) => f.cannot(format!("rlimit.{name}"), format!("getrlimit: {e:?}")),
        }
    }
    for name in ["max_user_watches", "max_user_instances"] {
        let key = format!("inotify.{name}");
        match read_value(format!("/proc/sys/fs/inotify/{name}")) {
            Ok(v) => f.set(key, v),
            Err(why) => f.cannot(key, why),
        }
    }
    f
}

const RLIMITS: &[(&str, Resource)] = &[
    ("as", Resource::RLIMIT_AS),
    ("core", Resource::RLIMIT_CORE),
    ("cpu", Resource::RLIMIT_CPU),
    ("data", Resource::RLIMIT_DATA),
    ("fsize", Resource::RLIMIT_FSIZE),
    ("locks", Resource::RLIMIT_LOCKS),
    ("memlock", Resource::RLIMIT_MEMLOCK),
    ("msgqueue", Resource::RLIMIT_MSGQUEUE),
    ("nice", Resource::RLIMIT_NICE),
    ("nofile", Resource::RLIMIT_NOFILE),
    ("nproc", Resource::RLIMIT_NPROC),
    ("rss", Resource::RLIMIT_RSS),
    ("rtprio", Resource::RLIMIT_RTPRIO),
    ("sigpending", Resource::RLIMIT_SIGPENDING),
    ("stack", Resource::RLIMIT_STACK),
];

/// `soft/hard`, each a number or `unlimited`.
pub fn rlimit_text(soft: libc::rlim_t, hard: libc::rlim_t) -> String {
    let one = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            v.to_string()
        }
    };
    format!("{}/{}", one(soft), one(hard))
}

fn mem_total(meminfo: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// A limit's tightness, to compare levels: `None` is no limit (`max`).
fn tightness(key: &str, value: &str) -> Option<f64> {
    if key == "cpu.max" {
        // "QUOTA PERIOD": the share of one CPU
        let mut it = value.split_whitespace();
        let quota = it.next()?.parse::<f64>().ok()?;
        let period = it.next().unwrap_or("100000").parse::<f64>().ok()?;
        return (period > 0.0).then(|| quota / period);
    }
    value.parse::<f64>().ok()
}

/// Of two levels' values of a limit, the tighter (the lower one).
fn tighter(key: &str, a: &str, b: &str) -> bool {
    match (tightness(key, a), tightness(key, b)) {
        (Some(x), Some(y)) => x < y,
        (Some(_), None) => true,
        _ => false,
    }
}

/// The process's cgroup v2 path (`0::/path`) and the v1 paths by
/// controller, from /proc/self/cgroup.
fn own_cgroups(text: &str) -> (Option<String>, Vec<(String, String)>) {
    let mut v2 = None;
    let mut v1 = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else {
            for c in ctrl.split(',') {
                v1.push((c.to_string(), path.to_string()));
            }
        }
    }
    (v2, v1)
}

/// The directories from `dir` up to `root`, nearest first, each with its
/// cgroup path.
fn levels(root: &Path, path: &str) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut rel = path.trim_end_matches('/').to_string();
    loop {
        let shown = if rel.is_empty() {
            "/".to_string()
        } else {
            rel.clone()
        };
        out.push((shown, root.join(rel.trim_start_matches('/'))));
        match rel.rfind('/') {
            Some(i) => rel.truncate(i),
            None => break,
        }
        if out.len() > 64 {
            break;
        }
    }
    out
}

/// The tightest value of `file` on the way up, with the level it came
/// from; None when no level has the file.
fn walk(levels: &[(String, PathBuf)], key: &str, file: &str) -> Option<(String, String)> {
    let mut best: Option<(String, String)> = None;
    for (shown, dir) in levels {
        let Ok(v) = std::fs::read_to_string(dir.join(file)) else {
            continue;
        };
        let v = v.trim().to_string();
        if best.as_ref().is_none_or(|(b, _)| tighter(key, &v, b)) {
            best = Some((v, shown.clone()));
        }
    }
    best
}

fn cgroup_limits(f: &mut Facet) {
    let text = match read_text("/proc/self/cgroup") {
        Ok(t) => t,
        Err(why) => {
            for key in LIMITS.iter().chain(&["memory.oom_kill", "cgroup"]) {
                f.cannot(*key, &why);
            }
            return;
        }
    };
    let (v2_path, v1) = own_cgroups(&text);
    let v2_root = crate::cgroup::v2_root();
    let v2_levels = match (&v2_path, &v2_root) {
        (Some(p), Some(root)) => levels(root, p),
        _ => Vec::new(),
    };
    let v1_path = |ctrl: &str| v1.iter().find(|(c, _)| c == ctrl).map(|(_, p)| p.clone());
    let v1_levels = |ctrl: &str, mount: &str| {
        v1_path(ctrl)
            .map(|p| levels(&Path::new("/sys/fs/cgroup").join(mount), &p))
            .unwrap_or_default()
    };
    let mut from = serde_json::Map::new();
    for key in LIMITS {
        if let Some((v, level)) = walk(&v2_levels, key, key) {
            from.insert(key.to_string(), json!(level));
            f.set(*key, v);
            continue;
        }
        // v1 (hybrid hosts): the same limit in its old file
        let old = match *key {
            "memory.max" => walk(&v1_levels("memory", "memory"), key, "memory.limit_in_bytes")
                .map(|(v, l)| (v1_bytes(&v), l)),
            "memory.swap.max" => None,
            "pids.max" => walk(&v1_levels("pids", "pids"), key, "pids.max"),
            "cpu.max" => v1_cpu_max(&v1_levels("cpu", "cpu")),
            _ => None,
        };
        match old {
            Some((v, level)) => {
                from.insert(key.to_string(), json!(format!("v1:{level}")));
                f.set(*key, v);
            }
            // no file of that limit in the process's cgroup or above, in a
            // hierarchy it could read: nothing limits it (the root cgroup,
            // or a controller nobody enabled on the way down)
            None if v2_levels.first().is_some_and(|(_, dir)| dir.is_dir()) => {
                from.insert(
                    key.to_string(),
                    json!("none: no limit in the cgroup or above"),
                );
                f.set(*key, "max")
            }
            None => f.cannot(
                *key,
                match &v2_path {
                    Some(p) => format!("no {key} in cgroup {p} or above (controller not enabled)"),
                    None => "no cgroup v2 line in /proc/self/cgroup".into(),
                },
            ),
        }
    }
    match crate::cgroup::MemoryCgroup::of(std::process::id()) {
        Some(m) => match m.oom_kills() {
            Some(n) => f.set("memory.oom_kill", n),
            None => f.cannot(
                "memory.oom_kill",
                format!("no oom_kill count in {}", m.dir.display()),
            ),
        },
        None => f.set("memory.oom_kill", 0),
    }
    f.set(
        "cgroup",
        json!({"path": v2_path.or_else(|| v1_path("memory")), "limits_from": from}),
    );
}

/// v1's memory.limit_in_bytes: "no limit" is a page-rounded huge number.
fn v1_bytes(v: &str) -> String {
    match v.parse::<u64>() {
        Ok(n) if n >= 1 << 62 => "max".into(),
        _ => v.into(),
    }
}

/// v1's cpu.cfs_quota_us and cpu.cfs_period_us as v2's `cpu.max`.
fn v1_cpu_max(levels: &[(String, PathBuf)]) -> Option<(String, String)> {
    let mut best: Option<(String, String)> = None;
    for (shown, dir) in levels {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        let (Some(quota), Some(period)) = (read("cpu.cfs_quota_us"), read("cpu.cfs_period_us"))
        else {
            continue;
        };
        let quota = quota.trim();
        let v = if quota.starts_with('-') {
            format!("max {}", period.trim())
        } else {
            format!("{quota} {}", period.trim())
        };
        if best.as_ref().is_none_or(|(b, _)| tighter("cpu.max", &v, b)) {
            best = Some((v, shown.clone()));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rlimits_format() {
        assert_eq!(rlimit_text(1024, 4096), "1024/4096");
        let inf = libc::RLIM_INFINITY;
        assert_eq!(rlimit_text(8 << 20, inf), "8388608/unlimited");
        assert_eq!(rlimit_text(inf, inf), "unlimited/unlimited");
    }

    #[test]
    fn the_tightest_level_wins() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/memory.max"), "1048576\n").unwrap();
        std::fs::write(root.join("a/b/memory.max"), "max\n").unwrap();
        std::fs::write(root.join("a/cpu.max"), "max 100000\n").unwrap();
        std::fs::write(root.join("a/b/cpu.max"), "50000 100000\n").unwrap();
        let lv = levels(root, "/a/b");
        assert_eq!(
            lv.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(),
            ["/a/b", "/a", "/"]
        );
        assert_eq!(
            walk(&lv, "memory.max", "memory.max"),
            Some(("1048576".into(), "/a".into()))
        );
        assert_eq!(
            walk(&lv, "cpu.max", "cpu.max"),
            Some(("50000 100000".into(), "/a/b".into()))
        );
        assert_eq!(walk(&lv, "pids.max", "pids.max"), None);
        assert_eq!(levels(root, "/"), [("/".to_string(), root.to_path_buf())]);
    }

    #[test]
    fn proc_cgroup_lines_split() {
        let (v2, v1) = own_cgroups("4:memory:/x\n2:cpu,cpuacct:/y\n0::/z\n");
        assert_eq!(v2.as_deref(), Some("/z"));
        assert!(v1.contains(&("cpuacct".into(), "/y".into())));
        assert_eq!(mem_total("MemTotal:       16384 kB\n"), Some(16 << 20));
        assert_eq!(v1_bytes("9223372036854771712"), "max");
    }

    #[test]
    fn the_facet_has_every_rlimit() {
        let f = facet();
        for (name, _) in RLIMITS {
            assert!(f.items.contains_key(&format!("rlimit.{name}")), "{name}");
        }
        assert!(f.items["cpus"].as_u64().unwrap() >= 1);
    }
}
