//! Values that flow on links between nodes.
//!
//! The executor never looks inside a value: it only needs the IO type tag (to check links),
//! a byte size (to budget the output cache) and a way for the consuming node to get its
//! concrete type back. Values are immutable once produced and shared by `Arc`, so a cached
//! output handed to ten downstream nodes is never copied.

use std::any::{Any, TypeId};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// The name of a socket type, as ComfyUI spells it (`MODEL`, `LATENT`, `INT`, ...).
///
/// Custom node packs define their own types, so this is an open set of strings rather
/// than an enum; the associated constants cover the ones ComfyUI ships.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IoType(Cow<'static, str>);

impl IoType {
    pub const MODEL: IoType = IoType::from_static("MODEL");
    pub const CLIP: IoType = IoType::from_static("CLIP");
    pub const VAE: IoType = IoType::from_static("VAE");
    pub const CONDITIONING: IoType = IoType::from_static("CONDITIONING");
    pub const LATENT: IoType = IoType::from_static("LATENT");
    pub const IMAGE: IoType = IoType::from_static("IMAGE");
    pub const MASK: IoType = IoType::from_static("MASK");
    pub const SAMPLER: IoType = IoType::from_static("SAMPLER");
    pub const SIGMAS: IoType = IoType::from_static("SIGMAS");
    pub const NOISE: IoType = IoType::from_static("NOISE");
    pub const GUIDER: IoType = IoType::from_static("GUIDER");
    pub const CONTROL_NET: IoType = IoType::from_static("CONTROL_NET");
    pub const UPSCALE_MODEL: IoType = IoType::from_static("UPSCALE_MODEL");
    pub const CLIP_VISION: IoType = IoType::from_static("CLIP_VISION");
    pub const CLIP_VISION_OUTPUT: IoType = IoType::from_static("CLIP_VISION_OUTPUT");
    pub const STYLE_MODEL: IoType = IoType::from_static("STYLE_MODEL");
    pub const GLIGEN: IoType = IoType::from_static("GLIGEN");
    pub const INT: IoType = IoType::from_static("INT");
    pub const FLOAT: IoType = IoType::from_static("FLOAT");
    pub const STRING: IoType = IoType::from_static("STRING");
    pub const BOOLEAN: IoType = IoType::from_static("BOOLEAN");
    /// The type ComfyUI gives a combo input when it is converted to a socket.
    pub const COMBO: IoType = IoType::from_static("COMBO");
    /// Matches every type (ComfyUI's `*`, used by Reroute and generic nodes).
    pub const ANY: IoType = IoType::from_static("*");

    pub const fn from_static(name: &'static str) -> Self {
        IoType(Cow::Borrowed(name))
    }

    pub fn new(name: impl Into<String>) -> Self {
        IoType(Cow::Owned(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether an output of type `self` may feed an input declared as `input`.
    ///
    /// Follows ComfyUI's `validate_node_input`: `*` on either side matches, and a
    /// comma-separated input type (`IMAGE,MASK`) accepts any of its members.
    pub fn feeds(&self, input: &IoType) -> bool {
        if self == input || self.0 == "*" || input.0 == "*" {
            return true;
        }
        let received: Vec<&str> = self.0.split(',').map(str::trim).collect();
        input
            .0
            .split(',')
            .map(str::trim)
            .any(|t| received.contains(&t))
    }
}

impl fmt::Debug for IoType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for IoType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for IoType {
    fn from(s: &str) -> Self {
        IoType::new(s)
    }
}

/// Implemented by everything that travels on a link, so the output cache can budget it.
///
/// Model-like values (MODEL, CLIP, VAE, ...) are handles into the residency manager, which
/// owns and evicts the weights; they report (close to) zero so they never push real
/// intermediate results out of the cache.
pub trait CacheSize: Any + Send + Sync {
    /// Bytes this value keeps alive that the output cache should count.
    fn cache_bytes(&self) -> usize;
}

impl CacheSize for i64 {
    fn cache_bytes(&self) -> usize {
        8
    }
}
impl CacheSize for f64 {
    fn cache_bytes(&self) -> usize {
        8
    }
}
impl CacheSize for bool {
    fn cache_bytes(&self) -> usize {
        1
    }
}
impl CacheSize for String {
    fn cache_bytes(&self) -> usize {
        self.len()
    }
}

/// One output of one node: a type tag plus an immutable, shared payload.
#[derive(Clone)]
pub struct Value {
    io_type: IoType,
    data: Arc<dyn Any + Send + Sync>,
    // Measured once at construction: values are immutable, so it cannot change.
    cache_bytes: usize,
    type_name: &'static str,
}

impl Value {
    pub fn new<T: CacheSize>(io_type: IoType, data: T) -> Self {
        Self::from_arc(io_type, Arc::new(data))
    }

    /// Wraps an already shared payload (e.g. a handle the residency manager also holds).
    pub fn from_arc<T: CacheSize>(io_type: IoType, data: Arc<T>) -> Self {
        let cache_bytes = data.cache_bytes();
        Value {
            io_type,
            data,
            cache_bytes,
            type_name: std::any::type_name::<T>(),
        }
    }

    /// A handle to something another component owns and evicts (a model in the residency
    /// manager): shared, and counted as 0 cache bytes.
    pub fn handle<T: Any + Send + Sync>(io_type: IoType, data: Arc<T>) -> Self {
        Self::with_size(io_type, data, 0)
    }

    /// A payload whose type cannot implement [`CacheSize`] here (the orphan rule keeps a
    /// node crate from implementing it for another crate's type), with its size given.
    pub fn with_size<T: Any + Send + Sync>(
        io_type: IoType,
        data: Arc<T>,
        cache_bytes: usize,
    ) -> Self {
        Value {
            io_type,
            data,
            cache_bytes,
            type_name: std::any::type_name::<T>(),
        }
    }

    pub fn int(v: i64) -> Self {
        Self::new(IoType::INT, v)
    }
    pub fn float(v: f64) -> Self {
        Self::new(IoType::FLOAT, v)
    }
    pub fn string(v: impl Into<String>) -> Self {
        Self::new(IoType::STRING, v.into())
    }
    pub fn boolean(v: bool) -> Self {
        Self::new(IoType::BOOLEAN, v)
    }

    pub fn io_type(&self) -> &IoType {
        &self.io_type
    }

    pub fn cache_bytes(&self) -> usize {
        self.cache_bytes
    }

    /// Rust type name of the payload, for error messages.
    pub fn payload_type_name(&self) -> &'static str {
        self.type_name
    }

    pub fn is<T: Any>(&self) -> bool {
        (*self.data).type_id() == TypeId::of::<T>()
    }

    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.data.downcast_ref::<T>()
    }

    /// The payload as a shared pointer, for nodes that pass it on or keep it.
    pub fn downcast_arc<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.data.clone().downcast::<T>().ok()
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Value")
            .field("io_type", &self.io_type)
            .field("payload", &self.type_name)
            .field("cache_bytes", &self.cache_bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_matching_follows_comfyui() {
        assert!(IoType::LATENT.feeds(&IoType::LATENT));
        assert!(!IoType::LATENT.feeds(&IoType::IMAGE));
        assert!(IoType::ANY.feeds(&IoType::IMAGE));
        assert!(IoType::MASK.feeds(&IoType::new("IMAGE,MASK")));
        assert!(!IoType::LATENT.feeds(&IoType::new("IMAGE,MASK")));
    }

    #[test]
    fn downcast_and_size() {
        let v = Value::string("hello");
        assert_eq!(v.cache_bytes(), 5);
        assert_eq!(
            v.downcast_ref::<String>().map(String::as_str),
            Some("hello")
        );
        assert!(v.downcast_ref::<i64>().is_none());
        assert!(v.is::<String>());
    }

    #[test]
    fn handles_count_nothing() {
        struct Weights(#[allow(dead_code)] Vec<u8>);
        let w = Arc::new(Weights(vec![0; 1024]));
        let v = Value::handle(IoType::MODEL, w.clone());
        assert_eq!(v.cache_bytes(), 0);
        assert!(Arc::ptr_eq(&v.downcast_arc::<Weights>().unwrap(), &w));
        assert_eq!(Value::with_size(IoType::IMAGE, w, 1024).cache_bytes(), 1024);
    }
}
