-- Indexes by agent put every write of a batch on its own leaf page (one per agent in the
-- batch), and those pages, written whole to the log at each commit, were most of what a commit
-- wrote. Lists by agent now read the approvals under the agent's idempotency keys (the unique
-- index by agent and key) and, for events, the events of those approvals (events_by_approval):
-- their cost grows with that agent's history, not with the whole store's.
DROP INDEX approvals_by_agent;
DROP INDEX events_by_agent;
