//! Where approvals go on GitHub: `owner/repo#number` (a comment on that issue or pull request)
//! or `owner/repo` (a new issue per approval).

use std::fmt;
use std::str::FromStr;

/// The channel name approvals are routed to GitHub by.
pub const CHANNEL: &str = "github";

/// A repository, `owner/name`, kept in lower case: GitHub names are case-insensitive, and one
/// spelling keeps comparisons and map keys simple.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoName {
    owner: String,
    name: String,
}

impl RepoName {
    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for RepoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

/// An issue or pull request (they share numbers and comments).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IssueRef {
    pub repo: RepoName,
    pub number: u64,
}

impl fmt::Display for IssueRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.repo, self.number)
    }
}

/// A route target of the `github` channel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Comment on this issue or pull request.
    Issue(IssueRef),
    /// Open a new issue in this repository for each approval.
    Repo(RepoName),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Issue(issue) => issue.fmt(f),
            Target::Repo(repo) => repo.fmt(f),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid GitHub target {input:?}: {problem} (expected owner/repo#number or owner/repo)")]
pub struct TargetError {
    input: String,
    problem: &'static str,
}

/// GitHub allows letters, digits, `-`, `_` and `.` in owner and repository names.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl FromStr for RepoName {
    type Err = TargetError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let error = |problem| TargetError {
            input: input.to_string(),
            problem,
        };
        let (owner, name) = input.trim().split_once('/').ok_or(error("no '/'"))?;
        if !valid_name(owner) || !valid_name(name) {
            return Err(error(
                "owner and repository may hold only letters, digits, '-', '_' and '.'",
            ));
        }
        Ok(RepoName {
            owner: owner.to_ascii_lowercase(),
            name: name.to_ascii_lowercase(),
        })
    }
}

impl FromStr for Target {
    type Err = TargetError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        match input.trim().split_once('#') {
            Some((repo, number)) => {
                let number = number
                    .parse::<u64>()
                    .ok()
                    .filter(|number| *number > 0)
                    .ok_or(TargetError {
                        input: input.to_string(),
                        problem: "the issue number must be a positive integer",
                    })?;
                Ok(Target::Issue(IssueRef {
                    repo: repo.parse()?,
                    number,
                }))
            }
            None => Ok(Target::Repo(input.parse()?)),
        }
    }
}

impl FromStr for IssueRef {
    type Err = TargetError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        match input.parse()? {
            Target::Issue(issue) => Ok(issue),
            Target::Repo(_) => Err(TargetError {
                input: input.to_string(),
                problem: "no issue number",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_issue_and_repository_targets() {
        let issue: Target = "Acme/Widgets#12".parse().unwrap();
        assert_eq!(issue.to_string(), "acme/widgets#12");
        let Target::Issue(issue) = issue else {
            panic!("not an issue target")
        };
        assert_eq!(issue.repo.owner(), "acme");
        assert_eq!(issue.repo.name(), "widgets");
        assert_eq!(issue.number, 12);

        let repo: Target = "acme/my.repo_2".parse().unwrap();
        assert_eq!(repo, Target::Repo("ACME/my.repo_2".parse().unwrap()));
    }

    #[test]
    fn refuses_malformed_targets() {
        for bad in [
            "",
            "acme",
            "acme/",
            "/widgets",
            "acme/widgets#",
            "acme/widgets#0",
            "acme/widgets#x",
            "acme/wid gets#1",
            "acme/../x",
            "a/b/c",
            "acme/..",
        ] {
            assert!(bad.parse::<Target>().is_err(), "{bad:?} was accepted");
        }
        assert!("acme/widgets".parse::<IssueRef>().is_err());
    }
}
