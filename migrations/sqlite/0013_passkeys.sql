-- Passkeys approvers registered in the web inbox, for step-up approvals (issue 40). The public
-- key is the COSE_Key the authenticator gave, base64url.
CREATE TABLE passkeys (
    credential_id TEXT PRIMARY KEY NOT NULL,
    approver      TEXT NOT NULL,
    name          TEXT NOT NULL,
    cose_key      TEXT NOT NULL,
    algorithm     INTEGER NOT NULL,
    sign_count    INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE INDEX passkeys_by_approver ON passkeys (approver);
