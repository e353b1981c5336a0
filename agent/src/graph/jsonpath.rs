//! kubectl's JSONPath templates (`include.object.json_path`), evaluated with an
//! RFC 9535 engine (`serde_json_path`).
//!
//! A template is literal text and `{…}` actions, as `kubectl -o jsonpath=…` takes it:
//!
//! - `{.metadata.name}`, `{.items[*].name}`, `{.a['b.c']}`, `{.a.b\.c}` (escaped dot),
//!   `{..name}` (recursive), `{.a.*}`, `{.a[0]}`, `{.a[-1:]}`, `{.a[0,1]}`,
//!   `{.a[?(@.x=="y")]}` — paths relative to the current node (the object, or the
//!   item of the enclosing `range`); `{$.x}` is from the object, `{@.x}` from the
//!   current node, `{$}` / `{@}` the node itself;
//! - `{range <path>}…{end}`: the body once per node the path selects, nested ranges
//!   allowed;
//! - `{"text"}`: a quoted literal (`\n`, `\t`, `\"`, `\\` escapes);
//! - text outside braces: a literal.
//!
//! **Result.** The Graph API sends `j`, an array. [`JsonPath::eval`] returns what
//! client-go's `JSONPath.FindResults` yields (which agentk, written in Go, most likely
//! uses), flattened in template order: every node each path selects, and every
//! literal text **as a JSON string** where kubectl would print it. So
//! `{.metadata.name}` gives `["web"]`, `{.items[*].n}` gives `[1, 2]`, and
//! `{range .a[*]}[{.n}]{end}` gives `["[", 1, "]", "[", 2, "]"]`. A path that selects
//! nothing (a missing key) contributes nothing, as kubectl prints nothing for it.
//!
//! **Differences from kubectl**, all refusals of templates kubectl accepts but
//! mishandles: `{range …}` without `{end}` (kubectl prints nothing) is an error; a
//! bracketed key is looked up literally (`{.a['b.c']}` selects key `b.c`, where
//! kubectl 1.3x prints nothing). Bracket contents are RFC 9535, which is a superset of
//! kubectl's bracket syntax (`['a','b']` unions are allowed).

use serde_json::Value;

/// A parsed template. `Send + Sync`; evaluate it against any number of objects.
#[derive(Debug, Clone)]
pub struct JsonPath {
    template: String,
    nodes: Vec<Node>,
}

/// A body being collected: the template's own, or that of an open `{range path}`.
type Frame = (Vec<Node>, Option<(bool, serde_json_path::JsonPath)>);

#[derive(Debug, Clone)]
enum Node {
    /// Literal text, emitted as a JSON string.
    Text(String),
    /// A path; `rooted` when it starts at the object (`$`), else at the current node.
    Path {
        rooted: bool,
        path: serde_json_path::JsonPath,
    },
    /// `{range path}body{end}`.
    Range {
        rooted: bool,
        path: serde_json_path::JsonPath,
        body: Vec<Node>,
    },
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<JsonPath>();
};

impl JsonPath {
    /// Parse a kubectl JSONPath template. The error says what is wrong and where.
    pub fn parse(t: &str) -> Result<JsonPath, String> {
        if t.trim().is_empty() {
            return Err("empty template".into());
        }
        // Each open `range` collects its body; the bottom of the stack is the template.
        let mut stack: Vec<Frame> = vec![(Vec::new(), None)];
        let mut rest = t;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                push_text(&mut stack.last_mut().expect("stack").0, rest);
                break;
            };
            push_text(&mut stack.last_mut().expect("stack").0, &rest[..open]);
            let after = &rest[open + 1..];
            let close = action_end(after)
                .ok_or_else(|| format!("unclosed action at byte {open} of {t:?}"))?;
            let action = after[..close].trim();
            rest = &after[close + 1..];
            if action == "end" {
                if stack.len() == 1 {
                    return Err(format!("{{end}} without {{range}} in {t:?}"));
                }
                let (body, range) = stack.pop().expect("stack");
                let (rooted, path) = range.expect("a range frame");
                stack
                    .last_mut()
                    .expect("stack")
                    .0
                    .push(Node::Range { rooted, path, body });
            } else if let Some(p) = action.strip_prefix("range ") {
                let (rooted, path) = translate(p.trim())?;
                stack.push((Vec::new(), Some((rooted, path))));
            } else if action.starts_with('"') {
                let text = unquote(action)?;
                push_text(&mut stack.last_mut().expect("stack").0, &text);
            } else if action.is_empty() {
                return Err(format!("empty action {{}} in {t:?}"));
            } else {
                let (rooted, path) = translate(action)?;
                stack
                    .last_mut()
                    .expect("stack")
                    .0
                    .push(Node::Path { rooted, path });
            }
        }
        if stack.len() > 1 {
            return Err(format!("{{range}} without {{end}} in {t:?}"));
        }
        let (nodes, _) = stack.pop().expect("stack");
        Ok(JsonPath {
            template: t.to_owned(),
            nodes,
        })
    }

    /// The template as given.
    pub fn template(&self) -> &str {
        &self.template
    }

    /// Every node the template selects from `v`, literal text as strings, in template
    /// order (module docs).
    pub fn eval(&self, v: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        eval_nodes(&self.nodes, v, v, &mut out);
        out
    }
}

fn eval_nodes(nodes: &[Node], root: &Value, current: &Value, out: &mut Vec<Value>) {
    for n in nodes {
        match n {
            Node::Text(s) => out.push(Value::String(s.clone())),
            Node::Path { rooted, path } => {
                let from = if *rooted { root } else { current };
                out.extend(path.query(from).all().into_iter().cloned());
            }
            Node::Range { rooted, path, body } => {
                let from = if *rooted { root } else { current };
                for item in path.query(from).all() {
                    eval_nodes(body, root, item, out);
                }
            }
        }
    }
}

fn push_text(nodes: &mut Vec<Node>, text: &str) {
    if text.is_empty() {
        return;
    }
    // Each piece of text is its own result, as in client-go's `FindResults`.
    nodes.push(Node::Text(text.to_owned()));
}

/// The characters of `s` outside its quoted strings (`"…"` or `'…'`, `\` escaping
/// inside them), with their indices; the quotes are left out too.
fn unquoted(s: &str) -> impl Iterator<Item = (usize, char)> + '_ {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    s.char_indices().filter(move |&(_, c)| {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            return false;
        }
        if c == '"' || c == '\'' {
            quote = Some(c);
            return false;
        }
        true
    })
}

/// The index of the `}` closing an action that starts right after a `{`, skipping
/// quoted strings and brackets.
fn action_end(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in unquoted(s) {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth = depth.saturating_sub(1),
            '}' if depth == 0 => return Some(i),
            '{' if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// `"…"` with Go-style escapes to its text.
fn unquote(action: &str) -> Result<String, String> {
    let inner = action
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .filter(|_| action.len() >= 2)
        .ok_or_else(|| format!("unterminated quoted string {action}"))?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            if c == '"' {
                return Err(format!("unexpected '\"' in quoted string {action}"));
            }
            out.push(c);
            continue;
        }
        out.push(match chars.next() {
            Some('n') => '\n',
            Some('t') => '\t',
            Some('r') => '\r',
            Some('\\') => '\\',
            Some('"') => '"',
            Some('\'') => '\'',
            Some(e) => return Err(format!("unknown escape \\{e} in {action}")),
            None => return Err(format!("unterminated quoted string {action}")),
        });
    }
    Ok(out)
}

/// A kubectl path (`.a.b[*]`, `$.a`, `@.a`, `..a`) as an RFC 9535 query, and whether
/// it starts at the object (`$`) rather than the current node.
fn translate(p: &str) -> Result<(bool, serde_json_path::JsonPath), String> {
    let (rooted, mut rest) = if let Some(r) = p.strip_prefix('$') {
        (true, r)
    } else if let Some(r) = p.strip_prefix('@') {
        (false, r)
    } else if p.starts_with('.') || p.starts_with('[') {
        (false, p)
    } else {
        return Err(format!(
            "invalid path {p:?}: must start with '.', '[', '$' or '@'"
        ));
    };
    let mut q = String::from("$");
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("..") {
            q.push_str("..");
            rest = r;
            if rest.starts_with('[') {
                continue;
            }
            rest = member(rest, &mut q, p)?;
        } else if let Some(r) = rest.strip_prefix('.') {
            if r.starts_with('[') {
                // `.[0]`: kubectl tolerates the dot.
                rest = r;
                continue;
            }
            rest = member(r, &mut q, p)?;
        } else if rest.starts_with('[') {
            let end = bracket_end(rest).ok_or_else(|| format!("unclosed '[' in {p:?}"))?;
            q.push_str(&rest[..=end]);
            rest = &rest[end + 1..];
        } else {
            return Err(format!("invalid path {p:?}: unexpected {rest:?}"));
        }
    }
    let path =
        serde_json_path::JsonPath::parse(&q).map_err(|e| format!("invalid path {p:?}: {e}"))?;
    Ok((rooted, path))
}

/// A dot member name (`name`, `*`, `a\.b`) at the start of `s`, appended to `q` in
/// bracket notation; returns what follows it.
fn member<'s>(s: &'s str, q: &mut String, p: &str) -> Result<&'s str, String> {
    if let Some(r) = s.strip_prefix('*') {
        q.push_str("[*]");
        return Ok(r);
    }
    let mut name = String::new();
    let mut chars = s.char_indices().peekable();
    let mut end = s.len();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, e)) => name.push(e),
                None => return Err(format!("invalid path {p:?}: trailing '\\'")),
            },
            '.' | '[' => {
                end = i;
                break;
            }
            c if c.is_whitespace() => {
                return Err(format!("invalid path {p:?}: unexpected whitespace"));
            }
            c if "]{}()\"'$@,".contains(c) => {
                return Err(format!(
                    "invalid path {p:?}: unexpected {c:?} in a field name"
                ));
            }
            c => name.push(c),
        }
    }
    if name.is_empty() {
        return Err(format!("invalid path {p:?}: empty field name"));
    }
    q.push_str("['");
    for c in name.chars() {
        match c {
            '\'' => q.push_str("\\'"),
            '\\' => q.push_str("\\\\"),
            c => q.push(c),
        }
    }
    q.push_str("']");
    Ok(&s[end..])
}

/// The index of the `]` closing the `[` at the start of `s`.
fn bracket_end(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in unquoted(s) {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj() -> Value {
        json!({"apiVersion":"v1","kind":"ConfigMap",
            "metadata":{"name":"cm1","namespace":"default",
                "labels":{"app":"web","app.kubernetes.io/name":"w"},
                "annotations":{"a.b/c-d":"x"}},
            "data":{"k1":"v1","k.2":"v2"},
            "list":[{"name":"a","n":1},{"name":"b","n":2},{"x":3}]})
    }

    fn j(t: &str) -> Vec<Value> {
        JsonPath::parse(t)
            .unwrap_or_else(|e| panic!("{t}: {e}"))
            .eval(&obj())
    }

    /// Each case's expectation is what `kubectl annotate --local -f x.json z=z -o
    /// jsonpath=<t>` printed for the same object (kubectl 1.3x), as nodes.
    #[test]
    fn templates_select_what_kubectl_prints() {
        let cases: Vec<(&str, Value)> = vec![
            ("{.metadata.name}", json!(["cm1"])),
            ("{ .metadata.name }", json!(["cm1"])),
            (
                "hello {.metadata.name} world",
                json!(["hello ", "cm1", " world"]),
            ),
            ("{.list[*].name}", json!(["a", "b"])),
            (
                "{.metadata.labels}",
                json!([{"app":"web","app.kubernetes.io/name":"w"}]),
            ),
            (r"{.data.k\.2}", json!(["v2"])),
            (r"{.metadata.annotations.a\.b/c-d}", json!(["x"])),
            (r"{.metadata.labels.app\.kubernetes\.io/name}", json!(["w"])),
            (
                r#"{range .list[*]}{.name}{"\n"}{end}"#,
                json!(["a", "\n", "b", "\n", "\n"]),
            ),
            ("{.missing}", json!([])),
            ("{.list[?(@.n==2)].name}", json!(["b"])),
            (r#"{.list[?(@.name=="a")].n}"#, json!([1])),
            ("{.list[?(@.name=='a')].n}", json!([1])),
            ("{.list[-1:]}", json!([{"x":3}])),
            ("{.list[0,1].name}", json!(["a", "b"])),
            (
                "{range .list[*]}[{.name}]{end}",
                json!(["[", "a", "]", "[", "b", "]", "[", "]"]),
            ),
            (r#"a{"b"}c"#, json!(["a", "b", "c"])),
            (
                "{.metadata.name} {$.kind}",
                json!(["cm1", " ", "ConfigMap"]),
            ),
            ("{.list.name}", json!([])),
            ("{.list[0].n}", json!([1])),
            ("{.list[*].x}", json!([3])),
            ("{.list[2].name}", json!([])),
            ("{.data.k1}{.data.k1}", json!(["v1", "v1"])),
            (r#"{"lit"}"#, json!(["lit"])),
            ("{.list[*].n}", json!([1, 2])),
            ("{.metadata.name}}", json!(["cm1", "}"])),
            (".metadata.name", json!([".metadata.name"])),
            (
                r#"{.list[0].name}{"\t"}{.kind}"#,
                json!(["a", "\t", "ConfigMap"]),
            ),
        ];
        for (t, want) in cases {
            assert_eq!(Value::Array(j(t)), want, "{t}");
        }
        assert_eq!(j("{$}"), vec![obj()]);
        assert_eq!(j("{@}"), vec![obj()]);
        // kubectl prints the values in key order (Go maps); serde_json keeps keys sorted too.
        assert_eq!(
            Value::Array(j("{.metadata.*}")),
            json!([{"a.b/c-d":"x"}, {"app":"web","app.kubernetes.io/name":"w"}, "cm1", "default"])
        );
        // `..` visits every descendant; kubectl prints "cm1 a b", RFC 9535 fixes no order
        // between siblings and their descendants, so compare as sets.
        let mut names: Vec<String> = j("{..name}")
            .into_iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["a", "b", "cm1"]);
    }

    /// What kubectl handles differently on purpose (module docs).
    #[test]
    fn deliberate_differences() {
        assert_eq!(Value::Array(j("{.data['k.2']}")), json!(["v2"]));
        assert_eq!(
            Value::Array(j(r#"{.list[*]["name","n"]}"#)),
            json!(["a", 1, "b", 2])
        );
        assert!(JsonPath::parse("{range .list[*]}").is_err());
    }

    #[test]
    fn nested_ranges_and_root_paths() {
        let v = json!({"kind":"Pod","spec":{"containers":[
            {"name":"a","ports":[{"p":1},{"p":2}]},
            {"name":"b","ports":[{"p":3}]}]}});
        let t = JsonPath::parse(
            "{range .spec.containers[*]}{.name}:{range .ports[*]}{.p}{end};{$.kind}{end}",
        )
        .unwrap();
        assert_eq!(
            Value::Array(t.eval(&v)),
            json!(["a", ":", 1, 2, ";", "Pod", "b", ":", 3, ";", "Pod"])
        );
    }

    #[test]
    fn malformed_templates_are_refused() {
        for t in [
            "",
            "  ",
            "{.metadata.name",
            "{{.metadata.name}}",
            "{end}",
            "{range .a[*]}",
            "{}",
            "{.a b}",
            "{.a[}",
            "{.a[?(@.x==)]}",
            "{metadata}",
            "{.a..}",
            "{.}",
            r#"{"unterminated}"#,
            r#"{"bad \q"}"#,
            "{.a.b\\}",
        ] {
            assert!(JsonPath::parse(t).is_err(), "{t:?} should be refused");
        }
    }
}
