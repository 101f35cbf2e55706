//! The storage floor: countersign's request writes (an approval row and its REQUESTED event,
//! with an idempotency lookup first) straight into SQLite, with the server's own schema
//! (migrations/sqlite) and settings, on one connection with prepared statements, in batches
//! of one transaction each. No gRPC, no service, no JSON, no audit hashing: what no server on
//! SQLite can beat on this machine.

use std::error::Error;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension};

const USAGE: &str = "usage: storage-floor DIR full|minimal FULL|NORMAL BATCH AGENTS SECONDS
  DIR      where the database goes (the same disk as the server's)
  full     the server's schema (every migration); minimal: only the tables' keys and the
           unique idempotency index
  FULL     synchronous=FULL (the server's durable setting); NORMAL: synchronous=NORMAL
  BATCH    changes per transaction (64 calls in flight give the server about 32)
  AGENTS   distinct agent ids
  SECONDS  how long to write

Environment, for layouts the server does not have (what a leaner layout could save):
  PAGE=1024          SQLite's page size for the new database (default 4096)
  EXTRA_SQL='...'    run after the server's migrations (e.g. DROP INDEX approvals_pending_by_agent)
  APPROVAL_BODY=N    bytes of each approval's body (default 1200, as the server writes them)
  EVENT_BODY=N       bytes of each REQUESTED event's body (default 1000)";

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("storage-floor: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 6 {
        return Err(USAGE.into());
    }
    let (dir, schema, sync) = (&args[0], args[1].as_str(), args[2].as_str());
    let batch: usize = args[3].parse()?;
    let agents: u64 = args[4].parse()?;
    let seconds: u64 = args[5].parse()?;
    if !matches!(schema, "full" | "minimal") || !matches!(sync, "FULL" | "NORMAL") {
        return Err(USAGE.into());
    }

    let path = format!("{dir}/storage-floor-{schema}.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
    let conn = Connection::open(&path)?;
    // The server's writer settings (crates/server/src/store/sqlite.rs).
    if let Ok(page) = std::env::var("PAGE") {
        let page: u32 = page.parse().map_err(|e| format!("PAGE={page}: {e}"))?;
        conn.execute_batch(&format!("PRAGMA page_size = {page};"))?;
    }
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA temp_store = memory;
         PRAGMA wal_autocheckpoint = 10000;"
    ))?;
    if schema == "full" {
        let migrations = concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations/sqlite");
        let mut files: Vec<_> = std::fs::read_dir(migrations)?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        files.sort();
        for file in files {
            conn.execute_batch(&std::fs::read_to_string(file)?)?;
        }
        if let Ok(extra) = std::env::var("EXTRA_SQL") {
            conn.execute_batch(&extra)?;
        }
    } else {
        conn.execute_batch(
            "CREATE TABLE approvals (id TEXT PRIMARY KEY NOT NULL, agent_id TEXT NOT NULL,
               idempotency_key TEXT NOT NULL, session_id TEXT NOT NULL, tool_name TEXT NOT NULL,
               state TEXT NOT NULL, channels TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
               expires_at_ms INTEGER NOT NULL, body TEXT NOT NULL, due_at_ms INTEGER,
               UNIQUE (agent_id, idempotency_key));
             CREATE TABLE events (seq INTEGER PRIMARY KEY, approval_id TEXT NOT NULL,
               kind TEXT NOT NULL, at_ms INTEGER NOT NULL, body TEXT NOT NULL, prev_hash TEXT,
               hash TEXT, agent_id TEXT NOT NULL DEFAULT '', decider TEXT NOT NULL DEFAULT '',
               approver TEXT NOT NULL DEFAULT '');",
        )?;
    }

    // Row sizes as the server writes them for the bench's requests.
    let approval_body = "a".repeat(size_from_env("APPROVAL_BODY", 1200)?);
    let event_body = "e".repeat(size_from_env("EVENT_BODY", 1000)?);
    let mut random = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut seq: i64 = 0;
    let mut hash = format!("{:064x}", 0);
    let mut changes = 0u64;
    let started = Instant::now();
    let (cpu_before, written_before) = (cpu_used()?, bytes_written()?);
    let mut checkpointed = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        {
            let mut find = conn.prepare_cached(
                "SELECT id FROM approvals WHERE agent_id = ?1 AND idempotency_key = ?2",
            )?;
            let mut insert_approval = conn.prepare_cached(
                "INSERT INTO approvals (id, agent_id, idempotency_key, session_id, tool_name,
                   state, channels, created_at_ms, expires_at_ms, body, due_at_ms)
                 VALUES (?1, ?2, ?3, 'session', 'shell', 'PENDING', '*', ?4, ?5, ?6, NULL)",
            )?;
            let mut insert_event = conn.prepare_cached(
                "INSERT INTO events (seq, approval_id, kind, at_ms, body, agent_id, decider,
                   approver, prev_hash, hash)
                 VALUES (?1, ?2, 'REQUESTED', ?3, ?4, ?5, '', '', ?6, ?7)",
            )?;
            for _ in 0..batch {
                let now = 1_790_000_000_000 + started.elapsed().as_millis() as i64;
                let agent = format!("agent-{}", random.next() % agents);
                // Idempotency keys are a host's call ids or digests: random.
                let key = format!("{:016x}{:016x}", random.next(), random.next());
                // Approval ids are UUIDv7: time first.
                let id = format!("{now:012x}-7{:03x}-{:016x}", changes % 4096, random.next());
                let existing: Option<String> = find
                    .query_row(params![agent, key], |row| row.get(0))
                    .optional()?;
                if existing.is_some() {
                    return Err("a random idempotency key repeated".into());
                }
                insert_approval.execute(params![
                    id,
                    agent,
                    key,
                    now,
                    now + 600_000,
                    approval_body
                ])?;
                seq += 1;
                let next = format!("{:064x}", random.next());
                insert_event.execute(params![seq, id, now, event_body, agent, hash, next])?;
                hash = next;
                changes += 1;
            }
        }
        conn.execute_batch("COMMIT")?;
        // The server's checkpointer runs 200 ms after commits on a connection of its own.
        if checkpointed.elapsed() > Duration::from_millis(200) {
            conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)")?;
            checkpointed = Instant::now();
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = (cpu_used()? - cpu_before).as_secs_f64();
    let written = (bytes_written()? - written_before) as f64;
    println!(
        "{schema} schema, synchronous={sync}, {batch} changes per commit, {agents} agents: \
         {:.0} changes/s, {:.1} us CPU per change ({:.0}% of a core), \
         {:.1} KiB written per change (database + WAL)",
        changes as f64 / wall,
        cpu * 1e6 / changes as f64,
        100.0 * cpu / wall,
        written / changes as f64 / 1024.0
    );
    Ok(())
}

/// A size from the environment, or the default when the variable is not set.
fn size_from_env(name: &str, default: usize) -> Result<usize, Box<dyn Error>> {
    match std::env::var(name) {
        Ok(value) => Ok(value.parse().map_err(|e| format!("{name}={value}: {e}"))?),
        Err(_) => Ok(default),
    }
}

/// This process's user + system CPU time.
fn cpu_used() -> Result<Duration, Box<dyn Error>> {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ok(time(usage.ru_utime) + time(usage.ru_stime))
}

/// Bytes this process has handed to write calls (/proc/self/io `wchar`).
fn bytes_written() -> Result<u64, Box<dyn Error>> {
    let io = std::fs::read_to_string("/proc/self/io")?;
    let value = io
        .lines()
        .find_map(|line| line.strip_prefix("wchar:"))
        .ok_or("no wchar in /proc/self/io")?;
    Ok(value.trim().parse()?)
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
