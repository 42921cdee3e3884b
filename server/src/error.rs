//! The one error type of the server. Every handler returns it; [`IntoResponse`] turns it
//! into a status code and a JSON body shaped like ComfyUI's errors
//! (`{"error": {"type", "message", "details", "extra_info"}, "node_errors": {}}`), which
//! ComfyUI clients show as they are.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sdflow_executor::ValidationReport;
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A request that cannot be understood: malformed JSON, a missing or mistyped field.
    #[error("{0}")]
    BadRequest(String),
    /// A workflow that failed validation; the report is ComfyUI's `/prompt` error body.
    #[error("{0}")]
    Invalid(Box<ValidationReport>),
    #[error("{0}")]
    NotFound(String),
    /// It existed and is no longer kept (an sdcpp API job past its time to live).
    #[error("{0}")]
    Gone(String),
    #[error("{0}")]
    Forbidden(String),
    /// The target exists and the client asked not to overwrite it.
    #[error("{0}")]
    Conflict(String),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the queue is full ({max} prompts waiting); try again later")]
    QueueFull { max: usize },
    /// Scale-out mode: the queue's Redis does not answer.
    #[error("{0}")]
    QueueUnavailable(String),
    /// The server is stopping and takes no new work.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// A prompt ran and failed (only the synchronous A1111/OpenAI endpoints wait for one).
    #[error("{0}")]
    RunFailed(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> Self {
        ApiError::BadRequest(message.into())
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ApiError::Io {
            context: context.into(),
            source,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Gone(_) => StatusCode::GONE,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::ShuttingDown | ApiError::QueueUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::RunFailed(_) | ApiError::Io { .. } | ApiError::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Invalid(_) => "invalid_prompt",
            ApiError::NotFound(_) => "not_found",
            ApiError::Gone(_) => "gone",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::Conflict(_) => "conflict",
            ApiError::Unauthorized => "unauthorized",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::ShuttingDown => "shutting_down",
            ApiError::QueueUnavailable(_) => "queue_unavailable",
            ApiError::RunFailed(_) => "execution_error",
            ApiError::Io { .. } => "io_error",
            ApiError::Internal(_) => "internal_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!("{self}");
        } else {
            tracing::debug!("{status}: {self}");
        }
        let body = match &self {
            ApiError::Invalid(report) => report.to_json(),
            other => json!({
                "error": {
                    "type": other.kind(),
                    "message": other.to_string(),
                    "details": "",
                    "extra_info": {},
                },
                "node_errors": {},
            }),
        };
        let mut response = (status, Json(body)).into_response();
        if matches!(self, ApiError::Unauthorized) {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}
