//! Errors as HTTP answers: an [`ErrorAnswer`] with the status of its
//! [`ErrorKind`] (`ErrorKind::http_status`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use uwf_db::api::{ErrorAnswer, ErrorBody, ErrorKind};

/// A failed request: the answer, and a status when the kind's own does not
/// say it (415 for a body that is not JSON).
#[derive(Debug)]
pub struct ApiError(pub ErrorAnswer, pub Option<StatusCode>);

impl ApiError {
    /// An error of `kind` saying `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError(
            ErrorAnswer {
                error: ErrorBody {
                    kind,
                    message: message.into(),
                    causes: Vec::new(),
                    hint: None,
                    exit_code: 1,
                },
            },
            None,
        )
    }

    /// Bad input, naming what is wrong.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.0.error.hint = Some(hint.into());
        self
    }

    /// A library error, with its kind and its chain of causes.
    pub fn of<E>(e: &E) -> Self
    where
        E: std::error::Error + 'static,
        for<'a> &'a E: Into<ErrorKind>,
    {
        let kind: ErrorKind = e.into();
        let kind = if is_damage(e) {
            ErrorKind::Damaged
        } else {
            kind
        };
        let message = e.to_string();
        let mut said = message.clone();
        let mut causes = Vec::new();
        let mut cause = e.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !crate::says_nothing(c) && !said.contains(&text) {
                said.push_str(&text);
                causes.push(text);
            }
            cause = c.source();
        }
        let mut err = ApiError::new(kind, message);
        err.0.error.causes = causes;
        err
    }

    pub fn status(&self) -> StatusCode {
        if let Some(s) = self.1 {
            return s;
        }
        StatusCode::from_u16(self.0.error.kind.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

fn is_damage(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<uwf_db::StoreError>()
            .is_some_and(uwf_db::StoreError::is_damage)
        {
            return true;
        }
        cause = c.source();
    }
    false
}

macro_rules! from_library {
    ($($t:ty),*) => {$(
        impl From<$t> for ApiError {
            fn from(e: $t) -> Self {
                ApiError::of(&e)
            }
        }
    )*};
}

from_library!(
    uwf_db::StoreError,
    uwf_db::thread::ThreadError,
    uwf_db::workflow::WorkflowError,
    uwf_db::engine::EngineError
);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, axum::Json(self.0)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"uwf-db\""),
            );
        }
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(r: axum::extract::rejection::JsonRejection) -> Self {
        let status = r.status();
        let text = r.body_text();
        match status {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                ErrorKind::TooLarge,
                format!("the request body is larger than {} bytes", super::MAX_BODY),
            ),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                let mut e = ApiError::invalid(
                    "the request body must be JSON, sent with Content-Type: application/json",
                );
                e.1 = Some(status);
                e
            }
            _ => ApiError::invalid(format!("the request body is not acceptable: {text}")),
        }
    }
}

/// Library calls running at once; more wait for a slot (bounded by the
/// connection cap), and one that waits longer than [`WAIT`] is refused.
/// Bounded so that a page hammering a costly endpoint queues behind this
/// instead of in the runtime's unbounded blocking queue.
const SLOTS: usize = 28;
/// Longest wait for a slot.
const WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Longest a request waits for its library call; the call itself goes on
/// (it holds its slot), the client is answered 503.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn slots() -> &'static tokio::sync::Semaphore {
    static SLOTS_: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SLOTS_.get_or_init(|| tokio::sync::Semaphore::new(SLOTS))
}

/// Runs a library call on the blocking pool, in one of [`SLOTS`].
pub async fn blocking<T, F>(f: F) -> ApiResult<T>
where
    T: Send + 'static,
    F: FnOnce() -> ApiResult<T> + Send + 'static,
{
    let busy = || {
        ApiError::new(
            ErrorKind::Unavailable,
            "the server is busy: too many requests are being answered; try again",
        )
    };
    let permit = match tokio::time::timeout(WAIT, slots().acquire()).await {
        Ok(Ok(permit)) => permit,
        _ => return Err(busy()),
    };
    let work = tokio::task::spawn_blocking(move || {
        let _held = permit;
        f()
    });
    match tokio::time::timeout(TIMEOUT, work).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => Err(ApiError::new(
            ErrorKind::Failed,
            format!("the request's work ended early: {e}"),
        )),
        Err(_) => Err(ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "the request took longer than {} s; try a smaller page",
                TIMEOUT.as_secs()
            ),
        )),
    }
}
