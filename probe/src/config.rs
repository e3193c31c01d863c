//! The daemon's config file (TOML). Every key is optional; flags win.
//!
//! ```toml
//! socket = "/run/probe/probe.sock"
//! db = "/var/lib/probe/evidence.db"
//! group = "probe"             # may use the socket besides root
//! events_per_span = 20000
//! max_open_spans = 4096
//! gvisor_socket = "/run/probe/probe.gvisor.sock"  # "off": no gVisor monitor
//! confine_clients = "sandboxed"  # or "all": non-root clients of the host too
//! [retention]                 # docs/RETENTION.md
//! max_age_secs = 604800       # a week (default: no age limit)
//! max_db_bytes = 1073741824   # 1 GiB (the default)…
//! max_disk_share = 0.1        # …or a tenth of the free disk, if smaller
//! keep_events = "failed"      # or "all": every event of every span
//! [otlp]                      # OpenTelemetry export (off without an endpoint)
//! endpoint = "http://127.0.0.1:4318/v1/traces"
//! headers = { authorization = "Bearer xyz" }
//! timeout_ms = 10000
//! service_name = "probe"
//! queue_capacity = 8192
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::store::RetentionPolicy;

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub socket: Option<PathBuf>,
    pub db: Option<PathBuf>,
    pub group: Option<String>,
    pub events_per_span: Option<usize>,
    pub max_open_spans: Option<usize>,
    /// Where gVisor sandboxes send their points (`"off"`: nowhere).
    pub gvisor_socket: Option<PathBuf>,
    /// Which clients are confined to their own sandbox.
    pub confine_clients: Option<crate::peer::Confine>,
    #[serde(default)]
    pub retention: RetentionPolicy,
    /// OpenTelemetry export; the flag and then `OTEL_EXPORTER_OTLP_*`
    /// fill what it leaves out.
    #[serde(default)]
    pub otlp: Option<crate::otlp::OtlpFile>,
}

/// Why the config file was not usable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{0}: {1}")]
    Read(PathBuf, std::io::Error),
    /// The file is not valid TOML or has unknown keys.
    #[error("{0}: {1}")]
    Parse(PathBuf, String),
}

pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.into(), e))?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse(path.into(), e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file the Debian package installs as /etc/probe/probe.toml.
    #[test]
    fn the_packaged_config_file_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/probe.toml");
        let config = load(&path).unwrap();
        assert_eq!(
            config.socket.as_deref(),
            Some(Path::new("/run/probe/probe.sock"))
        );
        assert_eq!(
            config.db.as_deref(),
            Some(Path::new("/var/lib/probe/evidence.db"))
        );
    }

    #[test]
    fn parses_and_rejects_unknown_keys() {
        let c: ConfigFile = toml::from_str(
            "socket = \"/tmp/p.sock\"\nevents_per_span = 100\n[retention]\nmax_age_secs = 60\n",
        )
        .unwrap();
        assert_eq!(c.socket.as_deref(), Some(Path::new("/tmp/p.sock")));
        assert_eq!(c.retention.max_age_secs, Some(60));
        assert!(toml::from_str::<ConfigFile>("sockett = \"x\"").is_err());
        let c: ConfigFile = toml::from_str(
            "[otlp]\nendpoint = \"http://127.0.0.1:4318/v1/traces\"\ntimeout_ms = 500\nheaders = { authorization = \"Bearer x\" }\n",
        )
        .unwrap();
        let o = c.otlp.unwrap();
        assert_eq!(
            o.endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(o.timeout_ms, Some(500));
        assert_eq!(o.headers["authorization"], "Bearer x");
        assert!(toml::from_str::<ConfigFile>("[otlp]\nendpont = \"x\"").is_err());
    }
}
