//! Unit tests of the module's private functions.

use super::read::{add_powers, find_readable, midpoint};
use super::*;

#[test]
fn add_powers_carries_and_stops_at_the_end() {
    assert_eq!(add_powers(&[0, 0xFF], &[0]), Some(vec![1, 0]));
    assert_eq!(add_powers(&[0, 1], &[8]), Some(vec![1, 1]));
    assert_eq!(add_powers(&[0, 0], &[3, 1]), Some(vec![0, 10]));
    assert_eq!(add_powers(&[0xFF, 0xFF], &[0]), None);
    assert_eq!(add_powers(&[0, 0], &[16]), None);
    assert_eq!(midpoint(&[0, 0xFF], &[1, 1]), vec![1, 0]);
    assert_eq!(midpoint(&[0xFF, 0xFF], &[0xFF, 0xFD]), vec![0xFF, 0xFE]);
}

/// A source whose keys 0..=255 (one byte) are readable except a
/// damaged stretch: reading into it fails, and so does any read that
/// starts inside it.
struct Damaged {
    bad: std::ops::Range<u8>,
}

impl SalvageSource for Damaged {
    fn read(
        &mut self,
        _table: Table,
        from: Option<&[u8]>,
        sink: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<bool, ReadFailure> {
        let start = from.map_or(0, |f| f[0]);
        for k in start..=255u8 {
            if self.bad.contains(&k) {
                return Err(ReadFailure::Page(format!("bad page at {k}")));
            }
            if !sink(&[k], b"v") {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[test]
fn a_failed_read_resumes_at_the_first_readable_key() {
    let mut source = Damaged { bad: 40..77 };
    let (resume, probes) = find_readable(&mut source, Table::Workflows, Some(&[39])).unwrap();
    assert_eq!(resume, Some(vec![77]));
    assert!(probes <= 16, "{probes} probes");
    let mut source = Damaged { bad: 0..255 };
    assert_eq!(
        find_readable(&mut source, Table::Workflows, Some(&[0]))
            .unwrap()
            .0,
        Some(vec![255])
    );
    let mut source = Damaged { bad: 10..255 };
    let (resume, _) = find_readable(&mut source, Table::Workflows, Some(&[9])).unwrap();
    assert_eq!(resume, Some(vec![255]));
}

/// A source whose stretch `bad` is a damaged page that reads as rows
/// with empty keys (what a zeroed LMDB page gives) before the read
/// fails, also when a read starts inside it.
struct Zeroed {
    bad: std::ops::Range<u8>,
    reads: u64,
}

impl SalvageSource for Zeroed {
    fn read(
        &mut self,
        _table: Table,
        from: Option<&[u8]>,
        sink: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<bool, ReadFailure> {
        self.reads += 1;
        let start = from.and_then(|f| f.first().copied()).unwrap_or(0);
        for k in start..=255u8 {
            if self.bad.contains(&k) {
                for _ in 0..3 {
                    if !sink(&[], &[]) {
                        return Ok(false);
                    }
                }
                return Err(ReadFailure::Page(format!("bad page at {k}")));
            }
            if !sink(&[k], b"v") {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

fn report_for(table: Table) -> SalvageReport {
    SalvageReport {
        tables: vec![TableSalvage {
            table: table.name(),
            ..TableSalvage::default()
        }],
        ..SalvageReport::default()
    }
}

/// Issue 18: rows out of order (empty keys from a zeroed page) sent
/// the search back to the table's start, for ever.
#[test]
fn rows_out_of_order_end_the_read_and_the_search_moves_on() {
    for bad in [1..9, 40..77, 200..255] {
        let mut source = Zeroed {
            bad: bad.clone(),
            reads: 0,
        };
        let mut report = report_for(Table::Workflows);
        let mut taken = Vec::new();
        read_table(&mut source, Table::Workflows, &mut report, |_, k, _| {
            taken.push(k[0]);
            Ok(true)
        })
        .unwrap();
        let want: Vec<u8> = (0..=255u8).filter(|k| !bad.contains(k)).collect();
        assert_eq!(taken, want, "{bad:?}");
        assert_eq!(report.tables[0].lost.len(), 1, "{bad:?}");
        assert!(source.reads < 40, "{bad:?}: {} reads", source.reads);
    }
}

/// A source that says stop: the table and the ones after it are
/// reported lost, with the reason.
#[test]
fn a_stop_ends_the_reading_with_the_reason() {
    struct Unopenable;
    impl SalvageSource for Unopenable {
        fn read(
            &mut self,
            _: Table,
            _: Option<&[u8]>,
            _: &mut dyn FnMut(&[u8], &[u8]) -> bool,
        ) -> Result<bool, ReadFailure> {
            Err(ReadFailure::Stop("cannot open".into()))
        }
    }
    let mut report = report_for(Table::Workflows);
    read_table(&mut Unopenable, Table::Workflows, &mut report, |_, _, _| {
        Ok(true)
    })
    .unwrap();
    assert_eq!(report.stopped.as_deref(), Some("cannot open"));
    assert_eq!(report.tables[0].reads, 1);
    assert!(!report.is_complete());
}
