//! `include/kerntune.h` is what cbindgen generates from the C ABI; this fails when it is stale.
//! Regenerate with `KERNTUNE_BLESS=1 cargo test -p kerntune-runtime --test header`.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses the C ABI")
        .write(&mut generated);
    let path = crate_dir.join("include/kerntune.h");
    if std::env::var_os("KERNTUNE_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} is stale: regenerate it with KERNTUNE_BLESS=1 cargo test -p kerntune-runtime --test header",
        path.display()
    );
}
