//! Prometheus's text exposition format read as samples, for tests and benches that
//! check what a process counted: `name{label="value",…} value [timestamp]` lines,
//! `#` lines for `HELP` and `TYPE`
//! (https://prometheus.io/docs/instrumenting/exposition_formats/).
//!
//! Written here rather than taken from `prometheus-parse`, the crate on crates.io that
//! reads this format: it splits label values at every `,` and `=` (a
//! `route="/a?b=c,d"` comes out wrong) and folds histogram buckets into one value,
//! where these tests select `_bucket`, `_sum` and `_count` series by their labels.
//! Self-contained, so a bench can include it with `#[path]`.

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    /// In the order written; values unescaped.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether this sample has `name` and every label pair of `labels`.
    fn matches(&self, name: &str, labels: &[(String, String)]) -> bool {
        self.name == name
            && labels
                .iter()
                .all(|(k, v)| self.label(k) == Some(v.as_str()))
    }
}

/// Every sample in `text`. Blank and `#` lines are skipped; a line that is not a
/// sample panics, naming it: the exposition under test is malformed.
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| parse_sample(l).unwrap_or_else(|| panic!("not a Prometheus sample: {l:?}")))
        .collect()
}

/// The samples `selector` picks: `name`, or `name{label="value",…}` for the samples
/// of `name` carrying at least those label values (as a PromQL selector picks).
pub fn select<'a>(samples: &'a [Sample], selector: &str) -> impl Iterator<Item = &'a Sample> {
    let (name, labels) = parse_series(selector)
        .filter(|(_, rest)| rest.is_empty())
        .map(|(series, _)| series)
        .unwrap_or_else(|| panic!("not a selector: {selector:?}"));
    samples.iter().filter(move |s| s.matches(&name, &labels))
}

/// The sum of the samples in `text` that `selector` picks (PromQL's
/// `sum(selector)`), `None` when it picks none.
pub fn value(text: &str, selector: &str) -> Option<f64> {
    let all = samples(text);
    let mut picked = select(&all, selector).peekable();
    picked.peek()?;
    Some(picked.map(|s| s.value).sum())
}

/// [`value`], 0 when `selector` picks nothing (a counter not yet incremented).
pub fn value_or_zero(text: &str, selector: &str) -> f64 {
    value(text, selector).unwrap_or(0.0)
}

/// The metric families a `# TYPE` line declares, in order.
pub fn families(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// `name{labels} value [timestamp]`.
fn parse_sample(line: &str) -> Option<Sample> {
    let ((name, labels), rest) = parse_series(line)?;
    let mut fields = rest.split_whitespace();
    let value = fields.next()?.parse().ok()?;
    // An optional timestamp (milliseconds), then nothing.
    if fields.next().is_some_and(|t| t.parse::<i64>().is_err()) || fields.next().is_some() {
        return None;
    }
    Some(Sample {
        name,
        labels,
        value,
    })
}

type Series = (String, Vec<(String, String)>);

/// The metric name and labels at the start of `s`, and what follows them.
fn parse_series(s: &str) -> Option<(Series, &str)> {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(s.len());
    let (name, mut rest) = s.split_at(end);
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = rest.split_once('=')?;
            let key = key.trim();
            if key.is_empty() {
                return None;
            }
            let (value, after) = quoted(after.trim_start())?;
            labels.push((key.to_owned(), value));
            rest = after.trim_start();
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    Some(((name.to_owned(), labels), rest))
}

/// A `"…"` label value with `\\`, `\"` and `\n` escapes, and what follows it.
fn quoted(s: &str) -> Option<(String, &str)> {
    let mut chars = s.strip_prefix('"')?.char_indices();
    let mut out = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 2..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP podgate_requests_total Requests.
# TYPE podgate_requests_total counter
podgate_requests_total{pod="1",path="/a?b=c,d",note="say \"hi\"\n"} 3
podgate_requests_total{pod="2",path="/"} 4 1700000000000
podgate_up 1
# TYPE podgate_seconds histogram
podgate_seconds_bucket{le="+Inf"} 5
podgate_seconds_sum 0.25
"#;

    #[test]
    fn reads_samples_with_escaped_labels() {
        let all = samples(TEXT);
        assert_eq!(all.len(), 5);
        assert_eq!(all[0].label("path"), Some("/a?b=c,d"));
        assert_eq!(all[0].label("note"), Some("say \"hi\"\n"));
        assert_eq!(all[1].value, 4.0);
        assert_eq!(all[3].label("le"), Some("+Inf"));
        assert_eq!(
            families(TEXT),
            ["podgate_requests_total", "podgate_seconds"]
        );
    }

    #[test]
    fn selectors_sum_what_they_pick() {
        assert_eq!(value(TEXT, "podgate_requests_total"), Some(7.0));
        assert_eq!(value(TEXT, r#"podgate_requests_total{pod="2"}"#), Some(4.0));
        assert_eq!(value(TEXT, r#"podgate_requests_total{pod="3"}"#), None);
        assert_eq!(value(TEXT, "podgate_requests"), None);
        assert_eq!(value(TEXT, "podgate_seconds_sum"), Some(0.25));
        assert_eq!(value_or_zero(TEXT, "podgate_down"), 0.0);
    }
}
