//! End-to-end: a synthetic input with 3 variants and 2 metrics produces
//! every file, with the expected tables, numbers and figure formats.

use std::path::Path;

use onionlab_report::*;

fn tls_ttfb() -> Vec<f64> {
    (0..20).map(|i| 100.0 + 5.0 * i as f64).collect()
}

fn quic_ttfb() -> Vec<f64> {
    (0..20).map(|i| 80.0 + 4.0 * i as f64).collect()
}

fn synthetic() -> ReportInput {
    let mut pctcp_ttfb: Vec<f64> = (0..30).map(|i| 90.0 + ((i * 37) % 23) as f64).collect();
    pctcp_ttfb.extend([400.0, 420.0]); // outliers for the box plot
    ReportInput {
        title: "Cross-circuit interference <test>".to_string(),
        scenario_toml: "[network]\nrelays = 3 # `a` ```\nlatency_ms = 20\n".to_string(),
        meta: vec![
            ("onionlab".to_string(), "0.1.0".to_string()),
            ("seed".to_string(), "42".to_string()),
            ("repetitions".to_string(), "10".to_string()),
        ],
        variants: vec!["tls".to_string(), "quic".to_string(), "pctcp".to_string()],
        metrics: vec![
            Metric {
                key: "ttfb_ms".to_string(),
                title: "Time to first byte".to_string(),
                unit: "ms".to_string(),
                lower_is_better: true,
                headline: false,
                values: vec![
                    ("tls".to_string(), tls_ttfb()),
                    ("quic".to_string(), quic_ttfb()),
                    ("pctcp".to_string(), pctcp_ttfb),
                ],
                repetitions: vec![],
            },
            Metric {
                key: "goodput_mibps".to_string(),
                title: "Goodput".to_string(),
                unit: "MiB/s".to_string(),
                lower_is_better: false,
                headline: false,
                values: vec![
                    (
                        "tls".to_string(),
                        (0..25).map(|i| 4.0 + (i % 7) as f64 * 0.25).collect(),
                    ),
                    ("quic".to_string(), vec![5.5]), // one value
                    ("pctcp".to_string(), vec![]),   // no data
                ],
                repetitions: vec![],
            },
        ],
        counts: vec![
            VariantCounts {
                variant: "tls".to_string(),
                repetitions: 10,
                transfers: 200,
                errors: 1,
                timeouts: 0,
                stalls: 2,
                checksum_failures: 0,
                cpu_saturated_repetitions: 3,
                host_dropped_repetitions: 0,
                conflux_fallback_repetitions: 2,
            },
            VariantCounts {
                variant: "quic".to_string(),
                repetitions: 10,
                transfers: 200,
                ..VariantCounts::default()
            },
        ],
        notes: vec!["3 repetitions ran on a saturated CPU".to_string()],
        findings: vec!["stall rate: tls 0.0%".to_string()],
        design: Design::default(),
    }
}

fn check_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!((w, h), FIGURE_SIZE, "{}", path.display());
    assert_eq!(FIGURE_SIZE, (800, 500));
}

fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    (w, h)
}

/// Decodes a PNG into RGB(A) rows.
fn decode_png(path: &Path) -> (png::OutputInfo, Vec<u8>) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    (info, buf)
}

fn check_svg(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(
        doc.descendants().any(|n| n.has_tag_name("text")),
        "no text in {}",
        path.display()
    );
}

#[test]
fn synthetic_report_writes_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_report(&synthetic(), dir.path()).unwrap();
    assert!(files.markdown.ends_with("report.md") && files.markdown.is_file());
    assert!(files.html.ends_with("report.html") && files.html.is_file());
    assert_eq!(files.figures.len(), 4);
    for key in ["ttfb_ms", "goodput_mibps"] {
        for kind in ["cdf", "box"] {
            let svg = dir.path().join(format!("{key}_{kind}.svg"));
            let png = dir.path().join(format!("{key}_{kind}.png"));
            assert!(files.figures.iter().any(|f| f.svg == svg && f.png == png));
            check_svg(&svg);
            check_png(&png);
        }
    }
}

#[test]
fn markdown_has_the_tables_and_hand_computed_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_report(&synthetic(), dir.path()).unwrap();
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.starts_with("# Cross-circuit interference \\<test\\>\n"));
    assert!(md.contains(
        "| variant | n | median | p10 | p90 | mean \\[95% CI\\] | median 95% CI | median ratio vs tls \\[95% CI\\] | Mann–Whitney p |"
    ));
    assert!(md.contains(
        "| variant | repetitions | transfers | errors | timeouts | stalls | checksum failures | CPU-saturated repetitions |"
    ));
    // tls TTFB: 100, 105, ..., 195 (n = 20). Median = (145 + 150) / 2 =
    // 147.5; p10: h = 19 * 0.1 = 1.9, 105 + 0.9 * 5 = 109.5; p90: h = 17.1,
    // 185 + 0.1 * 5 = 185.5; mean 147.5. Median CI: ranks 6 and 15 of 20,
    // i.e. 125 and 170.
    assert!(
        md.contains("| tls (baseline) | 20 | 147.5 | 109.5 | 185.5 | 147.5 \\["),
        "{md}"
    );
    assert!(md.contains("| \\[125.0, 170.0\\] | — | — |"), "{md}");
    // quic TTFB: 80, 84, ..., 156: median 118; ratio 118 / 147.5 = 0.8.
    // Mann–Whitney (ties, normal): scipy.stats.mannwhitneyu(quic, tls,
    // method='asymptotic') -> U = 91.5, p = 0.003479917160253161.
    assert!(md.contains("| quic | 20 | 118.0 |"), "{md}");
    assert!(md.contains("| 0.8000 \\["), "{md}");
    assert!(
        md.contains("lower (better) | **0.00348 ✱ (normal)** |"),
        "{md}"
    );
    // Edge cases: one value and no data.
    assert!(
        md.contains("| quic | 1 | 5.500 | 5.500 | 5.500 | 5.500 \\[−∞, ∞\\] | \\[−∞, ∞\\] |"),
        "{md}"
    );
    assert!(
        md.contains("| pctcp | 0 | — | — | — | — | — | no data | — |"),
        "{md}"
    );
    // Warnings: the input's note and the derived CPU-saturation warning.
    assert!(md.contains("> **⚠ Warning:** 3 repetitions ran on a saturated CPU"));
    assert!(md.contains("## Findings\n\n- stall rate: tls 0.0%\n"));
    assert!(
        !md.contains("Warning:** stall rate"),
        "findings are not warnings"
    );
    assert!(md.contains("Variant tls: 3 of 10 repetition(s) ran on a saturated CPU"));
    assert!(md.contains(
        "Variant tls: in 2 of 10 repetition(s) C tor ran some workload streams over plain (or unrecorded) circuits"
    ));
    // Counts: the row, with a variant that has no count row shown as zeros.
    assert!(
        md.contains("| tls | 10 | 200 | 1 | 0 | 2 | 0 | **3** |"),
        "{md}"
    );
    assert!(md.contains("| pctcp | 0 | 0 | 0 | 0 | 0 | 0 | 0 |"), "{md}");
    // Figures and the scenario (fence longer than its backtick run).
    assert!(md.contains("![Time to first byte: CDF](ttfb_ms_cdf.png)"));
    assert!(md.contains("[box plot](goodput_mibps_box.svg)"));
    assert!(md.contains("````toml\n[network]\nrelays = 3 # `a` ```\nlatency_ms = 20\n````\n"));
    assert!(
        md.contains("- Meta") || md.contains("| **seed** | 42 |"),
        "{md}"
    );
}

#[test]
fn html_is_self_contained_and_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_report(&synthetic(), dir.path()).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<style>"));
    assert!(!html.contains("<link") && !html.contains("<script"));
    assert!(html.contains("<title>Cross-circuit interference &lt;test&gt;</title>"));
    for f in [
        "ttfb_ms_cdf.svg",
        "ttfb_ms_box.svg",
        "goodput_mibps_cdf.svg",
        "goodput_mibps_box.svg",
    ] {
        assert!(html.contains(&format!("<img src=\"{f}\"")), "{f}");
    }
    assert!(html.contains("<td class=\"num\">147.5</td>"));
    assert!(html.contains("<strong class=\"sig\">0.00348 ✱ (normal)</strong>"));
    assert!(html.contains("class=\"warn\""));
    assert!(html.contains("relays = 3 # `a` ```"));
    assert!(html.trim_end().ends_with("</html>"));
}

#[test]
fn png_text_is_rendered_without_system_fonts() {
    // The caption strip (above the plot area) holds only the title text:
    // it must have dark pixels, which only a loaded font can draw.
    let dir = tempfile::tempdir().unwrap();
    write_report(&synthetic(), dir.path()).unwrap();
    let (info, buf) = decode_png(&dir.path().join("ttfb_ms_cdf.png"));
    let channels = info.line_size / info.width as usize;
    let dark = (0..36)
        .flat_map(|y| (0..info.width as usize).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let p = &buf[y * info.line_size + x * channels..][..3];
            p.iter().all(|&c| c < 100)
        })
        .count();
    assert!(dark > 200, "only {dark} dark pixels in the caption strip");
}

#[test]
fn same_input_same_report() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_report(&synthetic(), a.path()).unwrap();
    write_report(&synthetic(), b.path()).unwrap();
    for f in [
        "report.md",
        "report.html",
        "ttfb_ms_cdf.svg",
        "ttfb_ms_box.png",
    ] {
        assert_eq!(
            std::fs::read(a.path().join(f)).unwrap(),
            std::fs::read(b.path().join(f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
fn empty_and_single_value_inputs_do_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut input = ReportInput {
        title: "empty".to_string(),
        variants: vec!["only".to_string()],
        metrics: vec![Metric {
            key: "nothing".to_string(),
            title: "Nothing".to_string(),
            unit: String::new(),
            lower_is_better: true,
            headline: true,
            values: vec![],
            repetitions: vec![],
        }],
        ..ReportInput::default()
    };
    let files = write_report(&input, dir.path()).unwrap();
    for f in &files.figures {
        check_svg(&f.svg);
        check_png(&f.png);
    }
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.contains("| only (baseline) | 0 | — |"), "{md}");

    // One value, all variants; and all-equal values.
    input.variants = vec!["a".to_string(), "b".to_string()];
    input.metrics[0].values = vec![
        ("a".to_string(), vec![3.0]),
        ("b".to_string(), vec![7.0; 5]),
    ];
    let files = write_report(&input, dir.path()).unwrap();
    for f in &files.figures {
        check_svg(&f.svg);
        check_png(&f.png);
    }
    // No metrics at all.
    input.metrics.clear();
    write_report(&input, dir.path()).unwrap();
}

#[test]
fn invalid_input_is_rejected_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut bad = synthetic();
    bad.metrics[0].values[1].1[3] = f64::NAN;
    assert!(matches!(
        write_report(&bad, &out),
        Err(Error::NotFinite { ref metric, ref variant, index: 3, .. }) if metric == "ttfb_ms" && variant == "quic"
    ));
    let mut bad = synthetic();
    bad.metrics[1].values.push(("tor".to_string(), vec![1.0]));
    assert!(matches!(
        write_report(&bad, &out),
        Err(Error::UnknownVariant { .. })
    ));
    let mut bad = synthetic();
    bad.metrics[1].key = "good put".to_string();
    assert!(matches!(
        write_report(&bad, &out),
        Err(Error::BadMetricKey(_))
    ));
    let mut bad = synthetic();
    bad.variants.push("tls".to_string());
    assert!(matches!(
        write_report(&bad, &out),
        Err(Error::BadVariant(_))
    ));
    let mut bad = synthetic();
    bad.counts.push(VariantCounts {
        variant: "tls".to_string(),
        ..VariantCounts::default()
    });
    assert!(matches!(
        write_report(&bad, &out),
        Err(Error::UnknownVariant { .. })
    ));
    let mut bad = synthetic();
    bad.variants.clear();
    assert!(matches!(write_report(&bad, &out), Err(Error::NoVariants)));
    assert!(!out.exists());
}

#[test]
fn checksum_failures_become_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let mut input = synthetic();
    input.counts[1].checksum_failures = 2;
    let files = write_report(&input, dir.path()).unwrap();
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.contains("Variant quic: 2 transfer(s) failed the end-to-end checksum"));
    assert!(
        md.contains("| quic | 10 | 200 | 0 | 0 | 0 | **2** | 0 |"),
        "{md}"
    );
}

/// Writes the synthetic report to `$ONIONLAB_REPORT_SAMPLE_DIR` and the
/// designed one (small multiples, findings tables) to its `designed/`, for
/// a person to look at (skipped when the variable is not set).
#[test]
fn sample_report_for_inspection() {
    if let Some(dir) = std::env::var_os("ONIONLAB_REPORT_SAMPLE_DIR") {
        write_report(&synthetic(), Path::new(&dir)).unwrap();
        write_report(&designed(), &Path::new(&dir).join("designed")).unwrap();
    }
}

/// Two losses crossed with two transports, compared on the transport.
fn designed() -> ReportInput {
    let labels = [
        "loss=0% transport=tls",
        "loss=0% transport=quic",
        "loss=1% transport=tls",
        "loss=1% transport=quic",
    ];
    let values = |base: f64| -> Vec<f64> { (0..20).map(|i| base + i as f64).collect() };
    ReportInput {
        title: "designed".to_string(),
        variants: labels.map(String::from).to_vec(),
        metrics: vec![Metric {
            key: "ttlb_ms".to_string(),
            title: "time to last byte".to_string(),
            unit: "ms".to_string(),
            lower_is_better: true,
            headline: true,
            values: vec![
                (labels[0].to_string(), values(100.0)),
                (labels[1].to_string(), values(100.0)),
                (labels[2].to_string(), values(200.0)),
                (labels[3].to_string(), values(400.0)),
            ],
            repetitions: vec![],
        }],
        design: Design {
            parameters: vec![
                Parameter {
                    name: "loss".to_string(),
                    short: "loss".to_string(),
                },
                Parameter {
                    name: "transport".to_string(),
                    short: String::new(),
                },
            ],
            assignments: vec![
                vec!["0%".to_string(), "tls".to_string()],
                vec!["0%".to_string(), "quic".to_string()],
                vec!["1%".to_string(), "tls".to_string()],
                vec!["1%".to_string(), "quic".to_string()],
            ],
            compare: Some(Compare {
                parameter: "transport".to_string(),
                baseline: "tls".to_string(),
            }),
        },
        ..ReportInput::default()
    }
}

#[test]
fn short_labels_name_the_varying_parameters_compared_one_first() {
    let d = designed();
    assert_eq!(
        short_labels(&d.design, &d.variants),
        [
            "tls, loss 0%",
            "quic, loss 0%",
            "tls, loss 1%",
            "quic, loss 1%"
        ]
    );
    // A parameter with one value is left out of the labels.
    let mut one = d.clone();
    for a in &mut one.design.assignments {
        a[0] = "0%".to_string();
    }
    one.design.assignments[2][1] = "pctcp".to_string();
    one.design.assignments[3][1] = "auto".to_string();
    assert_eq!(
        short_labels(&one.design, &one.variants),
        ["tls", "quic", "pctcp", "auto"]
    );
}

#[test]
fn findings_compare_each_variant_with_the_baseline_of_its_condition() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_report(&designed(), dir.path()).unwrap();
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    // The legend defines each short label once.
    assert!(
        md.contains("## Variants\n\n| label | transport | loss | full label |"),
        "{md}"
    );
    assert!(
        md.contains("| quic, loss 1% | quic | 1% | loss=1% transport=quic |"),
        "{md}"
    );
    // One row per condition, one column per compared value: at 1% loss
    // quic's median 409.5 against tls's 209.5 (not against the first
    // variant's 109.5).
    assert!(
        md.contains("| condition | tls median (ms) | quic / tls \\[95% CI\\], p |"),
        "{md}"
    );
    assert!(md.contains("| loss 0% | 109.5 | 1.000 \\["), "{md}");
    assert!(md.contains("| loss 1% | 209.5 | **1.955 \\["), "{md}");
    assert!(md.contains("p adj. \\< 0.0001 ✱**"), "{md}");
    // The metric table compares with the same condition's baseline too.
    assert!(md.contains("| quic, loss 1% | 20 | 409.5 |"), "{md}");
    assert!(
        md.contains("| tls, loss 1% (baseline) | 20 | 209.5 |"),
        "{md}"
    );
    // The same tables as plain text for the terminal.
    assert!(
        files.findings_text.starts_with("time to last byte"),
        "{}",
        files.findings_text
    );
    assert!(
        files.findings_text.contains("loss 1%"),
        "{}",
        files.findings_text
    );
    // Two conditions: two panels side by side, the legend above them.
    for f in &files.figures {
        assert_eq!(f.size, (840, 368), "{}", f.png.display());
        assert_eq!(png_size(&f.png), f.size);
        check_svg(&f.svg);
    }
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("width=\"840\" height=\"368\""), "{html}");
}

#[test]
fn a_design_that_does_not_fit_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut bad = designed();
    bad.design.assignments.pop();
    assert!(matches!(write_report(&bad, &out), Err(Error::BadDesign(_))));
    let mut bad = designed();
    bad.design.assignments[1] = bad.design.assignments[0].clone();
    assert!(matches!(write_report(&bad, &out), Err(Error::BadDesign(_))));
    let mut bad = designed();
    bad.design.compare.as_mut().unwrap().parameter = "size".to_string();
    assert!(matches!(write_report(&bad, &out), Err(Error::BadDesign(_))));
    let mut bad = designed();
    bad.design.assignments[2].push("x".to_string());
    assert!(matches!(write_report(&bad, &out), Err(Error::BadDesign(_))));
    assert!(!out.exists());
}

#[test]
fn two_runs_are_compared_variant_by_variant() {
    let a = designed();
    let mut b = designed();
    // In B, quic at 1% loss takes twice as long.
    for x in &mut b.metrics[0].values[3].1 {
        *x *= 2.0;
    }
    let c = compare_runs(&a, &b, ("run-a", "run-b")).unwrap();
    assert!(c.text.starts_with("time to last byte (ms)\n"), "{}", c.text);
    let row = |label: &str| {
        c.text
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no row {label}: {}", c.text))
            .to_string()
    };
    let slower = row("quic, loss 1%");
    assert!(
        slower.contains("409.5") && slower.contains("819.0"),
        "{slower}"
    );
    assert!(
        slower.contains("2.000 [") && slower.contains("✱"),
        "{slower}"
    );
    let same = row("tls, loss 0%");
    assert!(same.contains("1.000 [") && !same.contains("✱"), "{same}");
    assert!(c.markdown.contains("- **A**: run-a"), "{}", c.markdown);
    assert!(
        c.markdown
            .contains("| quic, loss 1% | 409.5 | 819.0 | 2.000 \\["),
        "{}",
        c.markdown
    );
    // A variant in one run only is named, not compared.
    let mut fewer = designed();
    fewer.variants.pop();
    fewer.design.assignments.pop();
    fewer.metrics[0].values.pop();
    let c = compare_runs(&a, &fewer, ("a", "b")).unwrap();
    assert!(
        c.text
            .starts_with("Variants in one run only (not compared): quic, loss 1%"),
        "{}",
        c.text
    );
}
