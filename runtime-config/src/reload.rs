//! The periodic reloader: re-reads the file every period, re-parses only when its content
//! hash changed, and keeps the last good config when the new one is bad.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::watch;

use crate::config::{hex_sha256, ConfigError, RuntimeConfig};
use crate::limits::Defaults;

/// Reload metrics, named after Mimir's `cortex_runtime_config_*`.
#[derive(Clone)]
pub struct ReloadMetrics {
    /// 1 when the last attempted load succeeded, 0 when the file is bad (last good in force).
    pub last_reload_successful: IntGauge,
    /// One series, value 1, labelled with the hash of the config in force. Cardinality 1.
    pub hash: IntGaugeVec,
    /// Unix time of the last successful load.
    pub last_reload_success_timestamp_seconds: IntGauge,
}

impl ReloadMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = ReloadMetrics {
            last_reload_successful: IntGauge::new(
                "weir_runtime_config_last_reload_successful",
                "Whether the last runtime config load succeeded (1) or the last good config \
                 stays in force (0).",
            )?,
            hash: IntGaugeVec::new(
                Opts::new(
                    "weir_runtime_config_hash",
                    "SHA-256 of the runtime config file in force.",
                ),
                &["sha256"],
            )?,
            last_reload_success_timestamp_seconds: IntGauge::new(
                "weir_runtime_config_last_reload_success_timestamp_seconds",
                "Unix time of the last successful runtime config load.",
            )?,
        };
        registry.register(Box::new(metrics.last_reload_successful.clone()))?;
        registry.register(Box::new(metrics.hash.clone()))?;
        registry.register(Box::new(
            metrics.last_reload_success_timestamp_seconds.clone(),
        ))?;
        Ok(metrics)
    }

    fn record_success(&self, sha256: &str) {
        self.last_reload_successful.set(1);
        self.hash.reset();
        self.hash.with_label_values(&[sha256]).set(1);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_reload_success_timestamp_seconds
            .set(now.as_secs() as i64);
    }
}

/// Loads one file and keeps reloading it; or, with no file, the built-in defaults once.
pub struct Reloader {
    path: Option<PathBuf>,
    defaults: Defaults,
    metrics: ReloadMetrics,
    /// Hash of the bytes last looked at, good or bad: an unchanged file is not re-parsed,
    /// so a bad file is logged once, not once per period.
    last_seen_sha256: Option<String>,
    /// What the embedding service requires of a config beyond its own rules (for example a
    /// store for `shared` tenants).
    check: Check,
}

/// A rule a config must meet to be put in force; the error names what is wrong.
type Check = Box<dyn Fn(&RuntimeConfig) -> Result<(), String> + Send>;

impl Reloader {
    /// `path: None` runs on `defaults` alone (an empty file), with nothing to reload.
    pub fn new(path: Option<PathBuf>, defaults: Defaults, metrics: ReloadMetrics) -> Self {
        Reloader {
            path,
            defaults,
            metrics,
            last_seen_sha256: None,
            check: Box::new(|_| Ok(())),
        }
    }

    /// Adds a rule every config must meet to be put in force, at start-up and on reload.
    pub fn with_check(
        mut self,
        check: impl Fn(&RuntimeConfig) -> Result<(), String> + Send + 'static,
    ) -> Self {
        self.check = Box::new(check);
        self
    }

    fn parse(&self, content: &str) -> Result<RuntimeConfig, ConfigError> {
        let config = RuntimeConfig::parse(content, self.defaults)?;
        (self.check)(&config).map_err(|message| ConfigError::Invalid {
            place: "the runtime config".into(),
            message,
        })?;
        Ok(config)
    }

    /// The first load. Any error is returned: a bad file at start-up is fatal.
    pub fn load_first(&mut self) -> Result<RuntimeConfig, ConfigError> {
        let content = self.read()?;
        let config = self.parse(&content)?;
        self.last_seen_sha256 = Some(config.sha256.clone());
        self.accepted(&config);
        Ok(config)
    }

    /// One reload attempt. Returns the new config when the file changed and is good; `None`
    /// when it is unchanged or bad (then the error is logged and the metric drops to 0).
    pub fn reload(&mut self) -> Option<RuntimeConfig> {
        self.path.as_ref()?;
        let content = match self.read() {
            Ok(content) => content,
            Err(err) => {
                let marker = format!("error: {err}");
                if self.last_seen_sha256.as_deref() != Some(&marker) {
                    tracing::error!(%err, "runtime config reload failed; the last good config stays in force");
                    self.last_seen_sha256 = Some(marker);
                }
                self.metrics.last_reload_successful.set(0);
                return None;
            }
        };
        let sha256 = hex_sha256(content.as_bytes());
        if self.last_seen_sha256.as_deref() == Some(&sha256) {
            return None;
        }
        self.last_seen_sha256 = Some(sha256);
        match self.parse(&content) {
            Ok(config) => {
                self.accepted(&config);
                tracing::info!(path = %self.path_name(), sha256 = %config.sha256, "runtime config reloaded");
                Some(config)
            }
            Err(err) => {
                tracing::error!(path = %self.path_name(), %err, "runtime config is invalid; the last good config stays in force");
                self.metrics.last_reload_successful.set(0);
                None
            }
        }
    }

    /// Reloads every `period` until `shutdown` resolves, publishing each new config.
    pub async fn run(
        mut self,
        period: Duration,
        config_tx: watch::Sender<Arc<RuntimeConfig>>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is immediate; load_first already ran
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            // Reading a small file is quick; a blocking read here does not starve the runtime.
            if let Some(config) = self.reload() {
                config_tx.send_replace(Arc::new(config));
            }
        }
    }

    fn read(&self) -> Result<String, ConfigError> {
        let Some(path) = &self.path else {
            return Ok(String::new());
        };
        std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })
    }

    fn path_name(&self) -> String {
        self.path.as_ref().map_or_else(
            || "(built-in defaults)".to_string(),
            |path| path.display().to_string(),
        )
    }

    fn accepted(&self, config: &RuntimeConfig) {
        self.metrics.record_success(&config.sha256);
        let keys = &config.mimir_keys;
        if !keys.in_force.is_empty() {
            tracing::info!(
                keys = %keys.in_force.join(", "),
                "runtime config keys in force"
            );
        }
        if !keys.not_for_a_distributor.is_empty() {
            tracing::info!(
                keys = %grouped(&keys.not_for_a_distributor),
                "runtime config has Mimir settings of other components, which do not apply to \
                 a distributor"
            );
        }
        if !keys.ignored.is_empty() {
            tracing::warn!(
                keys = %grouped(&keys.ignored),
                "runtime config has Mimir distributor settings that weir accepts but does not \
                 enforce"
            );
        }
    }
}

/// `key, key (text); key (text)`: the keys that share a component or reason together, in the
/// order the list first names each text.
fn grouped(list: &[(String, &'static str)]) -> String {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for (key, text) in list {
        match groups.iter_mut().find(|(seen, _)| seen == text) {
            Some((_, keys)) => keys.push(key),
            None => groups.push((text, vec![key])),
        }
    }
    groups
        .iter()
        .map(|(text, keys)| format!("{} ({text})", keys.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::core::Collector;

    fn reloader(file: &tempfile::NamedTempFile) -> (Reloader, ReloadMetrics) {
        let metrics = ReloadMetrics::new(&Registry::new()).unwrap();
        (
            Reloader::new(
                Some(file.path().into()),
                Defaults::default(),
                metrics.clone(),
            ),
            metrics,
        )
    }

    #[test]
    fn bad_file_keeps_last_good_and_fix_restores_the_metric() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "overrides:\n  a:\n    ingestion_rate: 5\n").unwrap();
        let (mut reloader, metrics) = reloader(&file);
        let first = reloader.load_first().unwrap();
        assert_eq!(metrics.last_reload_successful.get(), 1);
        let good_hash = first.sha256.clone();
        assert_eq!(metrics.hash.with_label_values(&[&good_hash]).get(), 1);

        assert!(
            reloader.reload().is_none(),
            "unchanged file is not re-parsed"
        );

        std::fs::write(file.path(), "overrides:\n  a:\n    ingestion_rat: 5\n").unwrap();
        assert!(reloader.reload().is_none());
        assert_eq!(metrics.last_reload_successful.get(), 0);
        // The hash metric still names the config in force.
        assert_eq!(metrics.hash.with_label_values(&[&good_hash]).get(), 1);

        std::fs::write(file.path(), "overrides:\n  a:\n    ingestion_rate: 6\n").unwrap();
        let fixed = reloader.reload().expect("fixed file loads");
        assert_eq!(fixed.tenant_limits("a").ingestion_rate, 6.0);
        assert_eq!(metrics.last_reload_successful.get(), 1);
        assert_eq!(metrics.hash.collect()[0].get_metric().len(), 1);
    }

    #[test]
    fn logged_lists_group_the_keys_by_component_or_reason() {
        let ha = "HA deduplication is not implemented";
        let drop = "label dropping is not implemented";
        let list = [
            ("overrides.*.accept_ha_samples".to_string(), ha),
            ("overrides.*.drop_labels".to_string(), drop),
            ("overrides.*.ha_cluster_label".to_string(), ha),
        ];
        assert_eq!(
            grouped(&list),
            "overrides.*.accept_ha_samples, overrides.*.ha_cluster_label (HA deduplication is \
             not implemented); overrides.*.drop_labels (label dropping is not implemented)"
        );
        assert_eq!(grouped(&[]), "");
    }

    #[test]
    fn missing_file_at_start_is_an_error_and_later_keeps_last_good() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let (mut reloader, metrics) = reloader(&file);
        std::fs::write(file.path(), "").unwrap();
        reloader.load_first().unwrap();
        std::fs::remove_file(file.path()).unwrap();
        assert!(reloader.reload().is_none());
        assert_eq!(metrics.last_reload_successful.get(), 0);

        let err = Reloader::new(
            Some("/nonexistent/overrides.yaml".into()),
            Defaults::default(),
            metrics,
        )
        .load_first()
        .unwrap_err();
        assert!(err
            .to_string()
            .starts_with("cannot read /nonexistent/overrides.yaml"));
    }
}
