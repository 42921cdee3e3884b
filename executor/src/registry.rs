//! The catalogue of node types a host makes available.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use crate::node::Node;
use crate::schema::NodeSchema;

#[derive(Default, Clone)]
pub struct Registry {
    nodes: BTreeMap<String, Arc<dyn Node>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a node type under its schema name; returns the one it replaced, if any.
    pub fn register(&mut self, node: Arc<dyn Node>) -> Option<Arc<dyn Node>> {
        let name = node.schema().name;
        self.nodes.insert(name, node)
    }

    pub fn get(&self, class_type: &str) -> Option<&Arc<dyn Node>> {
        self.nodes.get(class_type)
    }

    pub fn schema(&self, class_type: &str) -> Option<NodeSchema> {
        self.get(class_type).map(|n| n.schema())
    }

    pub fn class_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The whole catalogue in the JSON shape of ComfyUI's `GET /object_info`.
    ///
    /// Schemas are asked for afresh, so combo lists that depend on the file system
    /// (checkpoint names) are current.
    pub fn object_info(&self) -> Json {
        let mut all = Map::new();
        for (name, node) in &self.nodes {
            all.insert(name.clone(), node.schema().object_info());
        }
        Json::Object(all)
    }
}
