//! Decisions through the reply topic: a button of a notification is an ntfy `http` action
//! that publishes its decision token to the reply topic on the same ntfy server, and the
//! worker follows that topic's JSON stream. Nothing reaches the worker from outside: no
//! inbound port, no public address.
//!
//! The token is a one-time decision link's (`countersign-links`) with the HMAC form token
//! bound to it, so a message on the reply topic decides only when it carries a token the
//! worker handed out, and a token decides once (a replay finds its link used). The stream is
//! opened again after any failure with `since=` the id of the last message dealt with (kept
//! in the state database, written after the message was dealt with), so a reply that came
//! while the worker was down or reconnecting is read then, and one whose decision a crash
//! interrupted is read again and decided (the link that claimed itself sends its decision
//! again, under the same idempotency key: it counts once).

use countersign_links::pages::{Confirmation, Decided, Pages};
use countersign_worker::retry::Backoff;

use crate::api::NtfyApi;
use crate::shown::Store;

/// How `countersign setup ntfy`'s Confirm button's message on the reply topic starts (the
/// one-time code follows).
pub const SETUP_CONFIRMATION: &str = "countersign-setup ";

/// What a button publishes to the reply topic: the link's token, the form token bound to it
/// and the digest of the arguments the notification showed. ntfy's action body is fixed
/// when the notification is published: it carries no text the approver types.
pub fn body(token: &str, form_token: &str, args_digest: &str) -> String {
    format!("countersign-decision token={token}&form_token={form_token}&args_digest={args_digest}")
}

/// Reads a reply topic's message: the token and its confirmation, or `None` for anything
/// else (which decides nothing).
pub fn parse(message: &str) -> Option<(String, Confirmation)> {
    let fields = message.trim().strip_prefix("countersign-decision ")?;
    let mut token = None;
    let mut confirmation = Confirmation::default();
    for pair in fields.split('&') {
        let (name, value) = pair.split_once('=')?;
        match name {
            "token" => token = Some(value.to_owned()),
            "form_token" => confirmation.form_token = value.to_owned(),
            "args_digest" => confirmation.args_digest = value.to_owned(),
            _ => return None,
        }
    }
    Some((token?, confirmation))
}

/// Follows the reply topic until the task is dropped: opens its JSON stream from after the
/// last message dealt with, decides each decision token that comes, and opens it again
/// (after a pause that grows with each failure in a row) when it fails or ends.
pub async fn follow(api: NtfyApi, topic: String, store: Store, pages: Pages, backoff: Backoff) {
    let mut failures = 0u32;
    loop {
        match read(&api, &topic, &store, &pages).await {
            Ok(()) => failures = 0,
            Err(Unread::Broke(error)) => {
                failures = 0;
                tracing::warn!(%error, "the reply topic's stream broke; opening it again");
            }
            Err(Unread::Failed(error)) => {
                failures = failures.saturating_add(1);
                tracing::warn!(%error, "cannot follow the reply topic; will try again");
            }
        }
        tokio::time::sleep(backoff.delay(failures)).await;
    }
}

/// Why a pass over the stream ended.
enum Unread {
    /// The stream was open and broke (or went silent): opened again after the first pause.
    Broke(String),
    /// The stream could not be opened, or a decision could not be made: the pause grows
    /// with each such failure in a row.
    Failed(String),
}

/// One pass: opens the stream and deals with its messages until it ends or fails. Returns
/// without advancing past a message whose decision could not be made now (the store or the
/// server failed), so the next pass reads it again.
async fn read(api: &NtfyApi, topic: &str, store: &Store, pages: &Pages) -> Result<(), Unread> {
    let since = store
        .reply_cursor(topic)
        .await
        .map_err(|error| Unread::Failed(error.to_string()))?
        .unwrap_or_else(|| "all".to_owned());
    let mut stream = api
        .subscribe(topic, &since)
        .await
        .map_err(|error| Unread::Failed(error.to_string()))?;
    tracing::debug!(%topic, %since, "following the reply topic");
    while let Some(event) = stream
        .next()
        .await
        .map_err(|error| Unread::Broke(error.to_string()))?
    {
        if event.event != "message" {
            // `open`, `keepalive`, `poll_request`.
            continue;
        }
        if decide(pages, &event.message).await.is_unavailable() {
            return Err(Unread::Failed(
                "a decision could not be made now; reading it again".to_owned(),
            ));
        }
        store
            .set_reply_cursor(topic, &event.id)
            .await
            .map_err(|error| Unread::Failed(error.to_string()))?;
    }
    Ok(())
}

/// Decides through one message of the reply topic; logs what it came to.
async fn decide(pages: &Pages, message: &str) -> Decided {
    let Some((token, confirmation)) = parse(message) else {
        if message.starts_with(SETUP_CONFIRMATION) {
            // `countersign setup ntfy`'s test notification, confirmed before the worker ran.
            tracing::debug!("the setup's confirmation on the reply topic");
        } else {
            tracing::warn!(
                "a message on the reply topic that is no decision token; it decides nothing"
            );
        }
        return Decided::Unknown;
    };
    let decided = pages.decide_token(&token, &confirmation).await;
    match &decided {
        Decided::Resolved { .. } | Decided::Recorded => {}
        Decided::Unknown | Decided::BadForm => {
            tracing::warn!(outcome = ?decided, "a decision token on the reply topic that the worker never handed out; it decides nothing");
        }
        other => {
            tracing::info!(outcome = ?other, "a decision token on the reply topic decided nothing");
        }
    }
    decided
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_reads_back_and_other_messages_are_no_decision() {
        let (token, confirmation) = parse(&body("tok-_1", "ab12", "cd34")).unwrap();
        assert_eq!(token, "tok-_1");
        assert_eq!(confirmation.form_token, "ab12");
        assert_eq!(confirmation.args_digest, "cd34");
        assert!(confirmation.reason.is_empty());
        assert!(parse("approve everything").is_none());
        assert!(parse("countersign-decision form_token=ab12").is_none());
        assert!(parse("countersign-decision token=t&reason=x").is_none());
    }
}
