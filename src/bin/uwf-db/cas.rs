//! `cas put|get|has|refs|walk|pin|unpin|pins`: add, inspect and pin blobs.

use std::path::PathBuf;

use clap::Subcommand;
use uwf_db::api;
use uwf_db::store::StoredBlob;
use uwf_db::{Blob, HashPrefix, StoreError};

use crate::output::{self, Output};
use crate::{Cli, CliError, parse_prefix};

#[derive(Subcommand)]
pub enum CasCommand {
    /// Store a file (or stdin with `-`) as a content blob; prints its hash
    Put {
        /// A UTF-8 text file, or `-` for stdin
        file: PathBuf,
    },
    /// Show a blob, decoded (or its exact canonical bytes with --raw)
    Get {
        /// Hash or unique prefix (at least 6 hex characters)
        #[arg(value_parser = parse_prefix)]
        hash: HashPrefix,
        /// Print the canonical bytes exactly (b3sum of them is the hash)
        #[arg(long, conflicts_with = "json")]
        raw: bool,
    },
    /// Whether a blob is stored (exit 0 if so, 1 if not)
    Has {
        /// Hash or unique prefix
        #[arg(value_parser = parse_prefix)]
        hash: HashPrefix,
    },
    /// The hashes a blob refers to
    Refs {
        /// Hash or unique prefix
        #[arg(value_parser = parse_prefix)]
        hash: HashPrefix,
    },
    /// Everything reachable from a blob, itself included (JSON Lines with --json)
    Walk {
        /// Hash or unique prefix
        #[arg(value_parser = parse_prefix)]
        hash: HashPrefix,
    },
    /// Keep a blob, and everything it reaches, through garbage collection
    Pin {
        /// Hash or unique prefix
        #[arg(value_parser = parse_prefix)]
        hash: HashPrefix,
    },
    /// Let garbage collection delete a pinned blob again if nothing reaches it
    Unpin {
        /// Hash or unique prefix
        #[arg(value_parser = parse_prefix)]
        hash: HashPrefix,
    },
    /// List pinned blobs
    Pins,
}

pub fn run(cli: &Cli, cmd: &CasCommand, out: &mut Output) -> Result<(), CliError> {
    match cmd {
        CasCommand::Put { file } => put(cli, file, out),
        CasCommand::Get { hash, raw } => get(cli, hash, *raw, out),
        CasCommand::Has { hash } => has(cli, hash, out),
        CasCommand::Refs { hash } => refs(cli, hash, out),
        CasCommand::Walk { hash } => walk(cli, hash, out),
        CasCommand::Pin { hash } => pin(cli, hash, true, out),
        CasCommand::Unpin { hash } => pin(cli, hash, false, out),
        CasCommand::Pins => pins(cli, out),
    }
}

fn pin(cli: &Cli, prefix: &HashPrefix, on: bool, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let hash = store.resolve(prefix)?;
    let changed = if on {
        store.pin(&hash)?
    } else {
        store.unpin(&hash)?
    };
    if out.json {
        return Ok(out.json_value(&api::BlobPin {
            changed,
            hash,
            pinned: on,
        })?);
    }
    let what = match (on, changed) {
        (true, true) => "pinned",
        (true, false) => "already pinned",
        (false, true) => "unpinned",
        (false, false) => "was not pinned",
    };
    Ok(out.line(format_args!("{hash}: {what}"))?)
}

fn pins(cli: &Cli, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let pins = store.pins()?;
    if out.json {
        return Ok(out.json_value(&pins)?);
    }
    for h in pins {
        out.line(h)?;
    }
    Ok(())
}

fn put(cli: &Cli, file: &std::path::Path, out: &mut Output) -> Result<(), CliError> {
    let name = if file.as_os_str() == "-" {
        "stdin".to_owned()
    } else {
        file.display().to_string()
    };
    let bytes = uwf_db::input::read_capped(file, uwf_db::input::MAX_BLOB_INPUT, "blob")
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        CliError::Failed(format!(
            "{name} is not UTF-8 text (invalid byte at offset {at}); content blobs hold text only"
        ))
    })?;
    let store = cli.open(true)?;
    let encoded = Blob::content(text, []).encode().map_err(StoreError::from)?;
    let new = store.write(|w| w.put_encoded(&encoded))?;
    if out.json {
        out.json_value(&api::BlobPut {
            hash: encoded.hash(),
            new,
            size: encoded.bytes().len() as u64,
        })?;
    } else {
        out.line(encoded.hash())?;
    }
    Ok(())
}

fn lookup(cli: &Cli, prefix: &HashPrefix) -> Result<(uwf_db::Store, StoredBlob), CliError> {
    let store = cli.open(false)?;
    let hash = store.resolve(prefix)?;
    let blob = store
        .get_stored(&hash)?
        .ok_or_else(|| StoreError::UnknownHash {
            prefix: prefix.to_string(),
        })?;
    Ok((store, blob))
}

fn get(cli: &Cli, prefix: &HashPrefix, raw: bool, out: &mut Output) -> Result<(), CliError> {
    let (_store, stored) = lookup(cli, prefix)?;
    if raw {
        return Ok(out.raw(&stored.bytes)?);
    }
    let blob = stored.decode()?;
    if out.json {
        return Ok(out.json_value(&api::BlobDetail::of(&stored, &blob))?);
    }
    let payload = api::blob::payload(&blob);
    let refs = if stored.refs.is_empty() {
        "none".to_owned()
    } else {
        stored
            .refs
            .iter()
            .map(|h| h.short(12))
            .collect::<Vec<_>>()
            .join(" ")
    };
    out.table(&[
        ("hash", stored.hash.to_string()),
        ("kind", stored.kind.to_string()),
        ("size", output::human_size(stored.bytes.len() as u64)),
        ("written", output::timestamp(stored.written_at)),
        ("refs", refs),
    ])?;
    out.line("")?;
    match payload {
        serde_json::Value::String(text) => out.line(text)?,
        other => out.line(serde_json::to_string_pretty(&other).unwrap_or_default())?,
    }
    Ok(())
}

fn has(cli: &Cli, prefix: &HashPrefix, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let found = match store.resolve(prefix) {
        Ok(h) => Some(h),
        Err(StoreError::UnknownHash { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    if out.json {
        out.json_value(&api::BlobPresence {
            hash: found,
            present: found.is_some(),
            query: prefix.as_str().to_owned(),
        })?;
    } else {
        match found {
            Some(h) => out.line(h)?,
            None => out.line(format_args!("no blob matches {prefix}"))?,
        }
    }
    if found.is_some() {
        Ok(())
    } else {
        Err(CliError::Reported)
    }
}

fn refs(cli: &Cli, prefix: &HashPrefix, out: &mut Output) -> Result<(), CliError> {
    let (store, stored) = lookup(cli, prefix)?;
    let kinds = store.read(|r| {
        stored
            .refs
            .iter()
            .map(|h| Ok(r.get_stored(h)?.map(|b| b.kind)))
            .collect::<Result<Vec<_>, StoreError>>()
    })?;
    if out.json {
        let rows: Vec<_> = stored
            .refs
            .iter()
            .zip(&kinds)
            .map(|(h, k)| api::BlobRef {
                hash: *h,
                kind: k.map(|k| k.as_str().to_owned()),
                present: k.is_some(),
            })
            .collect();
        return Ok(out.json_value(&rows)?);
    }
    for (h, k) in stored.refs.iter().zip(&kinds) {
        out.line(format_args!("{h}  {}", k.map_or("MISSING", |k| k.as_str())))?;
    }
    Ok(())
}

fn walk(cli: &Cli, prefix: &HashPrefix, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let root = store.resolve(prefix)?;
    let mut total_bytes = 0u64;
    let count = store.walk(&root, |b| -> Result<(), CliError> {
        total_bytes += b.bytes.len() as u64;
        if out.json {
            out.json_value(&api::WalkedBlob::from(b))?;
        } else {
            out.line(format_args!(
                "{}  {:<8}  {:>9}",
                b.hash,
                b.kind.as_str(),
                output::human_size(b.bytes.len() as u64)
            ))?;
        }
        Ok(())
    })?;
    if !out.json {
        output::note(format_args!(
            "{count} blobs reachable, {}",
            output::human_size(total_bytes)
        ));
    }
    Ok(())
}
