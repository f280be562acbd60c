//! PostgreSQL errors in our words: what the server reported, whether
//! the connection was lost, the URL without its password.

use super::*;

/// The URL with the password, if any, replaced by `***`.
pub(super) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

pub(super) fn pg_error(location: &str, op: String, e: postgres::Error) -> BackendError {
    use postgres::error::SqlState;
    match e.code() {
        Some(c)
            if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED =>
        {
            BackendError::Serialization {
                detail: e.to_string(),
            }
        }
        Some(c) if *c == SqlState::DISK_FULL => BackendError::DiskFull {
            path: location.into(),
        },
        _ => BackendError::Postgres {
            detail: describe(&op, &e),
            op,
            location: location.to_owned(),
            source: e,
        },
    }
}

/// Whether `e` says the connection is gone (closed, terminated by an
/// administrator or a server shutdown, an I/O error on the socket): the
/// transaction in flight is over, and a new connection may well work.
pub(crate) fn connection_lost(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.is_closed()
        || e.code().is_some_and(|c| {
            [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::IDLE_SESSION_TIMEOUT,
            ]
            .contains(c)
                || c.code().starts_with("08")
        })
        || (e.as_db_error().is_none()
            && std::error::Error::source(e).is_some_and(|c| c.is::<std::io::Error>()))
}

/// What a PostgreSQL error means, in words: the server's own report
/// (severity, SQLSTATE, message, detail, hint) when it sent one, else
/// the client's cause (a refused or lost connection, a timeout); and, for
/// a connection that went away, what became of the transaction in flight
/// (`op` says whether it was committing).
pub(super) fn describe(op: &str, e: &postgres::Error) -> String {
    use postgres::error::SqlState;
    let mut text = report(e);
    let code = e.code();
    let lost = connection_lost(e);
    if code == Some(&SqlState::INVALID_CATALOG_NAME) {
        text.push_str("; create the database first (createdb NAME)");
    }
    if lost && op != "connecting" {
        if op.contains("commit") {
            text.push_str(
                "; the connection was lost while the transaction committed: the server may or may \
                 not have applied it (read the thread again to see)",
            );
        } else {
            text.push_str("; the connection was lost: nothing of this transaction was applied");
        }
    } else if code.is_some() {
        text.push_str("; nothing of this transaction was applied");
    }
    text
}

/// Why a lock's connection is gone, in words: the server's report when it
/// sent one (an administrator's `pg_terminate_backend` is `FATAL 57P01`),
/// else that the connection was lost and the driver's cause.
pub(super) fn lock_lost_detail(e: &postgres::Error) -> String {
    if e.as_db_error().is_some() {
        report(e)
    } else {
        format!("the connection was lost: {}", report(e))
    }
}

/// The server's own report (severity, SQLSTATE, message, detail, hint)
/// when it sent one, else the driver's text and every cause under it.
pub(super) fn report(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut t = format!(
                "the server said {} {}: {}",
                db.severity(),
                db.code().code(),
                db.message()
            );
            if let Some(d) = db.detail() {
                t.push_str(&format!(" (detail: {d})"));
            }
            if let Some(h) = db.hint() {
                t.push_str(&format!(" (hint: {h})"));
            }
            t
        }
        None => {
            // The driver's own text ("db error", "connection closed", "error
            // connecting to server") and every cause under it.
            let mut t = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                t.push_str(&format!(": {c}"));
                cause = c.source();
            }
            t
        }
    }
}
