//! What is PostgreSQL's alone: the query plans behind a page of
//! `thread list`. (Everything else runs in the conformance suite, as
//! `postgres::*`.)
#![cfg(feature = "postgres")]

mod common;

use common::backend::TestBackend;

/// A page of `thread list` reads the `activity` table newest first
/// (`docs/design.md` §4, "Activity entry"); on PostgreSQL that is a range
/// of `uwf_activity` in descending key order, 512 rows per round trip, in
/// exactly this form (`backend/postgres.rs`, `Txn::page`). With 20,000
/// threads' entries it must be served by the primary key's index, never
/// by a sequential scan.
#[test]
fn a_page_of_thread_list_is_an_index_scan() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let url = store.store_arg().into_string().unwrap();
    let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    // 20,000 activity entries: 8-byte time + 16-byte id, as the engine
    // writes them.
    sql.batch_execute(
        "INSERT INTO uwf_activity (k, v) \
         SELECT int8send(1700000000000 + i) || decode(lpad(to_hex(i), 32, '0'), 'hex'), \
                '\\x000072657669657721'::bytea \
         FROM generate_series(1, 20000) AS i; \
         ANALYZE uwf_activity;",
    )
    .unwrap();
    let plans = [
        // The first page, newest first.
        "EXPLAIN SELECT k, v FROM uwf_activity WHERE true ORDER BY k DESC LIMIT 512",
        // A later page or `--until`: below a key.
        "EXPLAIN SELECT k, v FROM uwf_activity WHERE true AND k < '\\x0000018bcfe5a9d0'::bytea \
         ORDER BY k DESC LIMIT 512",
        // `--since` and `--until`: between two keys.
        "EXPLAIN SELECT k, v FROM uwf_activity WHERE true AND k >= '\\x0000018bcfe56800'::bytea \
         AND k < '\\x0000018bcfe5a9d0'::bytea ORDER BY k DESC LIMIT 512",
    ];
    for query in plans {
        let plan: Vec<String> = sql
            .query(query, &[])
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        let plan = plan.join("\n");
        assert!(
            plan.contains("Index Scan Backward using uwf_activity_pkey"),
            "{query}\n{plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{query}\n{plan}");
    }
    // The store still reads them (and lists nothing it cannot decode).
    assert_eq!(store.stats().unwrap().blob_count, 0);
}
