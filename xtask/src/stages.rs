//! The stages of `cargo xtask test`: the wall time of each and how busy the
//! machine's CPUs were meanwhile (from /proc/stat), printed as each stage
//! ends and as a table at the end, so a slow run says where its time went
//! and whether it waited or computed. A stage must also leave the owners of
//! /dev/null and of its own stdio as it found them.

use std::time::{Duration, Instant};

/// The machine's CPU time so far, in clock ticks, summed over its CPUs.
#[derive(Clone, Copy, Default)]
struct CpuTicks {
    busy: u64,
    /// The part of `busy` at a positive nice: the background builds.
    niced: u64,
    total: u64,
}

impl CpuTicks {
    /// Reads /proc/stat's first line (`cpu user nice system idle iowait irq
    /// softirq steal ...`); zeros where it cannot be read.
    fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .take(8)
            .filter_map(|f| f.parse().ok())
            .collect();
        let [user, nice, system, idle, iowait, irq, softirq, steal] = fields[..] else {
            return Self::default();
        };
        let busy = user + nice + system + irq + softirq + steal;
        Self {
            busy,
            niced: nice,
            total: busy + idle + iowait,
        }
    }

    /// (busy, niced) as shares of all CPU time since `earlier`.
    fn shares_since(self, earlier: CpuTicks) -> (f64, f64) {
        let total = self.total.saturating_sub(earlier.total).max(1) as f64;
        (
            self.busy.saturating_sub(earlier.busy) as f64 / total,
            self.niced.saturating_sub(earlier.niced) as f64 / total,
        )
    }
}

/// Who owns each of some files: (uid, gid), None where it cannot be read.
#[derive(PartialEq, Debug)]
struct Owners(Vec<(&'static str, Option<(u32, u32)>)>);

impl Owners {
    /// /dev/null and this process's stdio (their /proc links lead to the
    /// file, pipe or terminal itself). runsc chowns the stdio it gets to its
    /// sandbox's user: a test that hands it the caller's (CI's log) or
    /// /dev/null (the whole host's) changes them for everyone after it.
    fn of_stdio() -> Self {
        Self::of(&[
            ("/dev/null", "/dev/null"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ])
    }

    fn of(files: &[(&'static str, &str)]) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        Self(
            files
                .iter()
                .map(|&(name, path)| {
                    let owner = std::fs::metadata(path).ok().map(|m| (m.uid(), m.gid()));
                    (name, owner)
                })
                .collect(),
        )
    }

    /// What changed owner since `earlier`, said as `stdout: 0:0 -> 65534:65534`.
    fn changed_since(&self, earlier: &Owners) -> Vec<String> {
        let said =
            |o: Option<(u32, u32)>| o.map_or("unreadable".into(), |(u, g)| format!("{u}:{g}"));
        earlier
            .0
            .iter()
            .zip(&self.0)
            .filter(|(before, after)| before.1 != after.1)
            .map(|((name, before), (_, after))| {
                format!("{name}: {} -> {}", said(*before), said(*after))
            })
            .collect()
    }
}

struct Row {
    name: String,
    wall: Duration,
    busy: f64,
    niced: f64,
    ok: bool,
}

/// The stages run so far.
pub struct Stages {
    started: Instant,
    cpu_at_start: CpuTicks,
    rows: Vec<Row>,
}

impl Stages {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            cpu_at_start: CpuTicks::now(),
            rows: Vec::new(),
        }
    }

    /// Runs one stage, timing it; a failed stage is recorded too.
    pub fn run<T>(
        &mut self,
        name: &str,
        stage: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let (started, cpu, owners) = (Instant::now(), CpuTicks::now(), Owners::of_stdio());
        let mut result = stage();
        let changed = Owners::of_stdio().changed_since(&owners);
        if result.is_ok() && !changed.is_empty() {
            result = Err(anyhow::anyhow!(
                "stage {name} changed the owner of {}: a program it started was handed \
                 them (runsc chowns its stdio to its sandbox's user): give it pipes or \
                 files of its own",
                changed.join(", ")
            ));
        }
        let (busy, niced) = CpuTicks::now().shares_since(cpu);
        let row = Row {
            name: name.to_string(),
            wall: started.elapsed(),
            busy,
            niced,
            ok: result.is_ok(),
        };
        eprintln!("xtask: stage {}", describe(&row));
        self.rows.push(row);
        result
    }

    /// A table of the stages, the whole run last.
    pub fn table(&self) -> String {
        let (busy, niced) = CpuTicks::now().shares_since(self.cpu_at_start);
        let whole = Row {
            name: "the whole run".into(),
            wall: self.started.elapsed(),
            busy,
            niced,
            ok: self.rows.iter().all(|r| r.ok),
        };
        let width = self
            .rows
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(0)
            .max(13);
        let mut out = format!(
            "{:<width$}  {:>7}  {:>9}  {:>14}\n",
            "stage", "wall s", "CPUs busy", "of it nice > 0"
        );
        for row in self.rows.iter().chain([&whole]) {
            out += &format!(
                "{:<width$}  {:>7.0}  {:>8.0}%  {:>13.0}%{}\n",
                row.name,
                row.wall.as_secs_f64(),
                row.busy * 100.0,
                row.niced * 100.0,
                if row.ok { "" } else { "  FAILED" }
            );
        }
        out
    }
}

fn describe(row: &Row) -> String {
    format!(
        "{}: {:.0} s, the CPUs {:.0}% busy ({:.0}% at a positive nice: the background builds){}",
        row.name,
        row.wall.as_secs_f64(),
        row.busy * 100.0,
        row.niced * 100.0,
        if row.ok { "" } else { "; FAILED" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_is_timed_and_its_failure_recorded() {
        let mut stages = Stages::new();
        let spun = stages.run("spin", || {
            let until = Instant::now() + Duration::from_millis(300);
            let mut n = 0u64;
            while Instant::now() < until {
                n = n.wrapping_add(1);
            }
            Ok(n)
        });
        assert!(spun.is_ok());
        let failed: anyhow::Result<()> = stages.run("fail", || anyhow::bail!("no"));
        assert!(failed.is_err());
        let spin = &stages.rows[0];
        assert!(spin.wall >= Duration::from_millis(300), "{:?}", spin.wall);
        // one CPU spun the whole stage: at least that share of all of them
        // (the clock ticks are 10 ms: allow a tick either side)
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        assert!(spin.busy > 0.9 / cpus - 0.1, "busy {}", spin.busy);
        let table = stages.table();
        assert!(
            table.contains("fail") && table.contains("FAILED"),
            "{table}"
        );
        assert!(
            table.lines().last().unwrap().starts_with("the whole run"),
            "{table}"
        );
    }

    #[test]
    fn a_changed_owner_is_named_with_both_owners() {
        use std::os::unix::fs::MetadataExt as _;
        let file = std::env::temp_dir().join(format!("xtask-owners-{}", std::process::id()));
        std::fs::write(&file, "").unwrap();
        let path = file.to_str().unwrap();
        let owners = || Owners::of(&[("log", path), ("gone", "/nonexistent/log")]);
        let before = owners();
        assert_eq!(before.0[1], ("gone", None));
        assert!(owners().changed_since(&before).is_empty());
        let me = std::fs::metadata(&file).unwrap();
        // giving a file away takes root (CI runs this as root)
        let given = std::os::unix::fs::chown(&file, Some(65534), Some(65534));
        let changed = owners().changed_since(&before);
        std::fs::remove_file(&file).unwrap();
        if me.uid() != 0 {
            assert!(given.is_err() && changed.is_empty(), "{changed:?}");
            return;
        }
        given.unwrap();
        assert_eq!(changed, ["log: 0:0 -> 65534:65534"]);
    }
}
