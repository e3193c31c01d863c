//! Argument templates: `{var}` placeholders, their filters, rendering a
//! step's values into the target's arguments.

use super::*;

pub(super) const FILTERS: &str =
    "text, base64, sh, dirname, interpreter, default:VALUE, map:FROM=TO,…,*=TO";

/// A template value: JSON, or bytes (write_file's `content`).
#[derive(Debug, Clone)]
pub(super) enum TVal {
    Json(Value),
    Bytes(Vec<u8>),
}

/// One `{{var|filter|…}}`.
#[derive(Debug, Clone)]
pub(super) struct Placeholder {
    pub(super) var: String,
    pub(super) filters: Vec<String>,
}

/// A template string: literal text and placeholders.
#[derive(Debug, Clone)]
pub(super) enum Piece {
    Text(String),
    Var(Placeholder),
}

pub(super) fn parse_template(s: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find("{{") {
        if start > 0 {
            pieces.push(Piece::Text(rest[..start].to_string()));
        }
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("`{{{{` without `}}}}` in {s:?}"))?;
        let mut parts = after[..end].split('|').map(str::trim);
        let var = parts.next().unwrap_or_default().to_string();
        if var.is_empty() {
            return Err(format!("an empty placeholder in {s:?}"));
        }
        let filters: Vec<String> = parts.map(String::from).collect();
        for f in &filters {
            let name = f.split(':').next().unwrap_or_default();
            if !matches!(
                name,
                "text" | "base64" | "sh" | "dirname" | "interpreter" | "default" | "map"
            ) {
                return Err(format!("unknown filter `{f}` (filters: {FILTERS})"));
            }
            if f.starts_with("map:") && !f[4..].split(',').all(|p| p.contains('=')) {
                return Err(format!("`{f}`: a map is map:FROM=TO,FROM=TO,*=DEFAULT"));
            }
        }
        pieces.push(Piece::Var(Placeholder { var, filters }));
        rest = &after[end + 2..];
    }
    if rest.contains("}}") {
        return Err(format!("`}}}}` without `{{{{` in {s:?}"));
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_string()));
    }
    Ok(pieces)
}

/// Every placeholder variable in a TOML argument value, checked.
pub(super) fn template_vars(v: &toml::Value, out: &mut BTreeSet<String>) -> Result<(), String> {
    match v {
        toml::Value::String(s) => {
            for p in parse_template(s)? {
                if let Piece::Var(p) = p {
                    out.insert(p.var);
                }
            }
        }
        toml::Value::Array(a) => {
            for x in a {
                template_vars(x, out)?;
            }
        }
        toml::Value::Table(t) => {
            for x in t.values() {
                template_vars(x, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub(super) fn interpreter(language: &str) -> Option<&'static str> {
    Some(match language {
        "python" => "python3",
        "sh" => "sh",
        "bash" => "bash",
        "node" => "node",
        "perl" => "perl",
        _ => return None,
    })
}

pub(super) fn as_text(v: TVal, var: &str) -> Result<String, Unsupported> {
    match v {
        TVal::Json(Value::String(s)) => Ok(s),
        TVal::Json(v) => Ok(v.to_string()),
        TVal::Bytes(b) => String::from_utf8(b).map_err(|e| {
            Unsupported(format!(
                "`{var}` is not UTF-8 (invalid byte at offset {}) and the target takes text only",
                e.utf8_error().valid_up_to()
            ))
        }),
    }
}

/// A map target as sent: JSON when it is a number or true/false, else text.
pub(super) fn typed(to: &str) -> Value {
    match serde_json::from_str::<Value>(to) {
        Ok(v @ (Value::Number(_) | Value::Bool(_))) => v,
        _ => Value::String(to.into()),
    }
}

pub(super) fn apply_filter(
    v: Option<TVal>,
    filter: &str,
    var: &str,
) -> Result<Option<TVal>, Unsupported> {
    let (name, arg) = filter.split_once(':').unwrap_or((filter, ""));
    if name == "default" {
        return Ok(Some(v.unwrap_or_else(|| {
            TVal::Json(serde_json::from_str(arg).unwrap_or_else(|_| Value::String(arg.into())))
        })));
    }
    let Some(v) = v else { return Ok(None) };
    let s = |v| as_text(v, var);
    Ok(Some(match name {
        "text" => TVal::Json(Value::String(s(v)?)),
        "base64" => TVal::Json(Value::String(match v {
            TVal::Bytes(b) => base64_encode(&b),
            v => base64_encode(s(v)?.as_bytes()),
        })),
        "sh" => TVal::Json(Value::String(shell_quote(&s(v)?))),
        "dirname" => {
            let path = s(v)?;
            let parent = Path::new(&path)
                .parent()
                .map_or(String::new(), |p| p.to_string_lossy().into_owned());
            TVal::Json(Value::String(if parent.is_empty() {
                ".".into()
            } else {
                parent
            }))
        }
        "interpreter" => {
            let lang = s(v)?;
            let i = interpreter(&lang)
                .ok_or_else(|| Unsupported(format!("no interpreter known for `{lang}`")))?;
            TVal::Json(Value::String(i.into()))
        }
        "map" => {
            let key = s(v)?;
            let mut default = None;
            for pair in arg.split(',') {
                let (from, to) = pair.split_once('=').unwrap_or((pair, ""));
                if from == key {
                    return Ok(Some(TVal::Json(typed(to))));
                }
                if from == "*" {
                    default = Some(to);
                }
            }
            match default {
                Some(to) => TVal::Json(typed(to)),
                None => return Err(Unsupported(format!("`{var}` = {key:?} has no mapping"))),
            }
        }
        _ => unreachable!("filters are checked when the adapter loads"),
    }))
}

/// The value of one template string; `None` when a lone placeholder's
/// variable is absent (the argument is then left out).
pub(super) fn render(s: &str, vars: &BTreeMap<String, TVal>) -> Result<Option<Value>, Unsupported> {
    let pieces = parse_template(s).map_err(Unsupported)?;
    let value_of = |p: &Placeholder| -> Result<Option<TVal>, Unsupported> {
        let mut v = vars.get(&p.var).cloned();
        for f in &p.filters {
            v = apply_filter(v, f, &p.var)?;
        }
        Ok(v)
    };
    if let [Piece::Var(p)] = pieces.as_slice() {
        // a lone placeholder keeps its type: a number stays a number
        return Ok(match value_of(p)? {
            None => None,
            Some(TVal::Json(v)) => Some(v),
            Some(b @ TVal::Bytes(_)) => Some(Value::String(as_text(b, &p.var)?)),
        });
    }
    let mut out = String::new();
    for piece in &pieces {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Var(p) => match value_of(p)? {
                Some(v) => out.push_str(&as_text(v, &p.var)?),
                None => {
                    return Err(Unsupported(format!(
                        "the step has no `{}`, which the template {s:?} needs",
                        p.var
                    )));
                }
            },
        }
    }
    Ok(Some(Value::String(out)))
}

pub(super) fn render_value(
    v: &Value,
    vars: &BTreeMap<String, TVal>,
) -> Result<Option<Value>, Unsupported> {
    Ok(match v {
        Value::String(s) => render(s, vars)?,
        Value::Array(a) => Some(Value::Array(
            a.iter()
                .map(|x| render_value(x, vars))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .flatten()
                .collect(),
        )),
        Value::Object(o) => {
            let mut m = Map::new();
            for (k, x) in o {
                if let Some(x) = render_value(x, vars)? {
                    m.insert(k.clone(), x);
                }
            }
            Some(Value::Object(m))
        }
        v => Some(v.clone()),
    })
}

/// The variables of a step's templates: its arguments, and `content`.
pub(super) fn step_vars(step: &Step) -> Result<BTreeMap<String, TVal>, Unsupported> {
    let mut vars: BTreeMap<String, TVal> = step
        .arguments
        .iter()
        .map(|(k, v)| (k.clone(), TVal::Json(v.clone())))
        .collect();
    if let Some(content) = content(step) {
        vars.insert("content".into(), TVal::Bytes(content?));
    }
    Ok(vars)
}

/// A read value as a follow-up's template uses it: numbers as numbers.
pub(super) fn plain(field: &str, v: TVal) -> TVal {
    match shape(field, v.clone(), &mut Vec::new()) {
        n @ Value::Number(_) => TVal::Json(n),
        _ => v,
    }
}

pub(super) fn as_text_lossy(v: &TVal) -> String {
    match v {
        TVal::Json(Value::String(s)) => s.clone(),
        TVal::Json(v) => v.to_string(),
        TVal::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
    }
}
