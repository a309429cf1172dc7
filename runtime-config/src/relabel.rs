//! Mimir's `metric_relabel_configs`: Prometheus' relabelling rules, read and checked as
//! Prometheus' `relabel.Config` is, and applied to one series' labels as
//! `relabel.ProcessBuilder` applies them. Pure: a label set in, the label set changed in place
//! or the word to drop the series out.
//!
//! Where weir departs from Go's `regexp`: the Rust `regex` crate is the same RE2 family (no
//! look-around, no back-references), but its `\d`, `\w`, `\s` and `\b` know Unicode where Go's
//! know ASCII only; `lowercase` and `uppercase` follow Rust's Unicode case mapping. Label names
//! are checked as Prometheus 3 checks them (UTF-8, not empty).

use std::borrow::Cow;

use regex::Regex;
use serde::{Deserialize, Deserializer, Serialize};

/// A series' labels by name: sorted, each name once, as Prometheus' `labels.Builder` holds
/// them. Setting an empty value removes the label, as the builder does. Names and values
/// borrow from the request until a rule writes one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels<'a> {
    pairs: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

impl<'a> Labels<'a> {
    pub fn new() -> Labels<'a> {
        Labels::default()
    }

    /// The value of `name`, if the set has it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.find(name).ok().map(|at| self.pairs[at].1.as_ref())
    }

    /// Sets `name` to `value`; an empty value removes the label.
    pub fn set(&mut self, name: impl Into<Cow<'a, str>>, value: impl Into<Cow<'a, str>>) {
        let (name, value) = (name.into(), value.into());
        if value.is_empty() {
            self.remove(&name);
            return;
        }
        // Labels mostly come in name order: the end is the first place to look.
        if self.pairs.last().is_none_or(|(last, _)| **last < *name) {
            self.pairs.push((name, value));
            return;
        }
        match self.find(&name) {
            Ok(at) => self.pairs[at].1 = value,
            Err(at) => self.pairs.insert(at, (name, value)),
        }
    }

    /// Empties the set, keeping its room.
    pub fn clear(&mut self) {
        self.pairs.clear();
    }

    /// Removes `name`, if the set has it.
    pub fn remove(&mut self, name: &str) {
        if let Ok(at) = self.find(name) {
            self.pairs.remove(at);
        }
    }

    /// Keeps only the labels whose name `keep` says yes to.
    pub fn retain_names(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.pairs.retain(|(name, _)| keep(name));
    }

    /// The labels in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs
            .iter()
            .map(|(name, value)| (name.as_ref(), value.as_ref()))
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.pairs
            .binary_search_by(|(other, _)| other.as_ref().cmp(name))
    }
}

/// One rule as the file writes it (Prometheus' `relabel_config`); a field left out takes
/// Prometheus' default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_labels: Option<Vec<String>>,
    #[serde(
        default,
        deserialize_with = "scalar",
        skip_serializing_if = "Option::is_none"
    )]
    pub separator: Option<String>,
    #[serde(
        default,
        deserialize_with = "scalar",
        skip_serializing_if = "Option::is_none"
    )]
    pub regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modulus: Option<u64>,
    #[serde(
        default,
        deserialize_with = "scalar",
        skip_serializing_if = "Option::is_none"
    )]
    pub target_label: Option<String>,
    #[serde(
        default,
        deserialize_with = "scalar",
        skip_serializing_if = "Option::is_none"
    )]
    pub replacement: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

/// A string field that YAML may write as a number or a boolean (`regex: 500`), read as its
/// text, as Go's YAML decoder reads a scalar into a string.
fn scalar<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Integer(i64),
        Float(f64),
        Flag(bool),
    }
    Ok(
        Option::<Scalar>::deserialize(deserializer)?.map(|scalar| match scalar {
            Scalar::Text(text) => text,
            Scalar::Integer(number) => number.to_string(),
            Scalar::Float(number) => number.to_string(),
            Scalar::Flag(flag) => flag.to_string(),
        }),
    )
}

const DEFAULT_SEPARATOR: &str = ";";
const DEFAULT_REGEX: &str = "(.*)";
const DEFAULT_REPLACEMENT: &str = "$1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Replace,
    Keep,
    Drop,
    KeepEqual,
    DropEqual,
    HashMod,
    LabelMap,
    LabelDrop,
    LabelKeep,
    Lowercase,
    Uppercase,
}

impl Action {
    fn parse(text: &str) -> Result<Action, String> {
        Ok(match text.to_lowercase().as_str() {
            "replace" => Action::Replace,
            "keep" => Action::Keep,
            "drop" => Action::Drop,
            "keepequal" => Action::KeepEqual,
            "dropequal" => Action::DropEqual,
            "hashmod" => Action::HashMod,
            "labelmap" => Action::LabelMap,
            "labeldrop" => Action::LabelDrop,
            "labelkeep" => Action::LabelKeep,
            "lowercase" => Action::Lowercase,
            "uppercase" => Action::Uppercase,
            _ => return Err(format!("unknown relabel action {text:?}")),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Action::Replace => "replace",
            Action::Keep => "keep",
            Action::Drop => "drop",
            Action::KeepEqual => "keepequal",
            Action::DropEqual => "dropequal",
            Action::HashMod => "hashmod",
            Action::LabelMap => "labelmap",
            Action::LabelDrop => "labeldrop",
            Action::LabelKeep => "labelkeep",
            Action::Lowercase => "lowercase",
            Action::Uppercase => "uppercase",
        }
    }
}

/// One rule, checked and with its regular expression compiled (anchored at both ends, `.`
/// matching a newline too, as Prometheus anchors it).
#[derive(Debug, Clone)]
struct Rule {
    action: Action,
    source_labels: Vec<String>,
    separator: String,
    regex: Regex,
    modulus: u64,
    target_label: String,
    replacement: String,
}

impl Rule {
    /// The rule of `config`, or why Prometheus would not load it (its `Config.Validate`).
    fn new(config: &RuleConfig) -> Result<Rule, String> {
        let action = Action::parse(config.action.as_deref().unwrap_or("replace"))?;
        let separator = config.separator.as_deref().unwrap_or(DEFAULT_SEPARATOR);
        let regex = config.regex.as_deref().unwrap_or(DEFAULT_REGEX);
        let modulus = config.modulus.unwrap_or(0);
        let target_label = config.target_label.as_deref().unwrap_or("");
        let replacement = config.replacement.as_deref().unwrap_or(DEFAULT_REPLACEMENT);
        let name = action.name();
        use Action::*;
        if action == HashMod && modulus == 0 {
            return Err("relabel configuration for hashmod requires non-zero modulus".into());
        }
        let needs_target = matches!(
            action,
            Replace | HashMod | Lowercase | Uppercase | KeepEqual | DropEqual
        );
        if needs_target && target_label.is_empty() {
            return Err(format!(
                "relabel configuration for {name} action requires 'target_label' value"
            ));
        }
        let only_labels = matches!(action, Lowercase | Uppercase | KeepEqual | DropEqual);
        if only_labels && replacement != DEFAULT_REPLACEMENT {
            return Err(format!("'replacement' can not be set for {name} action"));
        }
        if matches!(action, KeepEqual | DropEqual)
            && (regex != DEFAULT_REGEX || modulus != 0 || separator != DEFAULT_SEPARATOR)
        {
            return Err(format!(
                "{name} action requires only 'source_labels' and `target_label`, and no other \
                 fields"
            ));
        }
        if matches!(action, LabelDrop | LabelKeep)
            && (config.source_labels.is_some()
                || !target_label.is_empty()
                || modulus != 0
                || separator != DEFAULT_SEPARATOR
                || replacement != DEFAULT_REPLACEMENT)
        {
            return Err(format!(
                "{name} action requires only 'regex', and no other fields"
            ));
        }
        let regex = Regex::new(&format!("^(?s:{regex})$"))
            .map_err(|err| format!("invalid regex {regex:?}: {err}"))?;
        Ok(Rule {
            action,
            source_labels: config.source_labels.clone().unwrap_or_default(),
            separator: separator.to_string(),
            regex,
            modulus,
            target_label: target_label.to_string(),
            replacement: replacement.to_string(),
        })
    }

    /// The source labels' values joined by the separator (a missing label is empty).
    fn value<'l>(&self, labels: &'l Labels) -> Cow<'l, str> {
        if let [name] = self.source_labels.as_slice() {
            return Cow::Borrowed(labels.get(name).unwrap_or(""));
        }
        let mut value = String::new();
        for (index, name) in self.source_labels.iter().enumerate() {
            if index > 0 {
                value.push_str(&self.separator);
            }
            value.push_str(labels.get(name).unwrap_or(""));
        }
        Cow::Owned(value)
    }

    /// Applies the rule; `false` when the series is to be dropped.
    fn apply(&self, labels: &mut Labels) -> bool {
        match self.action {
            Action::Drop => return !self.regex.is_match(&self.value(labels)),
            Action::Keep => return self.regex.is_match(&self.value(labels)),
            Action::DropEqual => {
                return labels.get(&self.target_label).unwrap_or("") != self.value(labels)
            }
            Action::KeepEqual => {
                return labels.get(&self.target_label).unwrap_or("") == self.value(labels)
            }
            Action::Replace => {
                let value = self.value(labels);
                // No match, no replacement.
                let Some(captures) = self.regex.captures(&value) else {
                    return true;
                };
                let mut target = String::new();
                captures.expand(&self.target_label, &mut target);
                if target.is_empty() {
                    return true;
                }
                let mut replaced = String::new();
                captures.expand(&self.replacement, &mut replaced);
                labels.set(target, replaced);
            }
            Action::Lowercase => {
                let lower = self.value(labels).to_lowercase();
                labels.set(self.target_label.clone(), lower);
            }
            Action::Uppercase => {
                let upper = self.value(labels).to_uppercase();
                labels.set(self.target_label.clone(), upper);
            }
            Action::HashMod => {
                use md5::Digest;
                let hash = md5::Md5::digest(self.value(labels).as_bytes());
                // The last 8 bytes, big-endian, as Prometheus reads them.
                let tail: [u8; 8] = hash[8..].try_into().expect("an MD5 sum is 16 bytes");
                let bucket = u64::from_be_bytes(tail) % self.modulus;
                labels.set(self.target_label.clone(), bucket.to_string());
            }
            Action::LabelMap => {
                // Over the labels as they were before the rule, as the builder's `Range`.
                let before: Vec<(String, String)> = labels
                    .iter()
                    .map(|(name, value)| (name.to_string(), value.to_string()))
                    .collect();
                for (name, value) in before {
                    if self.regex.is_match(&name) {
                        let mapped = self
                            .regex
                            .replace_all(&name, self.replacement.as_str())
                            .into_owned();
                        labels.set(mapped, value);
                    }
                }
            }
            Action::LabelDrop => labels.retain_names(|name| !self.regex.is_match(name)),
            Action::LabelKeep => labels.retain_names(|name| self.regex.is_match(name)),
        }
        true
    }
}

/// A tenant's rules, in order.
#[derive(Debug, Clone)]
pub struct Relabel {
    rules: Vec<Rule>,
    /// As the file wrote them: what two configs are compared by.
    configs: Vec<RuleConfig>,
}

impl PartialEq for Relabel {
    fn eq(&self, other: &Relabel) -> bool {
        self.configs == other.configs
    }
}

impl Relabel {
    /// The rules of `configs`, or the first that Prometheus would not load, with its index.
    pub fn new(configs: Vec<RuleConfig>) -> Result<Relabel, String> {
        let rules = configs
            .iter()
            .enumerate()
            .map(|(index, config)| Rule::new(config).map_err(|err| format!("rule {index}: {err}")))
            .collect::<Result<_, _>>()?;
        Ok(Relabel { rules, configs })
    }

    /// Applies every rule in order to `labels`; `false` when a rule drops the series (the
    /// labels are then left part-way).
    pub fn process(&self, labels: &mut Labels) -> bool {
        self.rules.iter().all(|rule| rule.apply(labels))
    }

    /// Whether a rule reads the value of the label `name`: names it among its source labels,
    /// or compares its source labels with it (`keepequal`, `dropequal`). Rules that do not
    /// treat series that differ only in that label's value alike (`labelmap` may copy the
    /// value, but does so for each of them).
    pub fn reads_value_of(&self, name: &str) -> bool {
        self.rules.iter().any(|rule| {
            rule.source_labels.iter().any(|label| label == name)
                || (matches!(rule.action, Action::KeepEqual | Action::DropEqual)
                    && rule.target_label == name)
        })
    }

    /// Whether every rule only keeps or drops a series by the labels `names`: a `keep` or a
    /// `drop` whose source labels are all among them. Such rules change no label, and what
    /// they make of a series hangs on those labels' values alone.
    pub fn only_drops_by(&self, names: &[&str]) -> bool {
        self.rules.iter().all(|rule| {
            matches!(rule.action, Action::Keep | Action::Drop)
                && rule
                    .source_labels
                    .iter()
                    .all(|label| names.contains(&label.as_str()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(yaml: &str) -> Result<Relabel, String> {
        let configs: Vec<RuleConfig> = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        Relabel::new(configs)
    }

    fn labels(pairs: &[(&'static str, &'static str)]) -> Labels<'static> {
        let mut labels = Labels::new();
        for (name, value) in pairs {
            labels.set(*name, *value);
        }
        labels
    }

    /// `rules` applied to `input`: the labels after, or `None` when dropped.
    fn run(yaml: &str, input: &[(&'static str, &'static str)]) -> Option<Labels<'static>> {
        let rules = rules(yaml).unwrap();
        let mut labels = labels(input);
        rules.process(&mut labels).then_some(labels)
    }

    // Where a case says it is Prometheus', its input, rules and expected output are those of
    // `model/relabel/relabel_test.go` (`TestRelabel`), written again here; the others follow
    // what `relabel.go` does.

    #[test]
    fn reads_value_of_is_a_source_label_or_an_equal_target() {
        let reads = |yaml: &str| rules(yaml).unwrap().reads_value_of("le");
        assert!(reads(
            "- source_labels: [__name__, le]\n  regex: x\n  action: drop\n"
        ));
        assert!(reads(
            "- source_labels: [a]\n  target_label: le\n  action: keepequal\n"
        ));
        assert!(!reads("- source_labels: [a]\n  target_label: le\n"));
        assert!(!reads(
            "- regex: (l)e\n  action: labelmap\n  replacement: x$1\n"
        ));
        assert!(!reads("- regex: le\n  action: labeldrop\n"));
    }

    #[test]
    fn only_drops_by_is_keep_and_drop_on_those_labels_only() {
        let name = ["__name__", "__meta_tenant_id"];
        let by_name = "- source_labels: [__name__]\n  regex: go_.*\n  action: drop\n\
                       - source_labels: [__meta_tenant_id, __name__]\n  regex: t;.*\n  action: keep\n";
        assert!(rules(by_name).unwrap().only_drops_by(&name));
        assert!(rules("[]").unwrap().only_drops_by(&name));
        for other in [
            "- source_labels: [job]\n  regex: a\n  action: drop\n",
            "- source_labels: [__name__]\n  target_label: n\n",
            "- regex: pod\n  action: labeldrop\n",
            "- source_labels: [__name__]\n  target_label: job\n  action: dropequal\n",
        ] {
            let rules = format!("{by_name}{other}");
            assert!(
                !self::rules(&rules).unwrap().only_drops_by(&name),
                "{other}"
            );
        }
    }

    #[test]
    fn replace_writes_the_expanded_replacement_into_the_target() {
        let yaml = "- source_labels: [a]\n  regex: f(.*)\n  target_label: d\n  \
                    separator: ';'\n  replacement: ch${1}-ch${1}\n  action: replace\n";
        assert_eq!(
            run(yaml, &[("a", "foo"), ("b", "bar"), ("c", "baz")]),
            Some(labels(&[
                ("a", "foo"),
                ("b", "bar"),
                ("c", "baz"),
                ("d", "choo-choo")
            ]))
        );
        // Two rules, the second reading the first's output; several sources joined.
        let yaml = "- source_labels: [a, b]\n  regex: f(.*);(.*)r\n  target_label: a\n  \
                    replacement: b${1}${2}m\n\
                    - source_labels: [c, a]\n  regex: (b).*b(.*)ba(.*)\n  target_label: d\n  \
                    replacement: $1$2$2$3\n";
        assert_eq!(
            run(yaml, &[("a", "foo"), ("b", "bar"), ("c", "baz")]),
            Some(labels(&[
                ("a", "boobam"),
                ("b", "bar"),
                ("c", "baz"),
                ("d", "boooom")
            ]))
        );
        // No match: nothing changes. A replacement that expands to nothing removes the target.
        let yaml = "- source_labels: [a]\n  regex: (f).*\n  target_label: a\n  \
                    replacement: $2\n";
        assert_eq!(
            run(yaml, &[("a", "foo"), ("b", "bar")]),
            Some(labels(&[("b", "bar")]))
        );
        let yaml = "- source_labels: [a]\n  regex: (b).*\n  target_label: c\n";
        assert_eq!(run(yaml, &[("a", "foo")]), Some(labels(&[("a", "foo")])));
        // The regex is anchored: `o` alone does not match `foo`.
        let yaml = "- source_labels: [a]\n  regex: o\n  target_label: c\n  replacement: x\n";
        assert_eq!(run(yaml, &[("a", "foo")]), Some(labels(&[("a", "foo")])));
        // A target named from a capture; `$1x` is the group named `1x`, which is empty.
        let yaml = "- source_labels: [a]\n  regex: (.*)\n  target_label: ${1}_x\n  \
                    replacement: $1x\n\
                    - source_labels: [a]\n  target_label: b\n  replacement: '${1}x'\n";
        assert_eq!(
            run(yaml, &[("a", "foo")]),
            Some(labels(&[("a", "foo"), ("b", "foox")]))
        );
        // A missing source label reads as empty, and the default regex matches it.
        let yaml = "- source_labels: [missing]\n  target_label: c\n  replacement: fixed\n";
        assert_eq!(
            run(yaml, &[("a", "foo")]),
            Some(labels(&[("a", "foo"), ("c", "fixed")]))
        );
        // Default action with no source labels: a constant label.
        let yaml = "- target_label: env\n  replacement: prod\n";
        assert_eq!(
            run(yaml, &[("__name__", "up")]),
            Some(labels(&[("__name__", "up"), ("env", "prod")]))
        );
    }

    #[test]
    fn keep_and_drop_match_the_joined_value() {
        let drop = "- source_labels: [a]\n  regex: f.+\n  action: drop\n";
        assert_eq!(run(drop, &[("a", "foo")]), None);
        assert_eq!(run(drop, &[("a", "boo")]), Some(labels(&[("a", "boo")])));
        let keep = "- source_labels: [a]\n  regex: f.+\n  action: keep\n";
        assert_eq!(run(keep, &[("a", "foo")]), Some(labels(&[("a", "foo")])));
        assert_eq!(run(keep, &[("a", "boo")]), None);
        // A missing label is empty: `keep` of `.*` keeps, of `.+` drops.
        assert!(run(
            "- source_labels: [b]\n  regex: .*\n  action: keep\n",
            &[("a", "x")]
        )
        .is_some());
        assert!(run(
            "- source_labels: [b]\n  regex: .+\n  action: keep\n",
            &[("a", "x")]
        )
        .is_none());
        // The action's name is read case-blind, as Prometheus reads it.
        assert_eq!(
            run(
                "- source_labels: [a]\n  regex: foo\n  action: DROP\n",
                &[("a", "foo")]
            ),
            None
        );
        // `.` matches a newline.
        assert_eq!(run(drop, &[("a", "f\no")]), None);
        // Two sources: `a;b`.
        let joined = "- source_labels: [a, b]\n  regex: x;y\n  action: drop\n";
        assert_eq!(run(joined, &[("a", "x"), ("b", "y")]), None);
        let joined = "- source_labels: [a, b]\n  separator: '|'\n  regex: x;y\n  action: drop\n";
        assert!(run(joined, &[("a", "x"), ("b", "y")]).is_some());
    }

    #[test]
    fn keepequal_and_dropequal_compare_with_the_target_label() {
        let keep = "- source_labels: [a]\n  target_label: b\n  action: keepequal\n";
        assert!(run(keep, &[("a", "x"), ("b", "x")]).is_some());
        assert!(run(keep, &[("a", "x"), ("b", "y")]).is_none());
        let drop = "- source_labels: [a]\n  target_label: b\n  action: dropequal\n";
        assert!(run(drop, &[("a", "x"), ("b", "x")]).is_none());
        assert!(run(drop, &[("a", "x"), ("b", "y")]).is_some());
    }

    #[test]
    fn hashmod_is_prometheus_md5_bucket() {
        // Prometheus' two cases: `baz` and `foo\nbar` modulo 1000 are 976 and 734.
        let yaml = "- source_labels: [c]\n  target_label: d\n  modulus: 1000\n  \
                    action: hashmod\n";
        assert_eq!(
            run(yaml, &[("a", "foo"), ("b", "bar"), ("c", "baz")]),
            Some(labels(&[
                ("a", "foo"),
                ("b", "bar"),
                ("c", "baz"),
                ("d", "976")
            ]))
        );
        let yaml = "- source_labels: [a]\n  target_label: b\n  modulus: 1000\n  \
                    action: hashmod\n";
        assert_eq!(
            run(yaml, &[("a", "foo\nbar")]),
            Some(labels(&[("a", "foo\nbar"), ("b", "734")]))
        );
    }

    #[test]
    fn labelmap_labeldrop_and_labelkeep_work_on_names() {
        let map = "- regex: meta_(.+)\n  action: labelmap\n";
        assert_eq!(
            run(map, &[("a", "foo"), ("meta_b", "bar"), ("meta_c", "baz")]),
            Some(labels(&[
                ("a", "foo"),
                ("b", "bar"),
                ("c", "baz"),
                ("meta_b", "bar"),
                ("meta_c", "baz")
            ]))
        );
        let map = "- regex: (b.*)\n  replacement: ${1}_x\n  action: labelmap\n";
        assert_eq!(
            run(map, &[("a", "1"), ("b", "2"), ("bc", "3")]),
            Some(labels(&[
                ("a", "1"),
                ("b", "2"),
                ("b_x", "2"),
                ("bc", "3"),
                ("bc_x", "3")
            ]))
        );
        let drop = "- regex: b.*\n  action: labeldrop\n";
        assert_eq!(
            run(drop, &[("a", "1"), ("b", "2"), ("bc", "3")]),
            Some(labels(&[("a", "1")]))
        );
        let keep = "- regex: b.*\n  action: labelkeep\n";
        assert_eq!(
            run(keep, &[("a", "1"), ("b", "2"), ("bc", "3")]),
            Some(labels(&[("b", "2"), ("bc", "3")]))
        );
    }

    #[test]
    fn lowercase_and_uppercase_write_the_target() {
        let yaml = "- source_labels: [a]\n  target_label: lower\n  action: lowercase\n\
                    - source_labels: [a]\n  target_label: upper\n  action: uppercase\n";
        assert_eq!(
            run(yaml, &[("a", "AbC")]),
            Some(labels(&[("a", "AbC"), ("lower", "abc"), ("upper", "ABC")]))
        );
        // An empty value removes the target, as the builder's `Set` does.
        let yaml = "- source_labels: [missing]\n  target_label: a\n  action: lowercase\n";
        assert_eq!(
            run(yaml, &[("a", "x"), ("b", "y")]),
            Some(labels(&[("b", "y")]))
        );
    }

    #[test]
    fn rules_prometheus_refuses_are_refused_with_its_message() {
        let err = |yaml: &str| rules(yaml).unwrap_err();
        assert!(err("- action: nope\n").contains("unknown relabel action \"nope\""));
        assert!(
            err("- source_labels: [a]\n  target_label: b\n  action: hashmod\n")
                .contains("requires non-zero modulus")
        );
        assert!(err("- source_labels: [a]\n  action: replace\n")
            .contains("replace action requires 'target_label' value"));
        assert!(err(
            "- source_labels: [a]\n  target_label: b\n  replacement: x\n  action: lowercase\n"
        )
        .contains("'replacement' can not be set for lowercase action"));
        assert!(
            err("- source_labels: [a]\n  target_label: b\n  regex: x\n  action: keepequal\n")
                .contains("keepequal action requires only 'source_labels'")
        );
        assert!(
            err("- source_labels: [a]\n  regex: x\n  action: labeldrop\n")
                .contains("labeldrop action requires only 'regex'")
        );
        assert!(
            err("- source_labels: [a]\n  regex: '(unclosed'\n  action: drop\n")
                .contains("invalid regex")
        );
        // The index of the rule that failed.
        assert!(err("- target_label: a\n- action: nope\n").starts_with("rule 1: "));
        // A key Prometheus does not know is a typo.
        assert!(err("- source_label: [a]\n  action: drop\n").contains("source_label"));
        // A number where a string goes reads as its text, as in Go.
        assert!(run(
            "- source_labels: [code]\n  regex: 500\n  action: drop\n",
            &[("code", "500")]
        )
        .is_none());
    }
}
