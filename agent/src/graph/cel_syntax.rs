//! Checks and rewrites of CEL source that need no evaluation: the reserved word
//! `namespace` as a variable, how deep the source nests (before the parser recurses
//! into it), free variables (names not bound by a macro), and outermost operations
//! that can never yield a bool.

use std::borrow::Cow;

use ::cel::common::ast::{EntryExpr, Expr as Ast, IdedEntryExpr, IdedExpr};

/// What the variable `namespace` is called inside a compiled program (see
/// [`escape_namespace`]).
pub(super) const NAMESPACE_IDENT: &str = "__namespace__";

/// `namespace` is a reserved word in CEL (cel-spec langdef "Syntax"; cel-go and the
/// `cel` crate refuse it as an identifier), yet GitLab's design document names the
/// variable so and
/// its own example uses it (`namespace == 'myns'`). So every bare identifier
/// `namespace` outside string literals and comments, and not a field after `.`,
/// becomes `__namespace__` before parsing, which is what Kubernetes' CEL escaping
/// calls such a name. `obj.metadata.namespace` is left alone (fields may be reserved
/// words).
pub(super) fn escape_namespace(src: &str) -> Cow<'_, str> {
    if !src.contains("namespace") {
        return Cow::Borrowed(src);
    }
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len() + 8);
    let mut i = 0;
    let mut last_significant: Option<u8> = None;
    let (mut prefix, mut prefix_end) = ("", usize::MAX);
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            let end = src[i..].find('\n').map_or(b.len(), |n| i + n);
            out.push_str(&src[i..end]);
            i = end;
        } else if c == b'"' || c == b'\'' {
            // A string literal; its prefix (`r`, `b`, `rb`, …) was copied as a word
            // just before it.
            let raw = prefix_end == i && prefix.to_ascii_lowercase().contains('r');
            let triple = b[i..].starts_with(&[c, c, c]);
            let quote_len = if triple { 3 } else { 1 };
            let mut j = i + quote_len;
            while j < b.len() {
                if !raw && b[j] == b'\\' {
                    j += 2;
                    continue;
                }
                if b[j] == c && (!triple || b[j..].starts_with(&[c, c, c])) {
                    j += quote_len;
                    break;
                }
                j += 1;
            }
            let j = j.min(b.len());
            out.push_str(&src[i..j]);
            i = j;
            last_significant = Some(c);
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            let word = &src[i..j];
            (prefix, prefix_end) = (word, j);
            if word == "namespace" && last_significant != Some(b'.') {
                out.push_str(NAMESPACE_IDENT);
            } else {
                out.push_str(word);
            }
            i = j;
            last_significant = Some(b'a');
        } else {
            let ch = src[i..].chars().next().expect("in bounds");
            out.push(ch);
            if !ch.is_whitespace() {
                last_significant = Some(if ch.is_ascii() { c } else { b'?' });
            }
            i += ch.len_utf8();
        }
    }
    Cow::Owned(out)
}

/// Deepest nesting [`nesting`] lets through to the parser: cel-go's default
/// `maxRecursionDepth` (`parser/options.go`), which refuses deeper expressions in
/// GitLab's kas with "expression recursion limit exceeded" (our count approximates
/// cel-go's, which counts parse-tree visits; inferred, not compared case by case).
pub(super) const MAX_NESTING: usize = 250;

/// Levels a bracket's contents add: the grammar's rule chain from `expr` down to
/// `primary` is entered again inside every `(`, `[` and `{` (about 25 nested
/// brackets in all, as in cel-go, where each is that many visits).
const BRACKET: usize = 9;

/// How deep `src` would nest as a parse tree, counted from its tokens, outside
/// string literals and comments: every operation that makes a left-recursive chain
/// (`.` selections, `[` indexes and lists, `(` calls and parentheses, `{` maps,
/// arithmetic and relations, `?` conditionals) adds a level, every bracket adds
/// [`BRACKET`] for what it opens, and a `,` starts a sibling. `&&`, `||`, `!` and a
/// run of `-` do not nest in CEL's grammar.
///
/// The `cel` crate's parser limits bracket nesting (96, which needed 0.5–1 MiB of
/// stack in release and overflowed 8 MiB unoptimised) but not chains: its parse
/// tree visitor recurses once per link, so `1+1+…+1` with 2,000 terms (4 KB) or
/// `obj.a.a…` with 8,000 overflowed a 2 MiB thread's stack (kas's and agentk's tokio
/// workers), aborting the process. Found by `fuzz/fuzz_targets/graph_request.rs`.
pub(super) fn nesting(src: &str) -> usize {
    let b = src.as_bytes();
    // Links in the current chain, per open bracket (the outermost first).
    let mut levels: Vec<usize> = vec![0];
    let mut depth = 0usize;
    let mut deepest = 0usize;
    let mut prefix_end = usize::MAX;
    let mut raw = false;
    let mut prev: u8 = b' ';
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = src[i..].find('\n').map_or(b.len(), |n| i + n);
                continue;
            }
            b'"' | b'\'' => {
                let raw = prefix_end == i && raw;
                let quote_len = if b[i..].starts_with(&[c, c, c]) { 3 } else { 1 };
                let mut j = i + quote_len;
                while j < b.len() {
                    if !raw && b[j] == b'\\' {
                        j += 2;
                        continue;
                    }
                    if b[j] == c && b[j..].starts_with(&b[i..i + quote_len]) {
                        j += quote_len;
                        break;
                    }
                    j += 1;
                }
                i = j;
                prev = b'a';
                continue;
            }
            _ if c.is_ascii_alphanumeric() || c == b'_' => {
                let mut j = i;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                    j += 1;
                }
                raw = src[i..j].to_ascii_lowercase().contains('r');
                prefix_end = j;
                i = j;
                prev = b'a';
                continue;
            }
            b'(' | b'[' | b'{' => {
                *levels.last_mut().expect("never empty") += 1;
                depth += 1 + BRACKET;
                levels.push(0);
            }
            b')' | b']' | b'}' if levels.len() > 1 => {
                depth -= levels.pop().expect("more than one") + BRACKET;
            }
            b',' => {
                let top = levels.last_mut().expect("never empty");
                depth -= *top;
                *top = 0;
            }
            b'.' | b'?' | b'*' | b'/' | b'%' | b'+' | b'<' | b'>' => {
                *levels.last_mut().expect("never empty") += 1;
                depth += 1;
            }
            // `==`, `!=`: once per operator (`!` alone is a flat prefix).
            b'=' if prev != b'=' && prev != b'<' && prev != b'>' => {
                *levels.last_mut().expect("never empty") += 1;
                depth += 1;
            }
            // Binary minus after an operand; a prefix run does not nest.
            b'-' if prev == b'a' || prev == b')' || prev == b']' || prev == b'}' => {
                *levels.last_mut().expect("never empty") += 1;
                depth += 1;
            }
            _ => {}
        }
        deepest = deepest.max(depth);
        if !c.is_ascii_whitespace() {
            prev = c;
        }
        i += 1;
    }
    deepest
}

/// What the outermost operation of `e` yields when it can never be a bool.
pub(super) fn never_bool(e: &Ast) -> Option<&'static str> {
    use ::cel::common::ast::LiteralValue as L;
    match e {
        Ast::Literal(L::Boolean(_)) => None,
        Ast::Literal(_) => Some("a literal of another type"),
        Ast::List(_) => Some("a list"),
        Ast::Map(_) => Some("a map"),
        Ast::Call(c) => match c.func_name.as_str() {
            "_+_" | "_-_" | "_*_" | "_/_" | "_%_" | "-_" => Some("an arithmetic result"),
            "size" | "int" | "uint" | "double" | "string" | "bytes" | "type" => {
                Some("a non-bool conversion")
            }
            _ => None,
        },
        _ => None,
    }
}

/// Call `found` for every identifier of `e` not bound by an enclosing comprehension
/// (`x` in `labels.all(x, …)`).
pub(super) fn free_variables<'e>(
    e: &'e IdedExpr,
    bound: &mut Vec<&'e str>,
    found: &mut impl FnMut(&'e str),
) {
    match &e.expr {
        Ast::Ident(name) => {
            if !name.starts_with('@') && !bound.contains(&name.as_str()) {
                found(name);
            }
        }
        Ast::Call(call) => {
            if let Some(t) = &call.target {
                free_variables(t, bound, found);
            }
            for a in &call.args {
                free_variables(a, bound, found);
            }
        }
        Ast::Comprehension(c) => {
            free_variables(&c.iter_range, bound, found);
            free_variables(&c.accu_init, bound, found);
            let depth = bound.len();
            bound.push(&c.iter_var);
            if let Some(v) = &c.iter_var2 {
                bound.push(v);
            }
            bound.push(&c.accu_var);
            free_variables(&c.loop_cond, bound, found);
            free_variables(&c.loop_step, bound, found);
            free_variables(&c.result, bound, found);
            bound.truncate(depth);
        }
        Ast::List(l) => {
            for x in &l.elements {
                free_variables(x, bound, found);
            }
        }
        Ast::Map(m) => entries(&m.entries, bound, found),
        Ast::Struct(s) => entries(&s.entries, bound, found),
        Ast::Select(s) => free_variables(&s.operand, bound, found),
        Ast::Literal(_) | Ast::Unspecified => {}
    }
}

fn entries<'e>(
    entries: &'e [IdedEntryExpr],
    bound: &mut Vec<&'e str>,
    found: &mut impl FnMut(&'e str),
) {
    for entry in entries {
        match &entry.expr {
            EntryExpr::StructField(f) => free_variables(&f.value, bound, found),
            EntryExpr::MapEntry(m) => {
                free_variables(&m.key, bound, found);
                free_variables(&m.value, bound, found);
            }
        }
    }
}
