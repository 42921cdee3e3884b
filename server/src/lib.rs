//! sdflow-server: the HTTP/WebSocket server (`sdflow serve`) with ComfyUI's, A1111's and
//! OpenAI's APIs over the executor.
//!
//! A crate of its own so the engine and the CLI build without the web stack. Empty until
//! the server issue lands.
