//! ComfyUI's utility nodes that work on plain values: primitives ([`primitive`]), strings
//! and regexes ([`string`], on Python's `re` syntax from [`pyre`]) and the any-typed
//! Switch and Preview Any ([`logic`]).

pub mod logic;
pub mod primitive;
pub mod pyre;
pub mod string;

use sdflow_executor::Registry;

pub fn register(registry: &mut Registry) {
    primitive::register(registry);
    string::register(registry);
    logic::register(registry);
}
