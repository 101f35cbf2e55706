//! `countersign setup discord` through the real binary against the fake Discord (REST and
//! Gateway): the bot token typed at the prompt, the pairing code sent to the bot in a direct
//! message, what it writes (and what not, on a refusal), then `countersign up` asking in that
//! conversation and a tap deciding.

use crate::support;

use std::process::Stdio;

use countersign_testkit::discord::{DiscordUser, FakeDiscord};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout};

use support::home::{hook_answer, installed_hook, spawn_hook, terminate, text, Home};
use support::STEP;

const TOKEN: &str = "discord-setup-bot-token";
const ALICE_ID: &str = "1400000000000000001";

fn setup_command(home: &Home, discord: &FakeDiscord, args: &[&str]) -> tokio::process::Command {
    let mut all = vec!["setup", "discord"];
    all.extend_from_slice(args);
    let mut command = home.countersign(&all);
    command
        .env("DISCORD_API_URL", discord.api_url())
        .env("DISCORD_GATEWAY_URL", discord.gateway_url())
        .env_remove("DISCORD_BOT_TOKEN")
        .stdin(Stdio::piped());
    command
}

/// Starts `setup discord`, types `token`, and reads the pairing code it shows.
async fn start(
    home: &Home,
    discord: &FakeDiscord,
    token: &str,
) -> (Child, BufReader<ChildStdout>, String) {
    let mut child = setup_command(home, discord, &[]).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(format!("{token}\n").as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let code = tokio::time::timeout(STEP, async {
        loop {
            let mut line = String::new();
            assert_ne!(
                stdout.read_line(&mut line).await.unwrap(),
                0,
                "setup ended without a code"
            );
            if let Some(code) = line.strip_prefix("    ") {
                return code.trim().to_owned();
            }
        }
    })
    .await
    .expect("no pairing code shown");
    (child, stdout, code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_discord_pairs_by_a_direct_message_then_up_asks_there_and_a_tap_decides() {
    let discord = FakeDiscord::start(TOKEN).await;
    let home = Home::new("http://127.0.0.1:9");
    let (mut child, mut stdout, code) = start(&home, &discord, TOKEN).await;
    discord
        .wait_for("the setup's Gateway session", |d| {
            d.connected().then_some(())
        })
        .await;
    let alice = DiscordUser::new(ALICE_ID, "alice");
    let dm = discord.dm_channel_of(ALICE_ID);
    // A wrong code pairs nothing and is answered.
    discord.direct_message(&alice, "NOTTHECODE");
    discord
        .wait_for("the refusal", |d| {
            d.messages(&dm)
                .into_iter()
                .find(|m| m.content.contains("not the pairing code"))
        })
        .await;
    discord.direct_message(&alice, &code.to_lowercase());
    let status = tokio::time::timeout(STEP, child.wait())
        .await
        .unwrap()
        .unwrap();
    let mut shown = String::new();
    stdout.read_to_string(&mut shown).await.unwrap();
    assert_eq!(status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("Paired alice as approver discord:1400000000000000001"),
        "{shown}"
    );
    assert!(!shown.contains(TOKEN), "{shown}");
    let confirmed = discord
        .messages(&dm)
        .into_iter()
        .any(|m| m.content.starts_with("Paired:"));
    assert!(confirmed, "{:?}", discord.messages(&dm));

    let config = std::fs::read_to_string(home.config_file()).unwrap();
    assert!(!config.contains(TOKEN), "{config}");
    let parsed: toml::Table = toml::from_str(&config).unwrap();
    assert_eq!(
        parsed["discord"]["default_channel"].as_str(),
        Some(dm.as_str())
    );
    assert_eq!(parsed["discord"]["channels"][0].as_str(), Some(dm.as_str()));
    assert_eq!(
        parsed["discord"]["gateway_url"].as_str(),
        Some(discord.gateway_url().as_str())
    );
    let approver = &parsed["approvers"].as_array().unwrap()[0];
    assert_eq!(
        approver["identities"]["discord"][0].as_str(),
        Some(ALICE_ID)
    );
    let secret = home.data().join("secrets/discord-bot-token");
    assert_eq!(std::fs::read_to_string(&secret).unwrap().trim(), TOKEN);

    let doctor = text(&home.run(&["doctor"]).await);
    assert!(
        doctor.contains(&format!("ok    Discord: approvals go to channel {dm}")),
        "{doctor}"
    );

    let mut up = home.up().await;
    assert!(
        home.up_log().contains("the Discord worker posts approvals"),
        "{}",
        home.up_log()
    );
    let installed = home.run(&["install", "claude-code"]).await;
    assert!(installed.status.success(), "{}", text(&installed));
    let hook = spawn_hook(
        &home,
        &installed_hook(&home),
        "toolu_setup_discord",
        "git push",
    );
    let asked = discord
        .wait_for("the request in the conversation", |d| {
            d.messages(&dm).into_iter().find(|m| m.buttons().len() == 3)
        })
        .await;
    discord
        .wait_for("up's Gateway session", |d| {
            (d.identifies() == 2 && d.connected()).then_some(())
        })
        .await;
    discord.tap(&alice, &asked, &asked.button("approve"));
    let answer = hook_answer(hook).await;
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "allow",
        "{answer}"
    );
    terminate(&home, &mut up).await;
    assert!(!home.up_log().contains(TOKEN));
}

/// A refused token and a code nobody sends in time: refused with the reason, and the config
/// file and the stored token stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_discord_refuses_and_changes_nothing() {
    let discord = FakeDiscord::start(TOKEN).await;
    let home = Home::new("http://127.0.0.1:9");
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    let before = "# mine\nlisten = \"127.0.0.1:50999\"\n";
    std::fs::write(home.config_file(), before).unwrap();
    let cases: [(&[&str], &str, &str); 2] = [
        (&[], "wrong-token", "Discord refused the bot token"),
        (&["--code-ttl", "1s"], TOKEN, "the pairing code expired"),
    ];
    for (args, token, expected) in cases {
        let mut command = setup_command(&home, &discord, args);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(format!("{token}\n").as_bytes())
            .await
            .unwrap();
        drop(stdin);
        let output = tokio::time::timeout(STEP, child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let shown = text(&output);
        assert_ne!(output.status.code(), Some(0), "{expected}: {shown}");
        assert!(shown.contains(expected), "{expected:?} missing: {shown}");
        assert!(!shown.contains(TOKEN), "{shown}");
        assert_eq!(std::fs::read_to_string(home.config_file()).unwrap(), before);
        assert!(!home.data().join("secrets/discord-bot-token").exists());
    }
}
