//! Exit codes a script can act on: 0 done, 1 failed, 77 skipped (a command that needs a GPU on a
//! machine without one, as automake and CTest count a skip).

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_gpu_command_without_a_gpu_exits_77_and_says_why() {
    let o = run(&["gpu-check", "--quick", "--sections", "kernels"]);
    let out = String::from_utf8_lossy(&o.stdout);
    if out.starts_with("SKIPPED: ") {
        assert_eq!(o.status.code(), Some(77), "{out}");
        assert_eq!(out.lines().count(), 1, "{out}");
    } else {
        // A machine with a GPU ran the checks.
        assert!(o.status.success(), "{out}");
    }
    // With --json, the skip is a JSON object on stdout, and still 77.
    let o = run(&["bench-load", "/nonexistent/pack.mpk.gguf", "--json"]);
    let out = String::from_utf8_lossy(&o.stdout);
    if o.status.code() == Some(77) {
        let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
        assert!(
            v["skipped"].as_str().is_some_and(|r| !r.is_empty()),
            "{out}"
        );
    } else {
        // A machine with a GPU: the missing pack is a failure.
        assert_eq!(o.status.code(), Some(1), "{out}");
    }
    // A failure is 1, whatever the machine.
    let o = run(&["verify", "/nonexistent/pack.mpk.gguf"]);
    assert_eq!(o.status.code(), Some(1));
}
