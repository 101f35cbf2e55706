//! Starts the private PostgreSQL cluster of a test run and prints its port, for
//! `COUNTERSIGN_TEST_POSTGRES_PORT`: `countersign-test-postgres --until PID`. The cluster stops,
//! and its directory is deleted, once process PID has ended.

use std::process::ExitCode;

use countersign_testkit::postgres::Cluster;

const USAGE: &str = "usage: countersign-test-postgres --until PID

Starts a private PostgreSQL cluster on 127.0.0.1 for a test run and prints its port.
It stops, and its files are deleted, once process PID has ended.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let owner = match args.as_slice() {
        [flag] if flag == "--help" || flag == "-h" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        [flag, pid] if flag == "--until" => match pid.parse::<u32>() {
            Ok(pid) => pid,
            Err(e) => {
                eprintln!("countersign-test-postgres: --until {pid:?}: {e}\n\n{USAGE}");
                return ExitCode::from(64);
            }
        },
        _ => {
            eprintln!("countersign-test-postgres: expected --until PID\n\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    match Cluster::start(owner) {
        Ok(cluster) => {
            println!("{}", cluster.port());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("countersign-test-postgres: {e}");
            ExitCode::FAILURE
        }
    }
}
