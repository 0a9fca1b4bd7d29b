//! `onionlab results`: the results pages' generated tables against the
//! stored runs they come from.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::error::{Error, Result};

/// Results commands.
#[derive(Subcommand, Debug)]
pub enum ResultsCommand {
    /// Make every generated table of README.md and docs/ again from its
    /// stored run and fail on any difference, or on a table that cannot
    /// be made; count and list the tables marked "Data lost".
    Check {
        /// The repository's root.
        #[arg(long, default_value = ".")]
        root: PathBuf,
    },
    /// Rewrite the generated tables whose stored runs now give other
    /// numbers (after storing a run again, or a change of the statistics).
    Update {
        /// The repository's root.
        #[arg(long, default_value = ".")]
        root: PathBuf,
    },
}

/// Run a results command.
pub fn run(cmd: ResultsCommand) -> Result<ExitCode> {
    let (root, write) = match cmd {
        ResultsCommand::Check { root } => (root, false),
        ResultsCommand::Update { root } => (root, true),
    };
    let outcome = onionlab_results::pages::check_or_update(&root, write)
        .map_err(|e| Error::Usage(format!("results: {e}")))?;
    print!("{}", outcome.text());
    Ok(if outcome.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
