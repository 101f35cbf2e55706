-- The audit chain's anchor, and the argument scope of session grants.

-- The ends of the hash chain, kept apart from the rows they cover: the newest row (seq and
-- hash) and the oldest row that must still be stored (seq and its prev_hash). Deleting rows at
-- either end, or clearing hashes, no longer verifies; `countersign-server audit head` prints
-- the head so that it can also be kept outside this file. The head follows every inserted
-- row (the trigger below); the tail moves only when retention prunes (server code) and when
-- an operator runs `countersign-server audit rechain`.
CREATE TABLE audit_anchor (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    head_seq       INTEGER NOT NULL,
    head_hash      TEXT NOT NULL,
    tail_seq       INTEGER NOT NULL,
    tail_prev_hash TEXT NOT NULL
);
-- Anchored to the rows as they are when this migration runs.
INSERT INTO audit_anchor (id, head_seq, head_hash, tail_seq, tail_prev_hash) VALUES (
    1,
    coalesce((SELECT seq FROM events ORDER BY seq DESC LIMIT 1), 0),
    coalesce((SELECT hash FROM events ORDER BY seq DESC LIMIT 1), ''),
    coalesce((SELECT seq FROM events ORDER BY seq LIMIT 1), 1),
    coalesce((SELECT prev_hash FROM events ORDER BY seq LIMIT 1), '')
);
CREATE TRIGGER events_move_anchor_head AFTER INSERT ON events
BEGIN
    UPDATE audit_anchor SET head_seq = NEW.seq, head_hash = coalesce(NEW.hash, '')
     WHERE id = 1 AND NEW.seq > head_seq;
END;

-- A session grant covers later calls whose arguments have the same scope (canonical JSON of
-- the argument parts a policy rule's grant_scope names; empty: any arguments of the tool).
ALTER TABLE grants ADD COLUMN scope TEXT NOT NULL DEFAULT '';
