//! The HTML report as a reader sees it: rendered by headless Chromium,
//! every figure must load and nothing may be wider than the window.
//!
//! Needs Debian's `chromium` (`scripts/test.sh` installs it when missing);
//! without it the test says why it is skipped and passes, unless
//! `ONIONLAB_REQUIRE_BROWSER=1` makes a missing browser a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use onionlab_report::*;

/// Window widths the page must fit: a laptop and a narrow window.
const WIDTHS: [u32; 2] = [1280, 820];

fn browser() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .filter_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(name))
                    .find(|p| p.is_file())
            })
        })
        .next()
}

/// A report with six conditions, three transports and long labels: the
/// widest tables and figures a scenario of this size makes.
fn wide_input() -> ReportInput {
    let latencies = ["20ms", "40ms"];
    let losses = ["0%", "0.1%", "1.832%"];
    let transports = ["tls", "quic", "quic-conn-per-circuit"];
    let mut variants = Vec::new();
    let mut assignments = Vec::new();
    let mut values = Vec::new();
    for (li, l) in latencies.iter().enumerate() {
        for (si, s) in losses.iter().enumerate() {
            for (ti, t) in transports.iter().enumerate() {
                let label = format!(
                    "latency:client-guard,guard-middle,middle-exit={l} loss:guard-middle={s} transport={t}"
                );
                let base = 100.0 * (1 + li + si + ti) as f64;
                values.push((
                    label.clone(),
                    (0..16).map(|i| base + 7.0 * i as f64).collect::<Vec<f64>>(),
                ));
                variants.push(label);
                assignments.push(vec![l.to_string(), s.to_string(), t.to_string()]);
            }
        }
    }
    let metric = |key: &str, title: &str| Metric {
        key: key.to_string(),
        title: title.to_string(),
        unit: "ms".to_string(),
        lower_is_better: true,
        headline: true,
        values: values.clone(),
        repetitions: vec![],
    };
    ReportInput {
        title: "browser check".to_string(),
        scenario_toml: format!("name = \"browser\" # {}\n", "x".repeat(400)),
        meta: vec![("commit".to_string(), "0123456789abcdef".repeat(4))],
        variants,
        metrics: vec![
            metric("light_ttlb_ms", "light: time to last byte"),
            metric("bulk_ttlb_ms", "bulk: time to last byte"),
        ],
        design: Design {
            parameters: vec![
                Parameter {
                    name: "latency:client-guard,guard-middle,middle-exit".to_string(),
                    short: "per hop".to_string(),
                },
                Parameter {
                    name: "loss:guard-middle".to_string(),
                    short: "loss".to_string(),
                },
                Parameter {
                    name: "transport".to_string(),
                    short: String::new(),
                },
            ],
            assignments,
            compare: Some(Compare {
                parameter: "transport".to_string(),
                baseline: "tls".to_string(),
            }),
        },
        ..ReportInput::default()
    }
}

/// Runs after the page and its images loaded; puts what it found into the
/// title, which `--dump-dom` prints.
const PROBE: &str = r#"<script>
window.addEventListener('load', () => {
  const images = Array.from(document.images);
  const broken = images.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute('src'));
  const page = document.documentElement.scrollWidth;
  const wide = Array.from(document.querySelectorAll('body *'))
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
    .filter(e => !(e.parentElement && e.parentElement.closest('table, pre')))
    .map(e => e.tagName + (e.getAttribute('src') ? ':' + e.getAttribute('src') : ''));
  document.title = 'PROBE ' + JSON.stringify({images: images.length, broken, page, window: window.innerWidth, wide: wide.slice(0, 5)});
});
</script>"#;

struct Probe {
    images: usize,
    broken: String,
    page: u64,
    window: u64,
    wide: String,
}

fn field<'a>(json: &'a str, key: &str) -> &'a str {
    let start = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + key.len()
        + 3;
    let rest = &json[start..];
    let end = if rest.starts_with('[') {
        rest.find(']').map_or(rest.len(), |e| e + 1)
    } else {
        rest.find([',', '}']).unwrap_or(rest.len())
    };
    &rest[..end]
}

fn render(chromium: &Path, page: &Path, width: u32) -> Probe {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--allow-file-access-from-files",
            "--virtual-time-budget=10000",
            &format!("--window-size={width},900"),
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("file://{}", page.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting chromium");
    // Read the DOM as it comes (a full pipe would block chromium) while
    // making sure chromium cannot hang the test suite.
    let mut stdout = child.stdout.take().expect("chromium's stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
        text
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while child.try_wait().expect("waiting for chromium").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish rendering {} in 120 s",
                page.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let dom = reader.join().expect("reading chromium's output");
    let title = dom
        .split("<title>PROBE ")
        .nth(1)
        .and_then(|t| t.split("</title>").next())
        .unwrap_or_else(|| panic!("the probe did not run; chromium printed: {dom:.2000}"))
        .replace("&quot;", "\"");
    Probe {
        images: field(&title, "images").parse().expect("images"),
        broken: field(&title, "broken").to_string(),
        page: field(&title, "page").parse().expect("page"),
        window: field(&title, "window").parse().expect("window"),
        wide: field(&title, "wide").to_string(),
    }
}

#[test]
fn the_html_report_loads_every_figure_and_fits_the_window() {
    let Some(chromium) = browser() else {
        let why = "no chromium on PATH (scripts/test.sh installs Debian's chromium when it can)";
        if std::env::var_os("ONIONLAB_REQUIRE_BROWSER").is_some_and(|v| v == "1") {
            panic!("{why}");
        }
        eprintln!("SKIPPED the_html_report_loads_every_figure_and_fits_the_window: {why}");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = write_report(&wide_input(), dir.path()).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    let probe_page = dir.path().join("probe.html");
    std::fs::write(
        &probe_page,
        html.replace("</body>", &format!("{PROBE}</body>")),
    )
    .unwrap();
    for width in WIDTHS {
        let p = render(&chromium, &probe_page, width);
        assert_eq!(
            p.images,
            files.figures.len(),
            "figures on the page at {width} px"
        );
        assert_eq!(p.broken, "[]", "figures that did not load at {width} px");
        assert!(
            p.page <= p.window,
            "at {width} px the page is {} px wide in a {} px window; too wide: {}",
            p.page,
            p.window,
            p.wide
        );
        assert_eq!(
            p.wide, "[]",
            "elements past the window's edge at {width} px"
        );
    }
}
