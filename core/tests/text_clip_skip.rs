//! Clip-skip configuration.

use sdflow_core::text::{ClipSkip, TextError, TextFamily};

#[test]
fn family_defaults() {
    assert_eq!(ClipSkip::default_for(TextFamily::Sd1).get(), 1);
    assert_eq!(ClipSkip::default_for(TextFamily::Sd2).get(), 2);
    assert_eq!(ClipSkip::default_for(TextFamily::Sdxl).get(), 2);
}

#[test]
fn user_values() {
    // sd.cpp: zero or negative means the family default.
    assert_eq!(ClipSkip::from_user(0, TextFamily::Sd2).unwrap().get(), 2);
    assert_eq!(ClipSkip::from_user(-1, TextFamily::Sd1).unwrap().get(), 1);
    assert_eq!(ClipSkip::from_user(3, TextFamily::Sd1).unwrap().get(), 3);
    assert!(matches!(
        ClipSkip::from_user(i64::MAX, TextFamily::Sd1),
        Err(TextError::InvalidClipSkip(i64::MAX))
    ));
    assert!(matches!(
        ClipSkip::new(0),
        Err(TextError::InvalidClipSkip(0))
    ));
}

#[test]
fn layer_index() {
    // 12-layer CLIP-L: skip 1 reads layer 11 (the last), skip 2 layer 10.
    assert_eq!(ClipSkip::new(1).unwrap().layer_index(12), Some(11));
    assert_eq!(ClipSkip::new(2).unwrap().layer_index(12), Some(10));
    assert_eq!(ClipSkip::new(13).unwrap().layer_index(12), None);
}
