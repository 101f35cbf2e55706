//! How an approval's groups, delegations and follow-up read for people, shared by the CLI and
//! the channel workers so that every surface says the same thing.

use crate::pb;

/// A requirement for a request's `approver_groups`: `required` distinct members of `group`
/// must approve.
pub fn quorum(group: &str, required: u32) -> pb::GroupQuorum {
    pb::GroupQuorum {
        group: group.to_owned(),
        required,
        ..Default::default()
    }
}

/// One line per group requirement: `1 of 2 from security`.
pub fn group_progress(approval: &pb::Approval) -> Vec<String> {
    approval
        .approver_groups
        .iter()
        .map(|g| format!("{} of {} from {}", g.approved, g.required, g.group))
        .collect()
}

/// `bob on behalf of alice` for a decision made under a delegation.
pub fn on_behalf_of(decision: &pb::Decision) -> Option<String> {
    (!decision.delegate.is_empty())
        .then(|| format!("{} on behalf of {}", decision.delegate, decision.approver))
}

/// Where the follow-up stands: `escalated to oncall` or `reminded`; `None` before either.
pub fn follow_up_state(approval: &pb::Approval) -> Option<String> {
    let follow_up = approval.follow_up.as_ref()?;
    if follow_up.escalated_at.is_some() {
        Some(format!("escalated to {}", follow_up.escalate_to))
    } else if follow_up.reminded_at.is_some() {
        Some("reminded".to_string())
    } else {
        None
    }
}

/// The identities on `channel` of the people still awaited: members of the groups whose quorum
/// is not met and, after an escalation, of the escalation group, except whoever already
/// decided on that channel; each once, in order.
pub fn awaited_contacts(approval: &pb::Approval, channel: &str) -> Vec<String> {
    let decided = |target: &str| {
        approval
            .decisions
            .iter()
            .filter_map(|d| d.decider.as_ref())
            .filter(|d| d.channel == channel)
            .any(|d| {
                d.user_id.eq_ignore_ascii_case(target)
                    || d.display_name.eq_ignore_ascii_case(target)
            })
    };
    let escalation = approval
        .follow_up
        .as_ref()
        .filter(|f| f.escalated_at.is_some())
        .and_then(|f| f.escalation_group.as_ref());
    let mut contacts: Vec<String> = Vec::new();
    for group in approval
        .approver_groups
        .iter()
        .filter(|g| g.approved < g.required)
        .chain(escalation)
    {
        for contact in group
            .contacts
            .iter()
            .filter(|c| c.channel == channel && !decided(&c.target))
        {
            if !contacts.contains(&contact.target) {
                contacts.push(contact.target.clone());
            }
        }
    }
    contacts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, approved: u32, required: u32, github: &[&str]) -> pb::GroupQuorum {
        pb::GroupQuorum {
            group: name.into(),
            approved,
            required,
            contacts: github
                .iter()
                .map(|login| pb::Route {
                    channel: "github".into(),
                    target: (*login).into(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn progress_delegation_and_contacts_read_as_people_say_them() {
        let approval = pb::Approval {
            approver_groups: vec![
                group("db", 1, 1, &["dave-gh"]),
                group("security", 1, 2, &["alice-gh", "bob-gh"]),
            ],
            follow_up: Some(pb::FollowUp {
                escalate_to: "oncall".into(),
                escalated_at: Some(Default::default()),
                escalation_group: Some(group("oncall", 0, 1, &["erin-gh", "bob-gh"])),
                ..Default::default()
            }),
            decisions: vec![pb::Decision {
                decider: Some(pb::Decider {
                    channel: "github".into(),
                    user_id: "583231".into(),
                    display_name: "Alice-GH".into(),
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            group_progress(&approval),
            ["1 of 1 from db", "1 of 2 from security"]
        );
        assert_eq!(follow_up_state(&approval).unwrap(), "escalated to oncall");
        assert_eq!(
            awaited_contacts(&approval, "github"),
            ["bob-gh", "erin-gh"],
            "alice decided already"
        );
        let decision = pb::Decision {
            approver: "alice".into(),
            delegate: "bob".into(),
            ..Default::default()
        };
        assert_eq!(on_behalf_of(&decision).unwrap(), "bob on behalf of alice");
        assert_eq!(on_behalf_of(&pb::Decision::default()), None);
    }
}
