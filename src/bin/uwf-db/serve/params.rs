//! Query strings, parsed strictly: an unknown or repeated parameter, or a
//! value that does not parse, is a 400 naming it.

use std::str::FromStr;

use super::error::{ApiError, ApiResult};

/// The parameters of one request.
pub struct Params {
    pairs: Vec<(String, String)>,
}

/// Largest page any listing returns.
pub const MAX_LIMIT: usize = 1000;

impl Params {
    /// Parses `query`, accepting only `known` names (and `token`, read by
    /// the guard); `repeatable` names may appear more than once.
    pub fn parse(query: Option<&str>, known: &[&str], repeatable: &[&str]) -> ApiResult<Params> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            if k == "token" {
                continue;
            }
            if !known.contains(&k.as_ref()) {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{}' (this endpoint takes: {})",
                    truncated(&k),
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                )));
            }
            if !repeatable.contains(&k.as_ref()) && pairs.iter().any(|(p, _)| *p == k) {
                return Err(ApiError::invalid(format!(
                    "query parameter '{k}' is given twice"
                )));
            }
            pairs.push((k.into_owned(), v.into_owned()));
        }
        Ok(Params { pairs })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn all(&self, name: &str) -> impl Iterator<Item = &str> {
        self.pairs
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `name` parsed, with `what` saying what it should be.
    pub fn parsed<T: FromStr>(&self, name: &str, what: &str) -> ApiResult<Option<T>> {
        self.get(name)
            .map(|v| {
                v.parse().map_err(|_| {
                    ApiError::invalid(format!(
                        "query parameter '{name}': '{}' is not {what}",
                        truncated(v)
                    ))
                })
            })
            .transpose()
    }

    /// `limit`: 1 to [`MAX_LIMIT`], `default` when absent.
    pub fn limit(&self, default: usize) -> ApiResult<usize> {
        let limit = self
            .parsed::<usize>("limit", "a number")?
            .unwrap_or(default);
        if limit == 0 || limit > MAX_LIMIT {
            return Err(ApiError::invalid(format!(
                "query parameter 'limit': {limit} is out of range (1 to {MAX_LIMIT})"
            )));
        }
        Ok(limit)
    }

    /// A boolean flag: `true`/`false` (`1`/`0`).
    pub fn flag(&self, name: &str) -> ApiResult<bool> {
        match self.get(name) {
            None | Some("false" | "0") => Ok(false),
            Some("true" | "1" | "") => Ok(true),
            Some(v) => Err(ApiError::invalid(format!(
                "query parameter '{name}': '{}' is not true or false",
                truncated(v)
            ))),
        }
    }

    /// A time: RFC 3339 (`2026-11-26T10:00:00Z`) or ms since the epoch.
    pub fn time(&self, name: &str) -> ApiResult<Option<u64>> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        if let Ok(ms) = v.parse::<u64>() {
            return Ok(Some(ms));
        }
        // Before the epoch is the epoch: no thread is older.
        v.parse::<jiff::Timestamp>()
            .ok()
            .map(|t| u64::try_from(t.as_millisecond()).unwrap_or(0))
            .map(Some)
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "query parameter '{name}': '{}' is not a time (RFC 3339 like 2026-11-26T10:00:00Z, or ms since the epoch)",
                    truncated(v)
                ))
            })
    }
}

/// A value quoted back in an error, cut to a readable length.
pub fn truncated(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut}…")
    }
}
