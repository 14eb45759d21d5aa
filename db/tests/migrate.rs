//! A schema-1 database (as the first kerntune release wrote it) migrates to the current schema
//! with its rows intact, and reads without migrating through `open_read`.

use std::path::Path;
use std::str::FromStr;

use kerntune_db::{Db, SCHEMA_VERSION};
use sqlx::migrate::Migrator;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};

/// Writes a database at schema 1 with one run, three measurements (one of them a final round's,
/// by its message) and a winner.
async fn schema_one(path: &Path) {
    let only_first = tempfile::tempdir().unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/0001_init.sql"),
        only_first.path().join("0001_init.sql"),
    )
    .unwrap();
    let mut conn = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .unwrap()
        .create_if_missing(true)
        .connect()
        .await
        .unwrap();
    Migrator::new(only_first.path())
        .await
        .unwrap()
        .run(&mut conn)
        .await
        .unwrap();
    conn.execute(
        "INSERT INTO devices VALUES (1, 'cpu/x/avx512/2t', 'cpu', 'x', 'avx512', 2, '', 'host-a');
         INSERT INTO kernels VALUES (1, 'gemm', 'cpu', 'gemm', 'abc');
         INSERT INTO problems VALUES (1, 'gemm', 'gemm:m=1,n=8,k=8', '{}');
         INSERT INTO runs (id, tool_version, command_line, device_id, started_at, status)
           VALUES (1, '0.1.0', 'tune', 1, '2026-11-30T00:00:00Z', 'done');
         INSERT INTO measurements (id, run_id, device_id, kernel_id, problem_id, config, status,
           message, median_ns, measured_at)
           VALUES (1, 1, 1, 1, 1, '{\"a\":1}', 'ok', NULL, 50.0, 't'),
                  (2, 1, 1, 1, 1, '{\"a\":2}', 'ok', NULL, 80.0, 't'),
                  (3, 1, 1, 1, 1, '{\"a\":1}', 'ok',
                   'final round: timed side by side with 1 others', 55.0, 't');
         INSERT INTO winners VALUES (1, 1, 1, 1, '{\"a\":1}', 50.0, 80.0, 1.6, '0.1.0', 't');",
    )
    .await
    .unwrap();
    conn.close().await.unwrap();
}

#[tokio::test]
async fn schema_one_reads_without_migrating_and_migrates_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    schema_one(&path).await;

    let read = Db::open_read(&path).await.unwrap();
    assert_eq!(read.schema(), 1);
    assert_eq!(
        read.winner_configs("cpu/x/avx512/2t").await.unwrap().len(),
        1
    );
    assert!(read
        .winner_snapshot("cpu/x/avx512/2t")
        .await
        .unwrap()
        .is_none());
    read.close().await;
    let err = Db::open_existing(&path).await.unwrap_err().to_string();
    assert!(err.contains("schema version 1"), "{err}");

    let db = Db::open(&path).await.unwrap();
    assert_eq!(db.schema(), SCHEMA_VERSION);
    let rows = db.winners(None).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].host, "host-a");
    db.close().await;

    // The migration filled the new columns: ids, the run's host, the default's mark.
    let mut conn = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (uids, host): (i64, String) = sqlx::query_as(
        "SELECT (SELECT COUNT(DISTINCT uid) FROM measurements), (SELECT host FROM runs)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!((uids, host.as_str()), (3, "host-a"));
    let default: i64 = sqlx::query_scalar("SELECT id FROM measurements WHERE is_default = 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(default, 2);
    // Schema 4: a final-round measurement written before the mark existed gets it.
    let finals: Vec<i64> = sqlx::query_scalar("SELECT id FROM measurements WHERE final_round")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(finals, [3]);
}

/// A database created and closed at once (as `tune import` into a new file can do) closes
/// without waiting out the busy timeout: the connection the migrations ran on used to keep a
/// read open, and the closing checkpoint waited 30 s for it.
#[tokio::test]
async fn a_new_database_closes_without_waiting_on_itself() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("new.db")).await.unwrap();
    assert_eq!(db.schema(), SCHEMA_VERSION);
    tokio::time::timeout(std::time::Duration::from_secs(10), db.close())
        .await
        .expect("closing a new database hung on its own read lock");
}
