-- Passkeys approvers registered in the web inbox, for step-up approvals (issue 40); the twin
-- of SQLite's 0013_passkeys.sql.
CREATE TABLE passkeys (
    credential_id TEXT PRIMARY KEY NOT NULL,
    approver      TEXT NOT NULL,
    name          TEXT NOT NULL,
    cose_key      TEXT NOT NULL,
    algorithm     BIGINT NOT NULL,
    sign_count    BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX passkeys_by_approver ON passkeys (approver);
