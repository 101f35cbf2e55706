//! Who may decide what, as the inbox needs it: the server's registered approvers (risk
//! ceilings, web identities) and the active delegations, read with the admin token and kept
//! fresh in the background. The inbox shows an approver only the approvals they may decide.
//! Without an admin token nothing is known and the inbox shows every approval routed to the
//! web; either way the server still refuses a decision it does not allow, with the reason.

use std::sync::RwLock;
use std::time::Duration;

use countersign_client::{pb, Client};

use crate::config::CHANNEL;

/// How often the registry and the delegations are read again.
const REFRESH: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Known {
    approvers: Vec<pb::RegisteredApprover>,
    delegations: Vec<pb::Delegation>,
    /// Whether a first read succeeded.
    loaded: bool,
}

#[derive(Default)]
pub struct Deciders {
    known: RwLock<Known>,
}

impl Deciders {
    /// Whether the approver signed in as `web_identity` may decide `approval` now, by the
    /// server's rules: within their risk ceiling and, when groups decide it, a member of one of
    /// them (or of the escalation group once escalated), or the delegate of such a member whose
    /// own ceiling allows it too.
    pub fn may_decide(&self, web_identity: &str, approval: &pb::Approval) -> bool {
        let known = self
            .known
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !known.loaded || known.approvers.is_empty() {
            // Nothing known, or a server that accepts any decider.
            return true;
        }
        let identity = name_key(web_identity);
        let Some(approver) = known.approvers.iter().find(|a| {
            a.identities
                .iter()
                .any(|i| i.channel == CHANNEL && name_key(&i.target) == identity)
        }) else {
            return false;
        };
        if approval.risk > approver.max_risk {
            return false;
        }
        if approval.approver_groups.is_empty() {
            return true;
        }
        // The approver decides as themself or for whoever delegated to them (within that
        // person's ceiling too).
        let mut decides_for = vec![approver.id.as_str()];
        decides_for.extend(
            known
                .delegations
                .iter()
                .filter(|d| d.active && name_key(&d.delegate) == name_key(&approver.id))
                .filter(|d| {
                    known
                        .approvers
                        .iter()
                        .find(|a| name_key(&a.id) == name_key(&d.delegator))
                        .is_some_and(|delegator| approval.risk <= delegator.max_risk)
                })
                .map(|d| d.delegator.as_str()),
        );
        let member_of = |group: &pb::GroupQuorum| {
            group
                .members
                .iter()
                .any(|member| decides_for.contains(&member.as_str()))
        };
        let escalated_to = approval
            .follow_up
            .as_ref()
            .filter(|follow_up| follow_up.escalated_at.is_some())
            .and_then(|follow_up| follow_up.escalation_group.as_ref());
        // Membership is all the server checks: a member may still approve a group that has
        // its quorum (the approval may need more approvals overall) and may always reject.
        escalated_to.is_some_and(member_of) || approval.approver_groups.iter().any(member_of)
    }

    fn replace(&self, approvers: Vec<pb::RegisteredApprover>, delegations: Vec<pb::Delegation>) {
        let mut known = self
            .known
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *known = Known {
            approvers,
            delegations,
            loaded: true,
        };
    }
}

/// A name as the server compares names (approver ids, identities): trimmed, lower case. (The
/// server also applies NFKC; a configured name that only NFKC makes equal is not matched here,
/// and the inbox then shows the approver less, never more, than the server allows.)
fn name_key(name: &str) -> String {
    name.trim().to_lowercase()
}

/// Keeps `deciders` current through the admin client, for as long as the inbox runs.
pub async fn follow(admin: Client, deciders: std::sync::Arc<Deciders>) {
    loop {
        let read = async {
            let approvers = admin.list_approvers().await?;
            let delegations = admin.list_delegations("", false).await?;
            Ok::<_, countersign_client::ClientError>((approvers, delegations))
        };
        match read.await {
            Ok((approvers, delegations)) => deciders.replace(approvers, delegations),
            Err(error) => {
                tracing::warn!(%error, "cannot read the approvers and delegations; the inbox keeps what it knew")
            }
        }
        tokio::time::sleep(REFRESH).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approver(id: &str, web: &str, max_risk: pb::Risk) -> pb::RegisteredApprover {
        pb::RegisteredApprover {
            id: id.into(),
            name: id.into(),
            max_risk: max_risk.into(),
            identities: vec![pb::Route {
                channel: CHANNEL.into(),
                target: web.into(),
            }],
        }
    }

    fn group(name: &str, members: &[&str], required: u32, approved: u32) -> pb::GroupQuorum {
        pb::GroupQuorum {
            group: name.into(),
            members: members.iter().map(|m| m.to_string()).collect(),
            required,
            approved,
            ..Default::default()
        }
    }

    #[test]
    fn only_what_the_approver_may_decide() {
        let deciders = Deciders::default();
        let critical = pb::Approval {
            risk: pb::Risk::Critical.into(),
            ..Default::default()
        };
        assert!(deciders.may_decide("carol", &critical), "nothing known yet");
        deciders.replace(
            vec![
                approver("alice", "Alice@Example.com", pb::Risk::Critical),
                approver("carol", "carol", pb::Risk::Medium),
                approver("erin", "erin", pb::Risk::Critical),
            ],
            vec![pb::Delegation {
                delegator: "alice".into(),
                delegate: "erin".into(),
                active: true,
                ..Default::default()
            }],
        );
        assert!(deciders.may_decide("alice@example.com", &critical));
        assert!(
            !deciders.may_decide("carol", &critical),
            "above her ceiling"
        );
        assert!(!deciders.may_decide("mallory", &critical), "not registered");

        let mut grouped = pb::Approval {
            risk: pb::Risk::Low.into(),
            approver_groups: vec![group("security", &["alice", "bob"], 2, 0)],
            ..Default::default()
        };
        assert!(deciders.may_decide("alice@example.com", &grouped));
        assert!(
            !deciders.may_decide("carol", &grouped),
            "in no deciding group"
        );
        assert!(deciders.may_decide("erin", &grouped), "alice's delegate");
        // With its quorum reached the group's members may still decide (more approvals may
        // be needed overall, and anyone may reject).
        grouped.approver_groups[0].approved = 2;
        assert!(deciders.may_decide("alice@example.com", &grouped));
        grouped.approver_groups[0].approved = 0;
        grouped.follow_up = Some(pb::FollowUp {
            escalated_at: Some(countersign_client::Timestamp::default()),
            escalation_group: Some(group("oncall", &["carol"], 1, 0)),
            ..Default::default()
        });
        assert!(
            deciders.may_decide("carol", &grouped),
            "escalated to her group"
        );
    }
}
