//! Approver groups (who must decide an approval), delegations (who decides for whom, until
//! when) and the follow-up of an approval nobody answers: a reminder, an escalation to another
//! group and what its deadline means (`reject`, the default, or `escalate`).
//!
//! An approval keeps a snapshot of its groups (members, destinations, the members' channel
//! identities) from the moment it was requested, so the quorum and the membership check never
//! depend on a configuration reloaded later.

use serde::Deserialize;

pub use crate::approval::{Delegation, FollowUp, GroupQuorum, OnTimeout};
use crate::approvers::ApproverRegistry;
use crate::fields::{identity_key, optional, required, subject, validate_channel, SpecError};
use crate::{ApprovalRequest, Error, Route};

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

/// The configured groups, checked against the approver registry; and, for a name that is
/// no configured group but a registered approver's id, that approver alone (an OpenID CIBA
/// `login_hint` names who decides so).
#[derive(Debug, Clone, Default)]
pub struct Groups {
    groups: Vec<GroupQuorum>,
    /// One group per registered approver, named by the approver's id, of the approver only.
    personal: Vec<GroupQuorum>,
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
        let personal = approvers
            .summaries()
            .map(|(id, _, _)| GroupQuorum {
                group: id.to_owned(),
                required: 1,
                members: vec![id.to_owned()],
                destinations: Vec::new(),
                contacts: approvers.identities_of(id),
            })
            .collect();
        Ok(Groups { groups, personal })
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

    /// The group `name` as configured, else the approver of that id alone.
    fn snapshot(&self, field: &str, name: &str) -> Result<GroupQuorum, Error> {
        self.groups
            .iter()
            .find(|g| g.group == name)
            .or_else(|| self.personal.iter().find(|g| g.group == name))
            .cloned()
            .ok_or_else(|| {
                Error::invalid(
                    field,
                    format!(
                        "no group {name:?} is configured (see [[groups]]), nor an approver of that id"
                    ),
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

#[cfg(test)]
mod tests;
