//! Sets `ONIONLAB_COMMIT`: the git commit this build came from, with
//! `-dirty` if the sources it watches had uncommitted changes, or `unknown`
//! outside a git checkout. Lab runs record it (`segments.jsonl`) so a result names the
//! code that produced it.

use std::path::Path;
use std::process::Command;

/// The sources a build depends on: a change here reruns this script, and
/// makes the commit `-dirty` until committed.
const WATCHED: [&str; 4] = ["crates", "Cargo.toml", "Cargo.lock", "scenarios"];

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    // At run time, not `env!`: a build script compiled for one checkout is
    // reused for another of the same workspace that shares the target
    // directory (a worktree, a clean clone), and must look at that one.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let root = Path::new(&manifest_dir).join("../..");
    let root = root.to_string_lossy();
    let commit = match git(&["-C", &root, "rev-parse", "--short=12", "HEAD"]) {
        Some(c) if !c.is_empty() => {
            // --no-optional-locks: do not take or refresh the index (which is
            // watched below, and a user's git may hold).
            let mut status = vec![
                "--no-optional-locks",
                "-C",
                &root,
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
            ];
            status.extend(WATCHED);
            let dirty = git(&status).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}-dirty")
            } else {
                c
            }
        }
        _ => {
            println!(
                "cargo:warning=ONIONLAB_COMMIT is unknown: `git rev-parse HEAD` failed in {root} \
                 (not a checkout, no git, or git's safe.directory): lab runs will not name their commit"
            );
            "unknown".to_string()
        }
    };
    println!("cargo:rustc-env=ONIONLAB_COMMIT={commit}");
    // Run again when the commit or the watched sources change.
    if let Some(git_dir) = git(&["-C", &root, "rev-parse", "--absolute-git-dir"]) {
        for f in ["HEAD", "index", "packed-refs", "refs/heads"] {
            // (A path that does not exist would rerun this every build.)
            if Path::new(&git_dir).join(f).exists() {
                println!("cargo:rerun-if-changed={git_dir}/{f}");
            }
        }
    }
    for path in WATCHED {
        if Path::new(&*root).join(path).exists() {
            println!("cargo:rerun-if-changed={root}/{path}");
        }
    }
}
