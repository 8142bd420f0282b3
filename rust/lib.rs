//! maleki_rs: the pure-Rust facade over every core crate.
//!
//! Rust users (and the criterion benches in `benches/`) depend on this crate; Python users
//! install the `maleki_rs` wheel, whose bindings live in `rust/maleki-py`.

pub use maleki_common as common;
pub use maleki_msgemm as msgemm;
pub use maleki_pose as pose;
pub use maleki_tessel as tessel;
