//! Server-sent events: the inbox's rows and an approval page's status, live.
//!
//! Every SSE event's id is the server's event seq (a `link` event, saying whether the inbox
//! is connected to the server, has none). A reconnecting browser sends
//! `Last-Event-ID` (the first connection passes the seq the page was rendered at as `after`)
//! and receives only what came after it. Rows are keyed by approval id, so a change applied
//! twice (after a resync) replaces the row instead of adding one.

use std::convert::Infallible;
use std::sync::Arc;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use countersign_client::pb;
use futures::{Stream, StreamExt};
use serde_json::json;
use tokio::sync::{broadcast, mpsc};

use crate::app::App;
use crate::auth::Viewer;
use crate::http::Refusal;
use crate::live::{Change, ChangeKind, Resume};
use crate::pages::{in_inbox, inbox_rows, RowsFragment, StatusFragment};
use crate::view::{Filters, Row, Status};

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct EventsQuery {
    agent: String,
    tool: String,
    risk: String,
    /// Follow one approval (its page) instead of the inbox.
    approval: String,
    /// The seq the page was rendered at (used when no `Last-Event-ID` is sent).
    after: Option<u64>,
}

pub async fn events(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    headers: HeaderMap,
    Query(query): Query<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Refusal> {
    let after = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .or(query.after)
        .unwrap_or(0);
    let (changes, resume) = app.live.subscribe(after);
    let (sender, receiver) = mpsc::channel(256);
    let feed = Feed {
        app: Arc::clone(&app),
        viewer,
        filters: Filters {
            agent: query.agent,
            tool: query.tool,
            risk: query.risk,
        },
        approval: query.approval,
        sender,
    };
    tokio::spawn(feed.run(changes, resume, after));
    let stream = tokio_stream::wrappers::ReceiverStream::new(receiver).map(Ok);
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// One open page's stream.
struct Feed {
    app: Arc<App>,
    viewer: Viewer,
    filters: Filters,
    /// Empty: the inbox.
    approval: String,
    sender: mpsc::Sender<Event>,
}

impl Feed {
    async fn run(self, mut changes: broadcast::Receiver<Arc<Change>>, resume: Resume, after: u64) {
        let mut last = after;
        let mut closing = self.app.closing.clone();
        let mut link = self.app.live.link();
        let linked = *link.borrow_and_update();
        if !self.send(link_event(linked)).await {
            return;
        }
        let sent = match resume {
            Resume::Resync(seq) => self.resync(seq, &mut last).await,
            Resume::Changes(replay) => {
                let mut sent = true;
                for change in replay {
                    sent = sent && self.change(&change, &mut last).await;
                }
                sent
            }
        };
        if !sent {
            return;
        }
        loop {
            let received = tokio::select! {
                received = changes.recv() => Some(received),
                Ok(()) = link.changed() => None,
                () = self.sender.closed() => return,
                _ = closing.wait_for(|closing| *closing) => return,
            };
            let Some(received) = received else {
                let linked = *link.borrow_and_update();
                if !self.send(link_event(linked)).await {
                    return;
                }
                continue;
            };
            let sent = match received {
                // A resync replaces the page's picture whatever its seq: after a restart of
                // this binary the server's snapshot may be at or below what the page saw.
                Ok(change) if change.seq <= last && !matches!(change.kind, ChangeKind::Resync) => {
                    true
                }
                Ok(change) => self.change(&change, &mut last).await,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "page stream lagged; resyncing it");
                    let (_, seq) = self.app.live.pending();
                    self.resync(seq, &mut last).await
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if !sent {
                return;
            }
        }
    }

    /// Sends what `change` means for this page; false once the page is gone.
    async fn change(&self, change: &Change, last: &mut u64) -> bool {
        match &change.kind {
            ChangeKind::Resync => self.resync(change.seq, last).await,
            ChangeKind::Approval(approval) => {
                *last = change.seq;
                match self.event_for(approval) {
                    Some(event) => self.send(event.id(change.seq.to_string())).await,
                    None => true,
                }
            }
        }
    }

    fn event_for(&self, approval: &pb::Approval) -> Option<Event> {
        if self.approval.is_empty() {
            let shown = in_inbox(&self.app, &self.viewer.approver.id, &self.filters, approval);
            let data = if shown {
                let html = RowsFragment {
                    rows: vec![Row::of(approval)],
                }
                .render()
                .ok()?;
                json!({ "id": approval.id, "pending": true, "html": html })
            } else {
                json!({ "id": approval.id, "pending": false })
            };
            Some(Event::default().event("row").data(data.to_string()))
        } else if approval.id == self.approval {
            Some(status_event(approval))
        } else {
            None
        }
    }

    /// The whole picture again: the inbox's rows, or the approval's status.
    async fn resync(&self, seq: u64, last: &mut u64) -> bool {
        if self.approval.is_empty() && !self.app.live.is_ready() {
            // Nothing known yet (this binary just started): the page keeps its rows until the
            // first snapshot's resync replaces them.
            return true;
        }
        *last = seq;
        let event = if self.approval.is_empty() {
            let (pending, _) = self.app.live.pending();
            let rows = inbox_rows(&self.app, &pending, &self.viewer.approver.id, &self.filters);
            let Ok(html) = (RowsFragment { rows }).render() else {
                return false;
            };
            Event::default()
                .event("resync")
                .data(json!({ "html": html }).to_string())
        } else {
            match self.app.client.get_approval(&self.approval).await {
                Ok(approval) => status_event(&approval),
                Err(error) => {
                    tracing::warn!(%error, approval = %self.approval, "cannot refresh an approval page");
                    return true;
                }
            }
        };
        self.send(event.id(seq.to_string())).await
    }

    async fn send(&self, event: Event) -> bool {
        self.sender.send(event).await.is_ok()
    }
}

/// Whether the inbox is connected to the server. No id: it is no change of the pending set,
/// and the page's resume point stays where it was.
fn link_event(linked: bool) -> Event {
    Event::default()
        .event("link")
        .data(json!({ "up": linked }).to_string())
}

fn status_event(approval: &pb::Approval) -> Event {
    let status = Status::of(approval);
    let pending = status.pending;
    let html = StatusFragment { status }.render().unwrap_or_default();
    Event::default()
        .event("status")
        .data(json!({ "id": approval.id, "pending": pending, "html": html }).to_string())
}
