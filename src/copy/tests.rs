//! Unit tests of the module's private functions.

use super::*;

#[test]
fn the_order_has_every_table_once_and_blobs_before_what_names_them() {
    let order = copy_order();
    let mut sorted = order;
    sorted.sort();
    let mut all = Table::ALL;
    all.sort();
    assert_eq!(sorted, all);
    let pos = |t: Table| order.iter().position(|x| *x == t).unwrap();
    for root in [
        Table::Workflows,
        Table::Pins,
        Table::Threads,
        Table::History,
    ] {
        assert!(pos(Table::Blobs) < pos(root), "{root}");
    }
    for index in [
        Table::HistoryIds,
        Table::Activity,
        Table::Children,
        Table::Labels,
    ] {
        assert!(pos(Table::Threads) < pos(index), "{index}");
        assert!(pos(Table::History) < pos(index), "{index}");
    }
}

fn rows(store: &Store, table: Table) -> Vec<Row> {
    store
        .read(|r| {
            r.tables()
                .range(table, KeyRange::ALL, Direction::Forward)?
                .map(|e| e.map(|(k, v)| (k.into_owned(), v.into_owned())))
                .collect::<Result<Vec<_>, BackendError>>()
                .map_err(StoreError::from)
        })
        .unwrap()
}

fn fill(store: &Store, table: Table, rows: &[(&str, &str)]) {
    store
        .write(|w| {
            for (k, v) in rows {
                w.tables_mut().put(table, k.as_bytes(), v.as_bytes())?;
            }
            Ok::<_, StoreError>(())
        })
        .unwrap();
}

/// The chunked merge makes any destination equal to the source, with
/// any chunk size: inserts, updates and deletes on either side of
/// every chunk boundary.
#[test]
fn a_table_is_reconciled_with_any_destination_and_any_chunk() {
    let source = [("a", "1"), ("b", "3"), ("c", "3"), ("e", "5"), ("f", "6")];
    let stale = [("0", "x"), ("a", "1"), ("b", "2"), ("d", "4"), ("e", "5")];
    let destinations: [&[(&str, &str)]; 4] = [&[], &stale, &source, &[("z", "z")]];
    let src = Store::memory();
    fill(&src, Table::Workflows, &source);
    for dest in destinations {
        for (chunk_rows, chunk_bytes) in [(1, usize::MAX), (2, 3), (3, usize::MAX), (100, 1)] {
            let dst = Store::memory();
            fill(&dst, Table::Workflows, dest);
            let copy = Copy {
                dst: &dst,
                from: "memory:",
                to: "memory:",
                chunk: Chunk {
                    rows: chunk_rows,
                    bytes: chunk_bytes,
                },
                cancel: None,
            };
            let mut handled = 0;
            let report = src
                .read(|r| {
                    Ok::<_, StoreError>(copy.table(r.tables(), Table::Workflows, &mut |n| {
                        handled += n;
                    }))
                })
                .unwrap()
                .unwrap();
            let case = format!("{dest:?} in chunks of {chunk_rows} rows, {chunk_bytes} bytes");
            assert_eq!(
                rows(&dst, Table::Workflows),
                rows(&src, Table::Workflows),
                "{case}"
            );
            assert_eq!(handled, 5, "{case}");
            assert_eq!(report.rows, 5, "{case}");
            let differing = source.iter().filter(|r| !dest.contains(r)).count() as u64;
            let extra = dest
                .iter()
                .filter(|(k, _)| !source.iter().any(|(s, _)| s == k))
                .count() as u64;
            assert_eq!(
                (report.written, report.deleted),
                (differing, extra),
                "{case}"
            );
            let digests = table_digests(&src).unwrap();
            let workflows = digests.iter().find(|d| d.table == Table::Workflows);
            assert_eq!(workflows.map(|d| &d.digest), Some(&report.digest), "{case}");
        }
    }
}

#[test]
fn transient_meta_keys_are_not_copied_and_do_not_make_a_store_non_empty() {
    let store = Store::memory();
    fill(
        &store,
        Table::Meta,
        &[(GC_EPOCH_KEY, "12345678"), (COPY_MARKER_KEY, "{}")],
    );
    assert_eq!(store.read(|r| first_content(r.tables())).unwrap(), None);
    let meta = table_digests(&store).unwrap()[0].clone();
    assert_eq!(
        (meta.table, meta.rows),
        (Table::Meta, 1),
        "format_version only"
    );
    fill(&store, Table::Meta, &[("retention", "7d")]);
    let what = store.read(|r| first_content(r.tables())).unwrap();
    assert_eq!(
        what.as_deref(),
        Some("its meta table has the setting 'retention'")
    );
}
