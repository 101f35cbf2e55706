//! The database volume fills up for a while and is freed again: every write answered OK is
//! committed, writes in between are refused naming the storage, health says NOT_SERVING, and
//! writes work again without a restart once there is space.
//!
//! Mounts a small tmpfs (tests run as root, as on the project's machines and CI).

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use countersign_proto::v1 as pb;
use countersign_testkit::server::TestServer;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A tmpfs of `size` mounted on a temporary directory; unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a tmpfs failed ({status}); this test needs root, as CI has"
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a connection the stopped server has not closed yet must not keep it mounted.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the volume of `dir` with one file until the disk says it is full.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("create filler");
    let block = vec![0xA5u8; 4096];
    loop {
        match file.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
    let _ = file.sync_all();
    path
}

/// A request whose arguments are large enough that each commit needs new pages.
fn bulky(key: &str) -> pb::RequestApprovalRequest {
    let mut req = request("agent-disk", key);
    req.arguments_json =
        serde_json::json!({ "script": "x".repeat(16 * 1024), "key": key }).to_string();
    req
}

async fn health(server: &TestServer) -> ServingStatus {
    let mut health = HealthClient::new(channel(server).await);
    let answer = health
        .check(HealthCheckRequest {
            service: "countersign.v1.ApprovalService".into(),
        })
        .await
        .expect("health check")
        .into_inner();
    ServingStatus::try_from(answer.status).expect("known status")
}

async fn wait_for_health(server: &TestServer, wanted: ServingStatus) {
    for _ in 0..100 {
        if health(server).await == wanted {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("health never became {wanted:?}");
}

/// Panics unless every acknowledged approval can be read back.
async fn assert_all_stored(client: &mut Client, acknowledged: &[String], when: &str) {
    for id in acknowledged {
        client
            .get_approval(pb::GetApprovalRequest {
                approval_id: id.clone(),
            })
            .await
            .unwrap_or_else(|status| panic!("acknowledged approval {id} lost {when}: {status:?}"));
    }
}

async fn state_of(client: &mut Client, id: &str) -> pb::ApprovalState {
    let approval = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: id.to_string(),
        })
        .await
        .expect("get approval")
        .into_inner();
    state(&approval)
}

fn assert_storage_refusal(status: &tonic::Status) {
    assert!(
        matches!(status.code(), Code::Unavailable | Code::ResourceExhausted),
        "a write the storage refused must be UNAVAILABLE or RESOURCE_EXHAUSTED, got {status:?}"
    );
    assert!(
        status.message().contains("storage"),
        "the refusal must name the storage: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_loses_nothing_acknowledged_and_recovers_without_restart() {
    if countersign_testkit::postgres::skip_unless_sqlite("fills the disk under a SQLite file") {
        return;
    }
    let volume = Tmpfs::mount("3m");
    let database = volume.path().join("countersign.db");
    let mut server = TestServer::start_with(|config| config.database = database.clone()).await;
    let mut client = connect(&server).await;
    let mut events = watch(&mut client, pb::WatchApprovalsRequest::default()).await;

    // The approvals whose creation was acknowledged.
    let mut acknowledged: Vec<String> = Vec::new();
    let to_decide = create(&mut client, bulky("before-0")).await;
    acknowledged.push(to_decide.id.clone());

    let filler = fill(volume.path());
    let mut refusals = 0;
    let mut decided_while_full = false;
    for i in 0..400 {
        match client.request_approval(bulky(&format!("full-{i}"))).await {
            Ok(answer) => acknowledged.push(answer.into_inner().approval.expect("approval").id),
            Err(status) => {
                assert_storage_refusal(&status);
                refusals += 1;
                if refusals == 1 {
                    // The health service learns of the refusal from the writer's signal, a
                    // moment after the refusal was answered.
                    wait_for_health(&server, ServingStatus::NotServing).await;
                    // A decision while the storage refuses writes is refused too, or stored.
                    match client
                        .decide(decide(&to_decide.id, pb::Verdict::Approve, "ops", "d-1"))
                        .await
                    {
                        Ok(_) => decided_while_full = true,
                        Err(status) => assert_storage_refusal(&status),
                    }
                }
                if refusals >= 5 {
                    break;
                }
            }
        }
    }
    assert!(
        refusals >= 5,
        "the disk never filled: {} writes were all acknowledged",
        acknowledged.len()
    );

    assert_all_stored(&mut client, &acknowledged, "while the disk was full").await;
    let expected = if decided_while_full {
        pb::ApprovalState::Approved
    } else {
        pb::ApprovalState::Pending
    };
    assert_eq!(
        state_of(&mut client, &to_decide.id).await,
        expected,
        "decision acknowledged = {decided_while_full}"
    );

    // Space returns: writes work again without a restart, and health follows.
    std::fs::remove_file(&filler).expect("free the disk");
    acknowledged.push(create(&mut client, bulky("after-0")).await.id);
    let outcome = client
        .decide(decide(&to_decide.id, pb::Verdict::Approve, "ops", "d-2"))
        .await
        .expect("decide after space returned")
        .into_inner();
    assert_eq!(
        state(&outcome.approval.expect("approval")),
        pb::ApprovalState::Approved
    );
    wait_for_health(&server, ServingStatus::Serving).await;

    // Every event a watcher saw is in the stored log.
    let mut seen = BTreeSet::new();
    while let Ok(Some(Ok(event))) =
        tokio::time::timeout(Duration::from_millis(300), events.message())
            .await
            .map(|m| m.transpose())
    {
        if kind(&event) != pb::EventKind::Heartbeat {
            seen.insert(event.seq);
        }
    }
    assert!(!seen.is_empty(), "the watcher saw no event");

    // After a restart, the same.
    server.restart().await;
    let mut client = connect(&server).await;
    assert_all_stored(&mut client, &acknowledged, "at restart").await;
    assert_eq!(
        state_of(&mut client, &to_decide.id).await,
        pb::ApprovalState::Approved
    );
    let mut admin = admin(&channel(&server).await, None);
    let stored: BTreeSet<u64> = all_events(&mut admin, pb::ListEventsRequest::default())
        .await
        .iter()
        .map(|e| e.event.as_ref().expect("event").seq)
        .collect();
    let missing: Vec<_> = seen.difference(&stored).collect();
    assert!(
        missing.is_empty(),
        "watched events missing from the log: {missing:?}"
    );
    let report = verify(&mut admin).await;
    assert!(report.intact, "{report:?}");
    server.stop().await;
}
