#![no_main]
//! The restricted unpickler and the torch containers (zip and legacy) over arbitrary bytes.

use libfuzzer_sys::fuzz_target;
use sdflow_core::io::pickle;

fuzz_target!(|data: &[u8]| {
    // The raw unpickler on its own, as data.pkl would be fed to it.
    let _ = pickle::unpickle(data, 0);
    if let Ok(p) = pickle::parse(data) {
        for (name, dtype, shape, loc) in &p.tensors {
            let n = sdflow_core::io::checked_numel(shape).expect("validated shape");
            assert!(shape
                .iter()
                .rev()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .is_some());
            let len = dtype.byte_len(n).expect("validated size");
            match loc {
                pickle::ParsedLoc::Range { start, len: l } => {
                    assert_eq!(*l, len, "{name}");
                    assert!(start + l <= data.len(), "{name}");
                }
                pickle::ParsedLoc::ZipDeflated { len: l, .. } => assert_eq!(*l, len, "{name}"),
            }
        }
    }
});
