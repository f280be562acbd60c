//! The dashboard's files, embedded in the binary (`assets/`; a debug
//! build reads them from the source tree, so they can be edited without
//! rebuilding). A request names a file exactly; no path is ever joined,
//! so nothing outside the embedded set can be reached.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

#[derive(rust_embed::RustEmbed)]
#[folder = "src/bin/uwf-db/serve/assets/"]
struct Assets;

/// What the dashboard may load and run: its own files, nothing inline.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Whether `name` is a plain relative file name: segments of letters,
/// digits, `.`, `-` and `_`, none of them `.` or `..`.
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        })
}

fn file(name: &str) -> Response {
    let found = if plain(name) { Assets::get(name) } else { None };
    let Some(found) = found else {
        return ApiError::not_found(format!(
            "no file /assets/{}",
            super::params::truncated(name)
        ))
        .into_response();
    };
    let mime = match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        Some("txt" | "md") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    };
    let mut response = (StatusCode::OK, found.data.into_owned()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `GET /`: the dashboard.
pub async fn index() -> Response {
    file("index.html")
}

/// `GET /assets/{*path}`.
pub async fn asset(Path(path): Path<String>) -> Response {
    file(&path)
}
