-- OpenID CIBA client assertions already used (issue 42): each private_key_jwt assertion's jti
-- is accepted once per client, also after a restart; a row is kept until the assertion
-- expires (later writes delete it). The twin of PostgreSQL's 0007.
CREATE TABLE used_client_assertions (
    client_id TEXT NOT NULL,
    jti TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (client_id, jti)
);
CREATE INDEX used_client_assertions_by_expiry ON used_client_assertions (expires_at_ms);
