-- Approver groups, delegations, reminders and escalation (issue 18); the twin of SQLite's
-- 0009_groups_and_delegations.sql.

-- When a pending approval next needs the sweeper: its deadline, or an earlier reminder or
-- escalation. Rows from before this migration are due at their deadline.
ALTER TABLE approvals ADD COLUMN due_at_ms BIGINT;
UPDATE approvals SET due_at_ms = expires_at_ms;
CREATE INDEX approvals_pending_by_due ON approvals (due_at_ms) WHERE state = 'PENDING';

-- One approver deciding for another until a time.
CREATE TABLE delegations (
    id            TEXT PRIMARY KEY NOT NULL,
    delegator     TEXT NOT NULL,
    delegate      TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    until_ms      BIGINT NOT NULL,
    revoked_at_ms BIGINT,
    reason        TEXT NOT NULL,
    created_by    TEXT NOT NULL
);
CREATE INDEX delegations_by_delegate ON delegations (delegate, until_ms);
CREATE INDEX delegations_by_delegator ON delegations (delegator, until_ms);
