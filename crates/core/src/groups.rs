//! Approver groups (who must decide an approval), delegations (who decides for whom, until
//! when) and the follow-up of an approval nobody answers: a reminder, an escalation to another
//! group and what its deadline means (`reject`, the default, or `escalate`).
//!
//! An approval keeps a snapshot of its groups (members, destinations, the members' channel
//! identities) from the moment it was requested, so the quorum and the membership check never
//! depend on a configuration reloaded later.

use serde::{Deserialize, Serialize};

use crate::approvers::{identity_key, ApproverRegistry};
use crate::policy::{subject, SpecError};
use crate::validate::{optional, required, validate_channel};
use crate::{ApprovalRequest, Error, Millis, Route};

const MAX_GROUP_NAME_CHARS: usize = 64;
const MAX_TARGET_CHARS: usize = 256;

/// One `[[groups]]` entry as configured.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupSpec {
    pub name: String,
    /// Approver ids (see `[[approvers]]`).
    pub members: Vec<String>,
    /// Where the group's approvals are shown when a request names no routes: a Telegram chat
    /// id, a GitHub `owner/repo#issue`, ...
    pub destinations: Vec<Route>,
}

/// How many distinct members of a group must approve, with the group as it was when the
/// approval was requested. A request or a rule names only `group` and `required`; the server
/// fills in the rest from the configuration ([`Groups::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupQuorum {
    pub group: String,
    pub required: u32,
    /// Approver ids.
    pub members: Vec<String>,
    pub destinations: Vec<Route>,
    /// The members' identities on each channel (`github` / `alice-gh`), for mentions.
    pub contacts: Vec<Route>,
}

/// What a deadline without a decision means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// The approval expires: the runtime is told no (fail closed).
    #[default]
    Reject,
    /// The approval goes to the escalation group with a fresh deadline (once); when that one
    /// passes too, it expires.
    Escalate,
}

impl OnTimeout {
    pub fn parse(name: &str) -> Option<OnTimeout> {
        match name.to_ascii_lowercase().as_str() {
            "reject" => Some(OnTimeout::Reject),
            "escalate" => Some(OnTimeout::Escalate),
            _ => None,
        }
    }
}

/// The reminder, escalation and timeout plan of an approval, and how far it went.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FollowUp {
    /// Seconds after the request at which the channels remind the deciders (0: never).
    pub remind_after_seconds: u32,
    /// Seconds after the request at which the approval goes to `escalate_to` (0: only on
    /// timeout, when `on_timeout` is `escalate`).
    pub escalate_after_seconds: u32,
    /// The group an escalation hands the approval to; its members may then decide, and count
    /// toward every group requirement.
    pub escalate_to: Option<GroupQuorum>,
    pub on_timeout: OnTimeout,
    pub reminded_at: Option<Millis>,
    pub escalated_at: Option<Millis>,
}

impl FollowUp {
    /// Whether this plan does anything at all.
    pub fn is_active(&self) -> bool {
        self.remind_after_seconds > 0
            || self.escalate_to.is_some()
            || self.on_timeout != OnTimeout::Reject
    }
}

/// A person deciding for another one until a time: the delegate's decisions count as the
/// delegator's, for the delegator's groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    pub id: String,
    /// Approver id of the person who is away.
    pub delegator: String,
    /// Approver id of the person deciding for them.
    pub delegate: String,
    pub created_at: Millis,
    pub until: Millis,
    pub revoked_at: Option<Millis>,
    pub reason: String,
    /// Who created it (the admin token's name).
    pub created_by: String,
}

impl Delegation {
    pub fn is_active(&self, now: Millis) -> bool {
        self.revoked_at.is_none() && now < self.until
    }
}

/// The configured groups, checked against the approver registry.
#[derive(Debug, Clone, Default)]
pub struct Groups {
    groups: Vec<GroupQuorum>,
}

impl Groups {
    /// Checks every entry; errors name the group. Members must be registered approvers.
    pub fn compile(specs: &[GroupSpec], approvers: &ApproverRegistry) -> Result<Groups, SpecError> {
        let mut groups: Vec<GroupQuorum> = Vec::with_capacity(specs.len());
        for (index, spec) in specs.iter().enumerate() {
            let fail = |message: String| SpecError {
                subject: subject("group", "groups", index, &spec.name),
                message,
            };
            let group = compile_group(spec, approvers).map_err(fail)?;
            if groups.iter().any(|g| g.group == group.group) {
                return Err(fail("another group has the same name".into()));
            }
            groups.push(group);
        }
        Ok(Groups { groups })
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// How many members the group of this name has; `None` when it is not configured.
    pub fn size(&self, name: &str) -> Option<usize> {
        self.groups
            .iter()
            .find(|g| g.group == name)
            .map(|g| g.members.len())
    }

    fn snapshot(&self, field: &str, name: &str) -> Result<GroupQuorum, Error> {
        self.groups
            .iter()
            .find(|g| g.group == name)
            .cloned()
            .ok_or_else(|| {
                Error::invalid(
                    field,
                    format!("no group {name:?} is configured (see [[groups]])"),
                )
            })
    }

    /// Fills the request's group requirements and escalation group in from the configuration
    /// and, when the request names no routes, routes it to its groups' destinations. A group
    /// that is not configured, or a quorum larger than the group, is refused.
    pub fn resolve(&self, request: &mut ApprovalRequest) -> Result<(), Error> {
        let mut resolved: Vec<GroupQuorum> = Vec::with_capacity(request.approver_groups.len());
        for (i, wanted) in request.approver_groups.iter().enumerate() {
            let field = format!("approver_groups[{i}]");
            let mut group = self.snapshot(&format!("{field}.group"), &wanted.group)?;
            group.required = wanted.required.max(1);
            if group.required as usize > group.members.len() {
                return Err(Error::invalid(
                    format!("{field}.required"),
                    format!(
                        "asks for {} approvals from group {:?}, which has {} members",
                        group.required,
                        group.group,
                        group.members.len()
                    ),
                ));
            }
            match resolved.iter_mut().find(|g| g.group == group.group) {
                // The same group named twice (by a rule and the request): the larger quorum.
                Some(existing) => existing.required = existing.required.max(group.required),
                None => resolved.push(group),
            }
        }
        request.approver_groups = resolved;
        if let Some(follow_up) = request.follow_up.as_mut() {
            if let Some(target) = follow_up.escalate_to.take() {
                let mut group = self.snapshot("escalate_to", &target.group)?;
                group.required = 1;
                follow_up.escalate_to = Some(group);
            }
            if follow_up.escalate_to.is_none()
                && (follow_up.escalate_after_seconds > 0
                    || follow_up.on_timeout == OnTimeout::Escalate)
            {
                return Err(Error::invalid(
                    "escalate_to",
                    "is required to escalate (escalate_after_seconds or on_timeout = escalate)",
                ));
            }
        }
        if request.routes.is_empty() {
            for route in request
                .approver_groups
                .iter()
                .flat_map(|g| g.destinations.iter())
            {
                if !request.routes.contains(route) {
                    request.routes.push(route.clone());
                }
            }
        }
        Ok(())
    }
}

fn compile_group(spec: &GroupSpec, approvers: &ApproverRegistry) -> Result<GroupQuorum, String> {
    let invalid = |e: Error| e.to_string();
    required("name", &spec.name, MAX_GROUP_NAME_CHARS).map_err(invalid)?;
    if spec.members.is_empty() {
        return Err("members lists nobody".into());
    }
    let mut members: Vec<String> = Vec::with_capacity(spec.members.len());
    let mut contacts = Vec::new();
    for member in &spec.members {
        let approver = approvers.approver(member).ok_or_else(|| {
            format!("member {member:?} is not the id of an approver (see [[approvers]])")
        })?;
        if members
            .iter()
            .any(|m| identity_key(m) == identity_key(approver))
        {
            return Err(format!("member {member:?} is listed twice"));
        }
        members.push(approver.to_string());
        contacts.extend(approvers.identities_of(approver));
    }
    for (i, route) in spec.destinations.iter().enumerate() {
        validate_channel(&format!("destinations[{i}].channel"), &route.channel)
            .and_then(|()| {
                optional(
                    &format!("destinations[{i}].target"),
                    &route.target,
                    MAX_TARGET_CHARS,
                )
            })
            .map_err(invalid)?;
    }
    Ok(GroupQuorum {
        group: spec.name.clone(),
        required: 1,
        members,
        destinations: spec.destinations.clone(),
        contacts,
    })
}

/// A duration for people, in whole seconds rounded down: `45s`, `10m`, `2h`, `1h30m`.
pub fn human_duration(millis: Millis) -> String {
    let seconds = millis.max(0) / 1000;
    let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    match (hours, minutes, seconds) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(human_duration(45_000), "45s");
        assert_eq!(human_duration(1_800_000), "30m");
        assert_eq!(human_duration(90_000), "1m30s");
        assert_eq!(human_duration(7_200_000), "2h");
        assert_eq!(human_duration(5_400_000), "1h30m");
    }
}
