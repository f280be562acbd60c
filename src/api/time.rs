//! Times in the contract: RFC 3339 strings in UTC with milliseconds.

use schemars::JsonSchema;
use serde::{Serialize, Serializer};

/// A point in time, kept as milliseconds since the Unix epoch and written
/// as an RFC 3339 string in UTC with three fractional digits
/// (`2026-11-26T07:30:00.123Z`): readable, and sorting as text sorts it
/// in time.
///
/// ```
/// use uwf_db::api::Timestamp;
/// let t = Timestamp(1_767_323_045_123);
/// assert_eq!(serde_json::to_string(&t)?, r#""2026-01-02T03:04:05.123Z""#);
/// assert_eq!(t.to_string(), "2026-01-02T03:04:05.123Z");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub u64);

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = i64::try_from(self.0).unwrap_or(i64::MAX);
        match jiff::Timestamp::from_millisecond(ms) {
            Ok(ts) => write!(f, "{ts:.3}"),
            // Past jiff's range (year 9999): the latest time it can write.
            Err(_) => write!(f, "{:.3}", jiff::Timestamp::MAX),
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl JsonSchema for Timestamp {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timestamp".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A time: RFC 3339 in UTC with milliseconds (2026-01-02T03:04:05.123Z).",
            "type": "string",
            "format": "date-time"
        })
    }
}

impl From<u64> for Timestamp {
    fn from(ms: u64) -> Self {
        Timestamp(ms)
    }
}
