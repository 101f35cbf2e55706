//! The deployment files against the real binaries and loaders: every command line in
//! docker-compose.yml parses with the binary it runs, every environment variable it sets is
//! one that binary reads, the Dockerfile builds every binary compose runs (through
//! scripts/release-build), and the example
//! configurations load with the real configuration loaders.

use countersign_worker::config::WorkerSettings;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use yaml_rust2::{Yaml, YamlLoader};

use crate::workspace::{binary, repo};

/// Runs the binary with `args` followed by `--help`: clap parses (and checks) every argument
/// before it, so this fails on an unknown flag, a bad value or a missing subcommand.
fn parse_then_help(name: &str, args: &[String]) -> String {
    let output = Command::new(binary(name))
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success() && stdout.contains("Usage:"),
        "{name} {args:?} is refused:\n{}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn compose() -> Yaml {
    let text = std::fs::read_to_string(repo().join("docker-compose.yml")).unwrap();
    YamlLoader::load_from_str(&text).unwrap().remove(0)
}

/// A service as compose reads it: the mapping its merge key names (`<<: *anchor`) fills in
/// what the service does not set itself.
fn merged(service: &Yaml) -> Yaml {
    let Some(own) = service.as_hash() else {
        return service.clone();
    };
    let merge_key = Yaml::String("<<".into());
    let mut result = match own.get(&merge_key).map(merged) {
        Some(Yaml::Hash(base)) => base,
        _ => yaml_rust2::yaml::Hash::new(),
    };
    for (key, value) in own.iter().filter(|(key, _)| **key != merge_key) {
        result.insert(key.clone(), value.clone());
    }
    Yaml::Hash(result)
}

fn strings(list: &Yaml) -> Vec<String> {
    list.as_vec()
        .unwrap_or_else(|| panic!("expected a list, got {list:?}"))
        .iter()
        .map(|item| match item {
            Yaml::String(s) => s.clone(),
            Yaml::Integer(i) => i.to_string(),
            other => panic!("unexpected item {other:?}"),
        })
        .collect()
}

/// `value` with a leading `${NAME:-default}` replaced by its default, as compose does when
/// NAME is unset.
fn default_of(value: &str) -> String {
    match value
        .strip_prefix("${")
        .and_then(|rest| rest.split_once(":-"))
    {
        Some((_, rest)) => {
            let (default, after) = rest.split_once('}').unwrap();
            format!("{default}{after}")
        }
        None => value.to_string(),
    }
}

/// The host file mounted at `target` in a service, from its `volumes`.
fn mounted_file(service: &Yaml, target: &str) -> Option<PathBuf> {
    strings(&service["volumes"]).into_iter().find_map(|volume| {
        let host = default_of(&volume);
        let (host, rest) = host.split_once(':')?;
        rest.starts_with(target)
            .then(|| repo().join(host.trim_start_matches("./")))
    })
}

fn example(name: &str) -> PathBuf {
    repo().join("config").join(name)
}

#[test]
fn compose_command_lines_and_environment_are_accepted_by_the_binaries() {
    let compose = compose();
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    // The image's binaries are those of the release archive: the Dockerfile builds them with
    // scripts/release-build, whose `binaries=(…)` lists them.
    assert!(
        dockerfile.contains("scripts/release-build"),
        "the Dockerfile does not build with scripts/release-build"
    );
    let release_build = std::fs::read_to_string(repo().join("scripts/release-build")).unwrap();
    let archived: Vec<&str> = release_build
        .split_once("\nbinaries=(")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(list, _)| list.split_whitespace().collect())
        .expect("scripts/release-build lists its binaries=(…)");
    let services = compose["services"].as_hash().unwrap();
    assert!(services.len() >= 3, "server and both workers");
    for (name, service) in services {
        let name = name.as_str().unwrap();
        let service = &merged(service);
        if service["command"].is_badvalue() {
            // A published image (PostgreSQL) with its own entry point: nothing of ours runs.
            assert!(
                service["build"].is_badvalue(),
                "service {name} builds this project's image but names no command"
            );
            continue;
        }
        let command = strings(&service["command"]);
        let program = command[0].clone();
        assert!(
            archived.contains(&program.as_str()),
            "the Dockerfile (scripts/release-build) does not build {program} (service {name})"
        );
        let help = parse_then_help(&program, &command[1..]);

        // Every variable is one the binary documents in its help, or (server) one its
        // configuration file names as a token's `value_env`.
        let value_envs: Vec<String> =
            match mounted_file(service, "/etc/countersign/countersign.toml") {
                Some(config) => {
                    let config = countersign_server::config::Config::load(&config).unwrap();
                    config
                        .tokens
                        .iter()
                        .filter_map(|t| t.value_env.clone())
                        .collect()
                }
                None => Vec::new(),
            };
        let environment = service["environment"].as_hash().unwrap();
        for variable in environment.keys() {
            let variable = variable.as_str().unwrap();
            assert!(
                help.contains(variable) || value_envs.iter().any(|v| v == variable),
                "service {name}: {program} does not read {variable}"
            );
        }
        for variable in &value_envs {
            assert!(
                environment.contains_key(&Yaml::String(variable.clone())),
                "service {name}: the config needs {variable}, compose does not set it"
            );
        }

        if !service["healthcheck"]["test"].is_badvalue() {
            let test = strings(&service["healthcheck"]["test"]);
            assert_eq!(test[0], "CMD");
            parse_then_help(&test[1], &test[2..]);
        }
    }
    // The server's health check is the image's (the workers' services turn it off).
    let healthcheck: Vec<String> = dockerfile
        .split_once("\nHEALTHCHECK ")
        .and_then(|(_, rest)| rest.split_once("CMD "))
        .and_then(|(_, command)| command.lines().next())
        .and_then(|line| serde_json::from_str(line).ok())
        .expect("the Dockerfile has a HEALTHCHECK … CMD [\"…\"] line");
    parse_then_help(&healthcheck[0], &healthcheck[1..]);
}

#[test]
fn compose_mounts_the_example_configurations() {
    let compose = compose();
    for (service, target, file) in [
        (
            "server",
            "/etc/countersign/countersign.toml",
            "countersign.example.toml",
        ),
        (
            "telegram",
            "/etc/countersign/telegram.toml",
            "telegram.example.toml",
        ),
        (
            "github",
            "/etc/countersign/github.toml",
            "github.example.toml",
        ),
        (
            "webhook",
            "/etc/countersign/webhook.toml",
            "webhook.example.toml",
        ),
    ] {
        let mounted = mounted_file(&compose["services"][service], target)
            .unwrap_or_else(|| panic!("{service} mounts no {target}"));
        assert_eq!(
            mounted.canonicalize().unwrap(),
            example(file).canonicalize().unwrap()
        );
        let command = strings(&compose["services"][service]["command"]);
        assert!(
            command.iter().any(|arg| arg == target),
            "{service}: {command:?}"
        );
    }
}

#[test]
fn the_server_example_loads_and_resolves_its_tokens() {
    let config = countersign_server::config::Config::load(&example("countersign.example.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    config.validate().unwrap_or_else(|e| panic!("{e}"));
    // Every option is written out, so the example cannot drift from the defaults unnoticed.
    assert!(config.metrics.listen.is_some());
    assert!(!config.tokens.is_empty() && !config.rules.is_empty() && !config.approvers.is_empty());
    let secrets: HashMap<String, String> = config
        .tokens
        .iter()
        .filter_map(|t| t.value_env.clone())
        .map(|name| {
            (
                name.clone(),
                format!("{name}-a-long-random-test-token-value"),
            )
        })
        .collect();
    countersign_server::auth::Tokens::from_config(&config.tokens, |name| {
        secrets.get(name).cloned()
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_telegram_example_loads() {
    let text = std::fs::read_to_string(example("telegram.example.toml")).unwrap();
    let file: countersign_telegram::config::FileConfig = toml::from_str(&text).unwrap();
    let settings = countersign_telegram::Settings::from_file(file, |name| match name {
        countersign_telegram::config::WORKER_TOKEN_ENV => Some("worker-token".into()),
        countersign_telegram::config::BOT_TOKEN_ENV => Some("123456:bot-token".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(settings.runtime.server.client.url, "http://server:50051");
    assert!(settings.default_chat_id.is_some());
}

#[test]
fn the_github_example_loads() {
    let text = std::fs::read_to_string(example("github.example.toml")).unwrap();
    let file: countersign_github::config::FileConfig = toml::from_str(&text).unwrap();
    let config =
        countersign_github::Settings::from_file(file, |name| Some(format!("secret-for-{name}")))
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.runtime.server.client.url, "http://server:50051");
    assert!(config.webhook.is_some() && config.polling.is_some());
}

#[test]
fn the_webhook_example_loads() {
    let text = std::fs::read_to_string(example("webhook.example.toml")).unwrap();
    let file: countersign_webhook::config::FileConfig = toml::from_str(&text).unwrap();
    let settings = countersign_webhook::Settings::from_file(file, |name| {
        (name == "COUNTERSIGN_WEBHOOK_SECRET_OPS")
            .then(|| "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD".to_owned())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(settings.runtime.server.client.url, "http://server:50051");
    assert_eq!(settings.endpoint("ops").unwrap().approver, "alice");
}
