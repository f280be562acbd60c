//! Importing a bundle, in phases: every blob checked (hash, canonical
//! form, refs), every record checked against its chain, the links between
//! threads checked, then one write transaction (`docs/design.md` §4d).

use super::*;

/// The bundle's blobs by hash, encoded and of their kind.
pub(super) type Blobs = HashMap<Hash, (crate::node::EncodedBlob, Kind)>;

/// Every blob hashes to its key, decodes canonically, and refers only to
/// blobs of the bundle or the store. Returns them, and their bytes.
pub(super) fn check_blobs<'b>(
    store: &Store,
    parsed: &Parsed<'b>,
) -> Result<(Blobs, HashMap<Hash, &'b [u8]>), BundleError> {
    // Blobs: hash, canonical form, refs.
    let mut blobs: Blobs = HashMap::new();
    let mut raw: HashMap<Hash, &[u8]> = HashMap::new();
    for (hash, bytes) in &parsed.blobs {
        let bad = |detail: String| BundleError::BadBlob {
            hash: *hash,
            detail,
        };
        if Hash::of(bytes) != *hash {
            return Err(bad(format!("its bytes hash to {}", Hash::of(bytes))));
        }
        let blob = Blob::decode(bytes).map_err(|e| bad(e.to_string()))?;
        let encoded = blob.encode().map_err(|e| bad(e.to_string()))?;
        let kind = blob.kind();
        blobs.insert(*hash, (encoded, kind));
        raw.insert(*hash, bytes);
    }
    let stored = |h: &Hash| store.contains(h);
    for (hash, (encoded, _)) in &blobs {
        for target in encoded.refs() {
            if !blobs.contains_key(target) && !stored(target)? {
                return Err(BundleError::MissingRef {
                    blob: *hash,
                    missing: *target,
                });
            }
        }
    }
    Ok((blobs, raw))
}

/// Every record decodes, has sane labels and usage, names blobs that are
/// there and of the right kinds, is held by no driver and agrees with its
/// chain; no thread comes twice.
pub(super) fn check_records(
    store: &Store,
    parsed: &Parsed<'_>,
    blobs: &Blobs,
    raw: &HashMap<Hash, &[u8]>,
) -> Result<Vec<ThreadRecord>, BundleError> {
    // A node of the bundle, else of the store.
    let mut node = |h: &Hash| -> Result<Option<Blob>, BundleError> {
        match raw.get(h) {
            // Checked above: it decodes.
            Some(bytes) => Ok(Blob::decode(bytes).ok()),
            None => Ok(store.get(h)?),
        }
    };
    // Records: decode, nodes present and of the right kinds, and in
    // agreement with their chains.
    let mut records = Vec::with_capacity(parsed.records.len());
    for (i, bytes) in parsed.records.iter().enumerate() {
        let record = ThreadRecord::decode(bytes).map_err(|e| BundleError::BadRecord {
            thread: format!("#{}", i + 1),
            detail: e.to_string(),
        })?;
        let bad = |detail: String| BundleError::BadRecord {
            thread: record.id.to_string(),
            detail,
        };
        // Labels become index keys and terminal output; a cost is summed.
        crate::thread::check_labels(&record.labels).map_err(|e| bad(format!("labels: {e}")))?;
        if let Some(u) = &record.usage
            && !(u.cost_usd.is_finite() && u.cost_usd >= 0.0)
        {
            return Err(bad(
                "usage: its cost is not a finite, non-negative number".into()
            ));
        }
        for (what, hash, want) in record.blob_refs() {
            let Some(hash) = hash else { continue };
            let kind = match blobs.get(&hash) {
                Some((_, kind)) => Some(*kind),
                None => store.get_stored(&hash)?.map(|b| b.kind),
            };
            match kind {
                None => return Err(bad(format!("its {what} {hash} is missing"))),
                Some(k) if !want.is_empty() && !want.contains(&k) => {
                    return Err(bad(format!("its {what} {hash} is a {k} blob")));
                }
                Some(_) => {}
            }
        }
        if record.status == ThreadStatus::Running || record.claimed_status.is_some() {
            return Err(bad(
                "status: it is held by a driver (running); a driver's claim is never imported"
                    .into(),
            ));
        }
        if let Some(detail) = crate::thread::check_against_chain(&record, usize::MAX, &mut node)? {
            return Err(bad(detail));
        }
        records.push(record);
    }
    let mut seen = HashSet::new();
    if let Some(dup) = records.iter().find(|r| !seen.insert(r.id)) {
        return Err(BundleError::BadRecord {
            thread: dup.id.to_string(),
            detail: "the bundle holds it twice".into(),
        });
    }
    Ok(records)
}

/// Every parent, active child and fork origin a record names is in the
/// bundle or in the store.
pub(super) fn check_links(
    store: &Store,
    records: &[ThreadRecord],
    blobs: &Blobs,
) -> Result<(), BundleError> {
    // Links between threads: inside the bundle, else in the store.
    let in_bundle: HashMap<ThreadId, &ThreadRecord> = records.iter().map(|r| (r.id, r)).collect();
    for record in records {
        let bad = |detail: String| BundleError::BadRecord {
            thread: record.id.to_string(),
            detail,
        };
        let known = |id: ThreadId| -> Result<bool, BundleError> {
            Ok(in_bundle.contains_key(&id) || store.threads().get(id)?.is_some())
        };
        if let Some(parent) = record.parent_thread
            && !known(parent)?
        {
            return Err(bad(format!(
                "parent_thread: {parent} is neither in the bundle nor in the store"
            )));
        }
        if let Some(child) = record.active_child {
            let parent_of_child = match in_bundle.get(&child) {
                Some(c) => Some(c.parent_thread),
                None => store.threads().get(child)?.map(|c| c.parent_thread),
            };
            match parent_of_child {
                None => {
                    return Err(bad(format!(
                        "active_child: {child} is neither in the bundle nor in the store"
                    )));
                }
                Some(p) if p != Some(record.id) => {
                    return Err(bad(format!(
                        "active_child: {child} is not a child of this thread"
                    )));
                }
                Some(_) => {}
            }
        }
        if let Some(origin) = &record.forked_from
            && !(blobs.contains_key(&origin.node) || store.contains(&origin.node)?)
        {
            return Err(bad(format!(
                "forked_from: node {} is neither in the bundle nor in the store",
                origin.node
            )));
        }
    }
    Ok(())
}

/// The one write transaction: refused if a thread exists (without
/// `new_ids`), blobs in ref order, then the records (renumbered with
/// `new_ids`; agents and directories dropped unless trusted).
pub(super) fn write(
    store: &Store,
    records: &[ThreadRecord],
    blobs: &Blobs,
    options: &ImportOptions,
) -> Result<ImportReport, BundleError> {
    let new_ids = options.new_ids;
    // Ids.
    let map: HashMap<ThreadId, ThreadId> = if new_ids {
        records
            .iter()
            .map(|r| (r.id, ThreadId::generate()))
            .collect()
    } else {
        records.iter().map(|r| (r.id, r.id)).collect()
    };
    // Blobs in an order where every ref comes before its referrer.
    let order = topological(blobs);
    let trust = options.trust_agents;
    let report = store.write(|w| {
        if !new_ids {
            let mut exists = Vec::new();
            for r in records {
                if index::find(w.tables(), r.id)?.is_some() {
                    exists.push(r.id);
                }
            }
            if !exists.is_empty() {
                return Err(BundleError::Exists { ids: exists });
            }
        }
        let mut new_blobs = 0;
        for hash in &order {
            if let Some((encoded, _)) = blobs.get(hash)
                && w.put_encoded(encoded)?
            {
                new_blobs += 1;
            }
        }
        let mut threads = Vec::with_capacity(records.len());
        let mut agents_dropped = 0;
        for record in records {
            let mut r = record.clone();
            let follow = |id: ThreadId| *map.get(&id).unwrap_or(&id);
            r.id = follow(r.id);
            r.parent_thread = r.parent_thread.map(follow);
            r.active_child = r.active_child.map(follow);
            if let Some(origin) = &mut r.forked_from {
                origin.thread = follow(origin.thread);
            }
            if !trust {
                if r.agent.take().is_some() {
                    agents_dropped += 1;
                }
                r.cwd = None;
            }
            index::put(w, None, &r)?;
            threads.push((record.id, r.id));
        }
        Ok::<_, BundleError>(ImportReport {
            threads,
            blobs: blobs.len() as u64,
            new_blobs,
            agents_dropped,
            signed: options.verify.is_some(),
        })
    })?;
    Ok(report)
}
