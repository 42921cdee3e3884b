#![no_main]
//! The GGUF parser over arbitrary bytes: every accepted tensor lies inside the input and
//! has exactly `shape × dtype` bytes.

use libfuzzer_sys::fuzz_target;
use sdflow_core::io::gguf;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = gguf::parse(data) {
        for t in &h.tensors {
            assert!(
                t.range.start >= h.data_offset && t.range.end <= data.len(),
                "{}",
                t.name
            );
            assert_eq!((t.range.start - h.data_offset) % h.alignment, 0);
            let n = sdflow_core::io::checked_numel(&t.shape).expect("validated shape");
            assert!(t
                .shape
                .iter()
                .rev()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .is_some());
            assert_eq!(t.dtype.byte_len(n), Some(t.range.len()), "{}", t.name);
        }
        for (_, v) in &h.kv {
            let _ = v.to_string();
        }
    }
});
