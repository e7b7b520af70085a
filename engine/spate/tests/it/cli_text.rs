//! Issue 31: `spate --help` says what the binary does (the insert format
//! and both delivery modes), not what it once did ("at least once" only,
//! "rows sent as RowBinary"). `spate check`'s claims are compared with a
//! real run's log in `e2e.rs` (`inserts: FORMAT ...; delivery: ...`).

use std::process::Command;

#[test]
fn help_names_the_insert_format_and_both_delivery_modes() {
    let out = Command::new(env!("CARGO_BIN_EXE_spate"))
        .arg("--help")
        .output()
        .expect("spawn spate --help");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for claim in [
        "FORMAT Native",
        "RowBinary",
        "at_least_once",
        "effectively_once",
    ] {
        assert!(text.contains(claim), "--help lacks `{claim}`: {text}");
    }
}
