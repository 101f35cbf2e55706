//! The approver registry: who may decide, up to which risk, and under which identities on each
//! channel.
//!
//! The server maps every decider to a registered approver before a decision counts. Quorum
//! counts approvers, so the same person approving on Telegram and on GitHub counts once. An
//! empty registry accepts any decider (a development setup; the server warns at start).
//!
//! Identities compare as [`identity_key`]s: after compatibility normalisation (NFKC) and case
//! folding, so `Alice`, `ALICE` and a fullwidth `ａｌｉｃｅ` are one name. A request's
//! `requester` names an approver by their id, any of their `aliases` (e-mail addresses,
//! logins, numeric ids) or any of their channel identities, with or without `channel:`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::fields::{identity_key, required, subject, validate_channel, SpecError};
use crate::{Approval, Decider, Delegation, Error, Risk, Route, Verdict};

/// The channel whose worker sends the user's login as the decider's display name: there an
/// identity that is not a number is a login (case-insensitive), a number a user id.
const LOGIN_CHANNEL: &str = "github";

const MAX_APPROVER_ID_CHARS: usize = 128;
const MAX_IDENTITY_CHARS: usize = 256;

/// One `[[approvers]]` entry as configured.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApproverSpec {
    /// Stable id; quorum counts distinct ids.
    pub id: String,
    /// Display name, for messages.
    pub name: String,
    /// The highest risk this approver may decide: low, medium, high or critical.
    pub max_risk: String,
    /// Channel → the approver's identities there: Telegram numeric user ids, GitHub logins
    /// and/or numeric ids, CLI user names.
    pub identities: BTreeMap<String, Vec<String>>,
    /// Other names the person goes by in a request's `requester` (e-mail addresses, logins,
    /// employee numbers): a request naming any of them is theirs for separation of duties.
    pub aliases: Vec<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ApproverRegistry {
    approvers: Vec<Approver>,
}

#[derive(Debug, Clone)]
struct Approver {
    id: String,
    name: String,
    max_risk: Risk,
    identities: Vec<Identity>,
    /// The identity keys of the id and the aliases.
    names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    channel: String,
    /// As configured, for messages.
    value: String,
    /// The [`identity_key`] of `value`.
    key: String,
}

impl Identity {
    fn is_login(&self) -> bool {
        self.channel == LOGIN_CHANNEL && !self.value.bytes().all(|b| b.is_ascii_digit())
    }

    fn identifies(&self, decider: &Decider) -> bool {
        self.channel == decider.channel
            && if self.is_login() {
                self.key == identity_key(&decider.display_name)
            } else {
                self.key == identity_key(&decider.user_id)
            }
    }

    /// Whether a request's `requester` (as an identity key) names this identity: its value,
    /// or `channel:value`.
    fn named_by(&self, requester: &str) -> bool {
        requester == self.key
            || requester
                .strip_prefix(self.channel.as_str())
                .and_then(|rest| rest.strip_prefix(':'))
                .is_some_and(|rest| rest == self.key)
    }
}

impl Approver {
    fn is_requester(&self, requester: &str) -> bool {
        let requester = identity_key(requester);
        !requester.is_empty()
            && (self.names.contains(&requester)
                || self.identities.iter().any(|i| i.named_by(&requester)))
    }

    fn label(&self) -> String {
        if self.name.is_empty() || self.name == self.id {
            self.id.clone()
        } else {
            format!("{} ({})", self.id, self.name)
        }
    }
}

impl ApproverRegistry {
    /// Checks every entry; errors name the approver. One identity may belong to one approver
    /// only.
    pub fn compile(specs: &[ApproverSpec]) -> Result<ApproverRegistry, SpecError> {
        let mut approvers: Vec<Approver> = Vec::with_capacity(specs.len());
        for (index, spec) in specs.iter().enumerate() {
            let fail = |message: String| SpecError {
                subject: subject("approver", "approvers", index, &spec.id),
                message,
            };
            let approver = compile_approver(spec).map_err(fail)?;
            if approvers.iter().any(|a| a.names[0] == approver.names[0]) {
                return Err(fail("another approver has the same id".into()));
            }
            for name in &approver.names {
                if let Some(other) = approvers.iter().find(|a| a.names.contains(name)) {
                    return Err(fail(format!(
                        "the name {name:?} is also an id or alias of approver {:?}",
                        other.id
                    )));
                }
            }
            for identity in &approver.identities {
                if let Some(other) = approvers
                    .iter()
                    .find(|a| a.identities.iter().any(|i| same_account(i, identity)))
                {
                    return Err(fail(format!(
                        "identity {}:{} is also listed for approver {:?}",
                        identity.channel, identity.value, other.id
                    )));
                }
            }
            approvers.push(approver);
        }
        Ok(ApproverRegistry { approvers })
    }

    pub fn is_empty(&self) -> bool {
        self.approvers.is_empty()
    }

    pub fn len(&self) -> usize {
        self.approvers.len()
    }

    /// Every registered approver: id, name and risk ceiling, in configuration order.
    pub fn summaries(&self) -> impl Iterator<Item = (&str, &str, Risk)> {
        self.approvers
            .iter()
            .map(|a| (a.id.as_str(), a.name.as_str(), a.max_risk))
    }

    /// The configured id of the approver whose id is `id` (compared as identity keys).
    pub fn approver(&self, id: &str) -> Option<&str> {
        let key = identity_key(id);
        self.approvers
            .iter()
            .find(|a| a.names[0] == key)
            .map(|a| a.id.as_str())
    }

    /// The approver's identities on every channel, as configured (for mentions).
    pub fn identities_of(&self, id: &str) -> Vec<Route> {
        self.approvers
            .iter()
            .filter(|a| a.id == id)
            .flat_map(|a| a.identities.iter())
            .map(|i| Route {
                channel: i.channel.clone(),
                target: i.value.clone(),
            })
            .collect()
    }

    /// The registered approver `decider` is, if any.
    pub fn identify(&self, decider: &Decider) -> Option<&str> {
        self.find(decider).map(|a| a.id.as_str())
    }

    fn find(&self, decider: &Decider) -> Option<&Approver> {
        self.approvers
            .iter()
            .find(|a| a.identities.iter().any(|i| i.identifies(decider)))
    }

    /// Who `decider` is for quorum purposes (the approver id, with an empty registry the
    /// decider's channel identity, and under a delegation the delegator's id with the
    /// delegate named), or why they may not make this decision on `approval`: not
    /// registered, above their risk ceiling, approving their own request while separation of
    /// duties applies, or in none of the groups that decide the approval.
    ///
    /// `delegations` are the active delegations to this decider. A delegate decides for a
    /// delegator only where the delegate does not count as themself (not a member of a
    /// deciding group); both must be within their risk ceiling and neither may be the
    /// requester, so a delegation never creates a self-approval. One person's decisions count
    /// once per version: a delegation never lets one person fill two places of a quorum. A
    /// delegate whose delegators all cast this vote already casts it for the first of them
    /// again, which the approval answers as a duplicate (not a refusal naming no member).
    pub fn authorize(
        &self,
        decider: &Decider,
        verdict: Verdict,
        approval: &Approval,
        delegations: &[Delegation],
    ) -> Result<Authorized, Error> {
        if self.is_empty() {
            return Ok(Authorized {
                approver: format!("{}:{}", decider.channel, identity_key(&decider.user_id)),
                delegate: None,
            });
        }
        let acting = self.find(decider).ok_or_else(|| {
            Error::PermissionDenied(format!(
                "decider {} ({:?}) is not a registered approver",
                decider.identity(),
                decider.display_name
            ))
        })?;
        self.check(acting, verdict, approval)?;
        // One person counts once: whoever already decided this version, as themself or for
        // someone, decides again as the same approver (a duplicate), never as another one.
        if let Some(earlier) = approval.decisions.iter().find(|d| {
            d.verdict == verdict
                && approval.is_current(d)
                && match &d.delegate {
                    Some(delegate) => *delegate == acting.id,
                    None => d.approver == acting.id,
                }
        }) {
            return Ok(Authorized {
                approver: earlier.approver.clone(),
                delegate: earlier.delegate.clone(),
            });
        }
        let voted = |id: &str| {
            approval
                .decisions
                .iter()
                .any(|d| d.approver == id && d.verdict == verdict && approval.is_current(d))
        };
        let own = approval.is_decider(&acting.id).then_some(&acting.id);
        let delegators: Vec<&Approver> = delegations
            .iter()
            .filter(|d| identity_key(&d.delegate) == acting.names[0])
            .filter_map(|d| self.approvers.iter().find(|a| a.id == d.delegator))
            .filter(|a| a.id != acting.id && approval.is_decider(&a.id))
            .collect();
        let delegator = match own {
            Some(id) if !voted(id) => None,
            // A delegate whose every delegator already decided so decides for the first of
            // them again: the same decision twice, a duplicate, not a stranger's refusal.
            _ => delegators
                .iter()
                .find(|a| !voted(&a.id))
                .or_else(|| delegators.first().filter(|_| own.is_none()))
                .copied(),
        };
        match (own, delegator) {
            (_, Some(delegator)) => {
                self.check(delegator, verdict, approval).map_err(|e| {
                    Error::PermissionDenied(format!(
                        "{} may not decide on behalf of {}: {e}",
                        acting.label(),
                        delegator.label()
                    ))
                })?;
                Ok(Authorized {
                    approver: delegator.id.clone(),
                    delegate: Some(acting.id.clone()),
                })
            }
            (Some(id), None) => Ok(Authorized {
                approver: id.clone(),
                delegate: None,
            }),
            (None, None) => {
                let groups: Vec<&str> = approval
                    .deciding_groups()
                    .map(|g| g.group.as_str())
                    .collect();
                Err(Error::PermissionDenied(format!(
                    "approver {} is not a member of {} (the groups that decide approval {}) and decides for no member of them",
                    acting.label(),
                    groups.join(", "),
                    approval.id
                )))
            }
        }
    }

    /// The ceiling and separation-of-duties checks of one approver.
    fn check(
        &self,
        approver: &Approver,
        verdict: Verdict,
        approval: &Approval,
    ) -> Result<(), Error> {
        let risk = approval.effective_risk();
        if risk > approver.max_risk {
            let edited = if approval.edit.is_some() {
                " with the edited arguments"
            } else {
                ""
            };
            return Err(Error::PermissionDenied(format!(
                "approver {} may decide up to {} risk; approval {} is {}{edited}",
                approver.label(),
                approver.max_risk.as_str(),
                approval.id,
                risk.as_str()
            )));
        }
        if verdict == Verdict::Approve
            && approval.effective_separation_of_duties()
            && approver.is_requester(&approval.requester)
        {
            return Err(Error::PermissionDenied(format!(
                "approver {} requested approval {} (requester {:?}) and may not approve it: separation of duties",
                approver.label(),
                approval.id,
                approval.requester
            )));
        }
        Ok(())
    }
}

/// Who a decision counts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    /// The approver id quorum counts.
    pub approver: String,
    /// Under a delegation: the approver id of the person who decided for `approver`.
    pub delegate: Option<String>,
}

/// Whether two identities name the same account.
fn same_account(a: &Identity, b: &Identity) -> bool {
    a.channel == b.channel && a.key == b.key
}

fn compile_approver(spec: &ApproverSpec) -> Result<Approver, String> {
    let invalid = |e: Error| e.to_string();
    required("id", &spec.id, MAX_APPROVER_ID_CHARS).map_err(invalid)?;
    let max_risk = match spec.max_risk.as_str() {
        "" => return Err("max_risk is required (low, medium, high or critical)".into()),
        name => Risk::parse(name).ok_or_else(|| {
            format!("max_risk {name:?} is not a risk level (low, medium, high or critical)")
        })?,
    };
    let mut identities = Vec::new();
    for (channel, values) in &spec.identities {
        validate_channel(&format!("identities.{channel}"), channel).map_err(invalid)?;
        for value in values {
            required(&format!("identities.{channel}"), value, MAX_IDENTITY_CHARS)
                .map_err(invalid)?;
            identities.push(Identity {
                channel: channel.clone(),
                value: value.clone(),
                key: identity_key(value),
            });
        }
    }
    if identities.is_empty() {
        return Err("identities lists no identity on any channel".into());
    }
    let mut names = vec![identity_key(&spec.id)];
    for alias in &spec.aliases {
        required("aliases", alias, MAX_IDENTITY_CHARS).map_err(invalid)?;
        names.push(identity_key(alias));
    }
    Ok(Approver {
        id: spec.id.clone(),
        name: spec.name.clone(),
        max_risk,
        identities,
        names,
    })
}

#[cfg(test)]
pub(crate) mod tests;
