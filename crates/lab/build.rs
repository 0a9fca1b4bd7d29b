//! Sets `ONIONLAB_COMMIT`: the git commit this build came from, with
//! `-dirty` if tracked files had uncommitted changes, or `unknown` outside a
//! git checkout. Lab runs record it (`segments.jsonl`) so a result names the
//! code that produced it.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.to_string_lossy();
    let commit = match git(&["-C", &root, "rev-parse", "--short=12", "HEAD"]) {
        Some(c) if !c.is_empty() => {
            let dirty = git(&["-C", &root, "status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}-dirty")
            } else {
                c
            }
        }
        _ => "unknown".to_string(),
    };
    println!("cargo:rustc-env=ONIONLAB_COMMIT={commit}");
    // Run again when the commit or the tracked sources change. (A changed
    // file outside these is not noticed until the next commit.)
    if let Some(git_dir) = git(&["-C", &root, "rev-parse", "--absolute-git-dir"]) {
        for f in ["HEAD", "index", "packed-refs", "refs/heads"] {
            // (A path that does not exist would rerun this every build.)
            if Path::new(&git_dir).join(f).exists() {
                println!("cargo:rerun-if-changed={git_dir}/{f}");
            }
        }
    }
    for dir in ["crates", "Cargo.toml", "Cargo.lock", "scenarios"] {
        println!("cargo:rerun-if-changed={root}/{dir}");
    }
}
