-- The audit hash chain, columns to filter the event history by, and an index for the
-- per-agent pending limit.

-- Each row's hash covers the previous row's hash and the row's canonical content (see the
-- server's `audit` module). Rows written before this migration get theirs when the server
-- starts, oldest first.
ALTER TABLE events ADD COLUMN prev_hash TEXT;
ALTER TABLE events ADD COLUMN hash TEXT;

-- Derived from the body, for ListEvents filters; verification checks they still match it.
ALTER TABLE events ADD COLUMN agent_id TEXT NOT NULL DEFAULT '';
-- "channel:user_id" of the event's decision, if any.
ALTER TABLE events ADD COLUMN decider TEXT NOT NULL DEFAULT '';
-- The approver the decision counted for, if any.
ALTER TABLE events ADD COLUMN approver TEXT NOT NULL DEFAULT '';

UPDATE events SET
    agent_id = coalesce(json_extract(body, '$.approval.agent_id'), ''),
    decider = coalesce(
        json_extract(body, '$.decision.decider.channel') || ':' ||
        json_extract(body, '$.decision.decider.user_id'), ''),
    approver = coalesce(json_extract(body, '$.decision.approver'), '');

-- Finds rows still to chain at start without reading the whole log.
CREATE INDEX events_unhashed ON events (seq) WHERE hash IS NULL;
CREATE INDEX events_by_agent ON events (agent_id, seq);
CREATE INDEX events_by_decider ON events (decider, seq);
CREATE INDEX events_by_approver ON events (approver, seq);

CREATE INDEX approvals_pending_by_agent ON approvals (agent_id, expires_at_ms) WHERE state = 'PENDING';
