//! Reading one table of a damaged store through a [`SalvageSource`]:
//! after a failed read, the search for the next readable key (K + 1,
//! K + 2, K + 4, …, then a bisection) and the rows recovered from pages no
//! tree reaches inside the lost stretch (`docs/design.md` §6b).

use super::*;

/// Reads one table through `source`, searching past each failure for the
/// next readable key; `take` is given each row and says whether it was
/// kept (it records drops itself).
///
/// Every pass either takes a row or starts its search for the next
/// readable key strictly past the start of the read that failed, and a
/// row is taken only when its key is greater than every key taken before
/// (a key out of order comes from a damaged page and ends the read like a
/// failure). So the position only moves forward, the same start is never
/// read twice, and at most [`MAX_LOST_STRETCHES`] searches are made
/// before the rest of the table is given up.
pub(super) fn read_table(
    source: &mut dyn SalvageSource,
    table: Table,
    report: &mut SalvageReport,
    mut take: impl FnMut(&mut SalvageReport, &[u8], &[u8]) -> Result<bool, SalvageError>,
) -> Result<(), SalvageError> {
    if let Some(detail) = report.stopped.clone() {
        report.count(table, |t| {
            t.lost.push(LostRange {
                after: None,
                before: None,
                detail: format!("not read: the salvage had stopped ({detail})"),
            });
        });
        return Ok(());
    }
    let mut from: Option<Vec<u8>> = None;
    let mut last: Option<Vec<u8>> = None;
    let mut stretches = 0;
    loop {
        let mut failed: Option<SalvageError> = None;
        let mut disorder: Option<Vec<u8>> = None;
        report.count(table, |t| t.reads += 1);
        let outcome = source.read(table, from.as_deref(), &mut |k, v| {
            let in_order =
                last.as_deref().is_none_or(|l| k > l) && from.as_deref().is_none_or(|f| k >= f);
            if !in_order {
                disorder = Some(k.to_vec());
                return false;
            }
            report.count(table, |t| t.read += 1);
            last = Some(k.to_vec());
            match take(report, k, v) {
                Ok(true) => report.count(table, |t| t.kept += 1),
                Ok(false) => {}
                Err(e) => {
                    failed = Some(e);
                    return false;
                }
            }
            true
        });
        if let Some(e) = failed {
            return Err(e);
        }
        let detail = match (outcome, disorder) {
            (_, Some(key)) => format!(
                "a damaged page: the read gave key {} out of order",
                hex(&key)
            ),
            (Ok(_), None) => return Ok(()),
            (Err(ReadFailure::Page(detail)), None) => detail,
            (Err(ReadFailure::Stop(detail)), None) => {
                stop(report, table, last.as_deref(), detail);
                return Ok(());
            }
        };
        stretches += 1;
        if stretches > MAX_LOST_STRETCHES {
            report.count(table, |t| {
                t.lost.push(LostRange {
                    after: last.as_deref().map(hex),
                    before: None,
                    detail: format!(
                        "{detail}; the rest of the table was given up after {MAX_LOST_STRETCHES} unreadable stretches"
                    ),
                });
            });
            return Ok(());
        }
        // Past the last key taken, and past the failed read's start (a
        // read there gives nothing more).
        let base = match (&last, &from) {
            (Some(l), Some(f)) => Some(l.max(f)),
            (l, f) => l.as_ref().or(f.as_ref()),
        }
        .cloned();
        let (resume, probes) = match find_readable(source, table, base.as_deref()) {
            Ok(found) => found,
            Err(stopped) => {
                stop(report, table, last.as_deref(), stopped);
                return Ok(());
            }
        };
        report.count(table, |t| t.reads += probes);
        let lost = LostRange {
            after: last.as_deref().map(hex),
            before: resume.as_deref().map(hex),
            detail,
        };
        report.count(table, |t| t.lost.push(lost));
        match resume {
            Some(k) => from = Some(k),
            None => return Ok(()),
        }
    }
}

/// Reads the rows of `table`'s lost stretches that the source finds
/// below the damaged pages ([`SalvageSource::orphans`]) and gives those
/// inside a stretch to `take`, in key order. Blobs are given as they are
/// found (a key once); of the other tables, whose rows are few, one row a
/// key is kept, and of a thread record the newest (highest `seq`, then
/// `updated_at`): a page no tree reaches may hold an older copy.
pub(super) fn recover(
    source: &mut dyn SalvageSource,
    table: Table,
    report: &mut SalvageReport,
    mut take: impl FnMut(&mut SalvageReport, &[u8], &[u8]) -> Result<bool, SalvageError>,
) -> Result<(), SalvageError> {
    let stretches: Vec<Stretch> = report
        .tables
        .iter()
        .filter(|t| t.table == table.name())
        .flat_map(|t| &t.lost)
        .map(|l| {
            let bound = |k: &Option<String>| k.as_deref().and_then(crate::hash::unhex);
            (bound(&l.after), bound(&l.before))
        })
        .collect();
    if stretches.is_empty() {
        return Ok(());
    }
    let inside = |key: &[u8]| {
        stretches.iter().any(|(after, before)| {
            after.as_deref().is_none_or(|a| key > a) && before.as_deref().is_none_or(|b| key < b)
        })
    };
    let mut found: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = Default::default();
    let mut failed = None;
    let outcome = source.orphans(table, &mut |key, value| {
        if failed.is_some() || !inside(key) {
            return;
        }
        if table == Table::Blobs {
            report.count(table, |t| {
                t.read += 1;
                t.recovered += 1;
            });
            match take(report, key, value) {
                Ok(true) => report.count(table, |t| t.kept += 1),
                Ok(false) => {}
                Err(e) => failed = Some(e),
            }
            return;
        }
        let newer = match found.get(key) {
            None => true,
            Some(old) => {
                let version =
                    |v: &[u8]| ThreadRecord::decode(v).ok().map(|r| (r.seq, r.updated_at));
                matches!(table, Table::Threads | Table::History) && version(value) > version(old)
            }
        };
        if newer {
            found.insert(key.to_vec(), value.to_vec());
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    for (key, value) in found {
        report.count(table, |t| {
            t.read += 1;
            t.recovered += 1;
        });
        if take(report, &key, &value)? {
            report.count(table, |t| t.kept += 1);
        }
    }
    if let Err(e) = outcome {
        report.count(table, |t| {
            t.lost.push(LostRange {
                after: None,
                before: None,
                detail: format!("looking for rows below the damaged pages failed: {e}"),
            });
        });
    }
    Ok(())
}

/// Records that the reading stopped in `table` after `last`.
pub(super) fn stop(report: &mut SalvageReport, table: Table, last: Option<&[u8]>, detail: String) {
    report.count(table, |t| {
        t.lost.push(LostRange {
            after: last.map(hex),
            before: None,
            detail: format!("the salvage stopped: {detail}"),
        });
    });
    report.stopped = Some(detail);
}

/// The lowest key after `last` (the table's start when `None`) at which
/// a read of `table` succeeds, to [`BISECT_BITS`] of precision, and the
/// number of reads tried; `None` when no read after `last` succeeds. A
/// read succeeds when it ends without error or gives a first key at or
/// after its start (a key before it comes from a damaged page). `Err`
/// when the source says to stop.
pub(super) fn find_readable(
    source: &mut dyn SalvageSource,
    table: Table,
    last: Option<&[u8]>,
) -> Result<(Option<Vec<u8>>, u64), String> {
    let base = match last {
        Some(k) if !k.is_empty() => k.to_vec(),
        _ => vec![0; natural_key_len(table)],
    };
    let mut probes = 0;
    let mut reads = |source: &mut dyn SalvageSource, key: &[u8]| {
        probes += 1;
        let mut in_order = true;
        let outcome = source.read(table, Some(key), &mut |k, _| {
            in_order = k >= key;
            false
        });
        match outcome {
            Ok(_) => Ok(in_order),
            Err(ReadFailure::Page(_)) => Ok(false),
            Err(ReadFailure::Stop(detail)) => Err(detail),
        }
    };
    // Exponential search: base + 1, + 2, + 4, … and at last the largest
    // key of base's length.
    let bits = u32::try_from(base.len() * 8).unwrap_or(u32::MAX);
    let mut lo = base.clone();
    let mut hi = None;
    for b in 0..=bits {
        let key = match add_powers(&base, &[b]) {
            Some(key) => key,
            None => vec![0xFF; base.len()],
        };
        if key <= lo {
            break;
        }
        if reads(source, &key)? {
            hi = Some(key);
            break;
        }
        let top = key.iter().all(|b| *b == 0xFF);
        lo = key;
        if top {
            break;
        }
    }
    let Some(mut hi) = hi else {
        return Ok((None, probes));
    };
    // Bisection: `lo` fails, `hi` reads.
    for _ in 0..BISECT_BITS {
        let mid = midpoint(&lo, &hi);
        if mid <= lo {
            break;
        }
        if reads(source, &mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok((Some(hi), probes))
}

/// `(a + b) / 2` for big-endian numbers of one length.
pub(super) fn midpoint(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut sum = vec![0u8; a.len()];
    let mut carry = 0u16;
    for ((out, x), y) in sum.iter_mut().zip(a).zip(b).rev() {
        let s = u16::from(*x) + u16::from(*y) + carry;
        *out = (s & 0xFF) as u8;
        carry = s >> 8;
    }
    // Shift right by one, the carry coming in at the top.
    let mut high = carry as u8;
    for byte in &mut sum {
        let low = *byte & 1;
        *byte = (*byte >> 1) | (high << 7);
        high = low;
    }
    sum
}

/// `key + Σ 2^b` for the bits `b`, as a big-endian number of `key`'s
/// length; `None` past the largest key of that length.
pub(super) fn add_powers(key: &[u8], bits: &[u32]) -> Option<Vec<u8>> {
    let mut out = key.to_vec();
    for &bit in bits {
        let byte = usize::try_from(bit / 8).ok()?;
        let mut at = out.len().checked_sub(1 + byte)?;
        let mut carry = 1u16 << (bit % 8);
        loop {
            let byte = out.get_mut(at)?;
            let sum = u16::from(*byte) + carry;
            *byte = (sum & 0xFF) as u8;
            carry = sum >> 8;
            if carry == 0 {
                break;
            }
            at = at.checked_sub(1)?;
        }
    }
    Some(out)
}

/// The usual key length of a table, for a search that starts before its
/// first key.
pub(super) fn natural_key_len(table: Table) -> usize {
    match table {
        Table::Blobs | Table::Pins => 32,
        Table::Threads | Table::HistoryIds => 16,
        Table::History => 20,
        Table::Activity => 24,
        Table::Children => 32,
        Table::Meta | Table::Workflows => 8,
        Table::Labels => 28,
    }
}
