//! The `countersign-telegram` binary: `--help`, and a run from a configuration file.

use crate::common::{alice, Harness, BOT_TOKEN, CHAT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_from_a_config_file_with_the_token_from_the_environment() {
    let harness = Harness::without_worker().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("telegram.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nurl = \"{}\"\n[telegram]\napi_url = \"{}\"\ndefault_chat_id = {}\nallowed_user_ids = [{}]\nbuttons = [\"approve\", \"reject\"]\npoll_timeout_secs = 5\nstate_dir = \"{}\"\n",
            harness.server.url(),
            harness.telegram.api_url(),
            CHAT,
            alice().id,
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_countersign-telegram"))
        .arg("--config")
        .arg(&config)
        .env("TELEGRAM_BOT_TOKEN", BOT_TOKEN)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let approval = harness.request("call-1", "{}").await;
    let message = harness.request_message(0).await;
    assert!(message.callback_data()[0].contains(&approval.id));
    assert_eq!(message.button_texts(), vec!["✅ Approve", "❌ Reject"]);
    child.kill().await.unwrap();
}

#[test]
fn the_binary_has_help() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_countersign-telegram"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("--config"), "{help}");
    assert!(help.contains("TELEGRAM_BOT_TOKEN"), "{help}");
    assert!(help.contains("COUNTERSIGN_WORKER_TOKEN"), "{help}");
}
