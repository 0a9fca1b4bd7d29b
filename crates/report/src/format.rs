//! Number formatting and escaping shared by the Markdown and HTML writers.

/// A number with 4 significant digits in plain notation (scientific only
/// below 1e-4 or from 1e7); infinities as `−∞` / `∞`.
pub(crate) fn num(x: f64) -> String {
    if x.is_nan() {
        return "NaN".to_string();
    }
    if x == f64::INFINITY {
        return "∞".to_string();
    }
    if x == f64::NEG_INFINITY {
        return "−∞".to_string();
    }
    if x == 0.0 {
        return "0".to_string();
    }
    let a = x.abs();
    if !(1e-4..1e7).contains(&a) {
        return format!("{x:.3e}");
    }
    let magnitude = a.log10().floor() as i32;
    let decimals = (3 - magnitude).clamp(0, 8) as usize;
    format!("{x:.decimals$}")
}

/// A ratio with three decimals (`0.657`), as findings tables show them.
pub(crate) fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        num(x)
    }
}

/// A ratio's interval as `[lo, hi]` with three decimals.
pub(crate) fn ratio_interval((lo, hi): (f64, f64)) -> String {
    format!("[{}, {}]", ratio(lo), ratio(hi))
}

/// An interval as `[lo, hi]`.
pub(crate) fn interval((lo, hi): (f64, f64)) -> String {
    format!("[{}, {}]", num(lo), num(hi))
}

/// A p-value with 3 significant digits, `< 0.0001` below that.
pub(crate) fn p_value(p: f64) -> String {
    if p < 1e-4 {
        "< 0.0001".to_string()
    } else if p >= 0.1 {
        format!("{p:.2}")
    } else {
        let magnitude = p.log10().floor() as i32;
        let decimals = (2 - magnitude).clamp(0, 6) as usize;
        format!("{p:.decimals$}")
    }
}

/// Escapes text for HTML element content and attribute values.
pub(crate) fn html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// Escapes text for a Markdown table cell or paragraph: characters with
/// Markdown meaning get a backslash; newlines become spaces.
pub(crate) fn md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' | '|' | '*' | '_' | '`' | '[' | ']' | '<' | '>' | '#' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

/// A code fence longer than any run of backticks in `text`.
pub(crate) fn fence_for(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    "`".repeat((longest + 1).max(3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(num(25.0), "25.00");
        assert_eq!(num(1234.5), "1234");
        assert_eq!(num(12345.0), "12345");
        assert_eq!(num(0.012345), "0.01235");
        assert_eq!(num(-3.0), "-3.000");
        assert_eq!(num(f64::INFINITY), "∞");
        assert_eq!(num(2.5e-7), "2.500e-7");
        assert_eq!(p_value(0.0123), "0.0123");
        assert_eq!(p_value(0.5), "0.50");
        assert_eq!(p_value(1e-9), "< 0.0001");
        assert_eq!(p_value(0.05), "0.0500");
    }

    #[test]
    fn escaping() {
        assert_eq!(html("<a & 'b'>"), "&lt;a &amp; &#39;b&#39;&gt;");
        assert_eq!(md("a|b_c"), "a\\|b\\_c");
        assert_eq!(fence_for("x ```` y"), "`````");
        assert_eq!(fence_for("plain"), "```");
    }
}
