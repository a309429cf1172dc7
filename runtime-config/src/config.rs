//! One overrides file, parsed strictly into the config in force.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};
use sha2::{Digest, Sha256};

use crate::admission::{AdmissionConfig, AdmissionDefaults, LimitSpec, TenantAdmission};
use crate::ha::{HaLimits, HaOverride};
use crate::limits::{Defaults, InstanceLimits, InstanceOverride, TenantLimits, TenantOverride};
use crate::mimir_keys;
use crate::otlp::{OtlpOverride, OtlpTranslation};
use crate::relabel::{Relabel, RuleConfig};
use crate::validation::{NameValidationScheme, ValidationLimits, ValidationOverride};

/// Why a file could not become the config in force. The message is for an operator.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid YAML: {0}")]
    Yaml(String),
    #[error("the file holds more than one YAML document; put everything in one document")]
    MultipleDocuments,
    #[error(
        "brackets nested deeper than {MAX_FLOW_DEPTH} levels; an overrides file needs a handful"
    )]
    TooDeep,
    #[error("unknown key `{key}` in {place}: it is neither a weir nor a Mimir setting (typo?)")]
    UnknownKey { key: String, place: String },
    #[error("{place}: {message}")]
    Invalid { place: String, message: String },
}

/// The top level of the file. Unknown keys are collected in `other` (a pass of their own,
/// [`decode_single_document`]) and checked against Mimir's runtime-config sections, so a Mimir
/// file loads and a typo does not.
#[derive(Debug, Default, Deserialize)]
struct FileContent {
    #[serde(default)]
    overrides: BTreeMap<String, TenantEntry>,
    #[serde(default)]
    distributor_limits: InstanceOverride,
    #[serde(default)]
    admission: Option<AdmissionDefaults>,
    #[serde(default)]
    envoy_domains: Vec<crate::envoy::EnvoyDomain>,
    #[serde(skip)]
    other: Vec<String>,
}

impl FileContent {
    /// The top-level keys [`FileContent`] reads.
    const KEYS: [&'static str; 4] = [
        "overrides",
        "distributor_limits",
        "admission",
        "envoy_domains",
    ];
}

#[derive(Debug, Default, Deserialize)]
struct TenantEntry {
    #[serde(default)]
    allow_client_limits: bool,
    #[serde(default)]
    limits: BTreeMap<String, LimitSpec>,
    /// Mimir's `drop_labels`: label names removed from every series before it is checked,
    /// charged and forwarded.
    #[serde(default)]
    drop_labels: Option<Vec<String>>,
    /// Mimir's `metric_relabel_configs`: Prometheus' relabelling rules, applied to every
    /// series before `drop_labels` and the checks.
    #[serde(default)]
    metric_relabel_configs: Option<Vec<crate::relabel::RuleConfig>>,
    /// Mimir's `metric_relabeling_enabled` (default true): false turns the rules off.
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    metric_relabeling_enabled: Option<bool>,
    /// Mimir's `ingestion_artificial_delay`: how long a push to this tenant takes at least
    /// before it is answered (0, the default, is off).
    #[serde(default, deserialize_with = "crate::validation::optional_duration")]
    ingestion_artificial_delay: Option<Duration>,
    #[serde(flatten)]
    known: TenantOverride,
    #[serde(flatten)]
    validation: ValidationOverride,
    #[serde(flatten)]
    ha: HaOverride,
    #[serde(flatten)]
    otlp: OtlpOverride,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// The config in force: the defaults, every tenant's resolved limits, and the instance limits.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    pub defaults: Defaults,
    pub overrides: BTreeMap<String, TenantLimits>,
    pub instance: InstanceLimits,
    /// Hex SHA-256 of the file's bytes (empty for a config built only from defaults).
    pub sha256: String,
    /// Where the file's keys stand: in force, another Mimir component's, or ignored.
    pub mimir_keys: MimirKeys,
    /// Series validation limits of the tenants whose entries set any (the others get
    /// Mimir's defaults, [`ValidationLimits::default`]).
    pub validation: BTreeMap<String, ValidationLimits>,
    /// Each tenant's `drop_labels`, for the tenants that set any.
    pub drop_labels: BTreeMap<String, Arc<[String]>>,
    /// Each tenant's relabelling rules, for the tenants that set some and have not turned
    /// them off.
    pub relabel: BTreeMap<String, Arc<Relabel>>,
    /// Each tenant's `metric_relabel_configs` and `metric_relabeling_enabled` as its entry
    /// writes them (whether in force or turned off), for the tenants that set either; shown by
    /// [`RuntimeConfig::render`].
    pub relabel_configs: BTreeMap<String, (bool, Vec<RuleConfig>)>,
    /// OTLP translation settings of the tenants whose entries set any (the others get
    /// Mimir's defaults, [`OtlpTranslation::default`]).
    pub otlp: BTreeMap<String, Arc<OtlpTranslation>>,
    /// Each tenant's `ingestion_artificial_delay`, for the tenants that set one above 0.
    pub artificial_delay: BTreeMap<String, Duration>,
    /// HA-tracker settings of the tenants whose entries set any (the others get Mimir's
    /// defaults, [`HaLimits::default`], which do not deduplicate).
    pub ha: BTreeMap<String, Arc<HaLimits>>,
    /// Limits for the admission API.
    pub admission: AdmissionConfig,
    /// Limits for Envoy's rate-limit service protocol, by domain.
    pub envoy_domains: Vec<crate::envoy::EnvoyDomain>,
}

/// Where the keys of the loaded file stand, for an operator coming from Mimir. A per-tenant
/// key is named `overrides.*.key` (once, whichever tenants set it), an instance limit
/// `distributor_limits.key`, a top-level section by its name. Each list is sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MimirKeys {
    /// The tenant and instance limits the file sets, which weir enforces (Mimir's
    /// `ingestion_rate`, `request_rate`, … and weir's own, such as `rate_limit_strategy`).
    /// The admission API's and Envoy's sections are not listed: they are not Mimir's.
    pub in_force: Vec<String>,
    /// Mimir keys another component reads (ingester, querier, ruler, …), with that component:
    /// they never applied to a distributor, so nothing is lost by weir not reading them.
    pub not_for_a_distributor: Vec<(String, &'static str)>,
    /// Mimir keys a distributor reads that weir does not enforce, with why and what happens
    /// to the pushes instead.
    pub ignored: Vec<(String, &'static str)>,
}

impl MimirKeys {
    fn render(&self) -> Mapping {
        let in_force = self
            .in_force
            .iter()
            .map(|key| Value::from(key.as_str()))
            .collect();
        let pairs = |list: &[(String, &str)]| {
            Value::Mapping(
                list.iter()
                    .map(|(key, text)| (Value::from(key.as_str()), Value::from(*text)))
                    .collect(),
            )
        };
        let mut mapping = Mapping::new();
        mapping.insert("in_force".into(), Value::Sequence(in_force));
        mapping.insert(
            "not_for_a_distributor".into(),
            pairs(&self.not_for_a_distributor),
        );
        mapping.insert("ignored".into(), pairs(&self.ignored));
        mapping
    }
}

/// What `/runtime_config` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenderMode {
    /// Every tenant's resolved limits, the defaults, the instance limits, and where the
    /// file's keys stand (`mimir_keys`).
    Full,
    /// Only the values that differ from the defaults.
    Diff,
}

impl RuntimeConfig {
    /// A config with no file: every tenant gets the defaults.
    pub fn from_defaults(defaults: Defaults) -> Self {
        RuntimeConfig {
            defaults,
            overrides: BTreeMap::new(),
            instance: defaults.instance,
            sha256: String::new(),
            mimir_keys: MimirKeys::default(),
            validation: BTreeMap::new(),
            drop_labels: BTreeMap::new(),
            relabel: BTreeMap::new(),
            relabel_configs: BTreeMap::new(),
            otlp: BTreeMap::new(),
            artificial_delay: BTreeMap::new(),
            ha: BTreeMap::new(),
            admission: AdmissionConfig::default(),
            envoy_domains: Vec::new(),
        }
    }

    /// Whether any tenant (or the defaults) uses the `shared` strategy, which needs a store.
    pub fn uses_shared_store(&self) -> bool {
        std::iter::once(&self.defaults.tenant)
            .chain(self.overrides.values())
            .any(|limits| limits.rate_limit_strategy == crate::limits::RateLimitStrategy::Shared)
    }

    /// Parses one file's content. An empty file means "no overrides".
    pub fn parse(content: &str, defaults: Defaults) -> Result<Self, ConfigError> {
        let sha256 = hex_sha256(content.as_bytes());
        let file = decode_single_document(content)?;
        let mut keys = KeySorter::default();

        for key in file.other {
            match mimir_keys::section(&key) {
                Some(standing) => keys.mimir(key, standing),
                None => {
                    return Err(ConfigError::UnknownKey {
                        key,
                        place: "the top level".into(),
                    })
                }
            }
        }
        keys.in_force_instance(&file.distributor_limits);

        let mut overrides = BTreeMap::new();
        let mut validation = BTreeMap::new();
        let mut drop_labels = BTreeMap::new();
        let mut relabel = BTreeMap::new();
        let mut relabel_configs = BTreeMap::new();
        let mut otlp = BTreeMap::new();
        let mut artificial_delay = BTreeMap::new();
        let mut ha = BTreeMap::new();
        let mut admission = AdmissionConfig::default();
        if let Some(defaults) = file.admission {
            if let Some(spec) = &defaults.default_limit {
                spec.validate().map_err(|message| ConfigError::Invalid {
                    place: "admission.default_limit".into(),
                    message,
                })?;
            }
            admission.strict = defaults.strict;
            admission.default_limit = defaults.default_limit.map(LimitSpec::resolved);
        }
        for domain in &file.envoy_domains {
            domain.validate().map_err(|message| ConfigError::Invalid {
                place: "envoy_domains".into(),
                message,
            })?;
        }
        for (tenant, entry) in file.overrides {
            // A name no push could carry is a typo, or a tenant that would never get its limits.
            crate::tenant::validate(&tenant).map_err(|err| ConfigError::Invalid {
                place: format!("overrides.{tenant:?}"),
                message: format!("{err}; no push could name this tenant"),
            })?;
            for (key, spec) in &entry.limits {
                spec.validate().map_err(|message| ConfigError::Invalid {
                    place: format!("overrides.{tenant}.limits.{key:?}"),
                    message,
                })?;
            }
            admission.tenants.insert(
                tenant.clone(),
                TenantAdmission {
                    allow_client_limits: entry.allow_client_limits,
                    limits: entry
                        .limits
                        .iter()
                        .map(|(key, spec)| (key.clone(), spec.resolved()))
                        .collect(),
                },
            );
            for key in entry.other.keys() {
                match mimir_keys::limit(key) {
                    Some(standing) => keys.mimir(format!("overrides.*.{key}"), standing),
                    None => {
                        return Err(ConfigError::UnknownKey {
                            key: key.clone(),
                            place: format!("overrides.{tenant}"),
                        })
                    }
                }
            }
            keys.in_force_tenant(&entry.known);
            keys.in_force_tenant(&entry.validation);
            if let Some(labels) = entry.drop_labels.filter(|labels| !labels.is_empty()) {
                keys.in_force.insert("overrides.*.drop_labels".to_string());
                drop_labels.insert(tenant.clone(), Arc::from(labels));
            }
            if entry.metric_relabeling_enabled.is_some() {
                keys.in_force
                    .insert("overrides.*.metric_relabeling_enabled".to_string());
            }
            let enabled = entry.metric_relabeling_enabled != Some(false);
            let configs = entry.metric_relabel_configs.unwrap_or_default();
            if !configs.is_empty() {
                keys.in_force
                    .insert("overrides.*.metric_relabel_configs".to_string());
                let rules =
                    Relabel::new(configs.clone()).map_err(|message| ConfigError::Invalid {
                        place: format!("overrides.{tenant}.metric_relabel_configs"),
                        message,
                    })?;
                if enabled {
                    relabel.insert(tenant.clone(), Arc::new(rules));
                }
            }
            if !configs.is_empty() || !enabled {
                relabel_configs.insert(tenant.clone(), (enabled, configs));
            }
            if let Some(delay) = entry.ingestion_artificial_delay {
                keys.in_force
                    .insert("overrides.*.ingestion_artificial_delay".to_string());
                if !delay.is_zero() {
                    artificial_delay.insert(tenant.clone(), delay);
                }
            }
            keys.in_force_tenant(&entry.otlp);
            // Under `name_validation_scheme: utf8` the translation keeps names as sent, so such
            // a tenant has settings of its own even with no OTLP key.
            let scheme = entry.validation.scheme();
            if !entry.otlp.is_empty() || scheme != NameValidationScheme::Legacy {
                let settings =
                    entry
                        .otlp
                        .apply(scheme)
                        .map_err(|message| ConfigError::Invalid {
                            place: format!("overrides.{tenant}"),
                            message,
                        })?;
                otlp.insert(tenant.clone(), Arc::new(settings));
            }
            keys.in_force_tenant(&entry.ha);
            if !entry.ha.is_empty() {
                let settings = entry.ha.apply(&HaLimits::default());
                settings
                    .validate()
                    .map_err(|message| ConfigError::Invalid {
                        place: format!("overrides.{tenant}"),
                        message,
                    })?;
                ha.insert(tenant.clone(), Arc::new(settings));
            }
            if !entry.validation.is_empty() {
                validation.insert(
                    tenant.clone(),
                    entry.validation.apply(&ValidationLimits::default()),
                );
            }
            let limits = entry.known.apply(&defaults.tenant);
            limits.validate().map_err(|message| ConfigError::Invalid {
                place: format!("overrides.{tenant}"),
                message,
            })?;
            overrides.insert(tenant, limits);
        }

        let instance = file.distributor_limits.apply(&defaults.instance);
        instance
            .validate()
            .map_err(|message| ConfigError::Invalid {
                place: "distributor_limits".into(),
                message,
            })?;

        Ok(RuntimeConfig {
            defaults,
            overrides,
            instance,
            sha256,
            mimir_keys: keys.finish(),
            validation,
            drop_labels,
            relabel,
            relabel_configs,
            otlp,
            artificial_delay,
            ha,
            admission,
            envoy_domains: file.envoy_domains,
        })
    }

    /// The limits in force for `tenant`: its override, or the defaults.
    pub fn tenant_limits(&self, tenant: &str) -> &TenantLimits {
        self.overrides.get(tenant).unwrap_or(&self.defaults.tenant)
    }

    /// The series validation limits for `tenant`: its override, or Mimir's defaults.
    pub fn validation_limits(&self, tenant: &str) -> ValidationLimits {
        self.validation.get(tenant).copied().unwrap_or_default()
    }

    /// The HA-tracker settings of `tenant`, when it deduplicates HA pairs
    /// (`accept_ha_samples: true`).
    pub fn ha_limits(&self, tenant: &str) -> Option<Arc<HaLimits>> {
        self.ha
            .get(tenant)
            .filter(|settings| settings.accept_ha_samples)
            .cloned()
    }

    /// The label names `tenant`'s series lose before anything else (`drop_labels`).
    pub fn drop_labels(&self, tenant: &str) -> Option<Arc<[String]>> {
        self.drop_labels.get(tenant).cloned()
    }

    /// `tenant`'s relabelling rules (`metric_relabel_configs`), when it has some in force.
    pub fn relabel(&self, tenant: &str) -> Option<Arc<Relabel>> {
        self.relabel.get(tenant).cloned()
    }

    /// `tenant`'s OTLP translation settings, when its entry sets any.
    pub fn otlp_translation(&self, tenant: &str) -> Option<Arc<OtlpTranslation>> {
        self.otlp.get(tenant).cloned()
    }

    /// How long a push to `tenant` takes at least (`ingestion_artificial_delay`), when it
    /// has a delay above 0.
    pub fn artificial_delay(&self, tenant: &str) -> Option<Duration> {
        self.artificial_delay.get(tenant).copied()
    }

    /// Every per-tenant key in force for `tenant` (`None`: the defaults, which a tenant
    /// without an entry gets), by its name in the file: the limits, the series checks, the
    /// HA tracker's settings, `drop_labels`, the relabelling rules and the artificial delay.
    fn tenant_view(&self, tenant: Option<&str>) -> Mapping {
        let limits = tenant.map_or(&self.defaults.tenant, |tenant| self.tenant_limits(tenant));
        let mut view = to_mapping(limits);
        let validation = tenant.map(|tenant| self.validation_limits(tenant));
        view.extend(to_mapping(&validation.unwrap_or_default()));
        let ha = tenant.and_then(|tenant| self.ha.get(tenant).cloned());
        view.extend(to_mapping(&*ha.unwrap_or_default()));
        let otlp = tenant.and_then(|tenant| self.otlp_translation(tenant));
        view.extend(to_mapping(&*otlp.unwrap_or_default()));
        let dropped = tenant.and_then(|tenant| self.drop_labels(tenant));
        view.insert(
            "drop_labels".into(),
            serde_yaml_ng::to_value(dropped.as_deref().unwrap_or_default())
                .expect("label names serialize"),
        );
        let (enabled, rules) = tenant
            .and_then(|tenant| self.relabel_configs.get(tenant))
            .map_or((true, &[][..]), |(enabled, rules)| (*enabled, &rules[..]));
        view.insert("metric_relabel_configs".into(), to_value(rules));
        view.insert("metric_relabeling_enabled".into(), Value::Bool(enabled));
        let delay = tenant.and_then(|tenant| self.artificial_delay(tenant));
        view.insert(
            "ingestion_artificial_delay".into(),
            Value::String(humantime::format_duration(delay.unwrap_or_default()).to_string()),
        );
        view
    }

    /// The config as YAML, in the same shape as the file: each tenant with every per-tenant
    /// key in force for it, or (`RenderMode::Diff`) only those that differ from the defaults.
    pub fn render(&self, mode: RenderMode) -> String {
        let mut out = String::new();
        self.render_pieces(mode, &mut |piece| {
            out.push_str(piece);
            true
        });
        out
    }

    /// [`RuntimeConfig::render`] a piece at a time (a section, or one tenant), handed to
    /// `write` in order; stops early when `write` returns false. Rendering many tenants
    /// holds one tenant's values at once, not every tenant's.
    pub fn render_pieces(&self, mode: RenderMode, write: &mut dyn FnMut(&str) -> bool) {
        let yaml = |value: &Mapping| {
            serde_yaml_ng::to_string(value).expect("a mapping of plain values always serializes")
        };
        let section = |name: &str, value: Mapping| {
            let mut one = Mapping::new();
            one.insert(name.into(), Value::Mapping(value));
            yaml(&one)
        };
        let default_tenant = self.tenant_view(None);
        if mode == RenderMode::Full && !write(&section("defaults", default_tenant.clone())) {
            return;
        }
        // Each tenant written as its own YAML, indented under `overrides:`.
        let mut any = false;
        let mut piece = String::new();
        for tenant in self.overrides.keys() {
            let mut limits = self.tenant_view(Some(tenant));
            if mode == RenderMode::Diff {
                limits.retain(|key, value| default_tenant.get(key) != Some(value));
                if limits.is_empty() {
                    continue;
                }
            }
            piece.clear();
            if !any {
                piece.push_str("overrides:\n");
                any = true;
            }
            for line in section(tenant, limits).lines() {
                piece.push_str("  ");
                piece.push_str(line);
                piece.push('\n');
            }
            if !write(&piece) {
                return;
            }
        }
        if !any && !write("overrides: {}\n") {
            return;
        }
        let mut instance = to_mapping(&self.instance);
        if mode == RenderMode::Diff {
            let default_instance = to_mapping(&self.defaults.instance);
            instance.retain(|key, value| default_instance.get(key) != Some(value));
        }
        if !write(&section("distributor_limits", instance)) {
            return;
        }
        // Not in the diff: that is the file's shape, and loads again as it is.
        if mode == RenderMode::Full {
            write(&section("mimir_keys", self.mimir_keys.render()));
        }
    }
}

/// Sorts the file's keys into [`MimirKeys`]' lists as the parser meets them.
#[derive(Default)]
struct KeySorter {
    in_force: BTreeSet<String>,
    not_for_a_distributor: BTreeMap<String, &'static str>,
    ignored: BTreeMap<String, &'static str>,
}

impl KeySorter {
    fn mimir(&mut self, key: String, standing: mimir_keys::Standing) {
        match standing {
            mimir_keys::Standing::NotForADistributor(component) => {
                self.not_for_a_distributor.insert(key, component);
            }
            mimir_keys::Standing::Ignored(reason) => {
                self.ignored.insert(key, reason);
            }
        }
    }

    /// The keys a tenant's entry sets, read from the entry as serde sees it (so the names are
    /// the file's): a key is set when its value is not null.
    fn in_force_tenant(&mut self, known: &impl serde::Serialize) {
        for (key, value) in to_mapping(known) {
            if let (Value::String(key), false) = (key, value.is_null()) {
                self.in_force.insert(format!("overrides.*.{key}"));
            }
        }
    }

    /// The keys `distributor_limits` sets. Every field is named, so a new one fails to build
    /// until it is listed here.
    fn in_force_instance(&mut self, instance: &InstanceOverride) {
        let InstanceOverride {
            max_inflight_push_requests,
            max_inflight_push_requests_bytes,
            max_ingestion_rate,
        } = instance;
        for (key, set) in [
            (
                "max_inflight_push_requests",
                max_inflight_push_requests.is_some(),
            ),
            (
                "max_inflight_push_requests_bytes",
                max_inflight_push_requests_bytes.is_some(),
            ),
            ("max_ingestion_rate", max_ingestion_rate.is_some()),
        ] {
            if set {
                self.in_force.insert(format!("distributor_limits.{key}"));
            }
        }
    }

    fn finish(self) -> MimirKeys {
        MimirKeys {
            in_force: self.in_force.into_iter().collect(),
            not_for_a_distributor: self.not_for_a_distributor.into_iter().collect(),
            ignored: self.ignored.into_iter().collect(),
        }
    }
}

/// The deepest `[`/`{` nesting a file may have. libyaml tracks its possible simple keys per
/// flow level and revisits them all on every token, so deep nesting costs quadratic time:
/// fuzzing found 29 KB of `{` taking a second to refuse. A real file nests a few levels.
const MAX_FLOW_DEPTH: usize = 64;

/// Whether a YAML text nests `[`/`{` deeper than any real file does ([`MAX_FLOW_DEPTH`]):
/// such a text is refused before the parser sees it. Counted over every bracket, quoted or
/// not: a string with 64 unclosed brackets is not worth the parser's time either.
pub fn too_deeply_nested(content: &str) -> bool {
    let mut depth = 0usize;
    for byte in content.bytes() {
        match byte {
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => continue,
        }
        if depth > MAX_FLOW_DEPTH {
            return true;
        }
    }
    false
}

fn decode_single_document(content: &str) -> Result<FileContent, ConfigError> {
    if too_deeply_nested(content) {
        return Err(ConfigError::TooDeep);
    }
    let mut documents = serde_yaml_ng::Deserializer::from_str(content);
    let Some(first) = documents.next() else {
        return Ok(FileContent::default());
    };
    // An empty or all-comment document decodes as unit; treat it as "no overrides".
    let mut value = Value::deserialize(first).map_err(|e| ConfigError::Yaml(e.to_string()))?;
    if documents.next().is_some() {
        return Err(ConfigError::MultipleDocuments);
    }
    if value.is_null() {
        return Ok(FileContent::default());
    }
    // Mimir's reader (yaml.v3) takes YAML's merge keys (`<<: *base`); the file is read on
    // from the merged document, written out again.
    let merged;
    let text = if has_merge_key(&value) {
        value
            .apply_merge()
            .map_err(|e| ConfigError::Yaml(format!("merge key `<<`: {e}")))?;
        merged = serde_yaml_ng::to_string(&value).expect("a value read from YAML writes out");
        merged.as_str()
    } else {
        content
    };
    // Read from the text, not the value: yaml.v3 reads a scalar into a map's string key as it
    // is written, so `123456:` in `overrides` is the tenant "123456", where the value would
    // have made it a number (and `0x1F` 31).
    let keys: BTreeMap<String, serde::de::IgnoredAny> =
        serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Yaml(e.to_string()))?;
    // The error names the key's path, and its line in `text`.
    let mut file: FileContent =
        serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Yaml(e.to_string()))?;
    file.other = keys
        .into_keys()
        .filter(|key| !FileContent::KEYS.contains(&key.as_str()))
        .collect();
    Ok(file)
}

/// Whether a mapping anywhere in `value` has a merge key, `<<`.
fn has_merge_key(value: &Value) -> bool {
    match value {
        Value::Mapping(mapping) => mapping
            .iter()
            .any(|(key, value)| key.as_str() == Some("<<") || has_merge_key(value)),
        Value::Sequence(items) => items.iter().any(has_merge_key),
        Value::Tagged(tagged) => has_merge_key(&tagged.value),
        _ => false,
    }
}

fn to_value<T: serde::Serialize + ?Sized>(value: &T) -> Value {
    serde_yaml_ng::to_value(value).expect("limit structs serialize")
}

fn to_mapping<T: serde::Serialize>(value: &T) -> Mapping {
    match serde_yaml_ng::to_value(value) {
        Ok(Value::Mapping(mapping)) => mapping,
        _ => unreachable!("limit structs serialize as mappings"),
    }
}

pub(crate) fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::RateLimitStrategy;

    fn parse(content: &str) -> Result<RuntimeConfig, ConfigError> {
        RuntimeConfig::parse(content, Defaults::default())
    }

    #[test]
    fn partial_override_inherits_defaults() {
        let config = parse("overrides:\n  team-a:\n    ingestion_rate: 500\n").unwrap();
        let limits = config.tenant_limits("team-a");
        assert_eq!(limits.ingestion_rate, 500.0);
        assert_eq!(limits.ingestion_burst_size, 200_000);
        assert_eq!(limits.rate_limit_strategy, RateLimitStrategy::Weighted);
        assert_eq!(config.tenant_limits("other"), &TenantLimits::default());
    }

    /// A tenant is named as its key is written, as yaml.v3 (Mimir's reader) reads a scalar into
    /// a string key: numeric tenant IDs, unquoted, are common in Mimir's files.
    #[test]
    fn a_tenant_key_is_its_text_whatever_yaml_would_make_of_it() {
        let config = parse(
            "overrides:\n  123456:\n    ingestion_rate: 1\n  0x1F:\n    ingestion_rate: 2\n  \
             1e3:\n    ingestion_rate: 3\n  true:\n    ingestion_rate: 4\n  007:\n    \
             ingestion_rate: 5\n  \"quoted\":\n    ingestion_rate: 6\n",
        )
        .unwrap();
        for (tenant, rate) in [
            ("123456", 1.0),
            ("0x1F", 2.0),
            ("1e3", 3.0),
            ("true", 4.0),
            ("007", 5.0),
            ("quoted", 6.0),
        ] {
            assert_eq!(
                config.tenant_limits(tenant).ingestion_rate,
                rate,
                "{tenant}"
            );
        }
        assert_eq!(config.overrides.len(), 6);
        assert_eq!(config.tenant_limits("31"), &TenantLimits::default());
    }

    /// Counts written as whole floats and YAML 1.1's words for booleans, which yaml.v3 (Mimir's
    /// reader) takes into typed keys, load as Mimir loads them.
    #[test]
    fn whole_floats_and_yaml_1_1_booleans_load_as_mimir_loads_them() {
        let config = parse(
            "overrides:\n  t:\n    ingestion_burst_size: 1e6\n    max_label_names_per_series: 40.0\n    \
             accept_ha_samples: yes\n    ha_cluster_label: cluster\n    ha_replica_label: __replica__\n\
             distributor_limits:\n  max_inflight_push_requests: 2e3\n",
        )
        .unwrap();
        assert_eq!(config.tenant_limits("t").ingestion_burst_size, 1_000_000);
        assert_eq!(config.validation_limits("t").max_label_names_per_series, 40);
        assert!(config.ha_limits("t").is_some(), "accept_ha_samples: yes");
        assert_eq!(config.instance.max_inflight_push_requests, 2_000);
        let err = parse("overrides:\n  t:\n    ingestion_burst_size: 1.5\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("floating point `1.5`"), "{err}");
    }

    /// YAML's merge keys, which yaml.v3 reads: a tenant's entry built on an anchored one, its
    /// own keys first.
    #[test]
    fn merge_keys_build_a_tenant_on_another() {
        let config = parse(
            "overrides:\n  base: &base\n    ingestion_rate: 100\n    ingestion_burst_size: 500\n  \
             t2:\n    <<: *base\n    ingestion_rate: 200\n  42:\n    <<: *base\n",
        )
        .unwrap();
        let t2 = config.tenant_limits("t2");
        assert_eq!((t2.ingestion_rate, t2.ingestion_burst_size), (200.0, 500));
        let numeric = config.tenant_limits("42");
        assert_eq!(
            (numeric.ingestion_rate, numeric.ingestion_burst_size),
            (100.0, 500)
        );
        // A typo in a merged entry is still one.
        let err = parse("overrides:\n  b: &b\n    ingestion_rat: 1\n  c:\n    <<: *b\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("ingestion_rat"), "{err}");
        let err = parse("overrides:\n  c:\n    <<: 5\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("merge key"), "{err}");
    }

    #[test]
    fn empty_and_comment_only_files_mean_no_overrides() {
        for content in ["", "# nothing yet\n", "---\n"] {
            let config = parse(content).unwrap();
            assert!(config.overrides.is_empty(), "{content:?}");
        }
    }

    #[test]
    fn typo_is_an_error_naming_the_key_and_place() {
        let err = parse("overrides:\n  a:\n    ingestion_rat: 5\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown key `ingestion_rat` in overrides.a: it is neither a weir nor a Mimir \
             setting (typo?)"
        );
        let err = parse("overides: {}\n").unwrap_err();
        assert!(
            err.to_string().contains("`overides` in the top level"),
            "{err}"
        );
        let err = parse("distributor_limits:\n  max_inflight: 3\n").unwrap_err();
        assert!(err.to_string().contains("max_inflight"), "{err}");
    }

    #[test]
    fn a_tenant_no_push_could_name_is_refused_at_load() {
        let err = parse("overrides:\n  \"a/b\":\n    ingestion_rate: 5\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "overrides.\"a/b\": tenant ID contains unsupported character '/': allowed are \
             a-z A-Z 0-9 and ! - _ . * ' ( ); no push could name this tenant"
        );
        for tenant in ["\"my team\"", "\".\"", "\"\"", &"x".repeat(151)] {
            let content = format!("overrides:\n  {tenant}: {{ingestion_rate: 5}}\n");
            assert!(
                matches!(parse(&content), Err(ConfigError::Invalid { .. })),
                "{content}"
            );
        }
        let fine = "overrides:\n  \"team_a.(1)*'!\": {ingestion_rate: 5}\n";
        assert_eq!(parse(fine).unwrap().overrides.len(), 1);
    }

    #[test]
    fn mimir_keys_are_accepted_and_listed() {
        let config = parse(
            "overrides:\n  a:\n    max_global_series_per_user: 5\n    ingestion_rate: 7\n\
             multi_kv_config: {}\ningester_limits:\n  max_series: 3\n",
        )
        .unwrap();
        assert_eq!(config.tenant_limits("a").ingestion_rate, 7.0);
        assert_eq!(
            config.mimir_keys,
            MimirKeys {
                in_force: vec!["overrides.*.ingestion_rate".to_string()],
                not_for_a_distributor: vec![
                    ("ingester_limits".to_string(), "ingester"),
                    (
                        "multi_kv_config".to_string(),
                        "Mimir's ring KV store (its migration between stores)"
                    ),
                    (
                        "overrides.*.max_global_series_per_user".to_string(),
                        "ingester"
                    ),
                ],
                ignored: vec![],
            }
        );
        // A key that is neither weir's nor Mimir's is still an error, at either level.
        assert!(parse("overrides:\n  a:\n    ha_clustr_label: x\n").is_err());
        assert!(parse("ingester_limit: {}\n").is_err());
        // With no file, nothing to list.
        assert_eq!(
            RuntimeConfig::from_defaults(Defaults::default()).mimir_keys,
            MimirKeys::default()
        );
    }

    #[test]
    fn each_key_lands_in_its_list_with_its_reason() {
        let config = parse(
            "overrides:\n  a:\n    ha_cluster_label: cluster\n    max_label_names_per_series: 40\n    \
             name_validation_scheme: utf8\n    separate_metrics_group_label: group\n    max_global_series_per_user: 150000\n    rate_limit_strategy: divided\n    \
             ingestion_burst_size: null\n  b:\n    accept_ha_samples: true\n    \
             ingestion_rate: 5\n    ruler_tenant_shard_size: 2\n\
             distributor_limits:\n  max_ingestion_rate: 100\n",
        )
        .unwrap();
        let group = "not implemented: weir's discarded-sample metrics have no group label";
        assert_eq!(
            config.mimir_keys.in_force,
            vec![
                "distributor_limits.max_ingestion_rate",
                "overrides.*.accept_ha_samples",
                "overrides.*.ha_cluster_label",
                "overrides.*.ingestion_rate",
                "overrides.*.max_label_names_per_series",
                "overrides.*.name_validation_scheme",
                "overrides.*.rate_limit_strategy",
            ],
            "a key set to null inherits the default: not listed"
        );
        assert_eq!(
            config.mimir_keys.not_for_a_distributor,
            vec![
                (
                    "overrides.*.max_global_series_per_user".to_string(),
                    "ingester"
                ),
                ("overrides.*.ruler_tenant_shard_size".to_string(), "ruler"),
            ]
        );
        assert_eq!(
            config.mimir_keys.ignored,
            vec![(
                "overrides.*.separate_metrics_group_label".to_string(),
                group
            )]
        );
        // ingestion_artificial_delay is in force; 0 is off, as in Mimir; a negative or
        // unreadable duration keeps the file out.
        let delayed = parse(
            "overrides:\n  a:\n    ingestion_artificial_delay: 1500ms\n  b:\n    \
             ingestion_artificial_delay: 0s\n",
        )
        .unwrap();
        assert!(delayed
            .mimir_keys
            .in_force
            .contains(&"overrides.*.ingestion_artificial_delay".to_string()));
        assert_eq!(
            delayed.artificial_delay("a"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(delayed.artificial_delay("b"), None);
        assert_eq!(delayed.artificial_delay("c"), None);
        for bad in ["-1s", "soon"] {
            let err = parse(&format!(
                "overrides:\n  a:\n    ingestion_artificial_delay: {bad}\n"
            ))
            .unwrap_err();
            assert!(matches!(err, ConfigError::Yaml(_)), "{bad}: {err}");
        }
        // drop_labels is in force for the tenant that sets it.
        let dropping = parse("overrides:\n  a:\n    drop_labels: [replica, pod]\n").unwrap();
        assert!(dropping
            .mimir_keys
            .in_force
            .contains(&"overrides.*.drop_labels".to_string()));
        assert_eq!(
            dropping.drop_labels("a").as_deref(),
            Some(&["replica".to_string(), "pod".to_string()][..])
        );
        assert_eq!(dropping.drop_labels("b"), None);
        // metric_relabel_configs: in force for the tenant that sets them, unless it turns
        // them off; a rule Prometheus would not load keeps the file out, naming the place.
        let relabelling = parse(
            "overrides:\n  a:\n    metric_relabel_configs:\n    - source_labels: [__name__]\n      \
             regex: go_.*\n      action: drop\n  b:\n    metric_relabeling_enabled: false\n    \
             metric_relabel_configs:\n    - target_label: env\n      replacement: prod\n",
        )
        .unwrap();
        for key in ["metric_relabel_configs", "metric_relabeling_enabled"] {
            assert!(relabelling
                .mimir_keys
                .in_force
                .contains(&format!("overrides.*.{key}")));
        }
        assert!(relabelling.mimir_keys.ignored.is_empty());
        let mut go = crate::relabel::Labels::new();
        go.set("__name__", "go_gc");
        assert!(!relabelling.relabel("a").unwrap().process(&mut go));
        assert_eq!(relabelling.relabel("b"), None, "turned off");
        assert_eq!(relabelling.relabel("c"), None);
        let bad = parse(
            "overrides:\n  a:\n    metric_relabel_configs:\n    - action: keep\n      regex: '('\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            bad.starts_with("overrides.a.metric_relabel_configs: rule 0: invalid regex"),
            "{bad}"
        );
        // Series validation: the tenant's own, else Mimir's defaults.
        assert_eq!(
            config.validation_limits("a").name_validation_scheme,
            crate::validation::NameValidationScheme::Utf8
        );
        assert_eq!(
            config.validation_limits("b").name_validation_scheme,
            crate::validation::NameValidationScheme::Legacy
        );
        assert_eq!(config.validation_limits("a").max_label_names_per_series, 40);
        assert_eq!(config.validation_limits("a").max_label_name_length, 1024);
        assert_eq!(config.validation_limits("b").max_label_names_per_series, 30);
        // The lists are only about the file: the limits are as before.
        assert_eq!(
            config.tenant_limits("a").rate_limit_strategy,
            RateLimitStrategy::Divided
        );
        assert_eq!(config.tenant_limits("b").ingestion_rate, 5.0);
        assert_eq!(config.instance.max_ingestion_rate, 100.0);
    }

    #[test]
    fn render_full_shows_where_the_keys_stand_and_diff_does_not() {
        let config = parse(
            "overrides:\n  a:\n    ingestion_rate: 7\n    \
             forwarding_drop_older_than: 1h\n    max_global_series_per_user: 5\n",
        )
        .unwrap();
        let full = config.render(RenderMode::Full);
        assert!(
            full.ends_with(
                "mimir_keys:\n  in_force:\n  - overrides.*.ingestion_rate\n  \
                 not_for_a_distributor:\n    overrides.*.max_global_series_per_user: ingester\n  \
                 ignored:\n    overrides.*.forwarding_drop_older_than: 'Mimir''s per-tenant \
                 forwarding is not implemented: every admitted push goes to --upstream'\n"
            ),
            "{full}"
        );
        let back: Value = serde_yaml_ng::from_str(&full).expect("valid YAML");
        assert_eq!(
            back["mimir_keys"]["ignored"]["overrides.*.forwarding_drop_older_than"],
            Value::from(mimir_keys::FORWARDING)
        );
        let diff = config.render(RenderMode::Diff);
        assert!(!diff.contains("mimir_keys"), "{diff}");
        parse(&diff).expect("the diff loads as a file");
        // No file: the section is there, with empty lists.
        let empty = RuntimeConfig::from_defaults(Defaults::default()).render(RenderMode::Full);
        assert!(
            empty.ends_with(
                "mimir_keys:\n  in_force: []\n  not_for_a_distributor: {}\n  ignored: {}\n"
            ),
            "{empty}"
        );
    }

    #[test]
    fn multiple_documents_are_an_error() {
        let err = parse("overrides: {}\n---\noverrides: {}\n").unwrap_err();
        assert!(matches!(err, ConfigError::MultipleDocuments), "{err}");
    }

    #[test]
    fn deep_nesting_is_refused_before_the_parser_sees_it() {
        let deep = format!("overrides: {}", "{".repeat(30_000));
        let err = parse(&deep).unwrap_err();
        assert!(matches!(err, ConfigError::TooDeep), "{err}");
        // Nesting a real file might use still parses.
        let nested = "overrides:\n  a: {ingestion_rate: 10, limits: {k: {rate: 1, burst: 2}}}\n";
        parse(nested).unwrap();
    }

    #[test]
    fn ingestion_burst_factor_sets_the_burst_as_mimir_does() {
        // Mimir: a factor above 0 makes the burst ceil(factor × rate), whatever
        // ingestion_burst_size says; 0 leaves the burst size in force.
        let config = parse(
            "overrides:\n  a:\n    ingestion_rate: 1000.5\n    ingestion_burst_size: 7\n    \
             ingestion_burst_factor: 3\n  b:\n    ingestion_rate: 1000\n    \
             ingestion_burst_size: 7\n    ingestion_burst_factor: 0\n",
        )
        .unwrap();
        assert_eq!(config.tenant_limits("a").ingestion_burst_size, 3002);
        assert_eq!(config.tenant_limits("b").ingestion_burst_size, 7);
        assert!(config
            .mimir_keys
            .in_force
            .contains(&"overrides.*.ingestion_burst_factor".to_string()));
        assert!(config.mimir_keys.ignored.is_empty());
        // A factor on a tenant that inherits the default rate reads that rate.
        let inherited = parse("overrides:\n  a:\n    ingestion_burst_factor: 2\n").unwrap();
        assert_eq!(
            inherited.tenant_limits("a").ingestion_burst_size,
            (2.0 * inherited.defaults.tenant.ingestion_rate).ceil() as u64
        );
        let err = parse("overrides:\n  a:\n    ingestion_burst_factor: -1\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "overrides.a: ingestion_burst_factor must be 0 (off) or more, got -1"
        );
    }

    #[test]
    fn bad_values_are_errors() {
        for (content, expected) in [
            (
                "overrides:\n  a:\n    ingestion_rate: -1\n",
                "overrides.a: ingestion_rate",
            ),
            (
                "overrides:\n  a:\n    request_rate: 5\n",
                "request_burst_size is 0",
            ),
            (
                "overrides:\n  a:\n    ingestion_burst_size: 0\n",
                "ingestion_burst_size is 0",
            ),
            (
                "overrides:\n  a:\n    ingestion_rate: abc\n",
                "invalid YAML",
            ),
            ("overrides: [1, 2]\n", "invalid YAML"),
            (
                "overrides:\n  a:\n    rate_limit_strategy: magic\n",
                "invalid YAML",
            ),
            (
                "distributor_limits:\n  max_ingestion_rate: .nan\n",
                "max_ingestion_rate",
            ),
            ("overrides: {a: {ingestion_rate: 1}\n", "invalid YAML"),
            // The tenant's entry is several structs flattened, so the path stops at it.
            (
                "overrides:\n  slow:\n    ingestion_burst_size: -20\n",
                "invalid YAML: overrides.slow: invalid value: integer `-20`",
            ),
            (
                "distributor_limits:\n  max_inflight_push_requests: -1\n",
                "invalid YAML: distributor_limits.max_inflight_push_requests: invalid value: integer `-1`",
            ),
        ] {
            let err = parse(content).unwrap_err().to_string();
            assert!(err.contains(expected), "{content:?}: {err}");
        }
    }

    #[test]
    fn a_limit_too_slow_for_the_buckets_clock_is_refused_at_load() {
        // 1e-12/s once let every push through: the bucket's 64-bit nanoseconds saturated.
        for (content, key) in [
            (
                "overrides:\n  a:\n    ingestion_rate: 1e-12\n",
                "ingestion_rate",
            ),
            (
                "overrides:\n  a:\n    request_rate: 1e-9\n    request_burst_size: 1\n",
                "request_rate",
            ),
            (
                "overrides:\n  a:\n    limits:\n      k: {rate: 1e-12}\n",
                "overrides.a.limits.\"k\"",
            ),
            ("admission:\n  default_limit: {rate: 1e-12}\n", "rate"),
        ] {
            let err = parse(content).unwrap_err().to_string();
            assert!(err.contains(key), "{content:?}: {err}");
            assert!(err.contains("ten years"), "{content:?}: {err}");
        }
        // A burst of 1 every 5 years is slow, but the clock holds it.
        let slow = parse("overrides:\n  a:\n    request_rate: 6.4e-9\n    request_burst_size: 1\n");
        assert!(slow.is_ok(), "{slow:?}");
    }

    #[test]
    fn admission_limits_per_tenant_and_key() {
        let config = RuntimeConfig::parse(
            "admission:\n  strict: true\n  default_limit: {rate: 7}\noverrides:\n  a:\n    allow_client_limits: true\n    max_inflight_push_requests: 4\n    limits:\n      \"GET /s\": {algorithm: sliding_window, rate: 100, window: 10s}\n      up: {max_concurrent: 3}\n",
            Defaults::default(),
        )
        .unwrap();
        let a = &config.admission.tenants["a"];
        assert!(a.allow_client_limits);
        let spec = a.limits["GET /s"];
        assert_eq!(spec.algorithm, crate::Algorithm::SlidingWindow);
        assert_eq!(spec.window, std::time::Duration::from_secs(10));
        assert_eq!(spec.burst, 100, "one second's worth by default");
        assert_eq!(a.limits["up"].max_concurrent, 3);
        assert!(config.admission.strict);
        assert_eq!(config.admission.default_limit.unwrap().rate, 7.0);
        assert_eq!(config.tenant_limits("a").max_inflight_push_requests, 4);
        // A bad spec names its place; an unknown field in a spec is an error.
        let err = RuntimeConfig::parse(
            "overrides:\n  a:\n    limits:\n      k: {rate: -1}\n",
            Defaults::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("overrides.a.limits.\"k\""), "{err}");
        assert!(RuntimeConfig::parse(
            "overrides:\n  a:\n    limits:\n      k: {rate: 1, rat: 2}\n",
            Defaults::default(),
        )
        .is_err());
    }

    #[test]
    fn render_diff_shows_only_what_differs() {
        let config = parse(
            "overrides:\n  a:\n    ingestion_rate: 10000\n  b:\n    request_rate: 3\n    \
             request_burst_size: 3\ndistributor_limits:\n  max_ingestion_rate: 9\n",
        )
        .unwrap();
        let diff = config.render(RenderMode::Diff);
        assert_eq!(
            diff,
            "overrides:\n  b:\n    request_rate: 3.0\n    request_burst_size: 3\n\
             distributor_limits:\n  max_ingestion_rate: 9.0\n"
        );
        let full = config.render(RenderMode::Full);
        assert!(
            full.contains("defaults:\n  ingestion_rate: 10000.0"),
            "{full}"
        );
        assert!(full.contains("  a:\n    ingestion_rate: 10000.0"), "{full}");
    }

    #[test]
    fn render_shows_every_per_tenant_key_and_the_diff_loads_as_it_was() {
        let file = "overrides:\n  a:\n    max_label_names_per_series: 40\n    \
                    accept_ha_samples: true\n    ha_tracker_sample_failover_timeout: 1m\n    \
                    drop_labels: [pod]\n    ingestion_artificial_delay: 250ms\n    \
                    metric_relabel_configs:\n    - source_labels: [__name__]\n      \
                    regex: go_.*\n      action: drop\n  \
                    b:\n    metric_relabeling_enabled: false\n";
        let config = parse(file).unwrap();
        let diff = config.render(RenderMode::Diff);
        assert_eq!(
            diff,
            "overrides:\n  a:\n    max_label_names_per_series: 40\n    \
             accept_ha_samples: true\n    ha_tracker_sample_failover_timeout: 1m\n    \
             drop_labels:\n    - pod\n    metric_relabel_configs:\n    - source_labels:\n      \
             - __name__\n      regex: go_.*\n      action: drop\n    \
             ingestion_artificial_delay: 250ms\n  \
             b:\n    metric_relabeling_enabled: false\n\
             distributor_limits: {}\n"
        );
        let again = parse(&diff).unwrap();
        assert_eq!(again.render(RenderMode::Diff), diff);
        assert_eq!(again.validation_limits("a"), config.validation_limits("a"));
        assert_eq!(again.ha_limits("a"), config.ha_limits("a"));
        assert_eq!(again.relabel_configs, config.relabel_configs);
        assert_eq!(
            again.artificial_delay("a"),
            Some(Duration::from_millis(250))
        );
        // The full view: the defaults of every key, and a tenant's whole set.
        let full = config.render(RenderMode::Full);
        for line in [
            "\n  max_label_names_per_series: 30\n",
            "\n  ha_tracker_failover_timeout: 30s\n",
            "\n  drop_labels: []\n",
            "\n  metric_relabeling_enabled: true\n",
            "\n  ingestion_artificial_delay: 0s\n",
            "\n    max_label_names_per_series: 40\n",
            "\n    max_label_value_length: 2048\n",
        ] {
            assert!(full.contains(line), "{line:?} in {full}");
        }
    }

    #[test]
    fn hash_is_of_the_bytes() {
        let config = parse("").unwrap();
        assert_eq!(
            config.sha256,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    /// The OTLP translation strategy is checked against the tenant's name scheme and
    /// suffixes, as Mimir checks its limits; the scheme decides whether names are kept as
    /// sent, also for a tenant with no OTLP key.
    #[test]
    fn the_translation_strategy_agrees_with_the_tenant_s_name_scheme() {
        let config = parse(
            "overrides:\n  utf8:\n    name_validation_scheme: utf8\n  \
             suffixed:\n    name_validation_scheme: utf8\n    otel_metric_suffixes_enabled: true\n    \
             otel_translation_strategy: NoUTF8EscapingWithSuffixes\n  \
             collapsing:\n    otel_label_name_preserve_multiple_underscores: false\n  \
             plain:\n    ingestion_rate: 5\n",
        )
        .unwrap();
        let utf8 = config
            .otlp_translation("utf8")
            .expect("a utf8 tenant has settings");
        assert!(utf8.utf8_names && !utf8.otel_metric_suffixes_enabled);
        let suffixed = config.otlp_translation("suffixed").unwrap();
        assert!(suffixed.utf8_names && suffixed.otel_metric_suffixes_enabled);
        let collapsing = config.otlp_translation("collapsing").unwrap();
        assert!(
            !collapsing.utf8_names && !collapsing.otel_label_name_preserve_multiple_underscores
        );
        assert_eq!(config.otlp_translation("plain"), None);
        for key in [
            "otel_translation_strategy",
            "otel_label_name_preserve_multiple_underscores",
        ] {
            assert!(
                config
                    .mimir_keys
                    .in_force
                    .contains(&format!("overrides.*.{key}")),
                "{key}"
            );
        }
        let refused = parse("overrides:\n  t:\n    otel_translation_strategy: NoTranslation\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            refused,
            "overrides.t: OTLP translation strategy NoTranslation is not allowed unless \
             validation scheme is utf8"
        );
        let unknown = parse("overrides:\n  t:\n    otel_translation_strategy: Escape\n")
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("unsupported OTLP translation strategy \"Escape\""),
            "{unknown}"
        );
    }
}
