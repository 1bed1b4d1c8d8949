//! Where `weir server`'s settings come from, seen from outside: a `WEIR_*` variable that names no
//! setting is warned about at start-up, and a bad value says whether it came from a flag, the
//! environment or the config file. Every broker here stops at start-up (a bad value, or a busy
//! port right after the settings are read), so nothing waits for anything.

mod admin_support;
mod support;

use admin_support::{run_weir, scratch_path as path, start_on_a_busy_port};

/// `weir server ARGS` with `env`, which must stop at start-up; returns its stderr.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let scratch = tempfile::Builder::new().prefix("weir-settings-").tempdir().expect("scratch dir");
    let data_dir = scratch.path().join("data");
    let mut all =
        vec!["server", "--set", "admin.listeners=", "--set", "rocketmq.listeners=", "--data-dir", path(&data_dir)];
    all.extend_from_slice(args);
    let output = run_weir(&all, "", env);
    assert_eq!(output.code, Some(1), "{output:?}");
    assert!(!data_dir.exists(), "a refused setting must stop the broker before it opens its data directory");
    output.stderr
}

#[test]
fn a_misspelt_weir_variable_is_named_at_start_up_with_the_setting_it_resembles() {
    let output = start_on_a_busy_port(&[
        ("WEIR_NUM_PARTITONS", "3"),
        // The project's own variables are no settings and no mistakes.
        ("WEIR_BIN", "/opt/weir/bin/weir"),
        ("WEIR_TEST_THREADS", "2"),
    ]);
    let warnings: Vec<&str> = output.stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "{}", output.stderr);
    assert!(
        warnings[0].ends_with(
            "ignoring the environment variable WEIR_NUM_PARTITONS: no setting is named `num.partitons`; \
             did you mean WEIR_NUM_PARTITIONS (`num.partitions`)?"
        ),
        "{}",
        warnings[0]
    );
}

#[test]
fn a_bad_value_says_whether_it_came_from_a_flag_the_environment_or_the_config_file() {
    let invalid = "invalid value \"zero\" for `num.partitions`: expected a number";
    let stderr = refused(&["--set", "num.partitions=zero"], &[]);
    assert!(stderr.contains(&format!("{invalid}; set by --set on the command line")), "{stderr}");

    let stderr = refused(&[], &[("WEIR_NUM_PARTITIONS", "zero")]);
    assert!(stderr.contains(&format!("{invalid}; set by the environment variable WEIR_NUM_PARTITIONS")), "{stderr}");

    let scratch = tempfile::Builder::new().prefix("weir-settings-").tempdir().expect("scratch dir");
    let file = scratch.path().join("weir.toml");
    std::fs::write(&file, "num.partitions = \"zero\"\n").expect("write the config file");
    let stderr = refused(&["--config", path(&file)], &[]);
    assert!(stderr.contains(&format!("{invalid}; set in the config file {}", file.display())), "{stderr}");
    // The file's path from WEIR_CONFIG rather than --config: the same file is named.
    let stderr = refused(&[], &[("WEIR_CONFIG", path(&file))]);
    assert!(stderr.contains(&format!("{invalid}; set in the config file {}", file.display())), "{stderr}");

    // The command line wins over the environment, and the message names what was used.
    let stderr = refused(&["--set", "num.partitions=zero"], &[("WEIR_NUM_PARTITIONS", "two")]);
    assert!(stderr.contains("set by --set on the command line"), "{stderr}");

    // Flags that clap also reads from the environment: which of the two it was.
    let bad_listener = "invalid value \"nowhere\" for `listeners`";
    let stderr = refused(&["--listen", "nowhere"], &[]);
    assert!(stderr.contains(bad_listener) && stderr.contains("; set by --listen on the command line"), "{stderr}");
    let stderr = refused(&[], &[("WEIR_LISTEN", "nowhere")]);
    assert!(
        stderr.contains(bad_listener) && stderr.contains("; set by the environment variable WEIR_LISTEN"),
        "{stderr}"
    );

    // An alias in the environment is a setting too (it used to be ignored in silence).
    let stderr = refused(&[], &[("WEIR_LOG_RETENTION_HOURS", "soon")]);
    assert!(stderr.contains("`log.retention.hours`"), "{stderr}");
    assert!(stderr.contains("set by the environment variable WEIR_LOG_RETENTION_HOURS"), "{stderr}");

    // An unknown name in the file says where it is.
    std::fs::write(&file, "log.retention.mss = 1000\n").expect("write the config file");
    let stderr = refused(&["--config", path(&file)], &[]);
    assert!(stderr.contains("unknown setting `log.retention.mss`"), "{stderr}");
    assert!(stderr.contains(&format!("set in the config file {}", file.display())), "{stderr}");
}

#[test]
fn an_unknown_setting_on_the_command_line_or_in_the_file_names_the_one_meant() {
    let stderr = refused(&["--set", "log.retenton.ms=1000"], &[]);
    assert!(
        stderr.contains(
            "unknown setting `log.retenton.ms` (did you mean `log.retention.ms`?); set by --set on the command line"
        ),
        "{stderr}"
    );
    // A topic config's name, where its broker-wide default is the setting.
    let stderr = refused(&["--set", "retention.ms=1000"], &[]);
    assert!(stderr.contains("did you mean its broker-wide default `log.retention.ms`?"), "{stderr}");
    let scratch = tempfile::Builder::new().prefix("weir-settings-").tempdir().expect("scratch dir");
    let file = scratch.path().join("weir.toml");
    std::fs::write(&file, "[group.initial.rebalance]\ndelay.mss = 0\n").expect("write the config file");
    let stderr = refused(&["--config", path(&file)], &[]);
    assert!(stderr.contains("(did you mean `group.initial.rebalance.delay.ms`?)"), "{stderr}");
    // Nothing close: where the list is.
    let stderr = refused(&["--set", "zzzz=1"], &[]);
    assert!(stderr.contains("unknown setting `zzzz` (see weir.example.toml"), "{stderr}");
}
