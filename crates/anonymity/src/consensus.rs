//! The relays of a C tor network-status consensus (dir-spec section 3.4.1,
//! "r", "s" and "w" lines), as path selection weighs them: for the Monte
//! Carlo over the live network (a consensus from CollecTor) or over a lab
//! run's C tor network (`raw/.../ctor/*/cached-consensus`). Hand-written
//! and minimal: only those three lines are read, everything else skipped;
//! signatures are not checked (the analysis trusts its input).

use crate::{Error, Relay};

/// The most relays a consensus may list here (the live network has about
/// 10 000).
pub const MAX_RELAYS: usize = 100_000;

/// The Running relays of `text`: bandwidth from `w Bandwidth=`, Guard and
/// Exit from the `s` line (an Exit with BadExit is not an exit). A relay
/// without a `w` line weighs 0. Errors name the line.
pub fn parse(text: &str) -> Result<Vec<Relay>, Error> {
    let mut relays = Vec::new();
    // The relay being read: (bandwidth, guard, exit, running).
    let mut current: Option<(u64, bool, bool, bool)> = None;
    let err = |line: usize, message: String| Error::Consensus {
        line: line + 1,
        message,
    };
    for (n, line) in text.lines().enumerate() {
        let mut words = line.split(' ');
        match words.next() {
            Some("r") => {
                if let Some(r) = current.take() {
                    push(&mut relays, r);
                }
                if relays.len() >= MAX_RELAYS {
                    return Err(err(n, format!("more than {MAX_RELAYS} relays")));
                }
                current = Some((0, false, false, false));
            }
            Some("s") => {
                let Some(r) = current.as_mut() else {
                    return Err(err(n, "an \"s\" line before any \"r\" line".into()));
                };
                let flags: Vec<&str> = words.collect();
                let has = |f: &str| flags.contains(&f);
                r.1 = has("Guard");
                r.2 = has("Exit") && !has("BadExit");
                r.3 = has("Running");
            }
            Some("w") => {
                let Some(r) = current.as_mut() else {
                    return Err(err(n, "a \"w\" line before any \"r\" line".into()));
                };
                let bw = words
                    .find_map(|w| w.strip_prefix("Bandwidth="))
                    .ok_or_else(|| err(n, "a \"w\" line without Bandwidth=".into()))?;
                r.0 = bw
                    .parse()
                    .map_err(|_| err(n, format!("Bandwidth={bw:?} is not a number")))?;
            }
            Some("directory-footer") => break,
            _ => {}
        }
    }
    if let Some(r) = current.take() {
        push(&mut relays, r);
    }
    if relays.is_empty() {
        return Err(Error::Consensus {
            line: 1,
            message: "no Running relay (is this a consensus?)".into(),
        });
    }
    Ok(relays)
}

fn push(relays: &mut Vec<Relay>, (bandwidth, guard, exit, running): (u64, bool, bool, bool)) {
    if running {
        relays.push(Relay {
            bandwidth,
            guard,
            exit,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "network-status-version 3 microdesc\n\
        vote-status consensus\n\
        r alpha AAAA 2026-11-26 07:18:54 10.0.0.1 9001 0\n\
        m sha256=x\n\
        s Fast Guard Running Stable Valid\n\
        w Bandwidth=2000\n\
        r beta BBBB 2026-11-26 07:18:54 10.0.0.2 9001 0\n\
        s Exit Fast Running Valid\n\
        w Bandwidth=500 Unmeasured=1\n\
        r gamma CCCC 2026-11-26 07:18:54 10.0.0.3 9001 0\n\
        s BadExit Exit Guard Running\n\
        w Bandwidth=30\n\
        r down DDDD 2026-11-26 07:18:54 10.0.0.4 9001 0\n\
        s Guard Valid\n\
        w Bandwidth=9999\n\
        directory-footer\n\
        r after EEEE 2026-11-26 07:18:54 10.0.0.5 9001 0\n";

    #[test]
    fn running_relays_with_their_flags_and_weights() {
        let relays = parse(TEXT).expect("parse");
        let r = |bandwidth, guard, exit| Relay {
            bandwidth,
            guard,
            exit,
        };
        assert_eq!(
            relays,
            vec![
                r(2000, true, false),
                r(500, false, true),
                r(30, true, false)
            ]
        );
    }

    #[test]
    fn broken_consensuses_name_the_line() {
        let line = |text: &str| match parse(text) {
            Err(Error::Consensus { line, .. }) => line,
            other => panic!("{other:?}"),
        };
        assert_eq!(line("s Guard Running\n"), 1);
        assert_eq!(line("r a\nw Bandwidth=x\n"), 2);
        assert_eq!(line("r a\ns Running\nw Measured=3\n"), 3);
        assert_eq!(line("just text\n"), 1);
        assert_eq!(line(""), 1);
    }
}
