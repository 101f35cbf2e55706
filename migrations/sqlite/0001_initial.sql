-- Current state: one row per approval; `body` is the approval as JSON (countersign-core's type).
CREATE TABLE approvals (
    id              TEXT PRIMARY KEY NOT NULL,
    agent_id        TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    session_id      TEXT NOT NULL,
    tool_name       TEXT NOT NULL,
    state           TEXT NOT NULL,
    -- ",telegram,github," or "*" when routed nowhere (shown on every channel).
    channels        TEXT NOT NULL,
    created_at_ms   INTEGER NOT NULL,
    expires_at_ms   INTEGER NOT NULL,
    body            TEXT NOT NULL,
    UNIQUE (agent_id, idempotency_key)
);
CREATE INDEX approvals_pending_by_expiry ON approvals (expires_at_ms) WHERE state = 'PENDING';
CREATE INDEX approvals_by_state ON approvals (state, id);
CREATE INDEX approvals_by_agent ON approvals (agent_id, id);

-- The append-only event log and audit trail; `seq` is the global cursor, assigned by the
-- single writer inside the change's transaction.
CREATE TABLE events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    approval_id TEXT NOT NULL,
    kind        TEXT NOT NULL,
    at_ms       INTEGER NOT NULL,
    body        TEXT NOT NULL
);
CREATE INDEX events_by_approval ON events (approval_id, seq);
CREATE INDEX events_by_time ON events (at_ms);

-- Session grants: an approval with scope SESSION approves later calls of the same tool in the
-- same agent session.
CREATE TABLE grants (
    id            TEXT PRIMARY KEY NOT NULL,
    agent_id      TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    tool_name     TEXT NOT NULL,
    approval_id   TEXT NOT NULL,
    granted_by    TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER,
    revoked_at_ms INTEGER
);
CREATE INDEX grants_by_scope ON grants (agent_id, session_id, tool_name);
