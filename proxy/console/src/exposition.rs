//! Prometheus's text exposition format (0.0.4), read as Prometheus reads a scrape:
//! `# HELP` / `# TYPE` and other comments skipped, each sample line
//! `name{label="value",…} value [timestamp]`, label values with `\\`, `\"` and `\n`
//! escapes, values `NaN`, `+Inf` and `-Inf`. One bad line fails the whole scrape,
//! as in Prometheus (`model/textparse/promparse.go`), with the line named.
//! Hand-written because crates.io's parser, `prometheus-parse` 0.2, splits label
//! values on `,` and `=` without unescaping them and skips bad lines silently.

use thiserror::Error;

/// A scrape that is not the text format. Not transient: the target's output is wrong.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("line {line}: {problem}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub problem: String,
}

/// One sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric name (`_bucket`, `_sum`, `_count` suffixes included).
    pub name: String,
    /// Label pairs in the order written.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

/// Every sample of `text` for which `keep(name)` holds.
pub fn parse(text: &str, keep: impl Fn(&str) -> bool) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |problem: &str| ParseError {
            line: i + 1,
            problem: problem.to_owned(),
        };
        let name_end = line
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(line.len());
        let name = &line[..name_end];
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(bad("expected a metric name"));
        }
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(r) = rest.strip_prefix('{') {
            rest = labels_of(r, &mut labels).map_err(|p| bad(&p))?;
        }
        let mut fields = rest.split_ascii_whitespace();
        let value = fields.next().ok_or_else(|| bad("expected a value"))?;
        let value = match value {
            "NaN" => f64::NAN,
            "+Inf" | "Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse::<f64>()
                .map_err(|_| bad(&format!("{v:?} is not a number")))?,
        };
        if let Some(ts) = fields.next()
            && ts.parse::<i64>().is_err()
        {
            return Err(bad(&format!("{ts:?} is not a timestamp")));
        }
        if fields.next().is_some() {
            return Err(bad("text after the timestamp"));
        }
        if keep(name) {
            out.push(Sample {
                name: name.to_owned(),
                labels,
                value,
            });
        }
    }
    Ok(out)
}

/// Parse `a="x",b="y"}` into `out`; what follows the `}`.
fn labels_of<'a>(mut s: &'a str, out: &mut Vec<(String, String)>) -> Result<&'a str, String> {
    loop {
        s = s.trim_start();
        if let Some(r) = s.strip_prefix('}') {
            return Ok(r);
        }
        let eq = s.find('=').ok_or("expected label=\"value\"")?;
        let name = s[..eq].trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("{name:?} is not a label name"));
        }
        let r = s[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or("a label value must be quoted")?;
        let mut value = String::new();
        let mut chars = r.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated label value".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => return Err("bad escape in a label value".into()),
                },
                Some((_, c)) => value.push(c),
            }
        };
        out.push((name.to_owned(), value));
        s = r[end + 1..].trim_start();
        if let Some(r) = s.strip_prefix(',') {
            s = r;
        } else if !s.starts_with('}') {
            return Err("expected ',' or '}' after a label".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder as _, IntCounterVec, Opts, Registry, TextEncoder};

    #[test]
    fn reads_what_the_prometheus_crate_writes() {
        let registry = Registry::new();
        let c = IntCounterVec::new(Opts::new("x_total", "help"), &["a", "b"]).unwrap();
        registry.register(Box::new(c.clone())).unwrap();
        c.with_label_values(&["1", "q\"uote\\back\nline"]).inc_by(7);
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let samples = parse(std::str::from_utf8(&text).unwrap(), |_| true).unwrap();
        assert_eq!(
            samples,
            vec![Sample {
                name: "x_total".into(),
                labels: vec![
                    ("a".into(), "1".into()),
                    ("b".into(), "q\"uote\\back\nline".into())
                ],
                value: 7.0,
            }]
        );
    }

    #[test]
    fn special_values_timestamps_and_the_filter() {
        let text =
            "# TYPE a gauge\na NaN\nb{} +Inf 1700000000000\nc_bucket{le=\"+Inf\"} 3\nd -Inf\n";
        let s = parse(text, |n| !n.ends_with("_bucket")).unwrap();
        assert_eq!(s.len(), 3);
        assert!(s[0].value.is_nan());
        assert_eq!(s[1].value, f64::INFINITY);
        assert!(s[1].labels.is_empty());
        assert_eq!(s[2].name, "d");
    }

    #[test]
    fn a_bad_line_names_itself() {
        for (text, line, problem) in [
            ("ok 1\nbad{a=1} 2\n", 2, "quoted"),
            ("x{a=\"1\" b=\"2\"} 1", 1, "after a label"),
            ("x{a=\"1} 1", 1, "unterminated"),
            ("x 1 2 3", 1, "after the timestamp"),
            ("x one", 1, "not a number"),
            ("{a=\"b\"} 1", 1, "metric name"),
            ("x", 1, "expected a value"),
            ("x{a=\"\\t\"} 1", 1, "escape"),
        ] {
            let e = parse(text, |_| true).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.problem.contains(problem), "{text:?}: {e}");
        }
    }
}
