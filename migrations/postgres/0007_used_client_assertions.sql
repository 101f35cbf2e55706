-- OpenID CIBA client assertions already used (issue 42): each private_key_jwt assertion's jti
-- is accepted once per client, on every replica and after a restart; a row is kept until the
-- assertion expires (later writes delete it). The twin of SQLite's 0014.
CREATE TABLE used_client_assertions (
    client_id TEXT NOT NULL,
    jti TEXT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    PRIMARY KEY (client_id, jti)
);
CREATE INDEX used_client_assertions_by_expiry ON used_client_assertions (expires_at_ms);
