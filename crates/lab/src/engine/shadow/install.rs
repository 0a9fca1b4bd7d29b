//! Finding the `shadow` binary, and building it from the vendored source
//! (`../shared/vendor/shadow/`, Shadow 3.3.0 with its git dependencies as
//! bundles) when a Shadow run finds none.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{io_err, Error, Result};

/// The vendored source's build script, relative to the folder that holds
/// it (`../shared` beside the repository).
const BUILD_SCRIPT: &str = "vendor/shadow/build.sh";

/// Environment variable naming the vendored source's folder
/// (`…/vendor/shadow`), where it is not at `../shared` beside the
/// repository.
pub const SOURCE_ENV: &str = "ONIONLAB_SHADOW_SOURCE";

/// Lines of the build's log quoted when it fails.
const QUOTED_LINES: usize = 30;

/// The installed `shadow`: the first of `shadow` on `PATH` and
/// `~/.local/bin/shadow` (where the vendored build installs it).
pub fn installed_shadow() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("shadow"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let home = std::env::var_os("HOME")?;
        let p = Path::new(&home).join(".local/bin/shadow");
        p.is_file().then_some(p)
    })
}

/// The vendored source's build script: in [`SOURCE_ENV`]'s folder, else
/// `../shared/vendor/shadow/` from the working directory, else beside the
/// repository this binary was built from.
pub fn vendored_build_script() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(SOURCE_ENV) {
        return Some(Path::new(&dir).join("build.sh")).filter(|p| p.is_file());
    }
    let from_cwd = Path::new("../shared").join(BUILD_SCRIPT);
    // This crate is `crates/lab` of the repository.
    let from_repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared")
        .join(BUILD_SCRIPT);
    [from_cwd, from_repo].into_iter().find(|p| p.is_file())
}

/// Builds Shadow from the vendored source and installs it in
/// `~/.local/bin` (the script's default; it installs the packages it
/// needs with apt-get when run as root), writing the build's output to
/// `log`; returns the installed binary. `announce` is told the build
/// script once it is found, before the build starts. Takes 10-20 minutes on two
/// cores; the build folder is removed afterwards.
///
/// # Errors
///
/// [`Error::Shadow`] if there is no vendored source, or the build fails
/// (with the log's last lines).
pub fn install_vendored(log: &Path, announce: impl FnOnce(&Path)) -> Result<PathBuf> {
    let script = vendored_build_script().ok_or_else(|| {
        Error::Shadow(format!(
            "no `shadow` binary on PATH or in ~/.local/bin, and no vendored source to \
             build it from (../shared/{BUILD_SCRIPT} beside the repository, or the folder \
             in {SOURCE_ENV}): install Shadow 3.x, or give --shadow PATH"
        ))
    })?;
    announce(&script);
    // Not in /tmp, often a small tmpfs: the build needs about 6 GB.
    let build_dir =
        Path::new("/var/tmp").join(format!("onionlab-shadow-build-{}", std::process::id()));
    let out = File::create(log).map_err(io_err(format!("creating {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io_err(format!("opening {}", log.display())))?;
    let status = Command::new("bash")
        .arg(&script)
        .env("SHADOW_BUILD_DIR", &build_dir)
        // Shadow's build runs cargo for its own tree, not into ours.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env_remove("CARGO_INCREMENTAL")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| Error::Shadow(format!("running {}: {e}", script.display())))?;
    // The build folder holds about 3 GB of objects nobody reads again.
    let _ = fs::remove_dir_all(&build_dir);
    if !status.success() {
        let text = fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(QUOTED_LINES)..].join("\n");
        return Err(Error::Shadow(format!(
            "building Shadow with {} failed ({status}); the log {} ends:\n{tail}",
            script.display(),
            log.display()
        )));
    }
    installed_shadow().ok_or_else(|| {
        Error::Shadow(format!(
            "{} finished but no `shadow` is in ~/.local/bin or on PATH (log: {})",
            script.display(),
            log.display()
        ))
    })
}
