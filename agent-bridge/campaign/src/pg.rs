//! PostgreSQL as the shared results store.
//!
//! - The schema is the SQLite one: the same `migrations/NN-name/up.sql`,
//!   translated word for word ([`translate`]), versioned in `bridge_schema`.
//! - Values cross as SQLite's own dynamic [`Value`], bound to whatever type
//!   the PostgreSQL column has ([`PgValue`]), so every write is written once
//!   for both backends (see [`super::db::Db`]).
//! - Reports read a snapshot: the runs they need, copied into an in-memory
//!   SQLite with the same schema, so a report from PostgreSQL is the report
//!   from SQLite, byte for byte.

use std::collections::HashMap;
use std::error::Error as _;
use std::time::Duration;

use anyhow::{Context as _, bail};
use postgres::types::{IsNull, ToSql, Type};
use postgres::{Client, NoTls, Statement};
use rusqlite::types::Value;

/// A PostgreSQL connection with its prepared statements.
pub struct Pg {
    client: Client,
    prepared: HashMap<String, Statement>,
    /// The URL without its password, for messages.
    pub shown: String,
}

/// `url` with its password replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some((a, h)) => (Some(a), h),
        None => (None, rest),
    };
    match auth.map(|a| a.split_once(':')) {
        Some(Some((user, _))) => format!("{scheme}://{user}:***@{host}"),
        Some(None) => format!("{scheme}://{}@{host}", auth.unwrap_or_default()),
        None => url.to_string(),
    }
}

impl Pg {
    /// Connects and brings the schema up to date (refusing a newer one).
    pub fn connect(url: &str) -> anyhow::Result<Pg> {
        let shown = redact(url);
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e| anyhow::anyhow!("{shown}: not a PostgreSQL URL: {e}"))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        config.application_name("agent-bridge campaign");
        let client = config.connect(NoTls).map_err(|e| {
            let why = e
                .as_db_error()
                .map(|d| d.message().to_string())
                .or_else(|| e.source().map(|s| s.to_string()))
                .unwrap_or_else(|| e.to_string());
            anyhow::anyhow!("cannot connect to {shown}: {why}")
        })?;
        let mut pg = Pg {
            client,
            prepared: HashMap::new(),
            shown,
        };
        pg.migrate()?;
        Ok(pg)
    }

    /// Applies the migrations this build knows and the DB lacks, one
    /// transaction each, under an advisory lock (runners starting together
    /// take turns).
    fn migrate(&mut self) -> anyhow::Result<()> {
        let known = probe::store::migration_sources();
        let mut tx = self.client.transaction()?;
        tx.batch_execute(
            "SELECT pg_advisory_xact_lock(7243000016);
             CREATE TABLE IF NOT EXISTS bridge_schema (version BIGINT NOT NULL, migrated_ms BIGINT NOT NULL)",
        )?;
        let version: i64 = tx
            .query_one("SELECT COALESCE(MAX(version), 0) FROM bridge_schema", &[])?
            .get(0);
        if version as usize > known.len() {
            bail!(
                "{}: the database schema is version {version}, newer than this agent-bridge knows ({}): \
                 upgrade agent-bridge, or point --db at another database",
                self.shown,
                known.len()
            );
        }
        for (i, (name, sql)) in known.iter().enumerate().skip(version as usize) {
            tx.batch_execute(&translate(sql))
                .with_context(|| format!("{}: migration {name}", self.shown))?;
            tx.execute(
                "INSERT INTO bridge_schema (version, migrated_ms) VALUES ($1, $2)",
                &[&(i as i64 + 1), &(probe::clock::now_ms() as i64)],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn statement(&mut self, sql: &str) -> anyhow::Result<Statement> {
        if let Some(s) = self.prepared.get(sql) {
            return Ok(s.clone());
        }
        let s = self
            .client
            .prepare(&placeholders(sql))
            .with_context(|| format!("preparing {sql}"))?;
        self.prepared.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    /// Runs one statement (SQLite placeholders `?N`); rows affected.
    pub fn execute(&mut self, sql: &str, values: &[Value]) -> anyhow::Result<u64> {
        let s = self.statement(sql)?;
        let params: Vec<PgValue> = values.iter().map(PgValue).collect();
        let refs: Vec<&(dyn ToSql + Sync)> =
            params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        self.client
            .execute(&s, &refs)
            .map_err(|e| anyhow::anyhow!("{}: {}", self.shown, describe(&e)))
    }

    /// Runs one query (SQLite placeholders `?N`); rows as values.
    pub fn query(&mut self, sql: &str, values: &[Value]) -> anyhow::Result<Vec<Vec<Value>>> {
        let s = self.statement(sql)?;
        let params: Vec<PgValue> = values.iter().map(PgValue).collect();
        let refs: Vec<&(dyn ToSql + Sync)> =
            params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        let rows = self
            .client
            .query(&s, &refs)
            .map_err(|e| anyhow::anyhow!("{}: {}", self.shown, describe(&e)))?;
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| Ok(r.try_get::<_, Owned>(i)?.0))
                    .collect()
            })
            .collect()
    }

    /// Runs plain SQL (BEGIN, COMMIT, ROLLBACK…).
    pub fn batch(&mut self, sql: &str) -> anyhow::Result<()> {
        self.client
            .batch_execute(sql)
            .map_err(|e| anyhow::anyhow!("{}: {}", self.shown, describe(&e)))
    }

    /// An in-memory SQLite with every run's row and the tests, steps,
    /// artifacts and shrinks of `runs` (all runs when `None`).
    pub fn snapshot(&mut self, runs: Option<&[String]>) -> anyhow::Result<rusqlite::Connection> {
        let store = probe::store::Store::open_in_memory()?;
        let mut conn = store.into_connection();
        let tx = conn.transaction()?;
        copy_out(self, &tx, "campaign_runs", None)?;
        for table in [
            "campaign_tests",
            "campaign_steps",
            "campaign_artifacts",
            "campaign_shrinks",
            "campaign_runners",
            "campaign_target_downs",
            "campaign_environments",
        ] {
            match runs {
                None => copy_out(self, &tx, table, None)?,
                Some(ids) => {
                    for id in ids {
                        copy_out(self, &tx, table, Some(id))?;
                    }
                }
            }
        }
        tx.commit()?;
        Ok(conn)
    }

    /// Copies every row of `table` from a SQLite connection into this DB,
    /// in one transaction; rows whose key exists already are skipped when
    /// `skip_existing`. Returns rows inserted.
    pub fn copy_in(
        &mut self,
        from: &rusqlite::Connection,
        table: &str,
        filter: Option<(&str, &[Value])>,
        skip_existing: bool,
    ) -> anyhow::Result<u64> {
        let columns = columns(from, table)?;
        let (cond, values) = filter.unwrap_or(("1 = 1", &[]));
        let mut stmt = from.prepare(&format!(
            "SELECT {} FROM {table} WHERE {cond}",
            columns.join(", ")
        ))?;
        let rows: Vec<Vec<Value>> = stmt
            .query_map(rusqlite::params_from_iter(values.iter()), |r| {
                (0..columns.len()).map(|i| r.get::<_, Value>(i)).collect()
            })?
            .collect::<Result<_, _>>()?;
        let insert = format!(
            "INSERT INTO {table} ({}) VALUES ({}){}",
            columns.join(", "),
            (1..=columns.len())
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", "),
            if skip_existing {
                " ON CONFLICT DO NOTHING"
            } else {
                ""
            }
        );
        let mut n = 0;
        for row in &rows {
            n += self.execute(&insert, row)?;
        }
        Ok(n)
    }
}

/// The column names of a SQLite table, in order.
fn columns(conn: &rusqlite::Connection, table: &str) -> anyhow::Result<Vec<String>> {
    let stmt = conn.prepare(&format!("SELECT * FROM {table} LIMIT 0"))?;
    Ok(stmt.column_names().iter().map(|c| c.to_string()).collect())
}

/// Copies rows of `table` (of one run, or all) from PostgreSQL into SQLite.
fn copy_out(
    pg: &mut Pg,
    to: &rusqlite::Connection,
    table: &str,
    run: Option<&str>,
) -> anyhow::Result<()> {
    let columns = columns(to, table)?;
    let key = if table == "campaign_runs" {
        "id"
    } else {
        "run"
    };
    let (cond, values) = match run {
        Some(r) => (format!("{key} = ?1"), vec![Value::Text(r.to_string())]),
        None => ("TRUE".to_string(), vec![]),
    };
    let rows = pg.query(
        &format!("SELECT {} FROM {table} WHERE {cond}", columns.join(", ")),
        &values,
    )?;
    let mut insert = to.prepare(&format!(
        "INSERT INTO {table} ({}) VALUES ({})",
        columns.join(", "),
        vec!["?"; columns.len()].join(", ")
    ))?;
    for row in rows {
        insert.execute(rusqlite::params_from_iter(row.iter()))?;
    }
    Ok(())
}

/// A PostgreSQL error in one line: the server's message and detail.
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => match d.detail() {
            Some(detail) => format!("{} ({detail})", d.message()),
            None => d.message().to_string(),
        },
        None if e.is_closed() => "the connection to the database was lost".to_string(),
        None => e
            .source()
            .map_or_else(|| e.to_string(), |s| format!("{e}: {s}")),
    }
}

/// SQLite placeholders `?N` as PostgreSQL's `$N` (outside quotes).
pub fn placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    for c in sql.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => out.push('$'),
            _ => out.push(c),
        }
    }
    out
}

/// A SQLite migration as PostgreSQL runs it: the same tables, columns and
/// keys; SQLite's storage classes as PostgreSQL types.
pub fn translate(sql: &str) -> String {
    let mut out = String::new();
    for line in sql.lines() {
        let (code, comment) = match line.find("--") {
            Some(i) => line.split_at(i),
            None => (line, ""),
        };
        let mut code = code.replace("WITHOUT ROWID", "");
        for (from, to) in [
            ("INTEGER", "BIGINT"),
            ("REAL", "DOUBLE PRECISION"),
            ("BLOB", "BYTEA"),
        ] {
            code = replace_word(&code, from, to);
        }
        out.push_str(&code);
        out.push_str(comment);
        out.push('\n');
        // a renamed table keeps its primary key's index name in PostgreSQL,
        // where index names are per schema: rename it too, as SQLite does
        let words: Vec<&str> = code
            .split_whitespace()
            .map(|w| w.trim_end_matches(';'))
            .collect();
        if let ["ALTER", "TABLE", old, "RENAME", "TO", new] = words.as_slice() {
            out.push_str(&format!(
                "ALTER INDEX IF EXISTS {old}_pkey RENAME TO {new}_pkey;\n"
            ));
        }
    }
    out
}

fn replace_word(s: &str, from: &str, to: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(from) {
        let before = rest[..i].chars().next_back();
        let after = rest[i + from.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        out.push_str(&rest[..i]);
        out.push_str(if ident(before) || ident(after) {
            from
        } else {
            to
        });
        rest = &rest[i + from.len()..];
    }
    out.push_str(rest);
    out
}

/// A SQLite value bound to a PostgreSQL parameter of whatever type the
/// statement gives it.
#[derive(Debug)]
struct PgValue<'a>(&'a Value);

impl ToSql for PgValue<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match (self.0, ty) {
            (Value::Null, _) => Ok(IsNull::Yes),
            (Value::Integer(i), &Type::INT8) => i.to_sql(ty, out),
            (Value::Integer(i), &Type::INT4) => i32::try_from(*i)?.to_sql(ty, out),
            (Value::Integer(i), &Type::INT2) => i16::try_from(*i)?.to_sql(ty, out),
            (Value::Integer(i), &Type::BOOL) => (*i != 0).to_sql(ty, out),
            (Value::Integer(i), &Type::FLOAT8) => (*i as f64).to_sql(ty, out),
            (Value::Integer(i), _) => i.to_string().as_str().to_sql(&Type::TEXT, out),
            (Value::Real(f), &Type::FLOAT4) => (*f as f32).to_sql(ty, out),
            (Value::Real(f), &Type::FLOAT8) => f.to_sql(ty, out),
            (Value::Real(f), _) => f.to_string().as_str().to_sql(&Type::TEXT, out),
            (Value::Text(s), &Type::BYTEA) => s.as_bytes().to_sql(ty, out),
            (Value::Text(s), _) => s.as_str().to_sql(&Type::TEXT, out),
            (Value::Blob(b), &Type::BYTEA) => b.as_slice().to_sql(ty, out),
            (Value::Blob(b), _) => {
                Err(format!("{} bytes of binary data for a {ty} parameter", b.len()).into())
            }
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

/// A PostgreSQL value read back as SQLite's dynamic [`Value`].
struct Owned(Value);

impl<'a> postgres::types::FromSql<'a> for Owned {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Owned, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Owned(match *ty {
            Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Integer(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Integer(i16::from_sql(ty, raw)?.into()),
            Type::BOOL => Value::Integer(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            Type::BYTEA => Value::Blob(Vec::<u8>::from_sql(ty, raw)?),
            _ => Value::Text(String::from_sql(ty, raw)?),
        }))
    }

    fn from_sql_null(_: &Type) -> Result<Owned, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Owned(Value::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_dollars_outside_quotes() {
        assert_eq!(
            placeholders("SELECT '?' , x FROM t WHERE a = ?1 AND b = ?12"),
            "SELECT '?' , x FROM t WHERE a = $1 AND b = $12"
        );
    }

    #[test]
    fn translation_maps_storage_classes_and_keeps_comments() {
        let t = translate(
            "CREATE TABLE t (a INTEGER NOT NULL, b REAL, c BLOB, d TEXT, integers_n INTEGER) WITHOUT ROWID; -- REAL stays\nALTER TABLE t RENAME TO t_old;\n",
        );
        assert!(t.contains(
            "CREATE TABLE t (a BIGINT NOT NULL, b DOUBLE PRECISION, c BYTEA, d TEXT, integers_n BIGINT) ; -- REAL stays"
        ));
        assert!(t.contains("ALTER INDEX IF EXISTS t_pkey RENAME TO t_old_pkey;"));
    }

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(
            redact("postgres://bob:s3cret@127.0.0.1:5432/results"),
            "postgres://bob:***@127.0.0.1:5432/results"
        );
        assert_eq!(
            redact("postgres://bob@127.0.0.1/results"),
            "postgres://bob@127.0.0.1/results"
        );
    }
}
