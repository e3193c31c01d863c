//! SOAK.md: each series' slope after warm-up (least squares, per hour, and
//! what it makes of a month), a plot of it over time with the planned
//! moments marked, the checks, and what the load was.

use std::fmt::Write as _;
use std::path::Path;

use super::checks::Timeline;
use super::fleet::Role;
use super::load::Load;
use super::sample::Sample;

pub struct Report<'a> {
    pub minutes: f64,
    pub interval_s: u64,
    pub tests: usize,
    pub samples: &'a [Sample],
    pub timeline: &'a Timeline,
    pub load: &'a Load,
    pub clock: &'a str,
}

/// One line of a plot: (seconds, value) points.
struct Line {
    name: String,
    points: Vec<(f64, f64)>,
}

/// A series judged for growth.
struct Series {
    name: String,
    unit: &'static str,
    /// The points the slope is fitted on.
    fit: Vec<(f64, f64)>,
    /// Growth below this over the fitted window is noise (a whole fd, a
    /// page of RSS…).
    floor: f64,
    /// A bound the process keeps the series under: growth toward it is
    /// filling, not a leak.
    cap: Option<f64>,
}

struct Fit {
    /// The window's first and last sample times, seconds into the run.
    from_s: f64,
    to_s: f64,
    first: f64,
    last: f64,
    mean: f64,
    per_hour: f64,
    residual_sd: f64,
    span_h: f64,
    /// Highest less lowest value in the window.
    range: f64,
}

impl Fit {
    fn of(points: &[(f64, f64)]) -> Option<Fit> {
        if points.len() < 3 {
            return None;
        }
        let n = points.len() as f64;
        let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
        let my = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
        let residual_sd = (points
            .iter()
            .map(|p| (p.1 - (my + slope * (p.0 - mx))).powi(2))
            .sum::<f64>()
            / n)
            .sqrt();
        Some(Fit {
            from_s: points[0].0,
            to_s: points[points.len() - 1].0,
            first: points[0].1,
            last: points[points.len() - 1].1,
            mean: my,
            per_hour: slope * 3600.0,
            residual_sd,
            span_h: (points[points.len() - 1].0 - points[0].0) / 3600.0,
            range: points.iter().map(|p| p.1).fold(f64::MIN, f64::max)
                - points.iter().map(|p| p.1).fold(f64::MAX, f64::min),
        })
    }

    /// Flat: the fitted change over the window is within twice the
    /// scatter around the line or under the series' floor, or the series
    /// never moved by more than its floor (a line fitted to a count that
    /// steps between 5 and 6 threads can rise by more than the step).
    fn flat(&self, floor: f64) -> bool {
        let change = self.per_hour * self.span_h;
        change <= (2.0 * self.residual_sd).max(floor) || self.range <= floor
    }
}

impl Report<'_> {
    /// Seconds of warm-up left out of the fits.
    fn warmup_s(&self) -> f64 {
        (self.minutes * 60.0 * 0.1).max(60.0)
    }

    /// Writes `out`/SOAK.md and `out`/soak/*.svg; the names of the series
    /// that grow.
    pub fn write(&self, out: &Path) -> anyhow::Result<Vec<String>> {
        std::fs::create_dir_all(out.join("soak"))?;
        let warm = self.warmup_s();
        let disk = self.disk_window();
        let series = self.series(warm, disk);
        let mut md = String::new();
        let _ = writeln!(
            md,
            "# Soak: {} minutes under load, kills and a full disk\n",
            self.minutes
        );
        let _ = writeln!(
            md,
            "Written by `cargo xtask soak --minutes {}` on {} ({} CPUs, kernel {}). \
             The probe daemon, `agent-bridge serve --http`, and `agent-bridge proxy --http` in front of \
             `agent-bridge serve --stdio` ran under three campaign loops of the generated suite \
             ({} tests, the browser domain left out): one against the HTTP bridge, one through stdio \
             bridges under each of {} fault profiles in turn, one through the proxy with the identity \
             adapter, and a hostile client (below). Samples every {} s; the first {:.0} s are warm-up, \
             left out of the slopes. See [RETENTION.md](RETENTION.md) for the evidence budget the full \
             disk shrinks.\n",
            self.minutes,
            date(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim(),
            self.tests,
            super::load::PROFILES.len(),
            self.interval_s,
            warm
        );
        let _ = writeln!(md, "## Does anything grow?\n");
        let _ = writeln!(
            md,
            "Least-squares slope of each series after warm-up (a process's series: over the second \
             half of its last life, from its restart to the end, which the early kills make most of \
             the run; the full-disk minute left out), and that slope over a month (720 h). The plots \
             show every sample, warm-ups included. *Flat* means the fitted change over the window is within twice the \
             scatter around the line, or under the series' floor (one fd, one thread, one span, \
             1 MiB of RSS). A series the process bounds (the daemon's write memory) may fill \
             toward its cap.\n"
        );
        let _ = writeln!(
            md,
            "| series | fitted over | first | last | mean | slope per hour | a month at that slope | verdict |\n|---|---|---:|---:|---:|---:|---:|---|"
        );
        let mut grows = Vec::new();
        for s in &series {
            let Some(f) = Fit::of(&s.fit) else {
                let _ = writeln!(md, "| {} | | | | | | | too few samples |", s.name);
                continue;
            };
            let flat = f.flat(s.floor);
            let capped = s.cap.filter(|&cap| f.last <= cap);
            if !flat && capped.is_none() {
                grows.push(s.name.clone());
            }
            let verdict = match (flat, capped) {
                (true, _) => "flat".to_string(),
                (false, Some(cap)) => format!("fills toward its cap ({cap:.0})"),
                (false, None) if super::judges_growth(self.minutes) => "**grows**".to_string(),
                (false, None) => format!(
                    "rises (not judged: a run under {:.0} minutes is warm-up)",
                    super::JUDGED_FROM_MINUTES
                ),
            };
            let _ = writeln!(
                md,
                "| {} | {:.1}–{:.1} min | {:.1} {u} | {:.1} {u} | {:.1} {u} | {:+.2} {u}/h | {:+.1} {u} | {} |",
                s.name,
                f.from_s / 60.0,
                f.to_s / 60.0,
                f.first,
                f.last,
                f.mean,
                f.per_hour,
                f.per_hour * 720.0,
                verdict,
                u = s.unit
            );
        }
        let _ = writeln!(md);
        for (file, title, unit, lines) in self.plots() {
            std::fs::write(
                out.join("soak").join(format!("{file}.svg")),
                svg(title, unit, &lines, &self.timeline.marks),
            )?;
            let _ = writeln!(md, "![{title}](soak/{file}.svg)\n");
        }
        let _ = writeln!(md, "## The planned moments\n");
        let _ = writeln!(md, "| at | check | result | detail |\n|---:|---|---|---|");
        for c in &self.timeline.checks {
            let _ = writeln!(
                md,
                "| {:.0} s | {} | {} | {} |",
                c.at,
                c.what,
                if c.passed { "ok" } else { "**FAILED**" },
                c.detail.replace('|', "\\|").replace('\n', " ")
            );
        }
        let _ = writeln!(md, "\n## The load\n");
        let _ = writeln!(
            md,
            "| loop | runs finished | resumed after a kill | errors |\n|---|---:|---:|---|"
        );
        for l in &self.load.loops {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                l.name,
                l.runs.len(),
                l.resumes,
                if l.errors.is_empty() {
                    "none".into()
                } else {
                    l.errors.join("; ").replace('|', "\\|")
                }
            );
        }
        let _ = writeln!(
            md,
            "\nThe hostile client, one operation about every second, bridge and proxy in turn:\n"
        );
        let _ = writeln!(md, "| operation | sent | answered |\n|---|---:|---:|");
        for (op, (sent, answered)) in &self.load.hostile.ops {
            let _ = writeln!(md, "| {op} | {sent} | {answered} |");
        }
        let _ = writeln!(
            md,
            "\n(*garbage*: 512 random bytes; *malformed JSON*: a NUL and invalid UTF-8 in a body; \
             *stalled body*: 40 of 4,096 promised bytes, answered 408 by the body timeout; \
             *abandoned session*: a call left running and its connection closed, the session never \
             deleted; *cancelled call*: `notifications/cancelled` half a second into a call; \
             *reused id*: two calls under one id at once.)\n"
        );
        let _ = writeln!(md, "## The wall clock\n\n{}\n", self.clock);
        std::fs::write(out.join("SOAK.md"), md)?;
        Ok(grows)
    }

    /// (start, end) seconds of the full disk, left out of the fits.
    fn disk_window(&self) -> (f64, f64) {
        let at = |label: &str| {
            self.timeline
                .marks
                .iter()
                .find(|m| m.1 == label)
                .map(|m| m.0)
        };
        (
            at("disk full").unwrap_or(f64::MAX),
            at("disk freed").map_or(f64::MAX, |t| t + 10.0),
        )
    }

    fn series(&self, warm: f64, disk: (f64, f64)) -> Vec<Series> {
        let in_fit = |t: f64| t >= warm && !(disk.0..=disk.1).contains(&t);
        let mut out = Vec::new();
        let end = self.samples.last().map_or(0.0, |s| s.t);
        for role in Role::ALL {
            // the second half of the role's last life: a process fills its
            // caches, pools and heap after a restart for a while that is
            // its own, and what grows after that is what a month adds up
            let restart = self
                .timeline
                .marks
                .iter()
                .filter(|m| m.1 == format!("kill -9 {}", role.name()))
                .map(|m| m.0)
                .fold(0.0, f64::max);
            let from = second_half(restart, end, warm);
            let pts = |f: &dyn Fn(&super::sample::ProcSample) -> f64| -> Vec<(f64, f64)> {
                self.samples
                    .iter()
                    .filter(|s| in_fit(s.t) && s.t >= from)
                    .filter_map(|s| s.procs.get(&role).map(|p| (s.t, f(p))))
                    .collect()
            };
            out.push(Series {
                name: format!("{} RSS", role.name()),
                unit: "MiB",
                fit: pts(&|p| p.rss_kib as f64 / 1024.0),
                floor: 1.0,
                cap: None,
            });
            out.push(Series {
                name: format!("{} open fds", role.name()),
                unit: "",
                fit: pts(&|p| p.fds as f64),
                floor: 1.0,
                cap: None,
            });
            out.push(Series {
                name: format!("{} threads", role.name()),
                unit: "",
                fit: pts(&|p| p.threads as f64),
                floor: 1.0,
                cap: None,
            });
        }
        let global = |f: &dyn Fn(&Sample) -> Option<f64>| -> Vec<(f64, f64)> {
            self.samples
                .iter()
                .filter(|s| in_fit(s.t))
                .filter_map(|s| f(s).map(|v| (s.t, v)))
                .collect()
        };
        out.push(Series {
            name: "daemon open spans".into(),
            unit: "",
            fit: global(&|s| s.open_spans.map(|v| v as f64)),
            floor: 1.0,
            cap: None,
        });
        out.push(Series {
            name: "spans to end with their connection".into(),
            unit: "",
            fit: global(&|s| s.ending_with_connection.map(|v| v as f64)),
            floor: 1.0,
            cap: None,
        });
        out.push(Series {
            name: "span ids kept to end if their client dies".into(),
            unit: "",
            fit: global(&|s| s.ending_with_client.map(|v| v as f64)),
            floor: 1.0,
            cap: None,
        });
        out.push(Series {
            name: "daemon's write memory (paths)".into(),
            unit: "",
            fit: global(&|s| s.paths_remembered.map(|v| v as f64)),
            floor: 1.0,
            // probe's sessions::MAX_REMEMBERED
            cap: Some(65_536.0),
        });
        out.push(Series {
            name: "call cgroups of live bridges".into(),
            unit: "",
            fit: global(&|s| Some(s.cgroups as f64)),
            floor: 1.0,
            cap: None,
        });
        out.push(Series {
            name: "call cgroups left by dead bridges".into(),
            unit: "",
            fit: global(&|s| Some(s.cgroups_orphaned as f64)),
            floor: 1.0,
            cap: None,
        });
        out.push(Series {
            name: "evidence DB + WAL".into(),
            unit: "MiB",
            fit: global(&|s| Some((s.db_bytes + s.wal_bytes) as f64 / 1048576.0)),
            floor: 1.0,
            cap: None,
        });
        out
    }

    fn plots(&self) -> Vec<(&'static str, &'static str, &'static str, Vec<Line>)> {
        let per_role = |f: &dyn Fn(&super::sample::ProcSample) -> f64| -> Vec<Line> {
            Role::ALL
                .iter()
                .map(|r| Line {
                    name: r.name().into(),
                    points: self
                        .samples
                        .iter()
                        .filter_map(|s| s.procs.get(r).map(|p| (s.t, f(p))))
                        .collect(),
                })
                .collect()
        };
        let line = |name: &str, f: &dyn Fn(&Sample) -> Option<f64>| Line {
            name: name.into(),
            points: self
                .samples
                .iter()
                .filter_map(|s| f(s).map(|v| (s.t, v)))
                .collect(),
        };
        let mut rates = Vec::new();
        for w in self.samples.windows(2) {
            if let (Some(a), Some(b)) = (w[0].events_total, w[1].events_total)
                && b >= a
            {
                rates.push((w[1].t, (b - a) as f64 / (w[1].t - w[0].t).max(1e-3)));
            }
        }
        vec![
            (
                "rss",
                "resident memory",
                "MiB",
                per_role(&|p| p.rss_kib as f64 / 1024.0),
            ),
            (
                "fds",
                "open file descriptors",
                "",
                per_role(&|p| p.fds as f64),
            ),
            ("threads", "threads", "", per_role(&|p| p.threads as f64)),
            (
                "spans",
                "the daemon's open spans, tracked tasks, spans to end with their connection, span ids kept for their client, write memory; call cgroups",
                "",
                vec![
                    line("open spans", &|s| s.open_spans.map(|v| v as f64)),
                    line("tracked tasks", &|s| s.tracked_tasks.map(|v| v as f64)),
                    line("spans to end with their connection", &|s| {
                        s.ending_with_connection.map(|v| v as f64)
                    }),
                    line("span ids kept to end if their client dies", &|s| {
                        s.ending_with_client.map(|v| v as f64)
                    }),
                    line("write memory (thousands of paths)", &|s| {
                        s.paths_remembered.map(|v| v as f64 / 1000.0)
                    }),
                    line("call cgroups (live bridges)", &|s| Some(s.cgroups as f64)),
                    line("call cgroups (dead bridges)", &|s| {
                        Some(s.cgroups_orphaned as f64)
                    }),
                ],
            ),
            (
                "db",
                "evidence DB, WAL and the filesystem's free space",
                "MiB",
                vec![
                    line("DB", &|s| Some(s.db_bytes as f64 / 1048576.0)),
                    line("WAL", &|s| Some(s.wal_bytes as f64 / 1048576.0)),
                    line("free", &|s| Some(s.fs_free_bytes as f64 / 1048576.0)),
                    line("budget", &|s| s.budget_bytes.map(|v| v as f64 / 1048576.0)),
                ],
            ),
            (
                "events",
                "kernel events per second; dropped (counted) since the daemon's start",
                "",
                vec![
                    Line {
                        name: "events/s".into(),
                        points: rates,
                    },
                    line("dropped", &|s| s.kernel_drops.map(|v| v as f64)),
                ],
            ),
        ]
    }
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

/// A line chart: time in minutes across, `lines` up, `marks` as dashed
/// verticals.
fn svg(title: &str, unit: &str, lines: &[Line], marks: &[(f64, String)]) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 260.0, 60.0, 150.0, 30.0, 30.0);
    let all = lines.iter().flat_map(|l| l.points.iter());
    let t_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_max = all.map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.1;
    let x = |t: f64| left + (w - left - right) * t / t_max;
    let y = |v: f64| h - bottom - (h - top - bottom) * v / y_max;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{left}" y="18" font-size="13">{}</text>"#,
        escape(title)
    );
    let _ = write!(
        s,
        r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>"#,
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for i in 0..=4 {
        let v = y_max * i as f64 / 4.0;
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{}</text><line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#ddd"/>"##,
            left - 4.0,
            y(v) + 4.0,
            short(v, unit),
            y(v),
            w - right,
            y(v)
        );
    }
    for i in 0..=4 {
        let t = t_max * i as f64 / 4.0;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{:.0} min</text>"#,
            x(t),
            h - bottom + 16.0,
            t / 60.0
        );
    }
    for (t, label) in marks {
        let _ = write!(
            s,
            r##"<line x1="{0}" y1="{top}" x2="{0}" y2="{1}" stroke="#888" stroke-dasharray="4 3"/><text x="{2}" y="{3}" fill="#666" font-size="9" transform="rotate(-90 {2} {3})" text-anchor="end">{4}</text>"##,
            x(*t),
            h - bottom,
            x(*t) - 2.0,
            top + 2.0,
            escape(label)
        );
    }
    for (i, l) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = l
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        );
        let _ = write!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="3" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
            w - right + 10.0,
            top + 14.0 * i as f64 + 4.0,
            w - right + 26.0,
            top + 14.0 * i as f64 + 8.0,
            escape(&l.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn short(v: f64, unit: &str) -> String {
    let n = if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    };
    if unit.is_empty() {
        n
    } else {
        format!("{n} {unit}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn date() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Where a process's fit starts: the second half of its life from
/// `restart` to `end`, and never within half the run's warm-up of its start.
fn second_half(restart: f64, end: f64, warm: f64) -> f64 {
    restart + ((end - restart) / 2.0).max(warm / 2.0)
}

#[cfg(test)]
mod tests {
    use super::{Fit, second_half};

    fn series(f: impl Fn(f64) -> f64) -> Vec<(f64, f64)> {
        (0..360)
            .map(|i| i as f64 * 10.0)
            .map(|t| (t, f(t)))
            .collect()
    }

    #[test]
    fn a_count_stepping_by_its_floor_is_flat_and_a_steady_climb_grows() {
        // a thread more in the second half (a spare worker kept): the
        // line rises by 1.5 over the window, the count by 1
        let stepping = series(|t| if t > 1_800.0 { 6.0 } else { 5.0 });
        assert!(Fit::of(&stepping).unwrap().flat(1.0));
        // one fd more every 10 minutes
        let climbing = series(|t| 30.0 + (t / 600.0).floor());
        assert!(!Fit::of(&climbing).unwrap().flat(1.0));
        // RSS scattered around a level
        let scattered = series(|t| 50.0 + ((t / 10.0) as u64 % 7) as f64 * 0.3);
        assert!(Fit::of(&scattered).unwrap().flat(1.0));
    }

    #[test]
    fn a_process_is_judged_past_a_long_warm_up_and_a_leak_still_shows() {
        // killed 6 minutes into an hour, then 17 MiB of warm-up over 20
        // minutes and flat: the shape the daemon's RSS had
        let restart = 360.0;
        let from = second_half(restart, 3_590.0, 360.0);
        assert_eq!(from, 1_975.0);
        let warming = |t: f64| 45.0 + 17.0 * ((t - restart) / 1_200.0).clamp(0.0, 1.0);
        let window = |f: &dyn Fn(f64) -> f64, start: f64| -> Vec<(f64, f64)> {
            series(f).into_iter().filter(|p| p.0 >= start).collect()
        };
        assert!(Fit::of(&window(&warming, from)).unwrap().flat(1.0));
        // three minutes after the restart, the warm-up reads as growth
        assert!(
            !Fit::of(&window(&warming, restart + 180.0))
                .unwrap()
                .flat(1.0)
        );
        // 4 MiB an hour on top of it still grows in the second half
        let leaking = |t: f64| warming(t) + 4.0 * t / 3_600.0;
        assert!(!Fit::of(&window(&leaking, from)).unwrap().flat(1.0));
        // a short run: never before half its warm-up after the restart
        assert_eq!(second_half(24.0, 60.0, 60.0), 54.0);
    }
}
