//! A bundle's bytes: splitting one into its records and blobs, checking
//! the framing, the order and the trailer (`docs/design.md` §4d). Never
//! panics, never allocates more than the input's size.

use super::*;

/// A bundle's parts.
#[derive(Debug, Default)]
pub struct Parsed<'b> {
    /// Record bytes, in bundle order.
    pub records: Vec<&'b [u8]>,
    /// (hash, bytes), in bundle order.
    pub blobs: Vec<(Hash, &'b [u8])>,
}

/// Splits an unsigned bundle into its parts ([`decode_with`] without a
/// key): a signed one is refused, as its trailer cannot be checked.
///
/// ```
/// let store = uwf_db::Store::memory();
/// let mut bytes = Vec::new();
/// uwf_db::bundle::export(&store, &[], &mut bytes)?;
/// let parts = uwf_db::bundle::decode(&bytes)?;
/// assert!(parts.records.is_empty() && parts.blobs.is_empty());
/// assert!(uwf_db::bundle::decode(b"not a bundle").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn decode(bundle: &[u8]) -> Result<Parsed<'_>, BundleError> {
    decode_with(bundle, None)
}

/// Splits a bundle into its parts, checking the framing, the order (ids
/// and hashes strictly increasing: one bundle per set of threads) and the
/// trailer: with `key`, the bundle must be signed with it; without, it
/// must be unsigned (a signed bundle's trailer says nothing to one without
/// the key). Never panics, never allocates more than the input's size.
///
/// ```
/// use uwf_db::bundle::{BundleKey, ExportOptions};
/// let store = uwf_db::Store::memory();
/// let key = BundleKey::from_secret(&[7; 32])?;
/// let mut bytes = Vec::new();
/// let mut options = ExportOptions::default();
/// options.sign = Some(key.clone());
/// uwf_db::bundle::export_with(&store, &[], &mut bytes, &options)?;
/// assert!(uwf_db::bundle::decode_with(&bytes, Some(&key)).is_ok());
/// let other = BundleKey::from_secret(&[8; 32])?;
/// assert!(uwf_db::bundle::decode_with(&bytes, Some(&other)).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn decode_with<'b>(
    bundle: &'b [u8],
    key: Option<&BundleKey>,
) -> Result<Parsed<'b>, BundleError> {
    let bad = |what: &str| BundleError::Malformed(what.to_owned());
    let (body, trailer) = bundle
        .split_last_chunk::<32>()
        .ok_or_else(|| bad("shorter than its trailer"))?;
    let (magic, mut rest) = body
        .split_first_chunk::<8>()
        .ok_or_else(|| bad("shorter than its header"))?;
    let signed = match magic {
        m if m == MAGIC => false,
        m if m == MAGIC_SIGNED => true,
        _ => return Err(bad("it does not start with UWFBNDL1 or UWFBNDS1")),
    };
    match (signed, key) {
        (false, None) => {
            if blake3::hash(body).as_bytes() != trailer {
                return Err(bad("its checksum does not match (damaged or cut short)"));
            }
        }
        (true, Some(key)) => {
            // `blake3::Hash` compares in constant time.
            if key.mac(body) != blake3::Hash::from_bytes(*trailer) {
                return Err(BundleError::Signature(
                    "it was not signed with this key, or it was changed after it was signed".into(),
                ));
            }
        }
        (false, Some(_)) => {
            return Err(BundleError::Signature(
                "it is not signed (exported without --sign), and a signed bundle was required"
                    .into(),
            ));
        }
        (true, None) => {
            return Err(BundleError::Signature(
                "it is signed; give the key to check it with (import --verify KEYFILE)".into(),
            ));
        }
    }
    let mut take = |n: usize, what: &str| -> Result<&[u8], BundleError> {
        if rest.len() < n {
            return Err(BundleError::Malformed(format!("cut short in {what}")));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let u32_of = |b: &[u8]| b.try_into().map(u32::from_le_bytes).unwrap_or(0);
    let threads = u32_of(take(4, "the thread count")?);
    let mut parsed = Parsed::default();
    for _ in 0..threads {
        let len = u32_of(take(4, "a record length")?) as usize;
        parsed.records.push(take(len, "a record")?);
    }
    let blobs = take(8, "the blob count")?
        .try_into()
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    let mut last: Option<Hash> = None;
    for _ in 0..blobs {
        let hash = Hash::from_slice(take(32, "a blob hash")?).ok_or_else(|| bad("a blob hash"))?;
        if last.is_some_and(|l| l >= hash) {
            return Err(bad("blobs out of order or repeated"));
        }
        last = Some(hash);
        let len = u32_of(take(4, "a blob length")?) as usize;
        parsed.blobs.push((hash, take(len, "a blob")?));
    }
    if !rest.is_empty() {
        return Err(bad("bytes after the last blob"));
    }
    Ok(parsed)
}
