//! Outputs in an S3-compatible object store (`--output-store s3://bucket/prefix`), for
//! scale-out workers on machines that share no folder with the front ends.
//!
//! A worker uploads each file a prompt's outputs list (`type` output or temp) to
//! `PREFIX/TYPE/SUBFOLDER/NAME` before it stores the history entry, and deletes its
//! local copy; front ends serve `/view` (and the A1111/OpenAI replies) from there. Names
//! are claimed in Redis first: workers on different machines count `ComfyUI_00001_.png`
//! from the same start, so a name another worker holds moves on to the next free number
//! of that prefix, and the history entry and the `executed` event carry the final name.
//!
//! Credentials, region and endpoint come from the variables every S3 tool reads:
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` (or `AWS_DEFAULT_REGION`;
//! `us-east-1` when unset) and `AWS_ENDPOINT_URL` for a store other than AWS (MinIO, Ceph,
//! Garage…), which is then addressed path-style.

use s3::creds::Credentials;
use s3::{Bucket, Region};

#[derive(Debug, thiserror::Error)]
pub enum ObjectStoreError {
    #[error("--output-store {url}: {reason}")]
    Config { url: String, reason: String },
    #[error("the output store {url}: {what}: {reason}")]
    Request { url: String, what: String, reason: String },
}

pub struct ObjectStore {
    bucket: Box<Bucket>,
    prefix: String,
    url: String,
}

/// Claims an output name for the whole cluster: the name itself when it is free, else the
/// next free number of its `STEM_NNNNN_.ext` series (past the highest ever claimed), or
/// the name prefixed with the prompt id when it has no number.
pub const CLAIM: &str = r#"
local dir = ARGV[1]
if ARGV[3] == '' then
  if redis.call('HSETNX', KEYS[1], dir .. '/' .. ARGV[5], ARGV[6]) == 1 then return ARGV[5] end
  local name = ARGV[6] .. '_' .. ARGV[5]
  redis.call('HSET', KEYS[1], dir .. '/' .. name, ARGV[6])
  return name
end
local series = dir .. '/' .. ARGV[2]
local n = tonumber(ARGV[3])
local seen = tonumber(redis.call('HGET', KEYS[2], series) or '0')
if redis.call('HEXISTS', KEYS[1], dir .. '/' .. ARGV[5]) == 1 and n <= seen then n = seen + 1 end
while true do
  local name = string.format('%s_%05d%s', ARGV[2], n, ARGV[4])
  if redis.call('HSETNX', KEYS[1], dir .. '/' .. name, ARGV[6]) == 1 then
    if n > seen then redis.call('HSET', KEYS[2], series, n) end
    return name
  end
  n = math.max(n, seen) + 1
end
"#;

/// `STEM_NNNNN_.ext` → (stem, number, `_.ext`), ComfyUI's output naming.
pub fn numbered(name: &str) -> Option<(&str, u64, &str)> {
    let dot = name.rfind('.')?;
    let body = name[..dot].strip_suffix('_')?;
    let us = body.rfind('_')?;
    let digits = &body[us + 1..];
    if digits.len() < 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((&body[..us], digits.parse().ok()?, &name[dot - 1..]))
}

impl ObjectStore {
    pub fn open(url: &str) -> Result<ObjectStore, ObjectStoreError> {
        let bad = |reason: &str| ObjectStoreError::Config { url: url.to_string(), reason: reason.to_string() };
        let rest = url.strip_prefix("s3://").ok_or_else(|| bad("must be s3://BUCKET[/PREFIX]"))?;
        let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if name.is_empty() {
            return Err(bad("no bucket name"));
        }
        let region_name = std::env::var("AWS_REGION").or_else(|_| std::env::var("AWS_DEFAULT_REGION")).unwrap_or_else(|_| "us-east-1".into());
        let endpoint = std::env::var("AWS_ENDPOINT_URL").ok().filter(|e| !e.is_empty());
        let region = match &endpoint {
            Some(endpoint) => Region::Custom { region: region_name, endpoint: endpoint.clone() },
            None => region_name.parse().map_err(|e| bad(&format!("region: {e}")))?,
        };
        let credentials = Credentials::from_env().map_err(|e| bad(&format!("credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY): {e}")))?;
        let bucket = Bucket::new(name, region, credentials).map_err(|e| bad(&e.to_string()))?;
        let bucket = if endpoint.is_some() { bucket.with_path_style() } else { bucket };
        let store = ObjectStore { bucket, prefix: prefix.trim_matches('/').to_string(), url: url.to_string() };
        // A wrong bucket, endpoint or key shows now rather than at the first image.
        let probe = store.key("output", "", ".sdflow-probe");
        match store.bucket.head_object(&probe) {
            Ok((_, code)) if code == 200 || code == 404 => Ok(store),
            Ok((_, code)) => Err(store.failed("checking the bucket", format!("HTTP {code}"))),
            Err(s3::error::S3Error::HttpFailWithBody(404, _)) => Ok(store),
            Err(e) => Err(store.failed("checking the bucket", e.to_string())),
        }
    }

    fn failed(&self, what: &str, reason: String) -> ObjectStoreError {
        ObjectStoreError::Request { url: self.url.clone(), what: what.to_string(), reason }
    }

    /// The object key of an output file.
    pub fn key(&self, kind: &str, subfolder: &str, filename: &str) -> String {
        [self.prefix.as_str(), kind, subfolder, filename].iter().filter(|p| !p.is_empty()).copied().collect::<Vec<_>>().join("/")
    }

    pub fn put(&self, key: &str, bytes: &[u8], content_type: &str) -> Result<(), ObjectStoreError> {
        let r = self.bucket.put_object_with_content_type(key, bytes, content_type).map_err(|e| self.failed(&format!("storing {key}"), e.to_string()))?;
        match r.status_code() {
            200..=299 => Ok(()),
            code => Err(self.failed(&format!("storing {key}"), format!("HTTP {code}: {}", String::from_utf8_lossy(r.as_slice())))),
        }
    }

    /// The object's bytes; `None` when there is no such object.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, ObjectStoreError> {
        let r = match self.bucket.get_object(key) {
            Ok(r) => r,
            Err(s3::error::S3Error::HttpFailWithBody(404, _)) => return Ok(None),
            Err(e) => return Err(self.failed(&format!("reading {key}"), e.to_string())),
        };
        match r.status_code() {
            200..=299 => Ok(Some(r.as_slice().to_vec())),
            404 => Ok(None),
            code => Err(self.failed(&format!("reading {key}"), format!("HTTP {code}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comfyui_output_names_split_into_series_and_number() {
        assert_eq!(numbered("ComfyUI_00012_.png"), Some(("ComfyUI", 12, "_.png")));
        assert_eq!(numbered("a_b_123456_.webp"), Some(("a_b", 123456, "_.webp")));
        assert_eq!(numbered("x_0001_.png"), None);
        assert_eq!(numbered("photo.png"), None);
        assert_eq!(numbered("ComfyUI_00012.png"), None);
    }

    #[test]
    fn urls_are_checked() {
        assert!(matches!(ObjectStore::open("http://bucket"), Err(ObjectStoreError::Config { .. })));
        assert!(matches!(ObjectStore::open("s3:///prefix"), Err(ObjectStoreError::Config { .. })));
    }
}
