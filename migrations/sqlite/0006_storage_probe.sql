-- One row the store's writer rewrites while the database refuses writes (disk full), to
-- notice when it accepts them again.
CREATE TABLE storage_probe (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    at_ms INTEGER NOT NULL
);
