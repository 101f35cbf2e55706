//! Tokens with roles and scopes on every RPC; health and reflection stay open; a token from the environment.

use super::*;

#[tokio::test]
async fn every_rpc_refuses_missing_unknown_wrong_role_and_out_of_scope_tokens_and_changes_nothing()
{
    let server = TestServer::start_with(|c| c.tokens = tokens()).await;
    let channel = channel(&server).await;
    let mut req = request("agent-a", "call-1");
    req.routes = vec![pb::Route {
        channel: "telegram".into(),
        target: String::new(),
    }];
    let approval = with_token(&channel, Some(CODER))
        .request_approval(req)
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    let before = stored_state(&server).await;

    for rpc in ALL_RPCS {
        for (token, expected) in [
            (None, Code::Unauthenticated),
            (Some("not-a-configured-token-42"), Code::Unauthenticated),
        ] {
            let status = call(&channel, rpc, &approval.id, token).await.unwrap_err();
            assert_eq!(
                status.code(),
                expected,
                "{rpc:?} with {token:?}: {status:?}"
            );
        }
        let (wrong_role, out_of_scope) = refused_tokens(rpc);
        for token in wrong_role.into_iter().chain(out_of_scope) {
            let status = call(&channel, rpc, &approval.id, Some(token))
                .await
                .unwrap_err();
            assert_eq!(
                status.code(),
                Code::PermissionDenied,
                "{rpc:?} with {token}: {status:?}"
            );
        }
    }
    assert_eq!(
        stored_state(&server).await,
        before,
        "a refused call changed something"
    );

    // The same calls with the right tokens get past authorization.
    for rpc in ALL_RPCS {
        if let Err(status) = call(&channel, rpc, &approval.id, Some(allowed_token(rpc))).await {
            assert!(
                !matches!(
                    status.code(),
                    Code::Unauthenticated | Code::PermissionDenied
                ),
                "{rpc:?} with its own token: {status:?}"
            );
        }
    }
    // An admin token may do what agents and workers do.
    assert!(call(&channel, Rpc::GetApproval, &approval.id, Some(ROOT))
        .await
        .is_ok());
}

#[tokio::test]
async fn health_and_reflection_stay_open_when_tokens_are_required() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let server = TestServer::start_with(|c| c.tokens = tokens()).await;
    let channel = channel(&server).await;
    for service in [
        "countersign.v1.ApprovalService",
        "countersign.v1.AdminService",
    ] {
        let answer = HealthClient::new(channel.clone())
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.status, ServingStatus::Serving as i32, "{service}");
    }
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let answer = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("unexpected reflection answer");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"countersign.v1.AdminService".to_string()),
        "{names:?}"
    );
}

#[tokio::test]
async fn a_token_may_come_from_an_environment_variable() {
    const VARIABLE: &str = "COUNTERSIGN_TEST_SECURITY_ENV_TOKEN";
    const SECRET: &str = "env-secret-token-0123456789";
    std::env::set_var(VARIABLE, SECRET);
    let server = TestServer::start_with(|c| {
        c.tokens = vec![TokenConfig {
            name: "from-env".into(),
            role: Role::Agent,
            agents: vec!["*".into()],
            channels: Vec::new(),
            value_env: Some(VARIABLE.into()),
            sha256: None,
        }]
    })
    .await;
    let channel = channel(&server).await;
    let created = with_token(&channel, Some(SECRET))
        .request_approval(request("any-agent", "call-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(created.created);
    let refused = with_token(&channel, Some(VARIABLE))
        .request_approval(request("any-agent", "call-2"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
}
