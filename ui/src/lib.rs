//! sdflow-ui: the browser graph editor, built from npm packages at build time and embedded
//! into the binary, so `sdflow serve` needs no Node.js at run time.
//!
//! Empty until the server issue lands.
