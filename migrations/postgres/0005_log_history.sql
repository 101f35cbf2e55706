-- The event log's history id (issue 44): a random id that a restored or re-chained log takes
-- anew. A watch cursor is (history id, seq), so a cursor read from another history of the
-- log (before a restore, whose new events reuse the seqs after the backup) is told apart from
-- one of this log. The first replica to start writes the row when there is none; after a
-- pg_restore, `countersign-server audit new-history` gives the restored log a history of its
-- own.
CREATE TABLE log_history (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    history_id TEXT NOT NULL
);
