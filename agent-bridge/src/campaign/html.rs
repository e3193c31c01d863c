//! The self-contained HTML report of one run.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::report::{Report, cut};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One self-contained HTML file: heat map, per-domain bars, a searchable
/// failure list with evidence. No external assets.
pub fn html(r: &Report) -> String {
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
    let mut h = String::new();
    let run = &r.run;
    let _ = write!(
        h,
        r#"<!doctype html><html><head><meta charset="utf-8"><title>campaign {id}</title><style>
body{{font:14px system-ui,sans-serif;margin:2em;color:#222}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} th{{background:#f3f3f3}} td.l,th.l{{text-align:left}}
.bar{{display:flex;height:16px;width:400px;background:#eee}} .p{{background:#4caf50}} .d{{background:#ffb300}} .f{{background:#e53935}}
pre{{white-space:pre-wrap;background:#f8f8f8;padding:6px;margin:0;font-size:12px}} details{{margin:2px 0}}
#q{{width:400px;padding:4px}} .muted{{color:#777}}
</style></head><body>
<h1>Campaign run <code>{id}</code></h1>
<p>{label} · target <code>{target}</code> · suite <code>{suite}</code><br>
<b>{rec}</b> of {total} tests recorded{complete} · <b style="color:#2e7d32">{pass} passed</b> · <b style="color:#b26a00">{degraded} degraded</b> · <b style="color:#c62828">{fail} failed</b> · {wall:.0} s wall</p>
"#,
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
        wall = r.wall_s
    );
    h.push_str("<h2>Pass / degraded / fail per domain</h2><table><tr><th class=l>domain</th><th>pass</th><th>degraded</th><th>fail</th><th class=l></th></tr>");
    for (d, c) in &r.domains {
        let n = (c.passed + c.degraded + c.failed).max(1) as f64;
        let _ = write!(
            h,
            "<tr><td class=l>{d}</td><td>{}</td><td>{}</td><td>{}</td><td class=l><div class=bar><div class=p style=\"width:{:.1}%\"></div><div class=d style=\"width:{:.1}%\"></div><div class=f style=\"width:{:.1}%\"></div></div></td></tr>",
            c.passed,
            c.degraded,
            c.failed,
            100.0 * c.passed as f64 / n,
            100.0 * c.degraded as f64 / n,
            100.0 * c.failed as f64 / n
        );
    }
    h.push_str("</table><h2>Failures: domain × primitive</h2>");
    if prims.is_empty() {
        h.push_str("<p>No failures.</p>");
    } else {
        h.push_str("<table><tr><th class=l>domain</th>");
        for p in &prims {
            let _ = write!(h, "<th>{}</th>", esc(p));
        }
        h.push_str("</tr>");
        for d in r.domains.keys() {
            let _ = write!(h, "<tr><td class=l>{d}</td>");
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
    let _ = write!(
        h,
        "</table><h2>Failed tests ({})</h2><input id=q placeholder=\"filter: test id, domain, primitive, words of the explanation\" oninput=\"f()\"><div id=list>",
        r.failures.len()
    );
    for f in &r.failures {
        let _ = write!(
            h,
            "<details data-k=\"{key}\"><summary><code>{id}</code> {layer}/<b>{prim}</b> <span class=muted>({conf:.2})</span> — {expl}</summary><p>{title}</p><pre>{ev}</pre></details>",
            key = esc(&format!(
                "{} {} {} {} {}",
                f.test_id, f.domain, f.layer, f.primitive, f.explanation
            )
            .to_lowercase()),
            id = esc(&f.test_id),
            layer = esc(&f.layer),
            prim = esc(&f.primitive),
            conf = f.confidence,
            expl = esc(&cut(&f.explanation, 140)),
            title = esc(&f.title),
            ev = esc(&serde_json::to_string_pretty(&f.evidence).unwrap_or_default()),
        );
    }
    h.push_str(
        "</div><script>function f(){var q=document.getElementById('q').value.toLowerCase().split(/\\s+/).filter(Boolean);\
         document.querySelectorAll('#list details').forEach(function(d){var k=d.dataset.k;\
         d.style.display=q.every(function(w){return k.indexOf(w)>=0})?'':'none'})}</script></body></html>\n",
    );
    h
}
