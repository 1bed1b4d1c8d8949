//! Prometheus' text exposition format 0.0.4: an encoder, and a validating parser that the
//! tests (unit and black-box) run over what the broker serves.
//!
//! The format, as far as it matters here: a family is introduced by `# HELP name text` and
//! `# TYPE name counter|gauge|histogram|summary`, followed by all of its samples
//! `name{label="value",...} number`. Histogram samples are `name_bucket{...,le="bound"}`
//! (cumulative, ending with `le="+Inf"`), `name_sum` and `name_count`; summary samples here are
//! `name_sum` and `name_count` only. In label values `\`, `"` and line feeds are escaped as
//! `\\`, `\"` and `\n`; in HELP text `\` and line feeds.

use std::collections::{HashMap, HashSet};
use std::fmt::{self, Display, Write};

use super::Histogram;

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Summary,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        [Kind::Counter, Kind::Gauge, Kind::Histogram, Kind::Summary].into_iter().find(|k| k.as_str() == s)
    }

    /// The suffixes a sample name may add to its family name.
    fn suffixes(self) -> &'static [&'static str] {
        match self {
            Kind::Counter | Kind::Gauge => &[""],
            Kind::Histogram => &["_bucket", "_sum", "_count"],
            Kind::Summary => &["", "_sum", "_count"],
        }
    }
}

/// A sample's value.
#[derive(Debug, Clone, Copy)]
pub enum Value {
    U(u64),
    I(i64),
    F(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::U(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::I(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::F(v)
    }
}

impl Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Value::U(v) => write!(f, "{v}"),
            Value::I(v) => write!(f, "{v}"),
            Value::F(v) if v.is_nan() => f.write_str("NaN"),
            Value::F(v) if v == f64::INFINITY => f.write_str("+Inf"),
            Value::F(v) if v == f64::NEG_INFINITY => f.write_str("-Inf"),
            // Rust prints floats without an exponent and with the shortest digits that
            // round-trip: `0.0001`, `2.5`, `60`.
            Value::F(v) => write!(f, "{v}"),
        }
    }
}

/// Label name and value; any `Display` value (strings, integers) is escaped as it is written.
pub(crate) type Label<'a> = (&'a str, &'a dyn Display);

/// Writes label values with `\`, `"` and line feed escaped.
struct Escaped<'a>(&'a mut String);

impl Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '\\' => self.0.push_str("\\\\"),
                '"' => self.0.push_str("\\\""),
                '\n' => self.0.push_str("\\n"),
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

/// Builds an exposition. Families must be written whole, one after another: `family`, then
/// its samples. Writing to a `String` cannot fail, so the `fmt::Result`s are ignored.
pub struct Exposition {
    out: String,
    /// The family being written (debug builds check samples against it).
    current: Option<(&'static str, Kind)>,
}

impl Exposition {
    pub fn with_capacity(bytes: usize) -> Exposition {
        Exposition { out: String::with_capacity(bytes), current: None }
    }

    /// Starts family `name`. `help` is one line.
    pub fn family(&mut self, name: &'static str, kind: Kind, help: &str) {
        debug_assert!(valid_metric_name(name), "{name}");
        debug_assert!(!help.contains('\n') && !help.contains('\\'), "{name}: HELP must be one plain line");
        debug_assert!(kind != Kind::Counter || name.ends_with("_total"), "{name}: a counter's name ends in _total");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
        self.current = Some((name, kind));
    }

    /// A sample of the current family, named as the family.
    pub fn sample(&mut self, name: &str, labels: &[Label<'_>], value: impl Into<Value>) {
        self.sample_suffixed(name, "", labels, value);
    }

    /// A sample named `name` + `suffix` (`_sum`, `_count`, `_bucket`).
    pub(crate) fn sample_suffixed(&mut self, name: &str, suffix: &str, labels: &[Label<'_>], value: impl Into<Value>) {
        debug_assert!(
            self.current.is_some_and(|(family, kind)| family == name && kind.suffixes().contains(&suffix)),
            "sample {name}{suffix} outside its family"
        );
        self.out.push_str(name);
        self.out.push_str(suffix);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", value.into());
    }

    /// Every sample of one histogram: cumulative buckets, +Inf, sum, count.
    pub fn histogram(&mut self, name: &str, labels: &[Label<'_>], bounds_nanos: &[u64], histogram: &Histogram) {
        let counts = histogram.bucket_counts();
        debug_assert_eq!(counts.len(), bounds_nanos.len() + 1);
        let mut cumulative = 0u64;
        for (i, count) in counts.iter().enumerate() {
            cumulative += count;
            self.out.push_str(name);
            self.out.push_str("_bucket");
            let le = match bounds_nanos.get(i) {
                Some(bound) => Value::F(*bound as f64 / 1e9),
                None => Value::F(f64::INFINITY),
            };
            self.labels(labels, Some(le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        self.sample_suffixed(name, "_sum", labels, histogram.sum_seconds());
        self.sample_suffixed(name, "_count", labels, cumulative);
    }

    fn labels(&mut self, labels: &[Label<'_>], le: Option<Value>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        for (i, (name, value)) in labels.iter().enumerate() {
            debug_assert!(valid_label_name(name), "{name}");
            if i > 0 {
                self.out.push(',');
            }
            self.out.push_str(name);
            self.out.push_str("=\"");
            let _ = write!(Escaped(&mut self.out), "{value}");
            self.out.push('"');
        }
        if let Some(le) = le {
            if !labels.is_empty() {
                self.out.push(',');
            }
            let _ = write!(self.out, "le=\"{le}\"");
        }
        self.out.push('}');
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

// ----- the validating parser ------------------------------------------------------------------

/// One parsed sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name (with any `_bucket`/`_sum`/`_count` suffix).
    pub name: String,
    /// Label values unescaped, in the order written.
    pub labels: Vec<(String, String)>,
    pub value: f64,
    /// The family it belongs to and its type.
    pub family: String,
    pub kind: Kind,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Parses an exposition and checks it: every sample belongs to a family declared by a TYPE line
/// (HELP first) and written contiguously, names and label names are valid, label values are
/// properly escaped, no sample repeats, values are numbers, counters are named `_total`, and
/// each histogram's buckets are cumulative and end with `+Inf` equal to its `_count`.
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let mut kinds: HashMap<String, Kind> = HashMap::new();
    let mut helped: HashSet<String> = HashSet::new();
    let mut finished: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut seen: HashSet<(String, Vec<(String, String)>)> = HashSet::new();
    let mut samples = Vec::new();
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the exposition must end with a line feed".into());
    }
    for (n, line) in text.lines().enumerate() {
        let at = |why: String| format!("line {}: {why}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut words = rest.trim_start().splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("HELP"), Some(name), Some(_)) => {
                    if !valid_metric_name(name) {
                        return Err(at("bad metric name".into()));
                    }
                    if kinds.contains_key(name) || !helped.insert(name.to_string()) {
                        return Err(at("HELP after the family's TYPE, or repeated".into()));
                    }
                }
                (Some("TYPE"), Some(name), Some(kind)) => {
                    let kind = Kind::parse(kind).ok_or_else(|| at("unknown type".into()))?;
                    if !valid_metric_name(name) {
                        return Err(at("bad metric name".into()));
                    }
                    if !helped.contains(name) {
                        return Err(at("TYPE without a HELP line before it".into()));
                    }
                    if kinds.insert(name.to_string(), kind).is_some() {
                        return Err(at("family declared twice".into()));
                    }
                    if kind == Kind::Counter && !name.ends_with("_total") {
                        return Err(at("a counter's name should end in _total".into()));
                    }
                    if let Some(previous) = current.replace(name.to_string()) {
                        finished.insert(previous);
                    }
                }
                _ => {} // other comments are allowed
            }
            continue;
        }
        let (name, labels, value) = parse_sample_line(line).map_err(at)?;
        let (family, kind) = family_of(&name, &kinds).ok_or_else(|| at("sample without a TYPE line".into()))?;
        if finished.contains(&family) || current.as_deref() != Some(family.as_str()) {
            return Err(at(format!("sample of family {family} outside its block")));
        }
        if !seen.insert((name.clone(), labels.clone())) {
            return Err(at("repeated sample".into()));
        }
        samples.push(Sample { name, labels, value, family, kind });
    }
    check_histograms(&samples)?;
    Ok(samples)
}

fn family_of(name: &str, kinds: &HashMap<String, Kind>) -> Option<(String, Kind)> {
    if let Some(kind) = kinds.get(name) {
        if kind.suffixes().contains(&"") {
            return Some((name.to_string(), *kind));
        }
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if let Some(kind) = kinds.get(base) {
                if kind.suffixes().contains(&suffix) {
                    return Some((base.to_string(), *kind));
                }
            }
        }
    }
    None
}

type Parsed = (String, Vec<(String, String)>, f64);

fn parse_sample_line(line: &str) -> Result<Parsed, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if !valid_metric_name(name) {
        return Err("bad metric name".into());
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find('=').ok_or("label without =")?;
            let label = &rest[..eq];
            if !valid_label_name(label) {
                return Err(format!("bad label name {label:?}"));
            }
            rest = rest[eq + 1..].strip_prefix('"').ok_or("label value not quoted")?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next() {
                    None => return Err("unterminated label value".into()),
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        other => return Err(format!("bad escape in label value: {other:?}")),
                    },
                    Some((_, c)) => value.push(c),
                }
            };
            if labels.iter().any(|(n, _)| n == label) {
                return Err(format!("label {label} twice"));
            }
            labels.push((label.to_string(), value));
            rest = &rest[end + 1..];
            if let Some(after) = rest.strip_prefix(',') {
                rest = after;
            } else if !rest.starts_with('}') {
                return Err("expected , or } after a label".into());
            }
        }
    }
    let value_text = rest.strip_prefix(' ').ok_or("no space before the value")?;
    // An optional timestamp may follow; this broker writes none.
    let value_text = value_text.split(' ').next().unwrap_or_default();
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse::<f64>().map_err(|e| format!("bad value {v:?}: {e}"))?,
    };
    Ok((name.to_string(), labels, value))
}

/// Each histogram series: buckets non-decreasing, the last `le="+Inf"`, equal to `_count`.
fn check_histograms(samples: &[Sample]) -> Result<(), String> {
    type Series = (String, Vec<(String, String)>);
    let mut buckets: HashMap<Series, Vec<(f64, f64)>> = HashMap::new();
    let mut counts: HashMap<Series, f64> = HashMap::new();
    for s in samples.iter().filter(|s| s.kind == Kind::Histogram) {
        let others: Vec<(String, String)> = s.labels.iter().filter(|(n, _)| n != "le").cloned().collect();
        let key = (s.family.clone(), others);
        if s.name.ends_with("_bucket") {
            let le = s.label("le").ok_or_else(|| format!("{} without le", s.name))?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().map_err(|_| format!("bad le {le:?}"))? };
            buckets.entry(key).or_default().push((le, s.value));
        } else if s.name.ends_with("_count") {
            counts.insert(key, s.value);
        }
    }
    for (key, series) in &buckets {
        let ordered = series.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1);
        let last = series.last().copied().unwrap_or((0.0, 0.0));
        if !ordered || last.0 != f64::INFINITY {
            return Err(format!("histogram {key:?}: buckets not cumulative or no +Inf bucket"));
        }
        if counts.get(key) != Some(&last.1) {
            return Err(format!("histogram {key:?}: +Inf bucket {} != _count {:?}", last.1, counts.get(key)));
        }
    }
    Ok(())
}
