//! Reading an LMDB data file's meta pages and orphaned leaf pages with
//! plain file reads (nothing mapped, nothing trusted), and writing the
//! working copies a salvage reads when a meta page is damaged
//! (`docs/design.md` §6b).

use std::path::{Path, PathBuf};

use super::SalvageError;
use crate::backend::Table;

/// `MDB_MAGIC`.
const LMDB_MAGIC: u32 = 0xBEEF_C0DE;
/// `MDB_DATA_VERSION`.
const LMDB_VERSION: u32 = 1;
/// `P_META`, in a page header's `mp_flags`.
const LMDB_P_META: u16 = 0x08;

/// One valid meta page of an LMDB data file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaPage {
    /// Which slot it is in (0 or 1).
    pub slot: u8,
    /// The transaction that wrote it: the larger one is current.
    pub txnid: u64,
    /// The last page that transaction uses.
    pub last_page: u64,
    /// The whole page.
    bytes: Vec<u8>,
}

/// What the meta pages of a store's LMDB data file (`<dir>/data.mdb`)
/// say, read with plain file reads (nothing mapped), and how a salvage
/// can read each snapshot they name.
///
/// LMDB keeps two meta pages (pages 0 and 1), written in turn by
/// successive commits; the one with the larger transaction id is
/// current, and the tree the other names is intact too (LMDB reuses no
/// page the last commit freed). LMDB refuses to open a file whose either
/// meta page is invalid, and maps a file shorter than its meta page says
/// past its end. A salvage therefore reads, where needed, a working copy
/// of the file in which both meta pages are the snapshot's and which is
/// padded with zeros to the length the snapshot uses (the missing pages
/// then read as damaged pages, whose rows are lost, not the whole file).
/// The layout is `src/backend/lmdb/check.rs`'s.
#[derive(Debug, Clone)]
pub struct LmdbDataFile {
    path: PathBuf,
    size: u64,
    page_size: u64,
    /// Valid meta pages, newest first.
    metas: Vec<MetaPage>,
    /// Why the meta pages that are not valid are not.
    invalid: Vec<String>,
}

impl LmdbDataFile {
    /// Reads the meta pages of `dir/data.mdb`.
    pub fn inspect(dir: &Path) -> Result<LmdbDataFile, SalvageError> {
        use std::os::unix::fs::FileExt;
        let path = dir.join("data.mdb");
        let io = |op| {
            let path = path.clone();
            move |source| SalvageError::Io { op, path, source }
        };
        let file = std::fs::File::open(&path).map_err(io("open"))?;
        let size = file.metadata().map_err(io("inspect"))?.len();
        if size == 0 {
            return Err(SalvageError::DataFile {
                path,
                detail: "the data file is empty (0 bytes): there is nothing to read".into(),
            });
        }
        // Page 0 says the page size; without it, page 1 is looked for at
        // each page size LMDB allows and must say the same size.
        let read_page = |at: u64, len: u64| -> Option<Vec<u8>> {
            let mut page = vec![0u8; usize::try_from(len).ok()?];
            file.read_exact_at(&mut page, at).ok()?;
            Some(page)
        };
        let mut metas = Vec::new();
        let mut invalid = Vec::new();
        let first = read_page(0, 4096.min(size)).and_then(|p| parse_meta(&p, 0));
        let page_size = match first {
            Some((m, page_size)) => {
                let bytes = read_page(0, page_size);
                if let Some(bytes) = bytes {
                    metas.push(MetaPage { bytes, ..m });
                }
                Some(page_size)
            }
            None => {
                invalid.push("meta page 0 is not a valid LMDB meta page".to_owned());
                None
            }
        };
        let sizes: Vec<u64> = match page_size {
            Some(p) => vec![p],
            None => (9..=16).map(|b| 1u64 << b).collect(),
        };
        let mut found_second = None;
        for candidate in sizes {
            let second = read_page(candidate, candidate).and_then(|p| parse_meta(&p, 1));
            if let Some((m, p)) = second
                && p == candidate
            {
                let bytes = read_page(candidate, p).unwrap_or_default();
                metas.push(MetaPage { bytes, ..m });
                found_second = Some(p);
                break;
            }
        }
        if found_second.is_none() {
            invalid.push("meta page 1 is not a valid LMDB meta page".to_owned());
        }
        let Some(page_size) = page_size.or(found_second) else {
            return Err(SalvageError::DataFile {
                path,
                detail: format!(
                    "the data file is {size} bytes and neither of its two meta pages is valid, so no snapshot of the store can be found"
                ),
            });
        };
        metas.sort_by_key(|m| std::cmp::Reverse(m.txnid));
        Ok(LmdbDataFile {
            path,
            size,
            page_size,
            metas,
            invalid,
        })
    }

    /// The snapshots the valid meta pages name, newest (current) first.
    pub fn snapshots(&self) -> &[MetaPage] {
        &self.metas
    }

    /// Bytes the snapshot `meta` uses.
    fn needed(&self, meta: &MetaPage) -> Option<u64> {
        meta.last_page.checked_add(1)?.checked_mul(self.page_size)
    }

    /// Why the snapshot `at` (an index into [`Self::snapshots`]) cannot be
    /// read in place, each reason a sentence; empty when LMDB can open the
    /// file as it is and reads that snapshot.
    pub fn repairs(&self, at: usize) -> Vec<String> {
        let mut out = self.invalid.clone();
        let Some(meta) = self.metas.get(at) else {
            return out;
        };
        if at > 0 {
            out.push(format!(
                "the current snapshot (transaction {}) cannot be opened: reading the previous one (transaction {})",
                self.metas.first().map_or(0, |m| m.txnid),
                meta.txnid
            ));
        }
        match self.needed(meta) {
            Some(needed) if needed > self.size => out.push(format!(
                "the data file is {} bytes, {} short of the {} pages transaction {} uses: the missing pages read as zeros",
                self.size,
                needed - self.size,
                meta.last_page + 1,
                meta.txnid
            )),
            _ => {}
        }
        out
    }

    /// Gives `sink` the rows of `table` on the leaf pages of snapshot `at`
    /// (an index into [`Self::snapshots`]) that no B-tree of the snapshot
    /// reaches and that are not free: what lies below a damaged branch
    /// page, which LMDB cannot reach. For blobs free pages are read too:
    /// one may hold an older copy of a damaged leaf, and a blob is the
    /// same in every copy. Read with plain file reads, every
    /// offset checked, so a damaged page is passed over, never followed;
    /// a row is taken for `table` only if its checksum (seeded with the
    /// table) matches, or in a store without checksums, if its key and
    /// value have the table's shape. Values come without their trailers.
    /// Returns the number of such pages and of rows given.
    pub fn orphan_rows(
        &self,
        at: usize,
        table: Table,
        sink: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<OrphanScan, SalvageError> {
        let Some(meta) = self.metas.get(at) else {
            return Err(SalvageError::DataFile {
                path: self.path.clone(),
                detail: format!("it has no snapshot {at}"),
            });
        };
        let scan = crate::backend::lmdb::pages::orphan_rows(
            &self.path,
            self.page_size,
            &meta.bytes,
            table,
            sink,
        )
        .map_err(|source| SalvageError::Io {
            op: "read the pages of",
            path: self.path.clone(),
            source,
        })?;
        Ok(OrphanScan {
            pages: scan.orphan_pages,
            rows: scan.rows,
        })
    }

    /// Writes `dir/data.mdb`: a copy of the data file whose two meta pages
    /// are both the snapshot `at`'s, padded with zeros to the length it
    /// uses. Pages that cannot be read are written as zeros; the returned
    /// list says which.
    pub fn write_copy(&self, at: usize, dir: &Path) -> Result<Vec<u64>, SalvageError> {
        use std::os::unix::fs::FileExt;
        let Some(meta) = self.metas.get(at) else {
            return Err(SalvageError::DataFile {
                path: self.path.clone(),
                detail: format!("it has no snapshot {at}"),
            });
        };
        let target = dir.join("data.mdb");
        let src = std::fs::File::open(&self.path).map_err(|source| SalvageError::Io {
            op: "open",
            path: self.path.clone(),
            source,
        })?;
        let write_io = |source| SalvageError::Io {
            op: "write the working copy",
            path: target.clone(),
            source,
        };
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&target)
            .map_err(write_io)?;
        let page = usize::try_from(self.page_size).unwrap_or(4096);
        let mut unreadable = Vec::new();
        let mut chunk = vec![0u8; page * 256];
        let mut at_byte = 0u64;
        while at_byte < self.size {
            let len = usize::try_from((self.size - at_byte).min(chunk.len() as u64))
                .unwrap_or(page)
                .min(chunk.len());
            let Some(buf) = chunk.get_mut(..len) else {
                break;
            };
            if src.read_exact_at(buf, at_byte).is_err() {
                // Page by page, zeros where the disk will not give them.
                for (i, p) in buf.chunks_mut(page).enumerate() {
                    let offset = at_byte + (i * page) as u64;
                    if src.read_exact_at(p, offset).is_err() {
                        p.fill(0);
                        unreadable.push(offset / self.page_size);
                    }
                }
            }
            out.write_all_at(buf, at_byte).map_err(write_io)?;
            at_byte += len as u64;
        }
        // Both meta pages the snapshot's, each with its own page number.
        for slot in 0..2u64 {
            let mut bytes = meta.bytes.clone();
            if let Some(pgno) = bytes.get_mut(0..8) {
                pgno.copy_from_slice(&slot.to_le_bytes());
            }
            out.write_all_at(&bytes, slot * self.page_size)
                .map_err(write_io)?;
        }
        let length = self.needed(meta).unwrap_or(self.size).max(self.size);
        out.set_len(length).map_err(write_io)?;
        out.sync_all().map_err(write_io)?;
        Ok(unreadable)
    }
}

/// What [`LmdbDataFile::orphan_rows`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrphanScan {
    /// Leaf pages that no tree of the snapshot reaches and that are not
    /// free.
    pub pages: u64,
    /// Rows of the table given.
    pub rows: u64,
}

/// A valid meta page in `page` (slot `slot`) and the page size it gives.
fn parse_meta(page: &[u8], slot: u8) -> Option<(MetaPage, u64)> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(page.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(page.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(page.get(at..at + 8)?.try_into().ok()?));
    if u16_at(10)? & LMDB_P_META == 0 || u32_at(16)? != LMDB_MAGIC || u32_at(20)? != LMDB_VERSION {
        return None;
    }
    let page_size = u64::from(u32_at(40)?);
    if !page_size.is_power_of_two() || !(512..=65536).contains(&page_size) {
        return None;
    }
    Some((
        MetaPage {
            slot,
            txnid: u64_at(144)?,
            last_page: u64_at(136)?,
            bytes: Vec::new(),
        },
        page_size,
    ))
}
