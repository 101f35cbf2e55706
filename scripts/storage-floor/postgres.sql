-- The storage floor on PostgreSQL: one batch of countersign's request writes (approval rows and
-- their REQUESTED events, set-based, under the chain head's row lock as the server takes it),
-- on a database migrated with migrations/postgres. One client, as writers take turns on that
-- lock. docs/performance.md, "The storage floor":
--   pgbench -n -c 1 -j 1 -T 8 -D batch=32 -f scripts/storage-floor/postgres.sql DATABASE
BEGIN;
SELECT head_seq FROM audit_anchor WHERE id = 1 FOR UPDATE;
WITH rows AS (
  SELECT lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000000)::bigint), 16, '0')
           || md5(random()::text) AS id,
         'agent-' || (random() * 63)::int AS agent, md5(random()::text) AS key, g
    FROM generate_series(1, :batch) AS g
), approvals_written AS (
  INSERT INTO approvals (id, agent_id, idempotency_key, session_id, tool_name, state, channels,
                         created_at_ms, expires_at_ms, body, due_at_ms)
  SELECT id, agent, key, 'session', 'shell', 'PENDING', '*', 1790000000000, 1790000600000,
         repeat('a', 1200), NULL
    FROM rows
), head AS (SELECT coalesce(max(seq), 0) AS seq FROM events)
INSERT INTO events (seq, approval_id, kind, at_ms, body, agent_id, prev_hash, hash)
SELECT head.seq + g, rows.id, 'REQUESTED', 1790000000000, repeat('e', 1000), rows.agent,
       md5(random()::text), md5(random()::text)
  FROM rows, head;
COMMIT;
