-- The PostgreSQL schema: the same model as migrations/sqlite/ after its last migration (a test
-- compares the two), in one migration. PostgreSQL-only: `rate_buckets`, the request and
-- decision rate limits that several replicas share.

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
    created_at_ms   BIGINT NOT NULL,
    expires_at_ms   BIGINT NOT NULL,
    body            TEXT NOT NULL,
    UNIQUE (agent_id, idempotency_key)
);
CREATE INDEX approvals_pending_by_expiry ON approvals (expires_at_ms) WHERE state = 'PENDING';
CREATE INDEX approvals_by_state ON approvals (state, id);
CREATE INDEX approvals_by_agent ON approvals (agent_id, id);
CREATE INDEX approvals_pending_by_agent ON approvals (agent_id, state, expires_at_ms) WHERE state = 'PENDING';

-- The append-only event log and audit trail. `seq` is the global cursor: the writer that holds
-- the lock on the `audit_anchor` row assigns it (head_seq + 1, ...) inside its transaction, so
-- seqs are gap-free and in commit order across every replica.
CREATE TABLE events (
    seq         BIGINT PRIMARY KEY NOT NULL,
    approval_id TEXT NOT NULL,
    kind        TEXT NOT NULL,
    at_ms       BIGINT NOT NULL,
    body        TEXT NOT NULL,
    prev_hash   TEXT,
    hash        TEXT,
    agent_id    TEXT NOT NULL DEFAULT '',
    decider     TEXT NOT NULL DEFAULT '',
    approver    TEXT NOT NULL DEFAULT ''
);
CREATE INDEX events_by_approval ON events (approval_id, seq);
CREATE INDEX events_by_time ON events (at_ms);
CREATE INDEX events_unhashed ON events (seq) WHERE hash IS NULL;
CREATE INDEX events_by_agent ON events (agent_id, seq);
CREATE INDEX events_by_decider ON events (decider, seq) WHERE decider <> '';
CREATE INDEX events_by_approver ON events (approver, seq) WHERE approver <> '';

-- Session grants, bounded by the risk, quorum and argument scope of the approval that made them.
CREATE TABLE grants (
    id                     TEXT PRIMARY KEY NOT NULL,
    agent_id               TEXT NOT NULL,
    session_id             TEXT NOT NULL,
    tool_name              TEXT NOT NULL,
    approval_id            TEXT NOT NULL,
    granted_by             TEXT NOT NULL,
    created_at_ms          BIGINT NOT NULL,
    expires_at_ms          BIGINT,
    revoked_at_ms          BIGINT,
    max_risk_rank          BIGINT NOT NULL DEFAULT 0,
    max_required_approvals BIGINT NOT NULL DEFAULT 0,
    scope                  TEXT NOT NULL DEFAULT ''
);
CREATE INDEX grants_by_scope ON grants (agent_id, session_id, tool_name);

-- The ends of the hash chain (see migrations/sqlite/0005). Its one row is also the lock that
-- serializes the writers of every replica.
CREATE TABLE audit_anchor (
    id             BIGINT PRIMARY KEY CHECK (id = 1),
    head_seq       BIGINT NOT NULL,
    head_hash      TEXT NOT NULL,
    tail_seq       BIGINT NOT NULL,
    tail_prev_hash TEXT NOT NULL
);
INSERT INTO audit_anchor (id, head_seq, head_hash, tail_seq, tail_prev_hash) VALUES (1, 0, '', 1, '');

-- The head follows every inserted row, once per statement.
CREATE FUNCTION events_move_anchor_head() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE audit_anchor SET head_seq = newest.seq, head_hash = coalesce(newest.hash, '')
      FROM (SELECT seq, hash FROM inserted ORDER BY seq DESC LIMIT 1) AS newest
     WHERE id = 1 AND newest.seq > head_seq;
    RETURN NULL;
END;
$$;
CREATE TRIGGER events_move_anchor_head AFTER INSERT ON events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION events_move_anchor_head();

CREATE TABLE storage_probe (
    id    BIGINT PRIMARY KEY CHECK (id = 1),
    at_ms BIGINT NOT NULL
);

-- Token buckets of the rate limits (limits.requests_per_minute and the others), one per
-- limit and key, shared by every replica.
CREATE TABLE rate_buckets (
    key        TEXT PRIMARY KEY NOT NULL,
    available  DOUBLE PRECISION NOT NULL,
    updated_ms BIGINT NOT NULL
);

-- SQLite's instr(), so that the backends share their read statements.
CREATE FUNCTION instr(haystack TEXT, needle TEXT) RETURNS INTEGER
    LANGUAGE sql IMMUTABLE STRICT AS $$ SELECT strpos(haystack, needle) $$;
