//! The self-contained HTML report of one run: per-domain bars, the domain ×
//! primitive heat map, the layer table, the failed tests grouped by layer,
//! primitive and explanation pattern (each with its kernel timeline, failed
//! expectations, interface messages, the screenshot it read back and its raw
//! evidence), and the degraded tests. One file: no external assets, no
//! network; a few lines of inline JS filter the failure list.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde_json::Value;

use super::pattern::{PLACEHOLDERS, pattern};
use super::report::{Failure, Report, cut};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const STYLE: &str = r#"
body{font:14px system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right} th{background:#f3f3f3} td.l,th.l{text-align:left}
.bar{display:flex;height:16px;width:400px;background:#eee} .p{background:#4caf50} .d{background:#ffb300} .f{background:#e53935}
pre{white-space:pre-wrap;word-break:break-all;background:#f8f8f8;padding:6px;margin:0;font-size:12px}
details{margin:2px 0} summary{cursor:pointer}
#q{width:400px;padding:4px} .muted{color:#777} .warn{color:#c62828}
h3{margin:1.4em 0 .2em;border-bottom:1px solid #ddd} h4{margin:.8em 0 .2em .5em;font-size:14px}
.grp{margin:3px 0 3px 1em;border-left:3px solid #e53935;padding-left:8px}
.grp.dg{border-left-color:#ffb300}
.cnt{display:inline-block;min-width:2.2em;text-align:right;font-weight:bold;margin-right:.4em}
.pat{font:12px ui-monospace,monospace} .ph{font-style:normal;color:#6a1b9a;background:#f3e5f5;border-radius:2px}
details.t{margin:2px 0 2px 1.2em} details.t>summary{font-size:13px}
.ev{margin:4px 0 10px 1.2em;padding:4px 10px;border:1px solid #ddd;background:#fcfcfc}
.ev h5{margin:.6em 0 .2em;font-size:13px} .ev ul{margin:0;padding-left:1.4em} .ev li{font:12px ui-monospace,monospace;word-break:break-all}
table.tl{margin:.3em 0} table.tl td,table.tl th{text-align:left;font:12px ui-monospace,monospace;padding:1px 6px;border-color:#e3e3e3}
table.tl td.r{text-align:right} tr.dec td{background:#ffebee;font-weight:bold}
.shot img{display:block;max-width:min(100%,640px);min-width:200px;min-height:40px;border:1px solid #ccc;margin:.3em 0}
"#;

/// Filters the failure list by every word typed; empty groups and sections hide.
const SCRIPT: &str = "function f(){var q=document.getElementById('q').value.toLowerCase().split(/\\s+/).filter(Boolean);\
document.querySelectorAll('#list .grp').forEach(function(g){var n=0;g.querySelectorAll('details.t').forEach(function(d){\
var ok=q.every(function(w){return d.dataset.k.indexOf(w)>=0});d.style.display=ok?'':'none';if(ok)n++});\
g.style.display=n?'':'none';g.querySelector('.cnt').textContent=n;if(q.length)g.open=n>0});\
document.querySelectorAll('#list .sec').forEach(function(s){var v=0;s.querySelectorAll('.grp').forEach(function(g){if(g.style.display!=='none')v++});s.style.display=v?'':'none'})}";

/// One self-contained HTML file. See the module doc for what it shows.
pub fn html(r: &Report) -> String {
    let mut h = String::new();
    let run = &r.run;
    let _ = write!(
        h,
        r##"<!doctype html><html><head><meta charset="utf-8"><title>campaign {id}</title><style>{STYLE}</style></head><body>
<h1>Campaign run <code>{id}</code></h1>
<p>{label} · target <code>{target}</code> · suite <code>{suite}</code><br>
<b>{rec}</b> of {total} tests recorded{complete} · <b style="color:#2e7d32">{pass} passed</b> · <a href="#degraded"><b style="color:#b26a00">{degraded} degraded</b></a> · <a href="#failed"><b style="color:#c62828">{fail} failed</b></a> · {unsupported} unsupported by the target{adapter} · {wall:.0} s wall</p>
"##,
        id = esc(&run.id),
        label = esc(&run.label),
        target = esc(&run.target),
        suite = esc(&run.suite),
        rec = run.recorded,
        total = run.tests_total,
        complete = if run.complete {
            " (complete)"
        } else {
            " (incomplete)"
        },
        pass = r.passed,
        degraded = r.degraded,
        fail = r.failed,
        unsupported = r.unsupported,
        adapter = run.adapter.as_ref().map_or(String::new(), |a| format!(
            " (adapter <code>{}</code>)",
            esc(a)
        )),
        wall = r.wall_s
    );
    domains(r, &mut h);
    heat_map(r, &mut h);
    layers(r, &mut h);
    failed(r, &mut h);
    degraded(r, &mut h);
    environment(r, &mut h);
    let _ = writeln!(h, "<script>{SCRIPT}</script></body></html>");
    h
}

/// The snapshot of each target, a collapsed table per facet.
fn environment(r: &Report, h: &mut String) {
    h.push_str("<h2 id=environment>Environment</h2>");
    if r.environment.is_empty() {
        h.push_str("<p class=muted>No environment stored with this run.</p>");
        return;
    }
    for e in &r.environment {
        let _ = write!(h, "<p>{}</p>", esc(&e.line()));
        let Some(s) = &e.snapshot else { continue };
        for (name, facet) in &s.facets {
            let _ = write!(
                h,
                "<details><summary><b>{}</b> <span class=muted>{} item(s){} · {}</span></summary><table>",
                esc(name),
                facet.items.len(),
                if facet.unreadable.is_empty() {
                    String::new()
                } else {
                    format!(", {} unreadable", facet.unreadable.len())
                },
                esc(&facet.how)
            );
            for (k, v) in &facet.items {
                let _ = write!(
                    h,
                    "<tr><td class=l><code>{}</code></td><td class=l>{}</td></tr>",
                    esc(k),
                    esc(&cut(&probe::env::diff::words(Some(v)), 160))
                );
            }
            for (k, why) in &facet.unreadable {
                let _ = write!(
                    h,
                    "<tr><td class=l><code>{}</code></td><td class='l muted'>unreadable: {}</td></tr>",
                    esc(k),
                    esc(why)
                );
            }
            h.push_str("</table></details>");
        }
    }
}

/// The comparison of two runs as one page: what flipped, and the
/// environment's differences with the broken tests each explains.
pub fn compare_html(c: &super::compare::Comparison) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r##"<!doctype html><html><head><meta charset="utf-8"><title>compare {a} → {b}</title><style>{STYLE}</style></head><body>
<h1>Runs compared: <code>{a}</code> → <code>{b}</code></h1>
<p>A: {la} against <code>{ta}</code> · B: {lb} against <code>{tb}</code><br>
<b class=warn>{broke} broke</b> (pass → fail) · {fixed} fixed · {moved} failed in both on another primitive</p>
"##,
        a = esc(&c.a.id),
        b = esc(&c.b.id),
        la = esc(&c.a.label),
        lb = esc(&c.b.label),
        ta = esc(&c.a.target),
        tb = esc(&c.b.target),
        broke = c.broke.len(),
        fixed = c.fixed.len(),
        moved = c.moved.len(),
    );
    h.push_str("<h2>Environment: which difference broke which test</h2>");
    match (&c.environment, &c.environment_missing) {
        (Some(env), _) => {
            let _ = write!(
                h,
                "<p>{} difference(s); {} of {} broken test(s) explained by one, <b>{} unexplained</b>.</p>",
                env.differences.len(),
                c.broke.len() - env.unexplained.len(),
                c.broke.len(),
                env.unexplained.len()
            );
            h.push_str("<table><tr><th class=l>facet/key</th><th class=l>A</th><th class=l>B</th><th>explains</th><th>possible</th><th class=l>tests explained</th></tr>");
            for e in &env.differences {
                let d = &e.difference;
                let muted = if e.explains.is_empty() && e.possible.is_empty() {
                    " class=muted"
                } else {
                    ""
                };
                let _ = write!(
                    h,
                    "<tr{muted}><td class=l><code>{}/{}</code></td><td class=l>{}</td><td class=l>{}</td><td>{}</td><td>{}</td><td class=l>{}</td></tr>",
                    esc(&d.facet),
                    esc(&d.key),
                    esc(&cut(&probe::env::diff::words(d.a.as_ref()), 80)),
                    esc(&cut(&probe::env::diff::words(d.b.as_ref()), 80)),
                    e.explains.len(),
                    e.possible.len(),
                    esc(&cut(&e.explains.join(", "), 200))
                );
            }
            h.push_str("</table>");
            if !env.unexplained.is_empty() {
                h.push_str("<h3>Unexplained: broke, and no difference touches the failure</h3><table><tr><th class=l>test</th><th class=l>layer/primitive</th><th class=l>explanation</th></tr>");
                for id in &env.unexplained {
                    if let Some(f) = c.broke.iter().find(|f| &f.test_id == id) {
                        let _ = write!(
                            h,
                            "<tr><td class=l>{}</td><td class=l>{}/{}</td><td class=l>{}</td></tr>",
                            esc(id),
                            esc(&f.layer),
                            esc(&f.primitive),
                            esc(&cut(&f.explanation, 160))
                        );
                    }
                }
                h.push_str("</table>");
            }
        }
        (None, Some(why)) => {
            let _ = write!(h, "<p class=muted>{}</p>", esc(why));
        }
        (None, None) => {}
    }
    h.push_str("<h2>Broke in B</h2><table><tr><th class=l>test</th><th class=l>layer/primitive</th><th class=l>explanation</th></tr>");
    for f in &c.broke {
        let _ = write!(
            h,
            "<tr><td class=l>{}</td><td class=l>{}/{}</td><td class=l>{}</td></tr>",
            esc(&f.test_id),
            esc(&f.layer),
            esc(&f.primitive),
            esc(&cut(&f.explanation, 160))
        );
    }
    h.push_str("</table></body></html>\n");
    h
}

fn domains(r: &Report, h: &mut String) {
    h.push_str("<h2>Pass / degraded / fail per domain</h2><table><tr><th class=l>domain</th><th>pass</th><th>degraded</th><th>fail</th><th>unsupported</th><th class=l></th></tr>");
    for (d, c) in &r.domains {
        let n = (c.passed + c.degraded + c.failed).max(1) as f64;
        let _ = write!(
            h,
            "<tr><td class=l>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=l><div class=bar><div class=p style=\"width:{:.1}%\"></div><div class=d style=\"width:{:.1}%\"></div><div class=f style=\"width:{:.1}%\"></div></div></td></tr>",
            esc(d),
            c.passed,
            c.degraded,
            c.failed,
            c.unsupported,
            100.0 * c.passed as f64 / n,
            100.0 * c.degraded as f64 / n,
            100.0 * c.failed as f64 / n
        );
    }
    h.push_str("</table>");
}

fn heat_map(r: &Report, h: &mut String) {
    let mut prims: BTreeSet<&String> = BTreeSet::new();
    for m in r.heat.values() {
        prims.extend(m.keys());
    }
    let max = r
        .heat
        .values()
        .flat_map(|m| m.values())
        .copied()
        .max()
        .unwrap_or(1)
        .max(1);
    h.push_str("<h2>Failures: domain × primitive</h2>");
    if prims.is_empty() {
        h.push_str("<p>No failures.</p>");
        return;
    }
    h.push_str("<table><tr><th class=l>domain</th>");
    for p in &prims {
        let _ = write!(h, "<th>{}</th>", esc(p));
    }
    h.push_str("</tr>");
    for d in r.domains.keys() {
        let _ = write!(h, "<tr><td class=l>{}</td>", esc(d));
        for p in &prims {
            let n = r.heat.get(d).and_then(|m| m.get(*p)).copied().unwrap_or(0);
            let alpha = if n == 0 {
                0.0
            } else {
                0.15 + 0.85 * n as f64 / max as f64
            };
            let _ = write!(
                h,
                "<td style=\"background:rgba(229,57,53,{alpha:.2})\">{}</td>",
                if n == 0 { String::new() } else { n.to_string() }
            );
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
}

fn layers(r: &Report, h: &mut String) {
    if r.top.is_empty() {
        return;
    }
    h.push_str("<h2>Layers</h2><table><tr><th class=l>layer</th><th class=l>primitive</th><th>tests</th><th class=l>example</th></tr>");
    for e in &r.top {
        let _ = write!(
            h,
            "<tr><td class=l>{}</td><td class=l>{}</td><td>{}</td><td class=l><code>{}</code>: {}</td></tr>",
            esc(&e.layer),
            esc(&e.primitive),
            e.tests,
            esc(&e.example_test),
            esc(&cut(&e.example, 160))
        );
    }
    h.push_str("</table>");
}

/// Failed tests with one explanation pattern.
struct Group<'a> {
    pattern: String,
    tests: Vec<&'a Failure>,
}

/// A primitive's groups, largest first.
struct Primitive<'a> {
    name: &'a str,
    tests: usize,
    groups: Vec<Group<'a>>,
}

/// A layer's primitives, largest first.
struct Layer<'a> {
    name: &'a str,
    tests: usize,
    primitives: Vec<Primitive<'a>>,
}

/// layer → primitive → pattern, each level largest first (ties by name).
fn grouped(failures: &[Failure]) -> Vec<Layer<'_>> {
    let mut tree: BTreeMap<&str, BTreeMap<&str, BTreeMap<String, Vec<&Failure>>>> = BTreeMap::new();
    for f in failures {
        tree.entry(&f.layer)
            .or_default()
            .entry(&f.primitive)
            .or_default()
            .entry(pattern(&f.explanation))
            .or_default()
            .push(f);
    }
    let mut layers: Vec<Layer> = tree
        .into_iter()
        .map(|(name, prims)| {
            let mut primitives: Vec<Primitive> = prims
                .into_iter()
                .map(|(name, pats)| {
                    let mut groups: Vec<Group> = pats
                        .into_iter()
                        .map(|(pattern, tests)| Group { pattern, tests })
                        .collect();
                    groups.sort_by_key(|g| Reverse(g.tests.len()));
                    Primitive {
                        name,
                        tests: groups.iter().map(|g| g.tests.len()).sum(),
                        groups,
                    }
                })
                .collect();
            primitives.sort_by_key(|p| Reverse(p.tests));
            Layer {
                name,
                tests: primitives.iter().map(|p| p.tests).sum(),
                primitives,
            }
        })
        .collect();
    layers.sort_by_key(|l| Reverse(l.tests));
    layers
}

/// A pattern, escaped, its placeholders marked.
fn marked(pattern: &str) -> String {
    let mut s = esc(&cut(pattern, 240));
    for p in PLACEHOLDERS {
        s = s.replace(&esc(p), &format!("<i class=ph>{}</i>", esc(p)));
    }
    s
}

fn failed(r: &Report, h: &mut String) {
    let _ = write!(h, "<h2 id=failed>Failed tests ({})</h2>", r.failures.len());
    if r.failures.is_empty() {
        h.push_str("<p>No failed tests.</p>");
        return;
    }
    h.push_str("<p class=muted>Grouped by layer, primitive and explanation pattern (pids, ports, numbers, digests and quoted values as <i class=ph>&lt;placeholders&gt;</i>); largest groups first. Open a group for its tests, a test for its evidence.</p>\
        <input id=q placeholder=\"filter: test id, domain, primitive, words of the explanation\" oninput=\"f()\"><div id=list>");
    for layer in grouped(&r.failures) {
        let _ = write!(
            h,
            "<div class=sec><h3>layer {} <span class=muted>· {} tests</span></h3>",
            esc(layer.name),
            layer.tests
        );
        for p in layer.primitives {
            let n = p.groups.len();
            let _ = write!(
                h,
                "<div class=sec><h4>{} <span class=muted>· {} tests, {n} pattern{}</span></h4>",
                esc(p.name),
                p.tests,
                if n == 1 { "" } else { "s" }
            );
            for g in p.groups {
                let _ = write!(
                    h,
                    "<details class=grp><summary><span class=cnt>{}</span><span class=pat>{}</span></summary>",
                    g.tests.len(),
                    marked(&g.pattern)
                );
                for f in g.tests {
                    test(r, f, h);
                }
                h.push_str("</details>");
            }
            h.push_str("</div>");
        }
        h.push_str("</div>");
    }
    h.push_str("</div>");
}

fn degraded(r: &Report, h: &mut String) {
    let _ = write!(
        h,
        "<h2 id=degraded>Degraded tests ({})</h2>",
        r.degraded_tests.len()
    );
    if r.degraded_tests.is_empty() {
        h.push_str("<p>No degraded tests.</p>");
        return;
    }
    h.push_str("<p class=muted>These passed, but ran past their time limit or stalled on memory.</p><div class=\"grp dg\">");
    for f in &r.degraded_tests {
        test(r, f, h);
    }
    h.push_str("</div>");
}

/// One test: a summary line, and opened, its evidence.
fn test(r: &Report, f: &Failure, h: &mut String) {
    let key = format!(
        "{} {} {} {} {} {}",
        f.test_id, f.domain, f.layer, f.primitive, f.title, f.explanation
    )
    .to_lowercase();
    let _ = write!(
        h,
        "<details class=t data-k=\"{}\"><summary><code>{}</code> <span class=muted>{} · {} · {:.2}</span> — {}{}</summary><div class=ev><p class=muted>{}</p>",
        esc(&key),
        esc(&f.test_id),
        esc(&f.domain),
        esc(&f.primitive),
        f.confidence,
        esc(&cut(&f.explanation, 160)),
        if r.images.contains_key(&f.test_id) {
            " <span class=muted>[screenshot]</span>"
        } else {
            ""
        },
        esc(&f.title)
    );
    if f.explanation.chars().count() > 160 {
        let _ = write!(h, "<p>{}</p>", esc(&f.explanation));
    }
    if let Some(m) = &f.minimized {
        let _ = write!(
            h,
            "<p><b>minimized cause</b> (campaign shrink): {}</p>",
            esc(m)
        );
    }
    let ev = &f.evidence;
    let step = ev["step"].as_u64();
    let at = |s: Option<u64>| s.map(|s| format!(" (step {s})")).unwrap_or_default();
    list(
        h,
        &format!("Failed expectations{}", at(step)),
        &ev["failures"],
    );
    list(
        h,
        &format!("Interface messages{}", at(step)),
        &ev["interface"],
    );
    if ev["kernel"].is_object() {
        kernel(
            h,
            &ev["kernel"],
            ev["kernel_step"].as_u64().or(step),
            &f.explanation,
        );
    }
    if let Some(url) = r.images.get(&f.test_id) {
        screenshot(h, &f.test_id, url);
    }
    if !ev.is_null() {
        let _ = write!(
            h,
            "<details><summary class=muted>raw evidence JSON</summary><pre>{}</pre></details>",
            esc(&serde_json::to_string_pretty(ev).unwrap_or_default())
        );
    }
    h.push_str("</div></details>");
}

/// A JSON array of strings as a list; nothing when empty.
fn list(h: &mut String, title: &str, items: &Value) {
    let Some(items) = items.as_array().filter(|a| !a.is_empty()) else {
        return;
    };
    let _ = write!(h, "<h5>{}</h5><ul>", esc(title));
    for i in items {
        let _ = write!(
            h,
            "<li>{}</li>",
            esc(&cut(&text(i).unwrap_or_default(), 600))
        );
    }
    h.push_str("</ul>");
}

/// A JSON string or number as text; `None` for null and absent.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        v => Some(v.to_string()),
    }
}

/// What died in the server's tree between the previous call and this one
/// (the proxy's `before_call`), when something did.
fn before_call(h: &mut String, k: &Value) {
    let before = &k["before_call"];
    let failed = before["hidden_failure"]
        .as_object()
        .map_or(before, |_| &before["hidden_failure"]);
    if let Some(primitive) = text(&failed["primitive"]).filter(|p| p != "none") {
        let _ = write!(
            h,
            "<p>before the call: <b>{}</b> — {}</p>",
            esc(&primitive),
            esc(&text(&failed["explanation"]).unwrap_or_default())
        );
    }
}

/// The probe's attribution for the step: what it concluded, and the
/// events around the decisive one as a timeline.
/// `said` is the test's explanation: the probe's is left out when it only repeats it.
fn kernel(h: &mut String, k: &Value, step: Option<u64>, said: &str) {
    let _ = write!(
        h,
        "<h5>Kernel evidence{}</h5>",
        step.map(|s| format!(" (step {s})")).unwrap_or_default()
    );
    if k["available"] == Value::Bool(false) {
        let _ = write!(
            h,
            "<p class=muted>none: {}</p>",
            esc(&text(&k["reason"]).unwrap_or_else(|| "the probe was not attached".into()))
        );
        // the call's own span is lost, what died before it is not
        before_call(h, k);
        return;
    }
    let unless_said = |why: &Value| match text(why) {
        Some(why) if !why.is_empty() && said.contains(why.as_str()) => "as above".to_string(),
        why => esc(&why.unwrap_or_default()),
    };
    let exit = match (text(&k["exit"]["code"]), text(&k["exit"]["signal"])) {
        (_, Some(sig)) => format!(" · killed by {}", esc(&sig)),
        (Some(code), None) => format!(" · exit {}", esc(&code)),
        _ => String::new(),
    };
    let _ = write!(
        h,
        "<p><b>{}</b>{}{} — {}</p>",
        esc(&text(&k["primitive"]).unwrap_or_else(|| "none".into())),
        text(&k["layer"])
            .map(|l| format!(" <span class=muted>({})</span>", esc(&l)))
            .unwrap_or_default(),
        exit,
        unless_said(&k["explanation"])
    );
    if let Some(hf) = k["hidden_failure"].as_object() {
        let _ = write!(
            h,
            "<p>hidden failure: <b>{}</b> — {}</p>",
            esc(&text(&hf["primitive"]).unwrap_or_default()),
            unless_said(&hf["explanation"])
        );
    }
    before_call(h, k);
    if let Some(hint) = text(&k["hint"]) {
        let _ = write!(h, "<p class=muted>hint: {}</p>", esc(&hint));
    }
    // failed lookups the probe saw but nothing corroborated: never the cause
    for n in k["noticed"].as_array().into_iter().flatten() {
        if let Some(n) = n.as_str() {
            let _ = write!(h, "<p class=muted>noticed, not the cause: {}</p>", esc(n));
        }
    }
    let decisive = &k["decisive"];
    let mut events: Vec<&Value> = k["events"].as_array().into_iter().flatten().collect();
    if decisive.is_object() && !events.contains(&decisive) {
        let ts = decisive["ts_ns"].as_f64().unwrap_or(0.0);
        let at = events
            .iter()
            .position(|e| e["ts_ns"].as_f64().unwrap_or(0.0) > ts)
            .unwrap_or(events.len());
        events.insert(at, decisive);
    }
    if events.is_empty() {
        h.push_str("<p class=muted>no kernel events recorded around this step</p>");
        return;
    }
    if !decisive.is_object() {
        h.push_str(
            "<p class=muted>no decisive event: the events below are the span's last ones</p>",
        );
    }
    h.push_str("<table class=tl><tr><th>+ms</th><th>process</th><th>kind</th><th>call</th><th>errno / signal</th><th>repeats</th></tr>");
    for e in events {
        let dec = decisive.is_object() && e == decisive;
        let _ = write!(
            h,
            "<tr{}><td class=r>{}</td><td>{}</td><td>{}{}</td><td>{}</td><td>{}</td><td class=r>{}</td></tr>",
            if dec { " class=dec" } else { "" },
            e["ts_ns"]
                .as_f64()
                .map(|ns| format!("+{:.3}", ns / 1e6))
                .unwrap_or_default(),
            esc(&format!(
                "{}[{}]",
                text(&e["comm"]).unwrap_or_else(|| "?".into()),
                text(&e["pid"]).unwrap_or_else(|| "?".into())
            )),
            esc(&text(&e["kind"]).unwrap_or_default()),
            if dec { " ◀ decisive" } else { "" },
            esc(&call(e)),
            esc(&text(&e["errno"])
                .or_else(|| text(&e["signal"]))
                .unwrap_or_default()),
            e["repeats"]
                .as_u64()
                .filter(|&n| n > 1)
                .map(|n| format!("×{n}"))
                .unwrap_or_default()
        );
    }
    h.push_str("</table>");
}

/// What an event did: `syscall(path|addr)`, an exit code, a signal's sender.
fn call(e: &Value) -> String {
    let target = text(&e["path"]).or_else(|| text(&e["addr"]));
    let mut parts: Vec<String> = Vec::new();
    match (text(&e["syscall"]), target) {
        (Some(sc), Some(t)) => parts.push(format!("{sc}({t})")),
        (Some(one), None) | (None, Some(one)) => parts.push(one),
        (None, None) => {}
    }
    if let Some(code) = text(&e["exit_code"]) {
        parts.push(format!("exit code {code}"));
    }
    if let (Some(comm), Some(pid)) = (text(&e["sender_comm"]), text(&e["sender_pid"])) {
        parts.push(format!("from {comm}[{pid}]"));
    }
    if let Some(via) = text(&e["via"]) {
        parts.push(format!("via {via}"));
    }
    if let Some(ns) = e["duration_ns"].as_f64() {
        parts.push(format!("after {:.3} ms", ns / 1e6));
    }
    parts.join(" ")
}

/// The image a test read back, inline, labelled with its size and with a
/// word when it is not a whole PNG (the browser then shows a broken image).
fn screenshot(h: &mut String, test: &str, url: &str) {
    let (mime, data) = url
        .strip_prefix("data:")
        .and_then(|u| u.split_once(";base64,"))
        .map(|(mime, b64)| {
            (
                mime,
                contract::bytes::base64_decode(b64).unwrap_or_default(),
            )
        })
        .unwrap_or(("?", Vec::new()));
    let problem = if mime != "image/png" {
        None
    } else if !data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(
            "not a PNG: its first bytes are not the PNG signature (mangled on the way?), so it cannot render",
        )
    } else if !data.ends_with(b"IEND\xae\x42\x60\x82") {
        Some(
            "an incomplete PNG: it has no IEND chunk at its end (cut short?), so it renders partly or not at all",
        )
    } else {
        None
    };
    let _ = write!(
        h,
        "<h5>Screenshot read back</h5><div class=shot><img src=\"{}\" alt=\"screenshot of {} ({} bytes): the browser could not render it\"><span class=muted>{} bytes, {}</span>{}</div>",
        esc(url),
        esc(test),
        data.len(),
        data.len(),
        esc(mime),
        problem
            .map(|p| format!(" · <span class=warn>{}</span>", esc(p)))
            .unwrap_or_else(|| " · a complete PNG".into())
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::super::report::{Failure, Outcomes, Report, RunInfo};
    use super::*;

    fn failure(id: &str, primitive: &str, explanation: &str, evidence: Value) -> Failure {
        Failure {
            test_id: id.into(),
            domain: "network".into(),
            title: format!("title of {id}"),
            layer: "sandbox".into(),
            primitive: primitive.into(),
            confidence: 0.9,
            explanation: explanation.into(),
            evidence,
            minimized: None,
        }
    }

    fn report(failures: Vec<Failure>, degraded_tests: Vec<Failure>) -> Report {
        Report {
            run: RunInfo {
                id: "r1".into(),
                label: "label".into(),
                target: "bridge".into(),
                suite: "suite".into(),
                tests_total: 10,
                recorded: 10,
                complete: true,
                started_ms: 0,
                finished_ms: Some(1),
                adapter: None,
            },
            targets: Vec::new(),
            domains: BTreeMap::from([(
                "network".to_string(),
                Outcomes {
                    passed: 5,
                    degraded: degraded_tests.len() as i64,
                    failed: failures.len() as i64,
                    unsupported: 0,
                },
            )]),
            layers: BTreeMap::new(),
            heat: BTreeMap::new(),
            top: Vec::new(),
            failed: failures.len() as i64,
            degraded: degraded_tests.len() as i64,
            failures,
            degraded_tests,
            unsupported_tests: Vec::new(),
            unsupported: 0,
            images: BTreeMap::new(),
            passed: 5,
            wall_s: 1.0,
            test_time_s: 1.0,
            environment: vec![],
        }
    }

    fn refused(id: &str, pid: u32, port: u32) -> Failure {
        let decisive = json!({"kind": "syscall_failed", "syscall": "connect", "errno": "ECONNREFUSED",
            "addr": format!("127.66.0.1:{port}"), "pid": pid, "comm": "python3", "ts_ns": 2_500_000});
        failure(
            id,
            "net.egress",
            &format!(
                "step 1: connect(127.66.0.1:{port}) failed with ECONNREFUSED in python3 (pid {pid})"
            ),
            json!({"step": 1, "failures": ["expected exit code 0, got exit code 1"], "interface": [],
                "kernel": {"available": true, "primitive": "net.egress", "explanation": "refused",
                    "decisive": decisive,
                    "events": [{"kind": "exec", "pid": pid, "comm": "python3", "ts_ns": 1_000_000},
                        decisive,
                        {"kind": "exit", "pid": pid, "comm": "python3", "exit_code": 1, "ts_ns": 3_000_000, "repeats": 4}]}}),
        )
    }

    /// The `<details class=grp>` groups, in order: (count, pattern text).
    fn groups(h: &str) -> Vec<(usize, String)> {
        h.split("<details class=grp><summary><span class=cnt>")
            .skip(1)
            .map(|g| {
                let (n, rest) = g.split_once("</span>").unwrap();
                let pat = rest.split("</summary>").next().unwrap();
                (n.parse().unwrap(), pat.to_string())
            })
            .collect()
    }

    #[test]
    fn same_failure_with_other_pids_and_ports_is_one_group_largest_first() {
        let r = report(
            vec![
                failure(
                    "fs-1",
                    "fs.missing",
                    "step 0: openat(\"/etc/x\") failed with ENOENT in sh (pid 9)",
                    Value::Null,
                ),
                refused("net-1", 26734, 43273),
                refused("net-2", 26800, 38819),
                refused("net-3", 11, 1),
                failure(
                    "net-4",
                    "net.egress",
                    "step 1: connect(127.66.0.1:43273) failed with ENETUNREACH in python3 (pid 5)",
                    Value::Null,
                ),
            ],
            vec![],
        );
        let h = html(&r);
        let g = groups(&h);
        assert_eq!(g.len(), 3, "{g:?}");
        assert_eq!(g[0].0, 3);
        assert!(g[0].1.contains("ECONNREFUSED"), "{g:?}");
        assert_eq!(g[1].0, 1);
        assert!(g[1].1.contains("ENETUNREACH"), "{g:?}");
        assert!(g[2].1.contains("openat"), "{g:?}");
        // the net.egress section (4 tests) comes before fs.missing (1)
        assert!(h.find("net.egress <span").unwrap() < h.find("fs.missing <span").unwrap());
    }

    #[test]
    fn unavailable_evidence_still_shows_what_died_before_the_call() {
        let oom = json!({"available": true, "failed": true, "primitive": "mem.oom",
            "explanation": "chromium (pid 41) was killed by the OOM killer"});
        let k = json!({"available": false, "reason": "the probe daemon did not answer within 30 s",
            "before_call": oom});
        let h = html(&report(
            vec![failure(
                "browser-1",
                "mem.oom",
                "step 0: before its call, chromium died",
                json!({"step": 0, "failures": [], "interface": [], "kernel": k}),
            )],
            vec![],
        ));
        assert!(
            h.contains("none: the probe daemon did not answer within 30 s"),
            "{h}"
        );
        assert!(
            h.contains(
                "before the call: <b>mem.oom</b> — chromium (pid 41) was killed by the OOM killer"
            ),
            "{h}"
        );
    }

    #[test]
    fn timeline_marks_the_decisive_event() {
        let h = html(&report(vec![refused("net-1", 26734, 43273)], vec![]));
        let row = h
            .split("<tr class=dec>")
            .nth(1)
            .expect("a decisive row")
            .split("</tr>")
            .next()
            .unwrap();
        assert!(row.contains("+2.500"), "{row}");
        assert!(row.contains("python3[26734]"), "{row}");
        assert!(row.contains("connect(127.66.0.1:43273)"), "{row}");
        assert!(row.contains("ECONNREFUSED"), "{row}");
        assert_eq!(h.matches("<tr class=dec>").count(), 1);
        assert!(h.contains("×4"));
        assert!(h.contains("expected exit code 0, got exit code 1"));
        assert!(h.contains("raw evidence JSON"));
    }

    #[test]
    fn screenshots_are_inline_and_a_broken_png_is_named() {
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend_from_slice(b"\0\0\0\0IEND\xae\x42\x60\x82");
        let whole = format!(
            "data:image/png;base64,{}",
            contract::bytes::base64_encode(&png)
        );
        let cut_short = format!(
            "data:image/png;base64,{}",
            contract::bytes::base64_encode(&png[..10])
        );
        let mut r = report(
            vec![refused("browser-1", 1, 2), refused("browser-2", 3, 4)],
            vec![],
        );
        r.images.insert("browser-1".into(), whole.clone());
        r.images.insert("browser-2".into(), cut_short.clone());
        let h = html(&r);
        assert!(h.contains(&format!("<img src=\"{whole}\" alt=")));
        assert!(h.contains(&format!("<img src=\"{cut_short}\" alt=")));
        assert!(h.contains(&format!(
            "{} bytes, image/png</span> · a complete PNG",
            png.len()
        )));
        assert!(h.contains("10 bytes, image/png</span> · <span class=warn>an incomplete PNG"));
    }

    #[test]
    fn text_is_escaped() {
        let mut f = refused("net-1", 1, 2);
        f.explanation = "step 0: <script>alert(1)</script> & \"q\"".into();
        f.evidence["kernel"]["events"][0]["comm"] = json!("<b>x</b>");
        let h = html(&report(vec![f], vec![]));
        assert!(!h.contains("<script>alert"), "unescaped explanation");
        assert!(!h.contains("<b>x</b>"), "unescaped event");
        assert!(h.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(h.contains("&lt;b&gt;x&lt;/b&gt;[1]"));
        assert_eq!(h.matches("<script>").count(), 1, "only the filter script");
    }

    #[test]
    fn degraded_tests_have_their_own_section() {
        let mut slow = failure(
            "browser-7",
            "mem.pressure",
            "step 2: took 9000 ms, past max_duration_ms 5000",
            Value::Null,
        );
        slow.domain = "browser".into();
        let h = html(&report(vec![], vec![slow]));
        let section = h
            .split("<h2 id=degraded>")
            .nth(1)
            .expect("a degraded section");
        assert!(section.starts_with("Degraded tests (1)"));
        assert!(section.contains("browser-7"));
        assert!(section.contains("took 9000 ms, past max_duration_ms 5000"));
        assert!(h.contains("<p>No failed tests.</p>"));
    }

    #[test]
    fn every_test_is_searchable_by_its_words() {
        let h = html(&report(vec![refused("net-1", 1, 2)], vec![]));
        let key = h
            .split("data-k=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        for w in [
            "net-1",
            "network",
            "sandbox",
            "net.egress",
            "econnrefused",
            "python3",
        ] {
            assert!(key.contains(w), "{w} not in {key}");
        }
    }
}
