//! A validated workflow, ready to run: only the nodes output nodes depend on, in
//! dependency order, with constants normalized and the constant part of each cache key
//! already hashed.

use std::sync::Arc;

use serde_json::Value as Json;

use crate::node::{InputData, Inputs, Lane, Node};
use crate::value::IoType;

/// A content hash identifying a node's outputs: equal keys mean equal outputs, whatever
/// the node ids of the workflows they came from.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey(pub [u8; 32]);

impl std::fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

pub(crate) struct PlanLink {
    pub input: String,
    /// Index into [`Plan::nodes`] of the producing node.
    pub from: usize,
    pub output: usize,
}

pub(crate) struct PlanNode {
    pub id: String,
    pub class_type: String,
    pub node: Arc<dyn Node>,
    pub lane: Lane,
    /// The constant inputs, normalized by validation; links are added at execution.
    pub consts: Inputs,
    pub links: Vec<PlanLink>,
    pub output_types: Vec<IoType>,
    pub output_node: bool,
    /// Hash state after the class and constants; links and fingerprint are added per run.
    pub key_prefix: blake3::Hasher,
}

/// The runnable form of a workflow, produced by [`crate::Executor::validate`].
pub struct Plan {
    /// Topologically sorted: every link points to an earlier node.
    pub(crate) nodes: Vec<PlanNode>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.nodes.iter().map(|n| (&n.id, &n.class_type)))
            .finish()
    }
}

impl Plan {
    /// Node ids in the order they would run one at a time.
    pub fn node_ids(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.id.as_str())
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

pub(crate) fn key_prefix(class_type: &str, consts: &Inputs) -> blake3::Hasher {
    let mut h = blake3::Hasher::new();
    h.update(b"sdflow-node-v1\0");
    hash_str(&mut h, class_type);
    let mut entries: Vec<(&str, &Json)> = consts
        .iter()
        .filter_map(|(n, d)| match d {
            InputData::Const(c) => Some((n, c)),
            InputData::Value(_) => None,
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    h.update(&(entries.len() as u64).to_le_bytes());
    for (name, value) in entries {
        hash_str(&mut h, name);
        hash_json(&mut h, value);
    }
    h
}

pub(crate) fn finish_key(
    prefix: &blake3::Hasher,
    links: &[(&str, CacheKey, usize)],
    fingerprint: Option<&[u8]>,
) -> CacheKey {
    let mut h = prefix.clone();
    h.update(b"links\0");
    h.update(&(links.len() as u64).to_le_bytes());
    for (name, key, output) in links {
        hash_str(&mut h, name);
        h.update(&key.0);
        h.update(&(*output as u64).to_le_bytes());
    }
    match fingerprint {
        Some(f) => {
            h.update(&[1]);
            h.update(&(f.len() as u64).to_le_bytes());
            h.update(f);
        }
        None => {
            h.update(&[0]);
        }
    }
    CacheKey(*h.finalize().as_bytes())
}

fn hash_str(h: &mut blake3::Hasher, s: &str) {
    h.update(&(s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

/// Hashes JSON canonically: object keys sorted, every item tagged and length-prefixed,
/// so key order in the file and formatting never change the key.
fn hash_json(h: &mut blake3::Hasher, v: &Json) {
    match v {
        Json::Null => {
            h.update(b"n");
        }
        Json::Bool(b) => {
            h.update(if *b { b"t" } else { b"f" });
        }
        Json::Number(n) => {
            h.update(b"#");
            hash_str(h, &n.to_string());
        }
        Json::String(s) => {
            h.update(b"s");
            hash_str(h, s);
        }
        Json::Array(a) => {
            h.update(b"[");
            h.update(&(a.len() as u64).to_le_bytes());
            for item in a {
                hash_json(h, item);
            }
        }
        Json::Object(o) => {
            h.update(b"{");
            h.update(&(o.len() as u64).to_le_bytes());
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            for k in keys {
                hash_str(h, k);
                hash_json(h, &o[k]);
            }
        }
    }
}
