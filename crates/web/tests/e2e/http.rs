//! The inbox over plain HTTP: sign-in, refusals (no session, bad CSRF token), escaping,
//! security headers, a rejection reaching the waiting agent, SSE resume after a reconnect,
//! proxy sign-in.

use std::time::Duration;

use countersign_client::pb;
use reqwest::header::{CONTENT_SECURITY_POLICY, COOKIE, LOCATION, SET_COOKIE};
use reqwest::{redirect, StatusCode};

use crate::common::{eventually, Mode, Setup};

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .build()
        .expect("HTTP client")
}

/// Signs in with a fresh login link; returns the cookie header value.
async fn sign_in(setup: &Setup, approver: &str, name: &str) -> String {
    let link = setup.web.issue_login(approver, name).await;
    let token = link.rsplit('/').next().expect("token").to_owned();
    let page = http().get(&link).send().await.expect("login page");
    assert_eq!(page.status(), StatusCode::OK);
    let body = page.text().await.expect("body");
    assert!(body.contains("id=\"sign-in\""), "{body}");
    let login = || {
        http()
            .post(format!("{}/login", setup.web.url))
            .form(&[("token", token.as_str())])
            .send()
    };
    let response = login().await.expect("login");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let cookie = response
        .headers()
        .get(SET_COOKIE)
        .expect("session cookie")
        .to_str()
        .expect("ascii")
        .to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Max-Age=", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    // A login link works once.
    let again = login().await.expect("login again");
    assert_eq!(again.status(), StatusCode::FORBIDDEN);
    cookie.split(';').next().expect("name=value").to_owned()
}

/// The CSRF token of the signed-in page.
fn csrf_of(page: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let start = page.find(marker).expect("a form with a CSRF token") + marker.len();
    page[start..start + 64].to_owned()
}

/// The page at `path` once it shows `id`: the inbox learns of approvals through its watch, a
/// moment after they are created.
async fn page_showing(setup: &Setup, path: &str, cookie: &str, id: &str) -> String {
    let mut page = String::new();
    for _ in 0..200 {
        page = get(setup, path, cookie).await.1;
        if page.contains(id) {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{path} never showed {id}: {page}");
}

/// Posts a form as the holder of `cookie`.
async fn post(
    url: &str,
    cookie: &str,
    form: &(impl serde::Serialize + ?Sized),
) -> reqwest::Response {
    http()
        .post(url)
        .header(COOKIE, cookie)
        .form(form)
        .send()
        .await
        .expect("POST")
}

async fn get(setup: &Setup, path: &str, cookie: &str) -> (StatusCode, String) {
    let response = http()
        .get(format!("{}{path}", setup.web.url))
        .header(COOKIE, cookie)
        .send()
        .await
        .expect("GET");
    (response.status(), response.text().await.expect("body"))
}

#[tokio::test]
async fn missing_sessions_and_csrf_failures_are_refused_and_change_nothing() {
    let setup = Setup::start(Mode::Login).await;
    let approval = setup
        .request("coder", "rm -rf build", pb::Risk::Medium)
        .await;
    let decide_url = format!("{}/approvals/{}/decide", setup.web.url, approval.id);

    for path in [
        "/",
        "/history",
        "/events?after=0",
        &format!("/approvals/{}", approval.id),
    ] {
        let response = http()
            .get(format!("{}{path}", setup.web.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let forged_cookie = "countersign_session=0123456789abcdef";
    let response = post(
        &decide_url,
        forged_cookie,
        &[("verdict", "approve"), ("csrf", "x")],
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    let cookie = sign_in(&setup, "alice", "Alice").await;
    let (status, inbox) = get(&setup, "/", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    let csrf = csrf_of(&inbox);
    for wrong in [None, Some("0".repeat(64)), Some(csrf[..63].to_owned())] {
        let mut form = vec![
            ("verdict", "approve".to_owned()),
            ("scope", "once".to_owned()),
        ];
        if let Some(token) = wrong {
            form.push(("csrf", token));
        }
        let response = post(&decide_url, &cookie, &form).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert!(response
            .text()
            .await
            .unwrap()
            .contains("nothing was changed"));
    }
    let unchanged = setup.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(unchanged.state(), pb::ApprovalState::Pending);
    assert!(unchanged.decisions.is_empty());

    // The same form with the right token decides, as alice on channel web.
    let response = post(
        &decide_url,
        &cookie,
        &[("verdict", "approve"), ("scope", "once"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        response.headers()[LOCATION],
        format!("/approvals/{}", approval.id).as_str()
    );
    let decided = setup.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(decided.state(), pb::ApprovalState::Approved);
    let decider = decided.decisions[0].decider.clone().unwrap();
    assert_eq!(
        (
            decider.channel.as_str(),
            decider.user_id.as_str(),
            decider.display_name.as_str()
        ),
        ("web", "alice", "Alice")
    );

    // Sign-out ends the session for good.
    let response = post(
        &format!("{}/logout", setup.web.url),
        &cookie,
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(get(&setup, "/", &cookie).await.0, StatusCode::UNAUTHORIZED);
    setup.web.stop().await;
}

#[tokio::test]
async fn agent_text_is_escaped_pages_have_a_strict_csp_and_a_rejection_reaches_the_agent() {
    let setup = Setup::start(Mode::Login).await;
    let cookie = sign_in(&setup, "alice", "Alice").await;
    let hostile = "<script>alert(1)</script><img src=x onerror=alert(2)> deploy";
    let approval = setup.request("coder", hostile, pb::Risk::High).await;

    let response = http()
        .get(format!("{}/approvals/{}", setup.web.url, approval.id))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    let csp = response.headers()[CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("style-src 'self'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    let page = response.text().await.unwrap();
    assert!(!page.contains("<script>alert"), "{page}");
    assert!(!page.contains("<img src=x"), "{page}");
    assert!(
        page.contains("&#60;script&#62;alert(1)&#60;/script&#62;")
            || page.contains("&lt;script&gt;alert(1)"),
        "{page}"
    );
    // No inline script or style anywhere: the only script is the vendored file.
    assert_eq!(page.matches("<script").count(), 1, "{page}");
    assert!(page.contains("<script src=\"/assets/app.js\" defer></script>"));
    assert!(!page.contains("style=\""));
    // The file edit is shown as a diff.
    assert!(
        page.contains("<span class=\"del\">-env=staging</span>"),
        "{page}"
    );
    assert!(
        page.contains("<span class=\"add\">+env=prod</span>"),
        "{page}"
    );
    assert!(page.contains(&approval.args_digest));
    // The timeline is the audit trail (the inbox has the admin token).
    // (audit entries are numbered by their seq: "#N requested").
    assert!(
        page.contains("</time> #") && page.contains(" requested</li>"),
        "{page}"
    );

    // A rejection's reason reaches the agent waiting for the decision.
    let waiting = {
        let agent = setup.agent.clone();
        let id = approval.id.clone();
        tokio::spawn(async move {
            agent
                .wait_until_resolved(&id, Duration::from_secs(20))
                .await
        })
    };
    let csrf = csrf_of(&page);
    let no_reason = post(
        &format!("{}/approvals/{}/decide", setup.web.url, approval.id),
        &cookie,
        &[("verdict", "reject"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(no_reason.status(), StatusCode::BAD_REQUEST);
    let response = post(
        &format!("{}/approvals/{}/decide", setup.web.url, approval.id),
        &cookie,
        &[
            ("verdict", "reject"),
            ("reason", "not on a Friday"),
            ("csrf", &csrf),
        ],
    )
    .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let resolved = waiting.await.unwrap().expect("resolved");
    assert_eq!(resolved.state(), pb::ApprovalState::Rejected);
    assert_eq!(resolved.resolution.unwrap().reason, "not on a Friday");
    setup.web.stop().await;
}

/// Reads SSE events (`id`, `event`, `data`) from a response until `count` arrived.
async fn read_events(response: &mut reqwest::Response, count: usize) -> Vec<(u64, String, String)> {
    let mut buffer = String::new();
    let mut events = Vec::new();
    while events.len() < count {
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.chunk())
            .await
            .unwrap_or_else(|_| panic!("no event within 10 s; got {events:?}, unparsed {buffer:?}"))
            .expect("stream")
            .expect("stream open");
        buffer.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|line| line.strip_prefix(&format!("{name}:")))
                    .map(|value| value.trim_start().to_owned())
            };
            if let (Some(id), Some(event), Some(data)) =
                (field("id"), field("event"), field("data"))
            {
                events.push((id.parse().expect("numeric id"), event, data));
            }
        }
    }
    events
}

#[tokio::test]
async fn an_inbox_stream_resumes_after_a_reconnect_without_missing_or_repeating() {
    let setup = Setup::start(Mode::Login).await;
    let cookie = sign_in(&setup, "alice", "Alice").await;
    let first = setup.request("coder", "first", pb::Risk::Low).await;
    let inbox = page_showing(&setup, "/", &cookie, &first.id).await;
    let seq_marker = "data-seq=\"";
    let start = inbox.find(seq_marker).unwrap() + seq_marker.len();
    let seq: u64 = inbox[start..].split('"').next().unwrap().parse().unwrap();

    let mut stream = http()
        .get(format!("{}/events?after={seq}", setup.web.url))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let second = setup.request("coder", "second", pb::Risk::Low).await;
    let events = read_events(&mut stream, 1).await;
    assert_eq!(events[0].1, "row");
    assert!(events[0].2.contains(&second.id) && events[0].2.contains("\"pending\":true"));
    let last_seen = events[0].0;
    drop(stream);

    // While disconnected: a third arrives and the first is decided elsewhere.
    let third = setup.request("coder", "third", pb::Risk::Low).await;
    setup.decide_on_telegram(&first.id, "2222", "Bob").await;
    let mut resumed = http()
        .get(format!("{}/events?after=0", setup.web.url))
        .header(COOKIE, &cookie)
        .header("Last-Event-ID", last_seen.to_string())
        .send()
        .await
        .unwrap();
    let events = read_events(&mut resumed, 2).await;
    assert!(
        events
            .iter()
            .all(|(id, kind, _)| *id > last_seen && kind == "row"),
        "{events:?}"
    );
    assert!(events[0].2.contains(&third.id), "{events:?}");
    assert!(
        events[1].2.contains(&first.id) && events[1].2.contains("\"pending\":false"),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|(_, _, data)| data.contains(&second.id)),
        "{events:?}"
    );
    setup.web.stop().await;
}

/// A page that reconnects to a restarted web binary before it has heard from the server keeps
/// its rows, and gets the whole list once the server answers, even when nothing happened in
/// between (the snapshot's seq is the one the page had already seen).
#[tokio::test]
async fn a_page_reconnecting_to_a_restarted_inbox_gets_the_list_back() {
    let mut setup = Setup::start(Mode::Login).await;
    let cookie = sign_in(&setup, "alice", "Alice").await;
    let first = setup.request("coder", "first", pb::Risk::Low).await;
    let inbox = page_showing(&setup, "/", &cookie, &first.id).await;
    let seq_marker = "data-seq=\"";
    let start = inbox.find(seq_marker).unwrap() + seq_marker.len();
    let seen: u64 = inbox[start..].split('"').next().unwrap().parse().unwrap();

    setup.server.stop().await;
    setup.web.restart().await;
    let mut resumed = http()
        .get(format!("{}/events", setup.web.url))
        .header(COOKIE, &cookie)
        .header("Last-Event-ID", seen.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    setup.server.restart().await;
    let events = read_events(&mut resumed, 1).await;
    assert_eq!(events[0].1, "resync", "{events:?}");
    assert!(events[0].2.contains(&first.id), "{events:?}");
    assert_eq!(events[0].0, seen);
    setup.web.stop().await;
}

#[tokio::test]
async fn proxy_sign_in_trusts_the_header_only_from_the_configured_proxies() {
    let mut trusted = Setup::start(Mode::Proxy(&["127.0.0.1"])).await;
    let response = http()
        .get(format!("{}/", trusted.web.url))
        .header("X-Forwarded-User", "bob")
        .header("X-Forwarded-Name", "Bob B.")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response
        .text()
        .await
        .unwrap()
        .contains("<b id=\"who\">Bob B.</b>"));
    // Forms still need the approver's CSRF token.
    let approval = trusted.request("coder", "tidy up", pb::Risk::Low).await;
    let page = http()
        .get(format!("{}/approvals/{}", trusted.web.url, approval.id))
        .header("X-Forwarded-User", "bob")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let decide_url = format!("{}/approvals/{}/decide", trusted.web.url, approval.id);
    let decide = |csrf: String| {
        http()
            .post(&decide_url)
            .header("X-Forwarded-User", "bob")
            .form(&[("verdict", "approve".to_owned()), ("csrf", csrf)])
            .send()
    };
    assert_eq!(
        decide("0".repeat(64)).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    // The page's form still works after the inbox restarted: the key is kept.
    trusted.web.restart().await;
    assert_eq!(
        decide(csrf_of(&page)).await.unwrap().status(),
        StatusCode::SEE_OTHER
    );
    let decided = trusted.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(decided.decisions[0].decider.clone().unwrap().user_id, "bob");
    let anonymous = http()
        .get(format!("{}/", trusted.web.url))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    trusted.web.stop().await;

    let elsewhere = Setup::start(Mode::Proxy(&["10.9.9.9"])).await;
    let response = http()
        .get(format!("{}/", elsewhere.web.url))
        .header("X-Forwarded-User", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    elsewhere.web.stop().await;
}

#[tokio::test]
async fn history_is_searchable_and_admins_revoke_grants() {
    let setup = Setup::start(Mode::Login).await;
    let alice = sign_in(&setup, "alice", "Alice").await;
    let bob = sign_in(&setup, "bob", "Bob").await;
    let deploy = setup
        .request("deployer", "deploy the payments service", pb::Risk::High)
        .await;
    let cleanup = setup
        .request("janitor", "clean the tmp directory", pb::Risk::Medium)
        .await;
    let (_, page) = get(&setup, &format!("/approvals/{}", deploy.id), &alice).await;
    let csrf = csrf_of(&page);
    for (approval, scope) in [(&deploy, "session"), (&cleanup, "once")] {
        let response = post(
            &format!("{}/approvals/{}/decide", setup.web.url, approval.id),
            &alice,
            &[("verdict", "approve"), ("scope", scope), ("csrf", &csrf)],
        )
        .await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
    }

    // More newer history than a search reads at once (500): it reads on and still finds the
    // older match.
    for n in 0..520 {
        let filler = setup
            .request("filler", &format!("routine job {n}"), pb::Risk::Low)
            .await;
        setup
            .agent
            .cancel_approval(&filler.id, "not needed")
            .await
            .unwrap();
    }
    let (status, found) = get(&setup, "/history?q=PAYMENTS", &alice).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        found.contains(&deploy.id) && !found.contains(&cleanup.id),
        "{found}"
    );
    let (_, by_agent) = get(&setup, "/history?agent=janitor&state=approved", &alice).await;
    assert!(
        by_agent.contains(&cleanup.id) && !by_agent.contains(&deploy.id),
        "{by_agent}"
    );
    let (_, rejected) = get(&setup, "/history?state=rejected", &alice).await;
    assert!(!rejected.contains(&deploy.id) && !rejected.contains(&cleanup.id));
    assert_eq!(
        get(&setup, "/history?state=bogus", &alice).await.0,
        StatusCode::BAD_REQUEST
    );

    // Grants: alice is an admin of the inbox, bob is not.
    let grant = setup
        .admin
        .list_grants(pb::ListGrantsRequest::default())
        .await
        .unwrap()
        .grants
        .into_iter()
        .find(|g| g.approval_id == deploy.id)
        .expect("the session approval's grant");
    let (status, grants) = get(&setup, "/grants", &alice).await;
    assert_eq!(status, StatusCode::OK);
    assert!(grants.contains(&grant.id), "{grants}");
    assert_eq!(get(&setup, "/grants", &bob).await.0, StatusCode::FORBIDDEN);
    let (_, bob_page) = get(&setup, "/", &bob).await;
    let revoke_url = format!("{}/grants/{}/revoke", setup.web.url, grant.id);
    let refused = http()
        .post(&revoke_url)
        .header(COOKIE, &bob)
        .form(&[("csrf", csrf_of(&bob_page))])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let revoked = http()
        .post(&revoke_url)
        .header(COOKIE, &alice)
        .form(&[("csrf", csrf.as_str()), ("reason", "session over")])
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), StatusCode::SEE_OTHER);
    let now = setup
        .admin
        .list_grants(pb::ListGrantsRequest {
            include_inactive: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .grants
        .into_iter()
        .find(|g| g.id == grant.id)
        .unwrap();
    assert!(!now.active && now.revoked_at.is_some(), "{now:?}");
    setup.web.stop().await;
}

#[tokio::test]
async fn a_batch_reports_per_approval_resolved_already_resolved_and_refused() {
    let setup = Setup::start(Mode::Login).await;
    // Carol may decide up to medium risk. Her batch names the critical approval too (a page
    // from before it went above her, a hand-made form): the server refuses it.
    let carol = sign_in(&setup, "carol", "Carol").await;
    let fine = setup
        .request("ops", "rotate the logs", pb::Risk::Medium)
        .await;
    let taken = setup
        .request("ops", "restart the cache", pb::Risk::Medium)
        .await;
    setup.decide_on_telegram(&taken.id, "2222", "Bob").await;
    // Requested after that decision: an inbox showing it has applied the decision too.
    let too_risky = setup
        .request("ops", "drop the database", pb::Risk::Critical)
        .await;
    // The inbox filters by risk, agent and tool; the riskiest comes first.
    let alice = sign_in(&setup, "alice", "Alice").await;
    let inbox = page_showing(&setup, "/", &alice, &too_risky.id).await;
    let position = |id: &str| inbox.find(&format!("id=\"row-{id}\"")).expect("a row");
    assert!(position(&too_risky.id) < position(&fine.id), "{inbox}");
    assert!(
        !inbox.contains(&format!("id=\"row-{}\"", taken.id)),
        "{inbox}"
    );
    let critical = get(&setup, "/?risk=critical", &alice).await.1;
    assert!(critical.contains(&too_risky.id) && !critical.contains(&fine.id));
    let other_agent = get(&setup, "/?agent=someone-else", &alice).await.1;
    assert!(!other_agent.contains(&too_risky.id) && !other_agent.contains(&fine.id));
    let by_tool = get(&setup, "/?agent=ops&tool=bash", &alice).await.1;
    assert!(by_tool.contains(&too_risky.id) && by_tool.contains(&fine.id));
    // Carol's inbox lists only what she may decide: not the critical one.
    let row = |id: &str| format!("id=\"row-{id}\"");
    eventually("Carol's inbox without the critical approval", || async {
        let page = get(&setup, "/", &carol).await.1;
        page.contains(&row(&fine.id)) && !page.contains(&row(&too_risky.id))
    })
    .await;
    let inbox = get(&setup, "/", &carol).await.1;
    let csrf = csrf_of(&inbox);
    let ids = [&fine.id, &taken.id, &too_risky.id];
    let mut form: Vec<(&str, &str)> = vec![("csrf", &csrf)];
    form.extend(ids.iter().map(|id| ("id", id.as_str())));
    let review = post(&format!("{}/batch", setup.web.url), &carol, &form).await;
    assert_eq!(review.status(), StatusCode::OK);
    let review = review.text().await.unwrap();
    for id in ids {
        assert!(review.contains(&format!("id=\"item-{id}\"")), "{review}");
    }
    form.push(("verdict", "approve"));
    let result = post(&format!("{}/batch/decide", setup.web.url), &carol, &form).await;
    assert_eq!(result.status(), StatusCode::OK);
    let result = result.text().await.unwrap();
    let line = |id: &str| {
        let start = result
            .find(&format!("data-id=\"{id}\""))
            .expect("a result line");
        let line = &result[..start];
        let class_start = line.rfind("class=\"").unwrap();
        let class = line[class_start..].to_owned();
        let end = result[start..].find("</tr>").unwrap();
        format!("{class}{}", &result[start..start + end])
    };
    let fine_line = line(&fine.id);
    assert!(
        fine_line.contains("result-resolved") && fine_line.contains("Approved by Carol (web)"),
        "{fine_line}"
    );
    let taken_line = line(&taken.id);
    assert!(
        taken_line.contains("result-already")
            && taken_line.contains("already resolved: Approved by Bob (telegram)"),
        "{taken_line}"
    );
    let risky_line = line(&too_risky.id);
    assert!(
        risky_line.contains("result-refused") && risky_line.contains("refused:"),
        "{risky_line}"
    );
    let risky = setup.agent.get_approval(&too_risky.id).await.unwrap();
    assert_eq!(risky.state(), pb::ApprovalState::Pending);
    setup.web.stop().await;
}

#[tokio::test]
async fn sigterm_ends_open_event_streams_and_exits() {
    let setup = Setup::start(Mode::Login).await;
    let cookie = sign_in(&setup, "alice", "Alice").await;
    let mut stream = http()
        .get(format!("{}/events?after=0", setup.web.url))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    // The new approval comes as its row, or, when the inbox's watch opened only after the
    // request (a slow start), inside the first snapshot's resync: the last event read.
    let approval = setup.request("coder", "a row", pb::Risk::Low).await;
    let mut events = Vec::new();
    while !events
        .iter()
        .any(|(_, kind, data): &(u64, String, String)| {
            (kind == "row" || kind == "resync") && data.contains(&approval.id)
        })
    {
        events.extend(read_events(&mut stream, 1).await);
    }
    let status = setup.web.terminate().await.expect("exited within 10 s");
    assert!(status.success(), "{status:?}");
    let rest = tokio::time::timeout(Duration::from_secs(5), stream.chunk()).await;
    assert!(matches!(rest, Ok(Ok(None)) | Ok(Err(_))), "{rest:?}");
}

/// What a browser sends when Enter submits a decision form implicitly (its first submit
/// button, which names no verdict), a form without any verdict, a rejection without a reason,
/// and a batch review of nothing: each decides nothing and comes back as the form itself,
/// with the error and what the approver had typed, instead of a bare error page.
#[tokio::test]
async fn a_form_without_an_explicit_verdict_decides_nothing_and_comes_back_with_the_error() {
    let setup = Setup::start(Mode::Login).await;
    let cookie = sign_in(&setup, "alice", "Alice").await;
    let drop = setup
        .request("db-migrator", "DROP DATABASE prod", pb::Risk::Critical)
        .await;
    let other = setup
        .request("db-migrator", "VACUUM FULL", pb::Risk::Medium)
        .await;
    let page = page_showing(
        &setup,
        &format!("/approvals/{}", drop.id),
        &cookie,
        &drop.id,
    )
    .await;
    let csrf = csrf_of(&page);
    let decide = format!("{}/approvals/{}/decide", setup.web.url, drop.id);
    let reason = "NO - this would destroy prod";
    for (form, error) in [
        (
            vec![("csrf", csrf.as_str()), ("verdict", ""), ("reason", reason)],
            "Enter does not decide",
        ),
        (
            vec![("csrf", csrf.as_str()), ("reason", reason)],
            "Enter does not decide",
        ),
        (
            vec![
                ("csrf", csrf.as_str()),
                ("verdict", "reject"),
                ("reason", " "),
            ],
            "needs a reason",
        ),
    ] {
        let response = post(&decide, &cookie, &form).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{form:?}");
        let body = response.text().await.unwrap();
        assert!(body.contains("id=\"decide\""), "the form again: {body}");
        assert!(body.contains("id=\"form-error\""), "{body}");
        assert!(body.contains(error), "{error}: {body}");
        if form.iter().any(|(_, value)| *value == reason) {
            assert!(
                body.contains(&format!("value=\"{reason}\"")),
                "reason kept: {body}"
            );
        }
    }
    // The form's first submit button names no verdict: that is the one Enter uses.
    let first_button = &page[page.find("id=\"decide\"").unwrap()..];
    let first_button = &first_button[first_button.find("<button").unwrap()..];
    assert!(
        first_button.starts_with("<button type=\"submit\" name=\"verdict\" value=\"\""),
        "{first_button}"
    );

    // The batch page, likewise.
    let ids = [drop.id.as_str(), other.id.as_str()];
    let batch = format!("{}/batch/decide", setup.web.url);
    let mut form: Vec<(&str, &str)> = vec![("csrf", &csrf), ("verdict", ""), ("reason", "no")];
    form.extend(ids.iter().map(|id| ("id", *id)));
    let response = post(&batch, &cookie, &form).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = response.text().await.unwrap();
    assert!(body.contains("id=\"batch-decide\""), "{body}");
    assert!(body.contains("Enter does not decide"), "{body}");
    for id in ids {
        assert!(body.contains(&format!("id=\"item-{id}\"")), "{body}");
    }
    for approval in [&drop, &other] {
        let now = setup.agent.get_approval(&approval.id).await.unwrap();
        assert_eq!(now.state(), pb::ApprovalState::Pending);
        assert!(now.decisions.is_empty(), "{:?}", now.decisions);
    }

    // Review selected with nothing ticked: the inbox again, saying what to do.
    let response = post(
        &format!("{}/batch", setup.web.url),
        &cookie,
        &[("csrf", csrf.as_str())],
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = response.text().await.unwrap();
    assert!(body.contains("id=\"inbox\""), "{body}");
    assert!(body.contains("Tick at least one approval"), "{body}");

    // The browser's favicon request is answered.
    let favicon = http()
        .get(format!("{}/favicon.ico", setup.web.url))
        .send()
        .await
        .unwrap();
    assert_eq!(favicon.status(), StatusCode::OK);
    assert_eq!(favicon.headers()["content-type"], "image/x-icon");
    assert!(favicon.bytes().await.unwrap().starts_with(&[0, 0, 1, 0]));
    setup.web.stop().await;
}

/// Asserts `body` is one of the inbox's own pages with a link back to the inbox, saying `says`.
fn a_page_with_a_way_back(body: &str, says: &str) {
    assert!(body.contains("<a href=\"/\" id=\"back\">"), "{body}");
    assert!(
        body.contains("/assets/app.css"),
        "in the inbox's style: {body}"
    );
    assert!(body.contains(says), "{body}");
}

#[tokio::test]
async fn unknown_pages_wrong_methods_and_a_lost_server_answer_with_a_page_and_a_way_back() {
    let mut setup = Setup::start(Mode::Login).await;
    let cookie = sign_in(&setup, "alice", "Alice").await;

    // An address that is no page, signed in or not.
    for cookie in [cookie.as_str(), ""] {
        let (status, body) = get(&setup, "/no/such/page", cookie).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        a_page_with_a_way_back(&body, "There is no page at this address");
    }

    // A method the address does not take: 405 with Allow, and a page.
    let approval = setup.request("coder", "deploy", pb::Risk::High).await;
    for (method, path, allowed) in [
        (reqwest::Method::POST, "/".to_owned(), "GET"),
        (
            reqwest::Method::GET,
            format!("/approvals/{}/decide", approval.id),
            "POST",
        ),
        (reqwest::Method::DELETE, "/history".to_owned(), "GET"),
    ] {
        let response = http()
            .request(method.clone(), format!("{}{path}", setup.web.url))
            .header(COOKIE, &cookie)
            .send()
            .await
            .expect("request");
        assert_eq!(
            response.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        let allow = response.headers()["allow"]
            .to_str()
            .expect("ascii")
            .to_owned();
        assert!(allow.contains(allowed), "{method} {path}: Allow {allow}");
        assert!(response.headers().contains_key(CONTENT_SECURITY_POLICY));
        a_page_with_a_way_back(&response.text().await.expect("body"), "nothing was changed");
    }

    // The server gone: what it means and what to do, no transport internals.
    setup.server.stop().await;
    let (status, body) = get(&setup, &format!("/approvals/{}", approval.id), &cookie).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    a_page_with_a_way_back(&body, "The countersign server cannot be reached right now");
    assert!(body.contains("tell whoever runs countersign"), "{body}");
    for internal in [
        "tcp",
        "connect error",
        "transport",
        "Unavailable",
        "unavailable:",
    ] {
        assert!(!body.contains(internal), "{internal:?} in {body}");
    }
    setup.web.stop().await;
}
