//! Facts about an approval that every channel acts on the same way.

use std::time::Duration;

use countersign_client::{pb, version, withdrawal, Client, ClientError};

/// Whether a session grant approved the approval at once (no one was asked): channels post a
/// short notice, so approvers see every use of the grants they gave.
pub fn is_granted(approval: &pb::Approval) -> bool {
    approval.state() != pb::ApprovalState::Pending
        && approval
            .resolution
            .as_ref()
            .is_some_and(|resolution| resolution.resolved_by() == pb::ResolvedBy::Grant)
}

/// The server's reminder text without its own "reminder: " lead, for a message whose heading
/// already says it is a reminder (not "Reminder: reminder: …").
pub fn reminder_detail(detail: &str) -> &str {
    detail.strip_prefix("reminder: ").unwrap_or(detail)
}

/// What a minimal message (one a platform took after refusing the full one for its content)
/// says about deciding: where the whole request can be seen and decided.
pub fn decide_elsewhere(id: &str) -> String {
    format!(
        "The full request could not be shown here. See it and decide in the web inbox, or with the CLI: countersign approve {id} (or reject {id})"
    )
}

/// The last 8 characters of the id, as every channel shows it.
pub fn short_id(id: &str) -> &str {
    let start = id.char_indices().rev().nth(7).map_or(0, |(at, _)| at);
    &id[start..]
}

/// A resolved approval's state in a word, with its sign (`✅ Approved`), for headings.
pub fn outcome_word(approval: &pb::Approval) -> &'static str {
    use pb::ApprovalState;
    match approval.state() {
        ApprovalState::Approved => "✅ Approved",
        ApprovalState::Consumed => "▶️ Approved and executed",
        ApprovalState::Rejected => "❌ Rejected",
        ApprovalState::Expired => "⌛ Expired",
        ApprovalState::Cancelled if withdrawal::is_withdrawn(approval) => "🚫 Withdrawn",
        ApprovalState::Cancelled => "🚫 Cancelled",
        ApprovalState::Pending | ApprovalState::Unspecified => "Pending",
    }
}

/// How every channel names a cancelled approval: "Withdrawn" when its caller withdrew it
/// because it stopped or left (or the server did, for a caller whose connection was gone),
/// else "Cancelled".
pub fn cancelled_word(approval: &pb::Approval) -> &'static str {
    if withdrawal::is_withdrawn(approval) {
        "Withdrawn"
    } else {
        "Cancelled"
    }
}

/// The risk in a lowercase word (`high`), as plain-text channels and the web inbox show it.
pub fn risk_word(risk: pb::Risk) -> &'static str {
    match risk {
        pb::Risk::Unspecified => "unspecified",
        pb::Risk::Low => "low",
        pb::Risk::Medium => "medium",
        pb::Risk::High => "high",
        pb::Risk::Critical => "critical",
    }
}

/// A pending approval's quorum progress: how many approvals it needs (at least one) and who
/// approved its current version so far.
pub struct Progress<'a> {
    pub required: usize,
    pub approvers: Vec<&'a pb::Decider>,
}

/// The quorum progress every channel shows while an approval is pending.
pub fn progress(approval: &pb::Approval) -> Progress<'_> {
    Progress {
        required: approval.required_approvals.max(1) as usize,
        approvers: version::current_approvals(approval)
            .filter_map(|decision| decision.decider.as_ref())
            .collect(),
    }
}

/// The deciders as a channel lists them: the first `shown`, each as `name` writes it in the
/// channel's markup, then how many more.
pub fn first_deciders(
    deciders: &[&pb::Decider],
    shown: usize,
    name: impl Fn(&pb::Decider) -> String,
) -> String {
    let mut names: Vec<String> = deciders.iter().take(shown).map(|d| name(d)).collect();
    if deciders.len() > shown {
        names.push(format!("{} more", deciders.len() - shown));
    }
    names.join(", ")
}

/// `-` for an empty identifier (an agent or session the request did not name).
pub fn or_dash(text: &str) -> &str {
    if text.is_empty() {
        "-"
    } else {
        text
    }
}

/// The first `chars` characters of `text` (a digest's head).
pub fn prefix(text: &str, chars: usize) -> &str {
    text.char_indices()
        .nth(chars)
        .map_or(text, |(at, _)| &text[..at])
}

/// A Unix time as channels show it: `2026-11-27 08:00 UTC`.
pub fn format_time(seconds: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(seconds)
        .ok()
        .and_then(|time| {
            time.format(time::macros::format_description!(
                "[year]-[month]-[day] [hour]:[minute] UTC"
            ))
            .ok()
        })
        .unwrap_or_else(|| seconds.to_string())
}

/// Every pending approval routed to `channel`, read page by page, as a snapshot would bring
/// them (for a worker that resumes its watch after a persisted cursor). Transient failures are
/// retried with backoff up to `max_backoff`: nothing can be shown before the server answers.
pub async fn pending_approvals(
    client: &Client,
    channel: &str,
    max_backoff: Duration,
) -> Result<Vec<pb::Approval>, ClientError> {
    let mut pending = Vec::new();
    let mut page_token = String::new();
    let mut pause = Duration::from_millis(100);
    loop {
        let request = pb::ListApprovalsRequest {
            states: vec![pb::ApprovalState::Pending.into()],
            channel: channel.to_owned(),
            page_size: 500,
            page_token: page_token.clone(),
            ..Default::default()
        };
        match client.list_approvals(request).await {
            Ok(page) => {
                pending.extend(page.approvals);
                if page.next_page_token.is_empty() {
                    return Ok(pending);
                }
                page_token = page.next_page_token;
            }
            Err(error) if error.is_transient() => {
                tracing::warn!(%error, channel, "cannot list the pending approvals yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(max_backoff);
            }
            Err(error) => return Err(error),
        }
    }
}

/// The ids of the `count` most recently resolved approvals of `channel` that have a delivery
/// of it recorded: after a snapshot, the messages that may still show buttons of an approval
/// resolved while the worker was not watching.
pub async fn recently_resolved_with_deliveries(
    client: &Client,
    channel: &str,
    count: u32,
) -> Result<Vec<String>, ClientError> {
    use pb::ApprovalState::{Approved, Cancelled, Consumed, Expired, Rejected};
    let request = pb::ListApprovalsRequest {
        states: [Approved, Rejected, Expired, Cancelled, Consumed]
            .into_iter()
            .map(i32::from)
            .collect(),
        channel: channel.to_owned(),
        page_size: count,
        ..Default::default()
    };
    let listed = client.list_approvals(request).await?.approvals;
    Ok(listed
        .into_iter()
        .filter(|approval| approval.deliveries.iter().any(|d| d.channel == channel))
        .map(|approval| approval.id)
        .collect())
}

/// The targets `channel`'s routes name, in order; `""` (the channel's default target) for an
/// approval without routes. Blank targets are `""` too.
pub fn route_targets<'a>(approval: &'a pb::Approval, channel: &str) -> Vec<&'a str> {
    if approval.routes.is_empty() {
        // Every channel's default target; once escalated, its group's destinations too (an
        // unrouted approval's routes cannot name "every channel" beside them).
        let escalated_to = approval
            .follow_up
            .as_ref()
            .filter(|follow_up| follow_up.escalated_at.is_some())
            .and_then(|follow_up| follow_up.escalation_group.as_ref());
        let mut targets = vec![""];
        for route in escalated_to.iter().flat_map(|group| &group.destinations) {
            let target = route.target.trim();
            if route.channel == channel && !targets.contains(&target) {
                targets.push(target);
            }
        }
        return targets;
    }
    approval
        .routes
        .iter()
        .filter(|route| route.channel == channel)
        .map(|route| route.target.trim())
        .collect()
}

/// The places of a channel (its configured chats, channels or topics) an approval goes to:
/// for each of [`route_targets`], the place it names when `configured` knows it, else the
/// `default` place (a target naming no configured place is logged with `unknown`: the approval
/// still reaches approvers, and an agent still cannot send anywhere else); without a default,
/// nowhere (logged with `no_default`). Each place once, in order.
pub fn configured_places<'a, T: PartialEq + ?Sized>(
    approval: &pb::Approval,
    channel: &str,
    configured: impl Fn(&str) -> Option<&'a T>,
    default: Option<&'a T>,
    unknown: &str,
    no_default: &str,
) -> Vec<&'a T> {
    let mut places: Vec<&'a T> = Vec::new();
    for target in route_targets(approval, channel) {
        let known = configured(target);
        if !target.is_empty() && known.is_none() {
            tracing::warn!(approval_id = %approval.id, target = ?target, "{unknown}");
        }
        let Some(place) = known.or(default) else {
            tracing::warn!(approval_id = %approval.id, "{no_default}");
            continue;
        };
        if !places.contains(&place) {
            places.push(place);
        }
    }
    places
}

/// Records a message on the server (`RecordDelivery`) unless the approval already carries a
/// delivery of `channel` to `target`. Best effort: the channel's own record of what it showed
/// is what a restarted worker goes by, so a failure is only logged.
pub async fn record_delivery_once(
    client: &Client,
    approval: &pb::Approval,
    channel: &str,
    target: &str,
    message_ref: String,
) {
    let recorded = approval
        .deliveries
        .iter()
        .any(|d| d.channel == channel && d.target == target);
    if recorded {
        return;
    }
    let request = pb::RecordDeliveryRequest {
        approval_id: approval.id.clone(),
        channel: channel.to_owned(),
        target: target.to_owned(),
        message_ref,
    };
    if let Err(error) = client.record_delivery(request).await {
        tracing::warn!(approval_id = %approval.id, %error, "cannot record the delivery on the server");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_escalated_unrouted_approval_also_goes_to_the_escalation_groups_destinations() {
        let route = |channel: &str, target: &str| pb::Route {
            channel: channel.into(),
            target: target.into(),
        };
        let mut approval = pb::Approval {
            follow_up: Some(pb::FollowUp {
                escalation_group: Some(pb::GroupQuorum {
                    group: "oncall".into(),
                    destinations: vec![
                        route("telegram", "-100900900"),
                        route("github", "acme/ops#2"),
                    ],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            route_targets(&approval, "telegram"),
            vec![""],
            "not escalated yet"
        );
        if let Some(follow_up) = approval.follow_up.as_mut() {
            follow_up.escalated_at = Some(countersign_client::Timestamp::default());
        }
        assert_eq!(route_targets(&approval, "telegram"), vec!["", "-100900900"]);
        assert_eq!(route_targets(&approval, "github"), vec!["", "acme/ops#2"]);
        assert_eq!(route_targets(&approval, "webhook"), vec![""]);
    }

    #[test]
    fn route_targets_of_one_channel_or_the_default() {
        let route = |channel: &str, target: &str| pb::Route {
            channel: channel.into(),
            target: target.into(),
        };
        let approval = pb::Approval {
            routes: vec![
                route("webhook", " ops "),
                route("telegram", "-1"),
                route("webhook", ""),
            ],
            ..Default::default()
        };
        assert_eq!(route_targets(&approval, "webhook"), vec!["ops", ""]);
        assert_eq!(route_targets(&approval, "github"), Vec::<&str>::new());
        assert_eq!(route_targets(&pb::Approval::default(), "github"), vec![""]);
    }

    #[test]
    fn only_a_grant_s_resolution_counts() {
        let resolved_by = |by: pb::ResolvedBy, state: pb::ApprovalState| pb::Approval {
            state: state.into(),
            resolution: Some(pb::Resolution {
                resolved_by: by.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(is_granted(&resolved_by(
            pb::ResolvedBy::Grant,
            pb::ApprovalState::Approved
        )));
        assert!(!is_granted(&resolved_by(
            pb::ResolvedBy::Rule,
            pb::ApprovalState::Approved
        )));
        assert!(!is_granted(&resolved_by(
            pb::ResolvedBy::Decision,
            pb::ApprovalState::Approved
        )));
        assert!(!is_granted(&pb::Approval::default()));
    }
}
