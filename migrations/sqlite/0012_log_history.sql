-- The event log's history id (issue 44): a random id that a restored or re-chained log takes
-- anew. A watch cursor is (history id, seq), so a cursor read from another history of the
-- log (before a restore, whose new events reuse the seqs after the backup) is told apart from
-- one of this log. The server writes the row at its start when there is none: a new
-- database, or a backup copy, which is made without it so that each restore of it begins a
-- history of its own.
CREATE TABLE log_history (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    history_id TEXT NOT NULL
);
