//! `countersign setup github` and `countersign setup web` through the real binary with real
//! stdin, from an empty home: what they check, what they write (and what not, on a mistake),
//! and that `countersign up` then asks and decides through what they set up.

use crate::support;

use std::path::Path;

use countersign_testkit::github::{FakeGitHub, PermissionShape, Role, UserKind, DEFAULT_TOKEN};
use support::github::GitHubRepo;
use tokio::process::Command;

use support::home::{hook_answer, installed_hook, spawn_hook, terminate, text, Home};
use support::{run_with_input, STEP};

fn setup_github(home: &Home, github: &FakeGitHub, args: &[&str]) -> Command {
    let mut all = vec!["setup", "github"];
    all.extend_from_slice(args);
    let mut command = home.countersign(&all);
    command.env("GITHUB_API_URL", github.url());
    command
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Typed at the prompts: the token, the repository, the issue, the approver's login. Then
/// `up` posts a hook's request on the issue and the approver's `/approve` comment decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_github_checks_what_it_is_given_then_up_asks_on_the_issue() {
    let repo = GitHubRepo::start().await;
    let (github, issue) = (&repo.fake, repo.issue);
    let home = Home::new("http://127.0.0.1:9");

    let typed = format!("{DEFAULT_TOKEN}\nAcme/Widgets\n{issue}\nalice\n");
    let output = run_with_input(setup_github(&home, github, &[]), typed.as_bytes()).await;
    let shown = text(&output);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains(&format!(
            "countersign asks on acme/widgets#{issue}, commenting as countersign-bot"
        )),
        "{shown}"
    );
    assert!(
        shown.contains("alice approves there with /approve"),
        "{shown}"
    );
    assert!(shown.contains("Next: countersign up"), "{shown}");
    assert!(!shown.contains(DEFAULT_TOKEN), "{shown}");

    let config = std::fs::read_to_string(home.config_file()).unwrap();
    assert!(!config.contains(DEFAULT_TOKEN), "{config}");
    let parsed: toml::Table = toml::from_str(&config).unwrap();
    assert_eq!(
        parsed["github"]["bot_login"].as_str(),
        Some("countersign-bot")
    );
    assert_eq!(
        parsed["github"]["default_target"].as_str(),
        Some(format!("acme/widgets#{issue}").as_str())
    );
    assert_eq!(
        parsed["github"]["api_url"].as_str(),
        Some(github.url().as_str())
    );
    assert!(
        parsed["github"]["polling"]["interval_ms"].is_integer(),
        "{config}"
    );
    let approver = &parsed["approvers"].as_array().unwrap()[0];
    assert_eq!(approver["id"].as_str(), Some("github:alice"));
    assert_eq!(approver["identities"]["github"][0].as_str(), Some("alice"));
    let secret = home.data().join("secrets/github-token");
    assert_eq!(mode(&secret), 0o600);
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap().trim(),
        DEFAULT_TOKEN
    );

    // Run again with nothing typed but the token: the configured target is offered and kept;
    // alice is not registered twice.
    let typed = format!("{DEFAULT_TOKEN}\n\n\n");
    let again = run_with_input(
        setup_github(&home, github, &["--approver", "alice"]),
        typed.as_bytes(),
    )
    .await;
    let shown = text(&again);
    assert_eq!(again.status.code(), Some(0), "{shown}");
    assert!(shown.contains("[acme/widgets]"), "{shown}");
    assert!(shown.contains("alice was already an approver"), "{shown}");
    let config = std::fs::read_to_string(home.config_file()).unwrap();
    assert_eq!(config.matches("[[approvers]]").count(), 1, "{config}");

    // Faster polling than a real setup's, for the test.
    let config = config.replace("interval_ms = 15000", "interval_ms = 200");
    std::fs::write(home.config_file(), config).unwrap();
    let mut up = home.up().await;
    assert!(
        home.up_log()
            .contains("the GitHub worker posts approvals as comments"),
        "{}",
        home.up_log()
    );
    let installed = home.run(&["install", "claude-code"]).await;
    assert!(installed.status.success(), "{}", text(&installed));
    let hook = spawn_hook(&home, &installed_hook(&home), "toolu_setup_gh", "git push");
    repo.request_comment("git push").await;
    repo.approve(&home, hook).await;
    terminate(&home, &mut up).await;
    assert!(!home.up_log().contains(DEFAULT_TOKEN));
}

/// One person is one approver: alice, paired on Telegram already, adds her GitHub login to
/// that approver (a quorum of two is not met by her twice). With several approvers configured,
/// setup asks whose login it is and writes nothing until told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_github_adds_the_login_to_the_approver_it_belongs_to() {
    let repo = GitHubRepo::start().await;
    let (github, issue) = (&repo.fake, repo.issue);
    github.add_user("bob", UserKind::User);
    github.set_permission("acme/widgets", "bob", Role::Write, PermissionShape::Modern);
    let home = Home::new("http://127.0.0.1:9");
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    let paired = "[[approvers]]\nid = \"telegram:1001\"\nname = \"Alice\"\nmax_risk = \"critical\"\nidentities = { telegram = [\"1001\"] }\n";
    std::fs::write(home.config_file(), paired).unwrap();
    let typed = format!("{DEFAULT_TOKEN}\n");
    let issue_arg = issue.to_string();
    let args = ["--repo", "acme/widgets", "--issue", issue_arg.as_str()];

    let joined = run_with_input(
        setup_github(
            &home,
            github,
            &[&args[..], &["--approver", "alice"]].concat(),
        ),
        typed.as_bytes(),
    )
    .await;
    let shown = text(&joined);
    assert_eq!(joined.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("as approver telegram:1001 (one person"),
        "{shown}"
    );
    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(home.config_file()).unwrap()).unwrap();
    let approvers = config["approvers"].as_array().unwrap();
    assert_eq!(approvers.len(), 1, "{config}");
    assert_eq!(
        approvers[0]["identities"]["github"][0].as_str(),
        Some("alice")
    );
    assert_eq!(
        approvers[0]["identities"]["telegram"][0].as_str(),
        Some("1001")
    );

    // Two approvers now (alice, and carol on Telegram): bob's login belongs to whom?
    let two = format!(
        "{}[[approvers]]\nid = \"carol\"\nidentities = {{ telegram = [\"1002\"] }}\n",
        std::fs::read_to_string(home.config_file()).unwrap()
    );
    std::fs::write(home.config_file(), &two).unwrap();
    std::fs::remove_file(home.data().join("secrets/github-token")).unwrap();
    let asked = run_with_input(
        setup_github(&home, github, &[&args[..], &["--approver", "bob"]].concat()),
        typed.as_bytes(),
    )
    .await;
    let shown = text(&asked);
    assert_eq!(asked.status.code(), Some(64), "{shown}");
    assert!(
        shown.contains("approvers telegram:1001, carol are configured already")
            && shown.contains("--approver-id ID"),
        "{shown}"
    );
    assert_eq!(std::fs::read_to_string(home.config_file()).unwrap(), two);
    assert!(!home.data().join("secrets/github-token").exists());

    let added = run_with_input(
        setup_github(
            &home,
            github,
            &[&args[..], &["--approver", "bob", "--approver-id", "bob"]].concat(),
        ),
        typed.as_bytes(),
    )
    .await;
    let shown = text(&added);
    assert_eq!(added.status.code(), Some(0), "{shown}");
    assert!(shown.contains("as approver bob."), "{shown}");
    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(home.config_file()).unwrap()).unwrap();
    let approvers = config["approvers"].as_array().unwrap();
    assert_eq!(approvers.len(), 3, "{config}");
    assert_eq!(approvers[2]["id"].as_str(), Some("bob"));
    assert_eq!(
        approvers[2]["identities"]["github"][0].as_str(),
        Some("bob")
    );
}

/// A bad token, an unknown repository or issue, an approver without write access or the
/// token's own account: each is named with what to do, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_github_refuses_what_does_not_check_out_and_changes_nothing() {
    let repo = GitHubRepo::start().await;
    let (github, issue) = (&repo.fake, repo.issue);
    github.add_user("bob", UserKind::User);
    github.set_permission("acme/widgets", "bob", Role::Read, PermissionShape::Modern);
    let home = Home::new("http://127.0.0.1:9");
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    let before = "# mine\nlisten = \"127.0.0.1:50999\"\n";
    std::fs::write(home.config_file(), before).unwrap();

    let cases: [(&[&str], String, &str); 6] = [
        (
            &[],
            format!("ghp_wrongToken\nacme/widgets\n{issue}\nalice\n"),
            "GitHub refused the token",
        ),
        (
            &[],
            format!("{DEFAULT_TOKEN}\nacme/nothing\n\nalice\n"),
            "repository acme/nothing not found for countersign-bot",
        ),
        (
            &["--issue", "999"],
            format!("{DEFAULT_TOKEN}\nacme/widgets\nalice\n"),
            "issue acme/widgets#999 not found",
        ),
        (
            &[],
            format!("{DEFAULT_TOKEN}\nacme/widgets\n{issue}\nbob\n"),
            "bob has read access to acme/widgets",
        ),
        (
            &[],
            format!("{DEFAULT_TOKEN}\nacme/widgets\n{issue}\ncountersign-bot\n"),
            "the token belongs to countersign-bot",
        ),
        (
            &[],
            format!("{DEFAULT_TOKEN}\nnot a repo\n"),
            "invalid GitHub target",
        ),
    ];
    for (args, typed, expected) in cases {
        let output = run_with_input(setup_github(&home, github, args), typed.as_bytes()).await;
        let shown = text(&output);
        assert_eq!(output.status.code(), Some(64), "{expected}: {shown}");
        assert!(shown.contains(expected), "{expected:?} missing: {shown}");
        assert!(
            shown.contains("countersign setup github") || shown.contains("--"),
            "no next step: {shown}"
        );
        assert!(!shown.contains(DEFAULT_TOKEN), "{shown}");
        assert_eq!(std::fs::read_to_string(home.config_file()).unwrap(), before);
        assert!(!home.data().join("secrets/github-token").exists());
    }

    // The token from the environment instead of the prompt.
    let mut command = setup_github(
        &home,
        github,
        &["--repo", "acme/widgets", "--approver", "alice"],
    );
    command.env("GITHUB_TOKEN", DEFAULT_TOKEN);
    let output = run_with_input(command, b"\n").await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let config = std::fs::read_to_string(home.config_file()).unwrap();
    assert!(config.starts_with(before), "{config}");
    assert!(
        config.contains("default_target = \"acme/widgets\""),
        "{config}"
    );
}

/// The cookie a response sets, as `name=value`.
fn set_cookie(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .map(|value| value.split(';').next().unwrap_or_default().to_owned())
        .find(|cookie| cookie.starts_with("countersign_session="))
}

/// The value of the hidden form field `name` in a page.
fn form_field(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        + marker.len();
    page[start..].split('"').next().unwrap().to_owned()
}

/// With several approvers `setup web` asks who signs in, and an identity another approver
/// has already is refused: the config file stays as it was (the server would refuse it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_web_refuses_an_ambiguous_or_taken_identity_and_changes_nothing() {
    let home = Home::new("http://127.0.0.1:9");
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    let before = "[[approvers]]\nid = \"a:b\"\nidentities = { telegram = [\"1\"] }\n[[approvers]]\nid = \"carol\"\nidentities = { web = [\"a-b\"] }\n";
    std::fs::write(home.config_file(), before).unwrap();

    let output = home.run(&["setup", "web"]).await;
    assert_eq!(output.status.code(), Some(64), "{}", text(&output));
    assert!(
        text(&output)
            .contains("approvers a:b, carol are configured: say who signs in with --approver ID"),
        "{}",
        text(&output)
    );
    let output = home.run(&["setup", "web", "--approver", "a:b"]).await;
    assert_eq!(output.status.code(), Some(64), "{}", text(&output));
    assert!(
        text(&output).contains(
            "approver a:b's web identity would be a-b, which another approver has already"
        ),
        "{}",
        text(&output)
    );
    assert_eq!(std::fs::read_to_string(home.config_file()).unwrap(), before);
}

/// `setup web` enables the inbox and prints a one-time link for the paired approver; the link
/// signs a browser-less client in (once: used again it is refused), and what that approver
/// decides in the inbox counts as theirs: the hook allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_web_prints_a_one_time_link_that_signs_the_approver_in() {
    let home = Home::new("http://127.0.0.1:9");
    let web = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    // As `setup telegram` leaves it (without the bot token, so that no Telegram worker runs).
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    std::fs::write(
        home.config_file(),
        "[[approvers]]\nid = \"telegram:1001\"\nname = \"Alice (@alice)\"\nmax_risk = \"critical\"\nidentities = { telegram = [\"1001\"] }\n",
    )
    .unwrap();

    // Nobody to sign in as: the approver named must exist.
    let output = home.run(&["setup", "web", "--approver", "bob"]).await;
    assert_eq!(output.status.code(), Some(64), "{}", text(&output));
    assert!(
        text(&output).contains("the approvers are telegram:1001"),
        "{}",
        text(&output)
    );

    let output = home.run(&["setup", "web", "--listen", &web]).await;
    let shown = text(&output);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    let link = shown
        .split_whitespace()
        .find(|word| word.starts_with(&format!("http://{web}/login/")))
        .unwrap_or_else(|| panic!("no sign-in link: {shown}"))
        .to_owned();
    assert!(
        shown.contains("sign in as Alice (@alice) (web:telegram-1001)"),
        "{shown}"
    );
    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(home.config_file()).unwrap()).unwrap();
    assert_eq!(config["web"]["listen"].as_str(), Some(web.as_str()));
    assert_eq!(
        config["approvers"][0]["identities"]["web"][0].as_str(),
        Some("telegram-1001")
    );

    let mut up = home.up().await;
    assert!(
        home.up_log()
            .contains(&format!("the web inbox is at http://{web}")),
        "{}",
        home.up_log()
    );
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let signed_out = http.get(format!("http://{web}/")).send().await.unwrap();
    assert_eq!(signed_out.status(), 401);

    // Following the link shows a page; its form signs in.
    let page = http.get(&link).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    let token = form_field(&page, "token");
    assert_eq!(link.rsplit('/').next(), Some(token.as_str()));
    let login = |token: String| {
        http.post(format!("http://{web}/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}"))
            .send()
    };
    let signed_in = login(token.clone()).await.unwrap();
    assert_eq!(signed_in.status(), 303);
    let cookie = set_cookie(&signed_in).expect("a session cookie");
    // A page of the inbox, as the signed-in browser asks for it: its status and text.
    let signed_get = |path: String| {
        let request = http
            .get(format!("http://{web}{path}"))
            .header("cookie", &cookie);
        async move {
            let response = request.send().await.unwrap();
            (response.status(), response.text().await.unwrap())
        }
    };
    let (status, inbox) = signed_get("/".into()).await;
    assert_eq!(status, 200);
    assert!(inbox.contains("Alice (@alice)"), "{inbox}");

    // The same link again: refused, no session.
    let reused = login(token).await.unwrap();
    assert_eq!(reused.status(), 403);
    assert!(set_cookie(&reused).is_none());
    assert!(reused.text().await.unwrap().contains("already used"));

    // A hook's request, approved in the inbox by the signed-in approver.
    let installed = home.run(&["install", "claude-code"]).await;
    assert!(installed.status.success(), "{}", text(&installed));
    let hook = spawn_hook(&home, &installed_hook(&home), "toolu_web_1", "git push");
    let approval = tokio::time::timeout(STEP, async {
        loop {
            let (_, inbox) = signed_get("/".into()).await;
            if let Some(start) = inbox.find("/approvals/") {
                let id: String = inbox[start + "/approvals/".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                break id;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the request in the inbox");
    let (_, page) = signed_get(format!("/approvals/{approval}")).await;
    let form = format!(
        "csrf={}&args_digest={}&scope=once&verdict=approve",
        form_field(&page, "csrf"),
        form_field(&page, "args_digest")
    );
    let decided = http
        .post(format!("http://{web}/approvals/{approval}/decide"))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap();
    assert_eq!(decided.status(), 303, "{}", decided.text().await.unwrap());
    let answer = hook_answer(hook).await;
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "allow",
        "{answer}"
    );
    terminate(&home, &mut up).await;
}

/// Writes `config`, runs `doctor`, and checks that it shows each of `lines`; returns all it
/// showed.
async fn doctor_with(home: &Home, config: &str, lines: &[&str]) -> String {
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    std::fs::write(home.config_file(), config).unwrap();
    let shown = text(&home.run(&["doctor"]).await);
    for line in lines {
        assert!(shown.contains(line), "{line:?} missing: {shown}");
    }
    shown
}

/// `doctor` names the channels that are not set up and the command for each, what a
/// channel that is set up still lacks, and server settings `up` would refuse.
#[tokio::test]
async fn doctor_names_missing_channels_and_their_setup_commands() {
    let home = Home::new("http://127.0.0.1:9");
    let approver = "[[approvers]]\nid = \"telegram:1001\"\nmax_risk = \"critical\"\nidentities = { telegram = [\"1001\"] }\n";
    let shown = doctor_with(
        &home,
        &format!("{approver}[telegram]\ndefault_chat_id = 1001\n"),
        &[
            "--    GitHub is not set up (run countersign setup github)",
            "--    the web inbox is off (run countersign setup web)",
        ],
    )
    .await;
    assert!(!shown.contains("FAIL  GitHub"), "{shown}");

    // Set up but incomplete: a GitHub section without a token, an inbox nobody can sign in to.
    doctor_with(
        &home,
        &format!("{approver}[github]\nbot_login = \"countersign-bot\"\ndefault_target = \"acme/widgets#1\"\n[github.polling]\n[web]\n"),
        &[
            "FAIL  no GitHub token (run countersign setup github)",
            "ok    GitHub: approvals go to acme/widgets#1",
            "FAIL  no approver can sign in to the web inbox (run countersign setup web)",
            "--    Telegram is not set up (run countersign setup telegram)",
        ],
    )
    .await;

    // Server settings `up` would refuse: said before `up` is run, naming the rule and the fix.
    let shown = doctor_with(
        &home,
        &format!("{approver}[[rules]]\nname = \"deploys need a passkey\"\naction = \"require\"\nstep_up = \"passkey\"\n[rules.match]\ntool = \"deploy\"\n"),
        &["FAIL  config: rule \"deploys need a passkey\" sets step_up: set passkeys.inbox_url"],
    )
    .await;
    assert!(
        shown.contains("countersign up refuses to start (fix it in "),
        "{shown}"
    );
    let shown = doctor_with(
        &home,
        &format!("{approver}[passkeys]\ninbox_url = \"http://localhost:8080\"\n[[rules]]\nname = \"deploys need a passkey\"\naction = \"require\"\nstep_up = \"passkey\"\n[rules.match]\ntool = \"deploy\"\n"),
        &["ok    config file"],
    )
    .await;
    assert!(!shown.contains("refuses to start"), "{shown}");
}
