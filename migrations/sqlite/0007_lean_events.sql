-- Lean events: from this migration on, a REQUESTED event stores the approval without its
-- argument values, and every later event only what changed (state, decision count,
-- deliveries, resolution, consumption, the decision or delivery itself); the approval's row
-- holds the rest. Rows written before keep their whole-approval bodies and their hashes; the
-- server reads both forms.

-- The decision columns are empty for most events: index only the rows that have them.
DROP INDEX events_by_decider;
DROP INDEX events_by_approver;
CREATE INDEX events_by_decider ON events (decider, seq) WHERE decider <> '';
CREATE INDEX events_by_approver ON events (approver, seq) WHERE approver <> '';
