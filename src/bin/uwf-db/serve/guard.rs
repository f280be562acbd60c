//! The checks every request passes before its handler (`docs/design.md`
//! §8d, "Safe by default"):
//!
//! 1. **Host.** Without a token (a loopback bind), the `Host` header must
//!    name the server (its bind address, `localhost`, `127.0.0.1`, `[::1]`
//!    on its port, or an `--allow-host`): a page on another site that
//!    rebinds its DNS name to 127.0.0.1 is refused (DNS rebinding).
//! 2. **Token.** With `--token`, every `/api/` request (and `/metrics`)
//!    carries it, as
//!    `Authorization: Bearer TOKEN`, or `?token=TOKEN` on a GET of an event
//!    stream only (browsers open those without headers); compared in
//!    constant time.
//! 3. **Origin.** An API request a browser sends from another site's page
//!    is refused, read or write: its `Origin`, when sent, must be this
//!    server's, and `Sec-Fetch-Site`, when sent, must be `same-origin` or
//!    `none`. (Another site's page could not read the answers, but could
//!    make the server work and time it.) Write bodies must be
//!    `application/json`, which a plain HTML form cannot send.
//! 4. **Read-only.** With `--read-only`, writes are refused.
//!
//! Every answer gets headers that keep browsers from sniffing types,
//! framing the dashboard, or sending referrers.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use uwf_db::api::ErrorKind;

use super::Shared;
use super::error::ApiError;

pub async fn guard(State(state): State<Shared>, request: Request, next: Next) -> Response {
    // `/metrics` (a Prometheus scrape) is data like the API's, guarded alike.
    let path = request.uri().path();
    let is_api = path.starts_with("/api/") || path == "/metrics";
    let mut response = match check(&state, &request, is_api) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    };
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if is_api {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

fn check(state: &Shared, request: &Request, is_api: bool) -> Result<(), ApiError> {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase);
    if let Some(allowed) = &state.hosts {
        match &host {
            Some(h) if allowed.iter().any(|a| a == h) => {}
            _ => {
                return Err(ApiError::new(
                    ErrorKind::Forbidden,
                    format!(
                        "this server does not answer to host '{}'",
                        host.as_deref().unwrap_or("")
                    ),
                )
                .with_hint(
                    "open it as http://127.0.0.1:PORT/, or start it with --allow-host HOST",
                ));
            }
        }
    }
    // A body announced past the cap is refused before it is read.
    if headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > super::MAX_BODY as u64)
    {
        return Err(ApiError::new(
            ErrorKind::TooLarge,
            format!("the request body is larger than {} bytes", super::MAX_BODY),
        ));
    }
    let get = matches!(*request.method(), Method::GET | Method::HEAD);
    if is_api && let Some(expected) = &state.token {
        // In the query only where a browser cannot send a header: an
        // EventSource (GET on an event stream).
        let in_query = get && request.uri().path().ends_with("/events");
        let given = bearer(request)
            .map(str::to_owned)
            .or_else(|| in_query.then(|| query_token(request)).flatten());
        let ok = given.is_some_and(|t| blake3::hash(t.as_bytes()) == *expected);
        if !ok {
            return Err(ApiError::new(
                ErrorKind::Unauthorized,
                "this server needs its token: send Authorization: Bearer TOKEN",
            ));
        }
    }
    // The API answers this server's own pages and programs that are not
    // browsers, never another site's page: a page elsewhere could not
    // read the answers, but could make the server work (and time them).
    if is_api {
        if headers
            .get("sec-fetch-site")
            .is_some_and(|v| !matches!(v.as_bytes(), b"same-origin" | b"none"))
        {
            return Err(ApiError::new(
                ErrorKind::Forbidden,
                "a request from another site's page is refused",
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("").to_ascii_lowercase();
            let same = host.as_deref().is_some_and(|h| {
                origin == format!("http://{h}") || origin == format!("https://{h}")
            });
            if !same {
                return Err(ApiError::new(
                    ErrorKind::Forbidden,
                    format!(
                        "a request from origin '{}' is refused: only this server's own pages may call it",
                        super::params::truncated(&origin)
                    ),
                ));
            }
        }
    }
    if !get && state.read_only && is_api {
        return Err(ApiError::new(
            ErrorKind::Forbidden,
            "this server is read-only (--read-only)",
        ));
    }
    Ok(())
}

fn bearer(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn query_token(request: &Request) -> Option<String> {
    let query = request.uri().query()?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
}
