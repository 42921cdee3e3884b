#![no_main]
//! The safetensors header parser over arbitrary bytes: errors are fine, panics and
//! out-of-range tensor ranges are not.

use libfuzzer_sys::fuzz_target;
use sdflow_core::io::safetensors;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = safetensors::parse(data) {
        for (name, dtype, shape, range) in &h.tensors {
            assert!(
                range.start <= range.end && range.end <= data.len(),
                "{name}"
            );
            let n = sdflow_core::io::checked_numel(shape).expect("validated shape");
            assert!(shape
                .iter()
                .rev()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .is_some());
            assert_eq!(dtype.byte_len(n), Some(range.len()), "{name}");
        }
    }
});
