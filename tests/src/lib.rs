//! End-to-end tests of kerntune live in `tests/`; this crate has no library code of its own.
