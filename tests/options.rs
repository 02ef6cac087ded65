//! One options model (`options::CONVERT`): every row is a field of `ConvertRequest`, set by
//! `ConvertRequest::set`, and a flag of `metrale-pack convert` that reaches the library. Python
//! and C read the same table (`python/tests/test_options.py` checks each row on both).

use metrale_pack::ConvertRequest;
use metrale_pack::options::{CONVERT, Kind};
use std::process::Command;

/// A value every option of `kind` takes, and one none takes.
fn values(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::Switch => ("true", "maybe"),
        Kind::Count => ("3", "many"),
        Kind::Words => ("bf16", ""),
        Kind::Path => ("/an/adapter", ""),
        Kind::Choice(w) => (w[0], "none of them"),
    }
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
}

#[test]
fn every_option_is_a_field_set_by_its_name() {
    let fields = format!("{:?}", ConvertRequest::default());
    for o in CONVERT {
        assert!(
            fields.contains(&format!(" {}: ", o.name)),
            "{}: no field",
            o.name
        );
        let (good, bad) = values(o.kind);
        let mut r = ConvertRequest::default();
        r.set(o.name, good).unwrap();
        assert_ne!(
            r,
            ConvertRequest::default(),
            "{} = {good:?} set nothing",
            o.name
        );
        let e = r.set(o.name, bad).expect_err(o.name).to_string();
        assert!(e.starts_with(&format!("{}: ", o.name)), "{e}");
    }
    // As many fields as rows: a field without a row would reach no surface.
    let rows = CONVERT.len();
    assert_eq!(fields.matches(": ").count(), rows, "{fields}");
    let e = ConvertRequest::default()
        .set("tpp", "2")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no such convert option") && e.contains("tp"),
        "{e}"
    );
}

#[test]
fn every_option_is_a_flag_of_convert_that_reaches_the_library() {
    let help = bin().args(["convert", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    for o in CONVERT {
        assert!(
            help.contains(&o.flag()),
            "{} missing from convert --help",
            o.flag()
        );
        // A value the option refuses is refused naming the flag (by clap for a switch and a
        // choice, else by the library), before the source is read: it does not exist.
        let (_, bad) = values(o.kind);
        let arg = format!("{}={bad}", o.flag());
        let out = bin()
            .args(["convert", src.to_str().unwrap(), &arg])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(&o.flag()),
            "{arg}: {err}"
        );
        assert!(!err.contains("No such file"), "{arg}: {err}");
    }
}
