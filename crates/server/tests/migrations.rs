//! The two backends' migrations describe the same model: after migrating an empty database of
//! each, the tables, their columns (with type and nullability) and the index names are the
//! same, PostgreSQL's shared rate limits aside.

use std::collections::BTreeSet;

use countersign_server::config::StorageConfig;
use countersign_server::store::hub::Hub;
use countersign_server::store::Store;
use countersign_testkit::postgres::Cluster;
use sqlx::Connection;

/// Tables only PostgreSQL has: the token buckets several replicas share.
const POSTGRES_ONLY: &[&str] = &["rate_buckets"];

/// (table, column, type, nullable), types in SQLite's affinities.
type Column = (String, String, String, bool);

fn affinity(declared: &str) -> String {
    match declared.to_ascii_lowercase().as_str() {
        "integer" | "bigint" => "integer".into(),
        "text" => "text".into(),
        other => other.into(),
    }
}

async fn sqlite_model(path: &std::path::Path) -> (BTreeSet<Column>, BTreeSet<String>) {
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let columns: Vec<(String, String, String, bool, bool)> = sqlx::query_as(
        "SELECT m.name, p.name, p.type, p.\"notnull\", p.pk FROM sqlite_master m
           JOIN pragma_table_info(m.name) p
          WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND m.name NOT LIKE '_sqlx%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let columns = columns
        .into_iter()
        // A primary key is never null, whether declared so or not.
        .map(|(table, column, kind, not_null, pk)| {
            (table, column, affinity(&kind), !(not_null || pk))
        })
        .collect();
    (columns, indexes.into_iter().collect())
}

async fn postgres_model(url: &str) -> (BTreeSet<Column>, BTreeSet<String>) {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let columns: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text
           FROM information_schema.columns
          WHERE table_schema = 'public' AND table_name NOT LIKE '_sqlx%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes
          WHERE schemaname = 'public' AND indexname NOT LIKE '%_pkey' AND indexname NOT LIKE '%_key'
            AND tablename NOT LIKE '_sqlx%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let columns = columns
        .into_iter()
        .filter(|(table, ..)| !POSTGRES_ONLY.contains(&table.as_str()))
        .map(|(table, column, kind, nullable)| (table, column, affinity(&kind), nullable == "YES"))
        .collect();
    (columns, indexes.into_iter().collect())
}

#[tokio::test]
async fn sqlite_and_postgres_migrations_describe_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = dir.path().join("countersign.db");
    let postgres = Cluster::shared().create_database().await;
    for database in [sqlite.clone(), postgres.clone().into()] {
        Store::open(
            &database,
            &StorageConfig::default(),
            Hub::new(16),
            None,
            None,
        )
        .await
        .unwrap();
    }
    let (sqlite_columns, sqlite_indexes) = sqlite_model(&sqlite).await;
    let (postgres_columns, postgres_indexes) = postgres_model(&postgres).await;
    assert!(sqlite_columns.len() > 30, "{sqlite_columns:?}");
    assert_eq!(
        sqlite_columns
            .symmetric_difference(&postgres_columns)
            .collect::<Vec<_>>(),
        Vec::<&Column>::new(),
        "columns that only one backend has"
    );
    assert_eq!(
        sqlite_indexes
            .symmetric_difference(&postgres_indexes)
            .collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "indexes that only one backend has"
    );
}
