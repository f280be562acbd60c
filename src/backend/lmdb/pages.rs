//! Reading an LMDB data file's pages without LMDB (issue 18), for
//! `salvage`: when a branch page of a table's B-tree (or the main tree
//! that names the tables) is damaged, LMDB cannot reach the leaf pages
//! below it although they are intact. This module walks the trees of one
//! snapshot with plain file reads, every offset and length checked
//! against the page, and gives the rows on the leaf pages that no tree of
//! the snapshot reaches and that are not free: the orphans of a damaged
//! page.
//!
//! Only LMDB 0.9's layout is read (what heed's `lmdb-master-sys` writes,
//! on a 64-bit little-endian machine), and only what this store uses:
//! plain keys and values, values on overflow pages, no duplicate keys.
//!
//! - A page: `mp_pgno` u64 at 0, `mp_flags` u16 at 10, then `mp_lower`
//!   and `mp_upper` (u16 at 12 and 14; on an overflow page `mp_pages`,
//!   u32 at 12); 16 bytes of header, then the node offsets (u16 each).
//! - A node: `mn_lo`, `mn_hi`, `mn_flags`, `mn_ksize` (u16 each), then the
//!   key. In a branch the child page is `lo | hi << 16 | flags << 32`; in a
//!   leaf the value's size is `lo | hi << 16` and the value follows the
//!   key, or with `F_BIGDATA` the value is on overflow pages whose number
//!   (u64) follows the key.
//! - The meta page holds two `MDB_db` records, the free-page tree's at 40
//!   and the main tree's at 88 (each 48 bytes, the root page at 40 of it);
//!   the main tree's leaves name each table (`F_SUBDATA`) with its
//!   `MDB_db`. The free tree's values are lists of page numbers, a count
//!   first (u64 each).
//!
//! Rows are told apart by table with the value checksums (`sum.rs`: each
//! trailer is seeded with its table), so a row of another table, or one
//! read from a garbage page, is not taken; in a store of the legacy
//! layout, by the shape of key and value (the salvage checks each row
//! further: a blob's bytes hash to its key, a record decodes under its id).

use std::os::unix::fs::FileExt;
use std::path::Path;

use super::Table;
use super::sum;
use crate::backend::format::BLOB_HEADER_LEN as HEADER_LEN;
use crate::backend::format::FORMAT_VERSION_KEY;

const PAGE_HEADER: usize = 16;
const NODE_HEADER: usize = 8;
const P_BRANCH: u16 = 0x01;
const P_LEAF: u16 = 0x02;
const P_OVERFLOW: u16 = 0x04;
const P_META: u16 = 0x08;
const F_BIGDATA: u16 = 0x01;
const F_SUBDATA: u16 = 0x02;
const F_DUPDATA: u16 = 0x04;
/// Where the meta page's `MDB_db` records are, and the root in one.
const FREE_DB: usize = PAGE_HEADER + 24;
const MAIN_DB: usize = FREE_DB + 48;
const DB_ROOT: usize = 40;
/// `P_INVALID`: an empty tree's root.
const NO_PAGE: u64 = u64::MAX;

/// A set of page numbers, one bit each.
struct PageSet(Vec<u64>);

impl PageSet {
    fn new(pages: u64) -> PageSet {
        PageSet(vec![0; usize::try_from(pages.div_ceil(64)).unwrap_or(0)])
    }

    /// Adds `page`; whether it was new (a page past the end is never).
    fn insert(&mut self, page: u64) -> bool {
        let Some(word) = usize::try_from(page / 64)
            .ok()
            .and_then(|i| self.0.get_mut(i))
        else {
            return false;
        };
        let bit = 1u64 << (page % 64);
        let new = *word & bit == 0;
        *word |= bit;
        new
    }

    fn contains(&self, page: u64) -> bool {
        usize::try_from(page / 64)
            .ok()
            .and_then(|i| self.0.get(i))
            .is_some_and(|w| w & (1u64 << (page % 64)) != 0)
    }
}

/// One snapshot of a data file, read page by page.
struct Pages<'f> {
    file: &'f std::fs::File,
    page_size: u64,
    /// Pages the snapshot uses: `0..=last_page`.
    last_page: u64,
}

impl Pages<'_> {
    /// Page `n`, if the file has it whole.
    fn read(&self, n: u64) -> Option<Vec<u8>> {
        if n > self.last_page {
            return None;
        }
        let mut page = vec![0u8; usize::try_from(self.page_size).ok()?];
        self.file
            .read_exact_at(&mut page, n.checked_mul(self.page_size)?)
            .ok()?;
        Some(page)
    }

    /// Page `n` if it says it is page `n` and has `flag`.
    fn read_as(&self, n: u64, flag: u16) -> Option<Vec<u8>> {
        let page = self.read(n)?;
        (u64_at(&page, 0)? == n && u16_at(&page, 10)? & flag != 0).then_some(page)
    }

    /// The value of a leaf node that is on overflow pages: `size` bytes
    /// from page `first`, which must be an overflow page long enough.
    fn overflow(&self, first: u64, size: usize) -> Option<(Vec<u8>, u64)> {
        let head = self.read_as(first, P_OVERFLOW)?;
        let pages = u64::from(u32_at(&head, 12)?);
        let room = pages
            .checked_mul(self.page_size)?
            .checked_sub(PAGE_HEADER as u64)?;
        if pages == 0 || size as u64 > room || first.checked_add(pages - 1)? > self.last_page {
            return None;
        }
        let mut value = vec![0u8; size];
        self.file
            .read_exact_at(
                &mut value,
                first
                    .checked_mul(self.page_size)?
                    .checked_add(PAGE_HEADER as u64)?,
            )
            .ok()?;
        Some((value, pages))
    }
}

/// A node of a page: its flags, key and the bytes after the key (a
/// branch's child is in the header, so `rest` is empty there).
struct Node<'p> {
    lo: u16,
    hi: u16,
    flags: u16,
    key: &'p [u8],
    rest: &'p [u8],
}

/// The nodes of `page`, each checked to lie inside it; a node that does
/// not ends the list.
fn nodes(page: &[u8]) -> impl Iterator<Item = Node<'_>> {
    let lower = u16_at(page, 12).map_or(0, usize::from);
    let count = lower.saturating_sub(PAGE_HEADER) / 2;
    (0..count).map_while(move |i| {
        let at = usize::from(u16_at(page, PAGE_HEADER + 2 * i)?);
        if at < PAGE_HEADER {
            return None;
        }
        let ksize = usize::from(u16_at(page, at + 6)?);
        let key_at = at.checked_add(NODE_HEADER)?;
        let key = page.get(key_at..key_at.checked_add(ksize)?)?;
        Some(Node {
            lo: u16_at(page, at)?,
            hi: u16_at(page, at + 2)?,
            flags: u16_at(page, at + 4)?,
            key,
            rest: page.get(key_at + ksize..)?,
        })
    })
}

impl Node<'_> {
    fn child(&self) -> u64 {
        u64::from(self.lo) | u64::from(self.hi) << 16 | u64::from(self.flags) << 32
    }

    fn data_size(&self) -> usize {
        usize::from(self.lo) | usize::from(self.hi) << 16
    }

    /// The node's value: inline, or read from its overflow pages (whose
    /// numbers `seen` is given).
    fn value(&self, pages: &Pages<'_>, seen: &mut dyn FnMut(u64, u64)) -> Option<Vec<u8>> {
        let size = self.data_size();
        if self.flags & F_BIGDATA != 0 {
            let first = u64_at(self.rest, 0)?;
            let (value, count) = pages.overflow(first, size)?;
            seen(first, count);
            Some(value)
        } else {
            self.rest.get(..size).map(<[u8]>::to_vec)
        }
    }
}

/// Walks the tree from `root`, marking its pages in `reached`; `leaf` is
/// given each leaf node and its value. A page already reached, or one
/// that is not a branch or leaf page that says it is itself, ends that
/// path (a damaged page's children are left unreached).
fn walk(
    pages: &Pages<'_>,
    root: u64,
    reached: &mut PageSet,
    leaf: &mut dyn FnMut(&Node<'_>, Option<Vec<u8>>),
) {
    let mut stack = vec![root];
    while let Some(n) = stack.pop() {
        if n == NO_PAGE || n < 2 || reached.contains(n) {
            continue;
        }
        let Some(page) = pages.read_as(n, P_BRANCH | P_LEAF) else {
            continue;
        };
        reached.insert(n);
        let flags = u16_at(&page, 10).unwrap_or(0);
        for node in nodes(&page) {
            if flags & P_BRANCH != 0 {
                stack.push(node.child());
            } else {
                let value = node.value(pages, &mut |first, count| {
                    for p in first..first.saturating_add(count) {
                        reached.insert(p);
                    }
                });
                leaf(&node, value);
            }
        }
    }
}

/// Most pages a data file may lack at its end and still be whole: the
/// free pages [`missing_pages_are_free`] looks for (more is a truncation).
const MOST_MISSING_FREE: u64 = 1 << 16;

/// Whether the pages `first..=last` — pages the snapshot whose meta page
/// is `meta` counts (`last` is its last page) but the data file `file`
/// does not have — are all free in that snapshot's free tree. LMDB
/// counts in its last page the pages a transaction took and gave back
/// before committing (its "loose" pages, saved into the free list), and
/// never writes them: a healthy file may end before its last page, by
/// free pages only (`check.rs`).
pub(crate) fn missing_pages_are_free(
    file: &std::fs::File,
    page_size: u64,
    meta: &[u8],
    first: u64,
    last: u64,
) -> bool {
    if first > last || last - first >= MOST_MISSING_FREE || page_size == 0 {
        return first > last;
    }
    let Ok(len) = file.metadata().map(|m| m.len()) else {
        return false;
    };
    let file_pages = len / page_size;
    let pages = Pages {
        file,
        page_size,
        last_page: last.min(file_pages.saturating_sub(1)),
    };
    let mut reached = PageSet::new(pages.last_page.saturating_add(1));
    let mut missing: std::collections::BTreeSet<u64> = (first..=last).collect();
    free_pages(&pages, meta, &mut reached, &mut |p| {
        missing.remove(&p);
    });
    missing.is_empty()
}

/// Gives `free` every page the free tree of the snapshot whose meta page
/// is `meta` lists (its values are lists of page numbers, a count first),
/// marking the tree's own pages in `reached`.
fn free_pages(pages: &Pages<'_>, meta: &[u8], reached: &mut PageSet, free: &mut dyn FnMut(u64)) {
    let free_root = u64_at(meta, FREE_DB + DB_ROOT).unwrap_or(NO_PAGE);
    walk(pages, free_root, reached, &mut |_, value| {
        let Some(value) = value else { return };
        let mut ids = value.chunks_exact(8).filter_map(|c| u64_at(c, 0));
        let count = ids.next().unwrap_or(0);
        for p in ids.take(usize::try_from(count).unwrap_or(0)) {
            free(p);
        }
    });
}

/// What a scan found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scan {
    /// Pages that no tree of the snapshot reaches and that are not free.
    pub(crate) orphan_pages: u64,
    /// Rows given.
    pub(crate) rows: u64,
}

/// Gives `sink` the rows of `table` found on the leaf pages of the
/// snapshot whose meta page is `meta` (in `data`, a data file of
/// `page_size` pages) that no tree reaches and that are not free (for
/// blobs, free ones too), in no order, values without their checksum
/// trailers. A page or value that
/// does not parse is passed over. Reads every page of the snapshot once
/// or twice; memory is two bits a page plus one page.
pub(crate) fn orphan_rows(
    data: &Path,
    page_size: u64,
    meta: &[u8],
    table: Table,
    sink: &mut dyn FnMut(&[u8], &[u8]),
) -> std::io::Result<Scan> {
    let file = std::fs::File::open(data)?;
    let last_page = u64_at(meta, PAGE_HEADER + 120).unwrap_or(0);
    let file_pages = file.metadata()?.len() / page_size.max(1);
    let pages = Pages {
        file: &file,
        page_size,
        last_page: last_page.min(file_pages.saturating_sub(1)),
    };
    let total = pages.last_page.saturating_add(1);
    let mut reached = PageSet::new(total);
    let mut free = PageSet::new(total);

    free_pages(&pages, meta, &mut reached, &mut |p| {
        free.insert(p);
    });
    // The tables, named by the main tree's leaves.
    let mut roots = Vec::new();
    let main_root = u64_at(meta, MAIN_DB + DB_ROOT).unwrap_or(NO_PAGE);
    walk(&pages, main_root, &mut reached, &mut |node, value| {
        if node.flags & F_SUBDATA != 0
            && let Some(root) = value.as_deref().and_then(|v| u64_at(v, DB_ROOT))
        {
            roots.push((node.key.to_vec(), root));
        }
    });
    let mut checksums = None;
    for (name, root) in roots {
        let is_meta = name == Table::Meta.name().as_bytes();
        walk(&pages, root, &mut reached, &mut |node, value| {
            if is_meta && node.key == FORMAT_VERSION_KEY.as_bytes() {
                checksums = value.map(|v| v.len() == 4 + sum::SUM_LEN);
            }
        });
    }

    // The orphans: every other page that is a leaf and says it is itself.
    // Free pages too for blobs: a free page may hold an older copy of a
    // leaf, and a blob is the same in every copy (its bytes hash to its
    // key); a thread record there may be out of date, or removed since.
    let with_free = table == Table::Blobs;
    let orphan = |n: u64| !reached.contains(n) && (with_free || !free.contains(n));
    let each_row = |sink: &mut dyn FnMut(&[u8], &[u8])| -> u64 {
        let mut count = 0;
        for n in (2..total).filter(|&n| orphan(n)) {
            let Some(page) = pages.read_as(n, P_LEAF) else {
                continue;
            };
            if u16_at(&page, 10).is_some_and(|f| f & (P_BRANCH | P_META | P_OVERFLOW) != 0) {
                continue;
            }
            count += 1;
            for node in nodes(&page) {
                if node.flags & (F_SUBDATA | F_DUPDATA) != 0 {
                    continue;
                }
                if let Some(value) = node.value(&pages, &mut |_, _| {}) {
                    sink(node.key, &value);
                }
            }
        }
        count
    };
    // A layout the format version does not tell: checksums if any orphan
    // row of any table carries one.
    let checksums = match checksums {
        Some(known) => known,
        None => {
            let mut any = false;
            each_row(&mut |key, value| {
                any |= Table::ALL
                    .into_iter()
                    .any(|t| sum::strip(t, key, value).is_some());
            });
            any
        }
    };
    let mut rows = 0;
    let orphan_pages = each_row(&mut |key, value| {
        let taken = if checksums {
            sum::strip(table, key, value)
        } else {
            legacy_shape(table, key, value).then_some(value)
        };
        if let Some(value) = taken {
            rows += 1;
            sink(key, value);
        }
    });
    Ok(Scan { orphan_pages, rows })
}

/// Whether a row of the legacy layout (no checksums) may be one of
/// `table`'s, by the lengths of its key and value.
fn legacy_shape(table: Table, key: &[u8], value: &[u8]) -> bool {
    match table {
        Table::Blobs => key.len() == 32 && value.len() >= HEADER_LEN,
        Table::Threads => key.len() == 16 && !value.is_empty(),
        Table::History => key.len() == 20 && !value.is_empty(),
        Table::Workflows => value.len() == 32 && std::str::from_utf8(key).is_ok(),
        Table::Pins => key.len() == 32 && value.is_empty(),
        _ => false,
    }
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Garbage pages, roots and overflow numbers end in no panic, no
    /// endless walk and no row of a table (no checksum matches).
    #[test]
    fn garbage_pages_give_no_row_and_no_panic() {
        let page = 4096usize;
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..20u64 {
            let dir = tempfile::tempdir().unwrap();
            let data = dir.path().join("data.mdb");
            let mut bytes: Vec<u8> = (0..page * 64).map(|_| next() as u8).collect();
            // Pages that claim to be themselves, half branches, half leaves.
            for n in 2..64usize {
                bytes[n * page..n * page + 8].copy_from_slice(&(n as u64).to_le_bytes());
                let flags: u16 = if (n as u64 + round).is_multiple_of(2) {
                    P_BRANCH
                } else {
                    P_LEAF
                };
                bytes[n * page + 10..n * page + 12].copy_from_slice(&flags.to_le_bytes());
            }
            let mut meta = vec![0u8; page];
            meta[PAGE_HEADER + 120..PAGE_HEADER + 128].copy_from_slice(&63u64.to_le_bytes());
            meta[FREE_DB + DB_ROOT..FREE_DB + DB_ROOT + 8]
                .copy_from_slice(&(2 + round % 60).to_le_bytes());
            meta[MAIN_DB + DB_ROOT..MAIN_DB + DB_ROOT + 8]
                .copy_from_slice(&(3 + round % 60).to_le_bytes());
            std::fs::write(&data, &bytes).unwrap();
            for table in [Table::Blobs, Table::Threads, Table::History] {
                let mut rows = 0;
                let scan =
                    orphan_rows(&data, page as u64, &meta, table, &mut |_, _| rows += 1).unwrap();
                assert_eq!((rows, scan.rows), (0, 0), "round {round}, {table:?}");
            }
        }
    }
}
