//! Where `weir server`'s settings come from, in increasing priority: built-in defaults, the TOML
//! file (`--config`), `WEIR_*` environment variables named after a setting
//! (`WEIR_LOG_RETENTION_MS` for `log.retention.ms`), and the command line (`--listen`,
//! `--data-dir`, `--set`).
//!
//! Each value keeps its [`Origin`], so an unknown name or a bad value is reported with the place
//! to fix it. A `WEIR_*` variable that names no setting is not an error (other programs may use
//! the prefix) but a warning at start-up, with the closest setting name when one is close;
//! the variables the project itself uses for other things are listed in [`NOT_SETTINGS`] and
//! never warned about.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::ArgMatches;
use weir_broker::config::{setting_names, ALIASES, TOPIC_DEFAULT_SETTINGS};
use weir_broker::BrokerConfig;

use crate::cli::ServerArgs;

/// The prefix of the environment variables that are settings.
const ENV_PREFIX: &str = "WEIR_";

/// `WEIR_*` variables that are not settings: no warning names them. A test checks that every
/// `WEIR_*` name in the project's files is either a setting or listed here.
pub const NOT_SETTINGS: &[&str] = &[
    // `weir server --config`, `--listen`, `--data-dir` (clap reads them).
    "WEIR_CONFIG",
    "WEIR_LISTEN",
    "WEIR_DATA_DIR",
    // The client commands' `--admin` and `--bootstrap`.
    "WEIR_ADMIN",
    "WEIR_BOOTSTRAP",
    // `weir user create --password`.
    "WEIR_USER_PASSWORD",
    // The client commands' admin API credentials (`--admin-user`, `--admin-password`).
    "WEIR_ADMIN_USER",
    "WEIR_ADMIN_PASSWORD",
    "WEIR_ADMIN_CA",
    // scripts/test and the Python client tests (tests/python/conftest.py).
    "WEIR_TEST_THREADS",
    "WEIR_BIN",
    "WEIR_KEEP_DATA",
    // tests/python/test_rocketmq_rust.py: where the built RocketMQ Rust client is.
    "WEIR_ROCKETMQ_RUST_CLIENT",
    // crates/weir-storage/tests/crash.rs and the child processes it starts.
    "WEIR_CRASH_TEST_SEED",
    "WEIR_CRASH_CHILD_DIR",
    "WEIR_CRASH_SEED",
    "WEIR_CRASH_ITERATION",
    "WEIR_CRASH_RECOVERY_POINT",
    // tests/python/test_replication.py's fault test: its round count (the long run) and seed.
    "WEIR_FAULT_ROUNDS",
    "WEIR_FAULT_SEED",
    // tests/python/test_failover.py: its rounds of kills (the long run).
    "WEIR_FAILOVER_ROUNDS",
    // The broker's process id in docs/performance.md's commands.
    "WEIR_PID",
];

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    File(PathBuf),
    /// The name of the environment variable.
    Env(String),
    /// A flag of `weir server` (`--set`, `--listen`, `--data-dir`).
    Flag(&'static str),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(path) => write!(f, "set in the config file {}", path.display()),
            Origin::Env(variable) => write!(f, "set by the environment variable {variable}"),
            Origin::Flag(flag) => write!(f, "set by {flag} on the command line"),
        }
    }
}

/// The settings of `weir server`, from its file, environment and command line. `matches` are
/// the server subcommand's, to tell a flag from its environment variable (`--listen` or
/// `WEIR_LISTEN`); without them a value counts as the flag's.
pub fn load_config(args: &ServerArgs, matches: Option<&ArgMatches>) -> anyhow::Result<BrokerConfig> {
    let mut given: BTreeMap<String, (String, Origin)> = BTreeMap::new();
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).with_context(|| {
            let origin = flag_origin(matches, "config", "--config", "WEIR_CONFIG");
            format!("cannot read config file {} ({origin})", path.display())
        })?;
        for (name, value) in BrokerConfig::settings_from_toml(&text, &path.display().to_string())? {
            given.insert(name, (value, Origin::File(path.clone())));
        }
    }
    let from_env = env_settings(std::env::vars_os())?;
    for warning in &from_env.warnings {
        tracing::warn!("{warning}");
    }
    for (name, value, variable) in from_env.settings {
        given.insert(name, (value, Origin::Env(variable)));
    }
    if let Some(listen) = &args.listen {
        given.insert("listeners".into(), (listen.clone(), flag_origin(matches, "listen", "--listen", "WEIR_LISTEN")));
    }
    if let Some(dir) = &args.data_dir {
        let origin = flag_origin(matches, "data_dir", "--data-dir", "WEIR_DATA_DIR");
        given.insert("log.dirs".into(), (dir.display().to_string(), origin));
    }
    for (name, value) in &args.settings {
        given.insert(name.clone(), (value.clone(), Origin::Flag("--set")));
    }
    let settings = given.iter().map(|(name, (value, _))| (name.clone(), value.clone())).collect();
    BrokerConfig::from_settings(&settings).map_err(|e| match e.setting().and_then(|name| origin_of(&given, name)) {
        Some(origin) => anyhow::anyhow!("{e}; {origin}"),
        None => e.into(),
    })
}

/// Where the value of `name` came from; for a setting given through an alias
/// (`log.retention.hours` for `log.retention.ms`), the alias's origin.
fn origin_of<'a>(given: &'a BTreeMap<String, (String, Origin)>, name: &str) -> Option<&'a Origin> {
    given.get(name).map(|(_, origin)| origin).or_else(|| {
        ALIASES
            .iter()
            .filter(|(_, canonical, _)| *canonical == name)
            .find_map(|(alias, _, _)| given.get(*alias))
            .map(|(_, origin)| origin)
    })
}

/// A flag's origin: the flag, or its environment variable when clap took the value from there.
fn flag_origin(matches: Option<&ArgMatches>, id: &str, flag: &'static str, variable: &str) -> Origin {
    match matches.and_then(|m| m.value_source(id)) {
        Some(ValueSource::EnvVariable) => Origin::Env(variable.to_string()),
        _ => Origin::Flag(flag),
    }
}

/// The settings found in the environment, and a warning for each `WEIR_*` variable that is
/// none.
#[derive(Debug, Default)]
struct EnvSettings {
    /// (setting name, value, variable name).
    settings: Vec<(String, String, String)>,
    warnings: Vec<String>,
}

fn env_settings(vars: impl IntoIterator<Item = (OsString, OsString)>) -> anyhow::Result<EnvSettings> {
    let names: Vec<&str> = setting_names().collect();
    let mut found = EnvSettings::default();
    for (variable, value) in vars {
        // A name that is not UTF-8 is no setting's, nor one of ours.
        let Some(variable) = variable.to_str() else { continue };
        let Some(rest) = variable.strip_prefix(ENV_PREFIX) else { continue };
        if NOT_SETTINGS.contains(&variable) {
            continue;
        }
        let name = rest.to_ascii_lowercase().replace('_', ".");
        if names.contains(&name.as_str()) {
            let value = value.into_string().map_err(|value| {
                anyhow::anyhow!("the environment variable {variable} is not valid UTF-8: {value:?}")
            })?;
            found.settings.push((name, value, variable.to_string()));
        } else {
            found.warnings.push(unknown_variable_warning(variable, &name, &names));
        }
    }
    Ok(found)
}

/// The environment variable of a setting: `log.retention.ms` → `WEIR_LOG_RETENTION_MS`.
fn variable_of(setting: &str) -> String {
    format!("{ENV_PREFIX}{}", setting.to_ascii_uppercase().replace('.', "_"))
}

fn unknown_variable_warning(variable: &str, name: &str, names: &[&str]) -> String {
    let ignored = format!("ignoring the environment variable {variable}: no setting is named `{name}`");
    // The name of a topic config: its broker-wide default is the setting.
    if let Some((broker_name, _, _)) = TOPIC_DEFAULT_SETTINGS.iter().find(|(_, topic_name, _)| *topic_name == name) {
        return format!(
            "{ignored}; `{name}` is a topic config, and its broker-wide default is `{broker_name}`: did you mean {}?",
            variable_of(broker_name)
        );
    }
    match weir_broker::error::closest_name(name, names.iter().copied()) {
        Some(setting) => format!("{ignored}; did you mean {} (`{setting}`)?", variable_of(setting)),
        None => format!("{ignored} (weir.example.toml lists the settings)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect()
    }

    #[test]
    fn weir_variables_named_after_settings_and_aliases_are_settings() {
        let found = env_settings(vars(&[
            ("WEIR_LOG_RETENTION_MS", "1000"),
            ("WEIR_LOG_RETENTION_HOURS", "2"),
            ("WEIR_NUM_PARTITIONS", "3"),
            ("PATH", "/bin"),
        ]))
        .expect("valid environment");
        assert_eq!(
            found.settings,
            [
                ("log.retention.ms".into(), "1000".into(), "WEIR_LOG_RETENTION_MS".into()),
                ("log.retention.hours".into(), "2".into(), "WEIR_LOG_RETENTION_HOURS".into()),
                ("num.partitions".into(), "3".into(), "WEIR_NUM_PARTITIONS".into()),
            ]
        );
        assert!(found.warnings.is_empty(), "{:?}", found.warnings);
    }

    #[test]
    fn a_misspelt_variable_is_warned_about_with_the_setting_it_resembles() {
        let found = env_settings(vars(&[
            ("WEIR_LOG_RETENSION_MS", "1000"),
            ("WEIR_RETENTION_MS", "1000"),
            ("WEIR_FROBNICATE", "yes"),
        ]))
        .expect("valid environment");
        assert!(found.settings.is_empty());
        assert_eq!(
            found.warnings,
            [
                "ignoring the environment variable WEIR_LOG_RETENSION_MS: no setting is named `log.retension.ms`; \
                 did you mean WEIR_LOG_RETENTION_MS (`log.retention.ms`)?",
                "ignoring the environment variable WEIR_RETENTION_MS: no setting is named `retention.ms`; \
                 `retention.ms` is a topic config, and its broker-wide default is `log.retention.ms`: \
                 did you mean WEIR_LOG_RETENTION_MS?",
                "ignoring the environment variable WEIR_FROBNICATE: no setting is named `frobnicate` \
                 (weir.example.toml lists the settings)",
            ]
        );
    }

    #[test]
    fn the_projects_own_weir_variables_are_not_warned_about() {
        let found = env_settings(NOT_SETTINGS.iter().map(|v| (OsString::from(v), OsString::from("1")))).expect("valid");
        assert!(found.settings.is_empty() && found.warnings.is_empty(), "{found:?}");
    }

    #[test]
    fn a_setting_whose_value_is_not_utf8_is_an_error_naming_the_variable() {
        use std::os::unix::ffi::OsStringExt;
        let value = OsString::from_vec(vec![0xff, b'1']);
        let error = env_settings([(OsString::from("WEIR_NUM_PARTITIONS"), value)]).unwrap_err().to_string();
        assert!(error.contains("WEIR_NUM_PARTITIONS is not valid UTF-8"), "{error}");
    }

    /// Every `WEIR_*` name written in the project's scripts, tests and docs is a setting or in
    /// [`NOT_SETTINGS`]: a new variable of a script must be added there, or every broker started
    /// next to it warns.
    #[test]
    fn every_weir_variable_the_project_uses_is_a_setting_or_listed() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = vec![root.join("README.md"), root.join("scripts/test"), root.join(".ci/run")];
        let mut dirs = vec![root.join("crates"), root.join("docs"), root.join("scripts"), root.join("tests")];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                let file_name = entry.file_name().to_string_lossy().into_owned();
                if path.is_dir() && !file_name.starts_with('.') && file_name != "target" {
                    dirs.push(path);
                } else if [".rs", ".py", ".md", ".sh", ".toml"].iter().any(|ext| file_name.ends_with(ext)) {
                    files.push(path);
                }
            }
        }
        // The wrong names that tests of the warnings use on purpose.
        let misspelt_on_purpose =
            ["WEIR_LOG_RETENSION_MS", "WEIR_RETENTION_MS", "WEIR_FROBNICATE", "WEIR_NUM_PARTITONS"];
        let names: Vec<&str> = setting_names().collect();
        let mut unlisted = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for file in &files {
            let Ok(text) = std::fs::read_to_string(file) else { continue };
            for (at, _) in text.match_indices(ENV_PREFIX) {
                let tail = &text[at + ENV_PREFIX.len()..];
                let end = tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'));
                let rest = &tail[..end.unwrap_or(tail.len())];
                let variable = format!("{ENV_PREFIX}{rest}");
                let name = rest.to_ascii_lowercase().replace('_', ".");
                seen.insert(variable.clone());
                // `WEIR_*` and the like are the prefix, not a variable.
                let known = names.contains(&name.as_str()) || NOT_SETTINGS.contains(&variable.as_str());
                if rest.is_empty() || known || misspelt_on_purpose.contains(&variable.as_str()) {
                    continue;
                }
                unlisted.push(format!("{variable} in {}", file.display()));
            }
        }
        // The scan reached the Python tests and the storage crash test: it is not vacuous.
        assert!(
            seen.contains("WEIR_BIN") && seen.contains("WEIR_CRASH_SEED"),
            "scanned {} files: {seen:?}",
            files.len()
        );
        assert!(unlisted.is_empty(), "add these to NOT_SETTINGS (or make them settings): {unlisted:#?}");
    }
}
