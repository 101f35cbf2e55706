//! `WatchApprovals` on the wire: the items of an application-layer watch
//! ([`crate::app::Watch`]) as `ApprovalEvent`s, then the error it ended with as a status.

use std::pin::Pin;

use countersign_proto::v1 as pb;
use futures::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::app::{Watch, WatchItem};
use crate::convert::{approval_to_pb, event_to_pb, timestamp};

pub type WatchStream =
    Pin<Box<dyn futures::Stream<Item = Result<pb::ApprovalEvent, Status>> + Send>>;

/// The watch's items first (each carrying the log's history id), then the status it ended
/// with, if any.
pub fn stream(watch: Watch) -> WatchStream {
    let Watch {
        history,
        items,
        end,
    } = watch;
    let events = ReceiverStream::new(items).map(move |item| Ok(item_to_pb(item, &history)));
    let end = futures::stream::once(end)
        .filter_map(|ended| async move { ended.ok().map(|error| Err(Status::from(error))) });
    Box::pin(events.chain(end))
}

fn item_to_pb(item: WatchItem, history: &str) -> pb::ApprovalEvent {
    let marker = |kind: pb::EventKind, seq: i64, at| pb::ApprovalEvent {
        seq: seq.max(0) as u64,
        kind: kind as i32,
        approval: None,
        at: Some(timestamp(at)),
        decision: None,
        delivery: None,
        detail: String::new(),
        history_id: history.to_owned(),
    };
    match item {
        WatchItem::Event(event) => pb::ApprovalEvent {
            history_id: history.to_owned(),
            ..event_to_pb(&event)
        },
        WatchItem::Snapshot { approval, at } => pb::ApprovalEvent {
            approval: Some(approval_to_pb(&approval)),
            ..marker(pb::EventKind::Snapshot, 0, at)
        },
        WatchItem::SnapshotComplete { head_seq, at } => {
            marker(pb::EventKind::SnapshotComplete, head_seq, at)
        }
        WatchItem::Heartbeat { examined, at } => marker(pb::EventKind::Heartbeat, examined, at),
    }
}
