//! Typed extractors whose rejections are [`ApiError`]s, so bad input gets the same JSON
//! error shape as every other failure.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON body, read whatever the `Content-Type` (ComfyUI reads bodies as JSON
/// regardless, and clients rely on it), within the body size limit.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad("the request body is empty; expected JSON"));
        }
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            ApiError::bad(format!(
                "malformed JSON body at line {}, column {}: {e}",
                e.line(),
                e.column()
            ))
        })
    }
}

/// The body, turning axum's length-limit rejection into a 413 that names the limit.
pub async fn body_bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let limit = req
        .extensions()
        .get::<BodyLimit>()
        .map(|l| l.0)
        .unwrap_or(usize::MAX);
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { limit }
        } else {
            ApiError::bad(format!("reading the request body: {e}"))
        }
    })
}

/// The configured body limit, put on every request so rejections can name it.
#[derive(Clone, Copy)]
pub struct BodyLimit(pub usize);

/// A query string, with ComfyUI's leniency: unknown keys are ignored.
pub struct QueryArgs<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryArgs<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryArgs(q.0))
            .map_err(|e| ApiError::bad(format!("bad query string: {}", e.body_text())))
    }
}

/// Multipart form, with its errors as [`ApiError`]s.
pub struct Form(pub axum::extract::Multipart);

impl<S: Send + Sync> FromRequest<S> for Form {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        axum::extract::Multipart::from_request(req, state)
            .await
            .map(Form)
            .map_err(|e| {
                ApiError::bad(format!(
                    "expected a multipart/form-data body: {}",
                    e.body_text()
                ))
            })
    }
}

/// One uploaded file or text field.
pub struct Part {
    pub name: String,
    pub file_name: Option<String>,
    pub bytes: Bytes,
}

impl Form {
    /// Reads every part; a body over the size limit is a 413.
    pub async fn parts(mut self, limit: usize) -> Result<Vec<Part>, ApiError> {
        let mut out = Vec::new();
        loop {
            let field = self
                .0
                .next_field()
                .await
                .map_err(|e| multipart_error(e, limit))?;
            let Some(field) = field else { break };
            let name = field.name().unwrap_or_default().to_string();
            let file_name = field.file_name().map(str::to_string);
            let bytes = field.bytes().await.map_err(|e| multipart_error(e, limit))?;
            out.push(Part {
                name,
                file_name,
                bytes,
            });
        }
        Ok(out)
    }
}

fn multipart_error(e: axum::extract::multipart::MultipartError, limit: usize) -> ApiError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge { limit }
    } else {
        ApiError::bad(format!("malformed multipart body: {}", e.body_text()))
    }
}

/// The text of part `name`, if the form has it.
pub fn text_field<'a>(parts: &'a [Part], name: &str) -> Result<Option<&'a str>, ApiError> {
    match parts.iter().find(|p| p.name == name) {
        Some(p) => std::str::from_utf8(&p.bytes)
            .map(Some)
            .map_err(|_| ApiError::bad(format!("form field `{name}` is not UTF-8 text"))),
        None => Ok(None),
    }
}
