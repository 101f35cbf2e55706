-- The per-agent pending limit counts an agent's unexpired pending approvals on every request.
-- With `state` in the partial index the count reads the index only, never the table rows.
DROP INDEX approvals_pending_by_agent;
CREATE INDEX approvals_pending_by_agent ON approvals (agent_id, state, expires_at_ms) WHERE state = 'PENDING';
