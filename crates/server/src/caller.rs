//! Who is calling (a token's name, role and scope) and what that caller may do: the rights
//! every use case checks. Free of gRPC: the edge (`crate::auth`) establishes the caller, and
//! a refusal is the domain's permission error.

use countersign_core::Approval;
use countersign_core::Error as DomainError;

use crate::config::Role;

/// Who is calling, as established by their token.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The token's configured name.
    pub name: String,
    pub role: Role,
    agents: Scope,
    channels: Scope,
}

#[derive(Debug, Clone)]
enum Scope {
    Any,
    Only(Vec<String>),
}

impl Scope {
    fn of(values: &[String]) -> Scope {
        if values.iter().any(|v| v == "*") {
            Scope::Any
        } else {
            Scope::Only(values.to_vec())
        }
    }

    fn contains(&self, value: &str) -> bool {
        match self {
            Scope::Any => true,
            Scope::Only(values) => values.iter().any(|v| v == value),
        }
    }

    /// The one value of a scope that has exactly one.
    fn sole(&self) -> Option<&str> {
        match self {
            Scope::Only(values) if values.len() == 1 => Some(&values[0]),
            _ => None,
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Any => f.write_str("any"),
            Scope::Only(values) => write!(f, "{values:?}"),
        }
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Agent => "agent",
        Role::Worker => "worker",
        Role::Admin => "admin",
    }
}

impl Caller {
    /// A token's caller: its name, role, and the agents and channels it is bound to (`*`: any).
    pub(crate) fn new(name: String, role: Role, agents: &[String], channels: &[String]) -> Caller {
        Caller {
            name,
            role,
            agents: Scope::of(agents),
            channels: Scope::of(channels),
        }
    }

    /// Everyone, when no tokens are configured (the server then serves only on loopback).
    pub(crate) fn open() -> Caller {
        Caller {
            name: "anonymous (no tokens configured)".into(),
            role: Role::Admin,
            agents: Scope::Any,
            channels: Scope::Any,
        }
    }

    fn denied(&self, what: String) -> DomainError {
        tracing::warn!(token = %self.name, role = role_name(self.role), refused = %what, "permission denied");
        DomainError::PermissionDenied(format!(
            "token {:?} ({} role) {what}",
            self.name,
            role_name(self.role)
        ))
    }

    /// Whether the caller's role may call `rpc` at all; admin may call everything.
    pub(crate) fn allow(&self, rpc: &str, roles: &[Role]) -> Result<(), DomainError> {
        if self.role == Role::Admin || roles.contains(&self.role) {
            Ok(())
        } else {
            Err(self.denied(format!("may not call {rpc}")))
        }
    }

    /// Acting for `agent_id`: admin, or an agent token bound to it.
    pub(crate) fn for_agent(&self, agent_id: &str) -> Result<(), DomainError> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Agent if self.agents.contains(agent_id) => Ok(()),
            Role::Agent => Err(self.denied(format!(
                "may act for agents {} only, not {agent_id:?}",
                self.agents
            ))),
            Role::Worker => Err(self.denied(format!("may not act for agent {agent_id:?}"))),
        }
    }

    /// Serving `channel`: admin, or a worker token bound to it.
    pub(crate) fn for_channel(&self, channel: &str) -> Result<(), DomainError> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Worker if self.channels.contains(channel) => Ok(()),
            Role::Worker => Err(self.denied(format!(
                "may serve channels {} only, not {channel:?}",
                self.channels
            ))),
            Role::Agent => Err(self.denied(format!("may not serve channel {channel:?}"))),
        }
    }

    /// Seeing `approval`: admin, an agent token bound to its agent, or a worker token bound to
    /// a channel it is routed to.
    pub(crate) fn may_read(&self, approval: &Approval) -> Result<(), DomainError> {
        match (&self.role, &self.channels) {
            (Role::Admin, _) | (Role::Worker, Scope::Any) => Ok(()),
            (Role::Agent, _) => self.for_agent(&approval.agent_id),
            (Role::Worker, Scope::Only(channels)) => {
                if channels.iter().any(|c| approval.is_routed_to(c)) {
                    Ok(())
                } else {
                    Err(self.denied(format!(
                        "may serve channels {} only; approval {} is not routed there",
                        self.channels, approval.id
                    )))
                }
            }
        }
    }

    /// Acting on `approval` as `channel` (checked with [`Caller::for_channel`] before): a
    /// worker only acts on approvals routed to its channel; others are not limited.
    pub(crate) fn routed_to(&self, channel: &str, approval: &Approval) -> Result<(), DomainError> {
        if self.role == Role::Worker && !approval.is_routed_to(channel) {
            return Err(self.denied(format!(
                "serves {channel:?}, and approval {} is not routed there",
                approval.id
            )));
        }
        Ok(())
    }

    /// The filter a list or watch call is limited to: the one asked for, or, when none was
    /// asked for, the caller's only agent (agent tokens) or channel (worker tokens).
    pub(crate) fn agent_filter(&self, asked: String) -> Result<String, DomainError> {
        match (self.role, asked.is_empty(), self.agents.sole()) {
            (Role::Agent, true, Some(sole)) => Ok(sole.to_owned()),
            (Role::Agent, true, None) if matches!(self.agents, Scope::Only(_)) => {
                Err(self.denied("must name one of its agents in agent_id".into()))
            }
            (Role::Agent, false, _) => self.for_agent(&asked).map(|()| asked),
            _ => Ok(asked),
        }
    }

    /// See [`Caller::agent_filter`].
    pub(crate) fn channel_filter(&self, asked: String) -> Result<String, DomainError> {
        match (self.role, asked.is_empty(), self.channels.sole()) {
            (Role::Worker, true, Some(sole)) => Ok(sole.to_owned()),
            (Role::Worker, true, None) if matches!(self.channels, Scope::Only(_)) => {
                Err(self.denied("must name one of its channels in channel".into()))
            }
            (Role::Worker, false, _) => self.for_channel(&asked).map(|()| asked),
            _ => Ok(asked),
        }
    }
}
