//! The fake GitHub as the `up` tests use it: a repository with an issue for approvals, and
//! alice, who has write access there and so decides with comments.

use countersign_testkit::github::{Comment, FakeGitHub, PermissionShape, Role, User, UserKind};
use tokio::process::Child;

use super::home::{hook_answer, Home};
use super::STEP;

pub const REPO: &str = "acme/widgets";

pub struct GitHubRepo {
    pub fake: FakeGitHub,
    pub issue: u64,
    pub alice: User,
}

impl GitHubRepo {
    pub async fn start() -> GitHubRepo {
        let fake = FakeGitHub::start().await;
        let issue = fake.add_issue(REPO, "Approvals");
        let alice = fake.add_user("alice", UserKind::User);
        fake.set_permission(REPO, "alice", Role::Write, PermissionShape::Modern);
        GitHubRepo { fake, issue, alice }
    }

    /// The request comment on the issue that shows `shell`, once posted.
    pub async fn request_comment(&self, shell: &str) -> Comment {
        self.fake
            .wait_for("the request comment", STEP, |github| {
                github
                    .comments(REPO, self.issue)
                    .into_iter()
                    .find(|comment| comment.body.contains(shell))
            })
            .await
    }

    /// alice comments `/approve`; the waiting hook must then allow the call.
    pub async fn approve(&self, home: &Home, hook: Child) {
        self.fake
            .add_comment(REPO, self.issue, &self.alice, "/approve");
        let answer = hook_answer(hook).await;
        assert_eq!(
            answer["hookSpecificOutput"]["permissionDecision"],
            "allow",
            "{answer}\n{}",
            home.up_log()
        );
    }
}
