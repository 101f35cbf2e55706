//! `setup github`: connects GitHub to the local instance. The token is checked against the
//! GitHub API (`GET /user` names the account countersign comments as), the repository (and the
//! issue, when one is given) must exist for it, and the approver must have write access there
//! (the GitHub worker takes `/approve` and `/reject` only from such people). Only when every
//! check passes is anything written: the token to a file only the user can read, the `[github]`
//! section of the config file, and the approver's GitHub login in `[[approvers]]`.
//!
//! The account the token belongs to is never registered as an approver: the worker comments
//! as that account and takes none of its comments as commands.

use std::time::Duration;

use countersign_github::api::{ApiError, GitHubApi, GitHubAuth, GitHubSettings};
use countersign_github::target::{IssueRef, RepoName, Target};
use toml_edit::{value, Item, Table};

use crate::args::SetupGitHubArgs;
use crate::config_file::{self, NewApprover, Owner, Registered};
use crate::exit::{CliError, Exit};
use crate::instance::{Instance, Secret};
use crate::local::setup::{prompt, prompt_secret};
use crate::settings::local_user;

const DEFAULT_API_URL: &str = "https://api.github.com";

/// The environment variable `setup github` takes the token from (as the `gh` CLI does).
const TOKEN_ENV: &str = "GITHUB_TOKEN";

/// How often a new setup's worker reads the comments of its issues (a webhook needs a public
/// address; polling works on any machine).
const POLLING_INTERVAL_MS: i64 = 15_000;

pub async fn github(instance: &Instance, args: SetupGitHubArgs) -> Result<Exit, CliError> {
    let mut doc = config_file::read(instance)?;
    let configured = |key: &str| {
        doc.get("github")
            .and_then(|github| github.get(key))
            .and_then(Item::as_str)
            .map(str::to_owned)
    };
    let api_url = args
        .api_url
        .clone()
        .or_else(|| configured("api_url"))
        .unwrap_or_else(|| DEFAULT_API_URL.to_owned());
    let configured_target = configured("default_target");

    let token = token()?;
    let api = client(&api_url, &token)?;
    let login = api.authenticated_login().await.map_err(|error| match error {
        ApiError::Status { status: 401, .. } => CliError::Usage(format!(
            "GitHub refused the token ({error}): copy it again, or create one (https://github.com/settings/tokens) for the account countersign comments as, with read and write access to issues, then run countersign setup github again"
        )),
        error => github_error(&api_url, error),
    })?;

    let target = target(&args, configured_target.as_deref())?;
    let repo = match &target {
        Target::Issue(issue) => &issue.repo,
        Target::Repo(repo) => repo,
    };
    if !api
        .repository_exists(repo)
        .await
        .map_err(|error| github_error(&api_url, error))?
    {
        return Err(CliError::Usage(format!(
            "repository {repo} not found for {login}: check its name, or give the token access to it (fine-grained tokens: Repository access, and Issues read and write), then run countersign setup github again"
        )));
    }
    if let Target::Issue(issue) = &target {
        if api
            .get_issue(issue)
            .await
            .map_err(|error| github_error(&api_url, error))?
            .is_none()
        {
            return Err(CliError::Usage(format!(
                "issue {issue} not found: give the number of an open issue or pull request of {repo}, or none to open an issue for each approval (countersign setup github --issue NUMBER)"
            )));
        }
    }

    let approver = match &args.approver {
        Some(approver) => approver.trim().to_owned(),
        None => prompt("Your GitHub login (you approve with /approve comments there)")?,
    };
    if approver.is_empty() {
        return Err(CliError::Usage(
            "no approver: type the GitHub login of the person who approves at the prompt, or pass --approver LOGIN".into(),
        ));
    }
    if approver.eq_ignore_ascii_case(&login) {
        return Err(CliError::Usage(format!(
            "the token belongs to {login}, the account countersign comments as, and its comments are never taken as decisions: use the token of another account (a machine user) or name another approver (countersign setup github --approver LOGIN)"
        )));
    }
    let permission = api
        .permission(repo, &approver)
        .await
        .map_err(|error| github_error(&api_url, error))?;
    if !permission.can_write {
        return Err(CliError::Usage(format!(
            "{approver} has {} access to {repo}; countersign takes /approve and /reject only from people with write access: give them write access, or name another login (countersign setup github --approver LOGIN)",
            permission.level.as_str()
        )));
    }

    let newly = NewApprover {
        id: format!("github:{approver}"),
        name: &approver,
        channel: "github",
        identity: &approver,
    };
    let owner = match &args.approver_id {
        Some(id) => Owner::Approver(id),
        None => Owner::TheOnlyOne { else_new: false },
    };
    let registered = config_file::register_identity(&mut doc, instance, &newly, owner)?;
    instance.write_secret(Secret::GitHubToken, &token)?;
    let github = config_file::table(&mut doc, instance, "github")?;
    github["bot_login"] = value(login.as_str());
    github["default_target"] = value(target.to_string());
    // The API the token was checked against, also when it replaces another one.
    if api_url == DEFAULT_API_URL {
        github.remove("api_url");
    } else {
        github["api_url"] = value(api_url.as_str());
    }
    if !github.contains_key("polling") && !github.contains_key("webhook") {
        let mut polling = Table::new();
        polling["interval_ms"] = value(POLLING_INTERVAL_MS);
        github["polling"] = Item::Table(polling);
    }
    config_file::write(instance, &doc)?;

    let where_ = match &target {
        Target::Issue(issue) => format!("on {issue}"),
        Target::Repo(repo) => format!("in a new issue of {repo} for each approval"),
    };
    println!("GitHub is set up: countersign asks {where_}, commenting as {login}.");
    match &registered {
        Registered::Added(id) => println!(
            "{approver} approves there with /approve (or /reject <reason>), as approver {id}."
        ),
        Registered::Joined(id) => println!(
            "{approver} approves there with /approve (or /reject <reason>), as approver {id} (one person on two channels, counted once in a quorum)."
        ),
        Registered::Already(id) => {
            println!("{approver} was already an approver on GitHub ({id}).")
        }
    }
    if local_user().is_some_and(|user| user.trim().eq_ignore_ascii_case(approver.trim())) {
        println!(
            "Note: {approver} is also your user name here, which the hooks send as the requester: separation of duties (on by default) refuses {approver}'s approvals of requests from this machine. Approve them on another channel (countersign setup telegram), or set separation_of_duties = false on the rules that ask you (docs/configuration.md)."
        );
    }
    println!(
        "Written to {}; the token is kept in {} (readable only by you).\nNext: countersign up (restart it if it is running).",
        instance.config_file.display(),
        instance.secret_path(Secret::GitHubToken).display()
    );
    crate::rules_file::offer_preset(instance, args.preset.name.as_deref())?;
    Ok(Exit::Success)
}

/// The token: `GITHUB_TOKEN`, or typed at the prompt.
fn token() -> Result<String, CliError> {
    let token = match std::env::var(TOKEN_ENV)
        .ok()
        .filter(|token| !token.is_empty())
    {
        Some(token) => token,
        None => prompt_secret("GitHub token (https://github.com/settings/tokens)")?,
    };
    if token.is_empty() {
        return Err(CliError::Usage(format!(
            "no GitHub token: type it at the prompt or set {TOKEN_ENV}"
        )));
    }
    // It becomes an HTTP header value.
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err(CliError::Usage(
            "the GitHub token holds spaces or other characters no token has: copy it again".into(),
        ));
    }
    Ok(token)
}

/// Where approvals go: `--repo` and `--issue`, else asked, the configured target offered.
fn target(args: &SetupGitHubArgs, configured: Option<&str>) -> Result<Target, CliError> {
    let configured: Option<Target> = configured.and_then(|target| target.parse().ok());
    let (configured_repo, configured_issue) = match &configured {
        Some(Target::Issue(issue)) => (Some(issue.repo.to_string()), Some(issue.number)),
        Some(Target::Repo(repo)) => (Some(repo.to_string()), None),
        None => (None, None),
    };
    let repo = match &args.repo {
        Some(repo) => repo.clone(),
        None => {
            let offered = configured_repo
                .as_deref()
                .map_or(String::new(), |repo| format!(" [{repo}]"));
            let typed = prompt(&format!("Repository for approvals (owner/repo){offered}"))?;
            if typed.is_empty() {
                configured_repo.clone().unwrap_or_default()
            } else {
                typed
            }
        }
    };
    if repo.is_empty() {
        return Err(CliError::Usage(
            "no repository: type owner/repo at the prompt, or pass --repo OWNER/REPO".into(),
        ));
    }
    let repo: RepoName = repo.parse().map_err(|error| {
        CliError::Usage(format!(
            "{error}: type it as owner/repo, or pass --repo OWNER/REPO"
        ))
    })?;
    let issue = match args.issue {
        Some(issue) => Some(issue),
        None => {
            let offered = configured_issue
                .filter(|_| configured_repo.as_deref() == Some(repo.to_string().as_str()))
                .map_or(String::new(), |issue| format!(" [{issue}]"));
            let typed = prompt(&format!(
                "Issue or pull request to comment on (a number; empty: a new issue for each approval){offered}"
            ))?;
            match typed.trim_start_matches('#') {
                "" if !offered.is_empty() => configured_issue,
                "" => None,
                number => Some(
                    number
                        .parse::<u64>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| {
                            CliError::Usage(format!("{typed:?} is not an issue number"))
                        })?,
                ),
            }
        }
    };
    Ok(match issue {
        Some(number) => Target::Issue(IssueRef { repo, number }),
        None => Target::Repo(repo),
    })
}

fn client(api_url: &str, token: &str) -> Result<GitHubApi, CliError> {
    let timeout = Duration::from_secs(20);
    GitHubApi::new(GitHubSettings {
        api_url: api_url.trim_end_matches('/').to_owned(),
        auth: GitHubAuth::Token(token.to_owned()),
        // Unknown until GitHub says whose token it is; setup writes nothing there.
        bot_login: String::new(),
        write_interval: Duration::ZERO,
        secondary_limit_wait: Duration::from_secs(10),
        max_attempts: 3,
        connect_timeout: timeout,
        read_timeout: timeout,
    })
    .map_err(|error| CliError::Usage(format!("GitHub API {api_url}: {error}")))
}

/// GitHub could not be asked, or answered what setup cannot use: nothing was written.
fn github_error(api_url: &str, error: ApiError) -> CliError {
    CliError::Failure(format!(
        "cannot check with GitHub ({api_url}): {error}; nothing was changed, run countersign setup github again"
    ))
}
