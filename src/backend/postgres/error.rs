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
            detail: describe(&op, &e, location),
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
pub(super) fn describe(op: &str, e: &postgres::Error, location: &str) -> String {
    use postgres::error::SqlState;
    let mut text = report(e);
    let code = e.code();
    let lost = connection_lost(e);
    if code == Some(&SqlState::INVALID_CATALOG_NAME) {
        text.push_str(&format!(
            "; create the database first: {}",
            createdb_command(location)
        ));
    }
    if op == "connecting" {
        // No transaction began: nothing to say of one.
        return text;
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

/// The `createdb` command that makes the database `location` names, with
/// its host, port and user (`createdb NAME` when the URL does not parse).
fn createdb_command(location: &str) -> String {
    let Ok(config) = location.parse::<postgres::Config>() else {
        return "createdb NAME".to_owned();
    };
    let mut cmd = String::from("createdb");
    if let Some(host) = config.get_hosts().first() {
        match host {
            postgres::config::Host::Tcp(h) => cmd.push_str(&format!(" -h {}", shell_word(h))),
            #[cfg(unix)]
            postgres::config::Host::Unix(p) => {
                cmd.push_str(&format!(" -h {}", shell_word(&p.display().to_string())))
            }
        }
    }
    if let Some(port) = config.get_ports().first() {
        cmd.push_str(&format!(" -p {port}"));
    }
    if let Some(user) = config.get_user() {
        cmd.push_str(&format!(" -U {}", shell_word(user)));
    }
    match config.get_dbname() {
        Some(db) => cmd.push_str(&format!(" {}", shell_word(db))),
        None => cmd.push_str(" NAME"),
    }
    cmd
}

/// `word` as one shell word: as is when it holds only characters no shell
/// treats specially, else in single quotes.
fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.,/:@%+=".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
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

#[cfg(test)]
mod createdb_tests {
    use super::createdb_command;

    #[test]
    fn the_command_names_the_url_s_server_user_and_database() {
        assert_eq!(
            createdb_command("postgres://root:***@db.example:6432/runs"),
            "createdb -h db.example -p 6432 -U root runs"
        );
        // A name a shell would split or expand is quoted.
        assert_eq!(
            createdb_command("host=/run/postgresql user=me dbname='my runs; rm'"),
            "createdb -h /run/postgresql -U me 'my runs; rm'"
        );
        assert_eq!(
            createdb_command("postgres://me@h/it%27s"),
            "createdb -h h -p 5432 -U me 'it'\\''s'"
        );
    }
}
