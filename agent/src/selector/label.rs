//! Label selectors (`k8s.io/apimachinery/pkg/labels/selector.go`): requirements,
//! matching, and the parser with kube-apiserver's key and value rules.

use std::fmt;

use super::{Result, SelectorError};

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` or `key==value`.
    Eq(String, String),
    /// `key!=value` (also true when the label is absent).
    NotEq(String, String),
    /// `key in (v1,v2)`.
    In(String, Vec<String>),
    /// `key notin (v1,v2)` (also true when the label is absent).
    NotIn(String, Vec<String>),
    /// `key`: the label is present.
    Exists(String),
    /// `!key`: the label is absent.
    NotExists(String),
    /// `key>n`: the label is an integer greater than `n`.
    Gt(String, i64),
    /// `key<n`: the label is an integer less than `n`.
    Lt(String, i64),
}

impl Requirement {
    /// Whether labels (`get` looks one up) meet this requirement.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        match self {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
            Requirement::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            Requirement::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        }
    }
}

/// A parsed label selector: every requirement must hold. The empty selector
/// matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    /// The requirements, in the order written.
    pub requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parse a label selector (`a=b,c!=d,e in (f,g),h notin (i),j,!k`).
    pub fn parse(s: &str) -> Result<Self> {
        LabelParser::new(s).parse()
    }

    /// Whether labels (`get` looks one up) meet every requirement.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches(&get))
    }

    /// Whether the selector has no requirements (selects everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// Parse a label selector into its requirements (kube-sim's entry point).
pub fn parse_selector(s: &str) -> Result<Vec<Requirement>, String> {
    LabelSelector::parse(s)
        .map(|l| l.requirements)
        .map_err(|e| e.to_string())
}

/// Whether an object's labels (`get` looks one up) meet every requirement.
pub fn labels_match<'a>(reqs: &[Requirement], get: impl Fn(&str) -> Option<&'a str>) -> bool {
    reqs.iter().all(|r| r.matches(&get))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Not,      // !
    Eq,       // =
    DoubleEq, // ==
    NotEq,    // !=
    Comma,    // ,
    Open,     // (
    Close,    // )
    Gt,       // >
    Lt,       // <
    In,       // in
    NotIn,    // notin
    End,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Ident(s) => write!(f, "{s:?}"),
            Token::Not => f.write_str("'!'"),
            Token::Eq => f.write_str("'='"),
            Token::DoubleEq => f.write_str("'=='"),
            Token::NotEq => f.write_str("'!='"),
            Token::Comma => f.write_str("','"),
            Token::Open => f.write_str("'('"),
            Token::Close => f.write_str("')'"),
            Token::Gt => f.write_str("'>'"),
            Token::Lt => f.write_str("'<'"),
            Token::In => f.write_str("'in'"),
            Token::NotIn => f.write_str("'notin'"),
            Token::End => f.write_str("end of string"),
        }
    }
}

fn tokenize(s: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let special = |c: char| "!=,()<>".contains(c) || c.is_whitespace();
        if special(c) {
            chars.next();
            let t = match c {
                '!' if chars.peek() == Some(&'=') => {
                    chars.next();
                    Token::NotEq
                }
                '!' => Token::Not,
                '=' if chars.peek() == Some(&'=') => {
                    chars.next();
                    Token::DoubleEq
                }
                '=' => Token::Eq,
                ',' => Token::Comma,
                '(' => Token::Open,
                ')' => Token::Close,
                '>' => Token::Gt,
                _ => Token::Lt,
            };
            out.push(t);
            continue;
        }
        let mut word = String::new();
        while let Some(&c) = chars.peek() {
            if special(c) {
                break;
            }
            word.push(c);
            chars.next();
        }
        out.push(match word.as_str() {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Ident(word),
        });
    }
    out.push(Token::End);
    out
}

struct LabelParser<'a> {
    src: &'a str,
    tokens: Vec<Token>,
    pos: usize,
}

impl<'a> LabelParser<'a> {
    fn new(src: &'a str) -> Self {
        LabelParser {
            src,
            tokens: tokenize(src),
            pos: 0,
        }
    }

    fn peek(&self) -> &Token {
        &self.tokens[self.pos]
    }

    fn next(&mut self) -> Token {
        let t = self.tokens[self.pos].clone();
        if t != Token::End {
            self.pos += 1;
        }
        t
    }

    fn err(&self, what: impl fmt::Display) -> SelectorError {
        SelectorError::Label(format!("{:?}: {what}", self.src))
    }

    fn parse(mut self) -> Result<LabelSelector> {
        let mut requirements = Vec::new();
        if *self.peek() == Token::End {
            return Ok(LabelSelector { requirements });
        }
        loop {
            requirements.push(self.requirement()?);
            match self.next() {
                Token::End => break,
                Token::Comma => {
                    if *self.peek() == Token::End {
                        return Err(self.err("expected a requirement after ','"));
                    }
                }
                t => return Err(self.err(format_args!("found {t}, expected ','"))),
            }
        }
        Ok(LabelSelector { requirements })
    }

    fn key(&mut self) -> Result<String> {
        match self.next() {
            Token::Ident(k) => {
                validate_key(&k).map_err(|e| self.err(e))?;
                Ok(k)
            }
            t => Err(self.err(format_args!("found {t}, expected a label key"))),
        }
    }

    fn requirement(&mut self) -> Result<Requirement> {
        if *self.peek() == Token::Not {
            self.next();
            return Ok(Requirement::NotExists(self.key()?));
        }
        let key = self.key()?;
        let op = self.next();
        Ok(match op {
            Token::Comma | Token::End => {
                // Give the separator back to the caller.
                self.pos -= usize::from(op == Token::Comma);
                Requirement::Exists(key)
            }
            Token::Eq | Token::DoubleEq => Requirement::Eq(key, self.single_value()?),
            Token::NotEq => Requirement::NotEq(key, self.single_value()?),
            Token::In => Requirement::In(key, self.set()?),
            Token::NotIn => Requirement::NotIn(key, self.set()?),
            Token::Gt | Token::Lt => {
                let v = self.single_value()?;
                let n = v
                    .parse::<i64>()
                    .map_err(|_| self.err(format_args!("{v:?} is not an integer")))?;
                if op == Token::Gt {
                    Requirement::Gt(key, n)
                } else {
                    Requirement::Lt(key, n)
                }
            }
            t => return Err(self.err(format_args!("found {t}, expected an operator"))),
        })
    }

    /// The value after `=`, `==`, `!=`: may be empty (`a=`).
    fn single_value(&mut self) -> Result<String> {
        match self.peek().clone() {
            Token::Comma | Token::End => Ok(String::new()),
            Token::Ident(v) => {
                self.next();
                validate_value(&v).map_err(|e| self.err(e))?;
                Ok(v)
            }
            t => Err(self.err(format_args!("found {t}, expected a value"))),
        }
    }

    /// `(v1, v2)` after `in` / `notin`: at least one value.
    fn set(&mut self) -> Result<Vec<String>> {
        match self.next() {
            Token::Open => {}
            t => return Err(self.err(format_args!("found {t}, expected '('"))),
        }
        let mut values = Vec::new();
        loop {
            match self.next() {
                Token::Ident(v) => {
                    validate_value(&v).map_err(|e| self.err(e))?;
                    values.push(v);
                    match self.next() {
                        Token::Comma => continue,
                        Token::Close => break,
                        t => return Err(self.err(format_args!("found {t}, expected ',' or ')'"))),
                    }
                }
                Token::Close if values.is_empty() => {
                    return Err(self.err("for 'in', 'notin' operators, values set can't be empty"));
                }
                t => return Err(self.err(format_args!("found {t}, expected a value"))),
            }
        }
        Ok(values)
    }
}

/// A label key: `[prefix/]name`, prefix a DNS subdomain (≤253), name ≤63 characters of
/// `[A-Za-z0-9_.-]` beginning and ending alphanumeric.
fn validate_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(format!(
                "invalid label key {k:?}: prefix part must be a lowercase DNS subdomain"
            ));
        }
    }
    if name.is_empty() || !is_label_name(name) {
        return Err(format!(
            "invalid label key {k:?}: name part must be at most 63 characters of \
             alphanumerics, '-', '_' or '.', beginning and ending with an alphanumeric"
        ));
    }
    Ok(())
}

/// A label value: empty, or like the name part of a key.
fn validate_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_label_name(v) {
        Ok(())
    } else {
        Err(format!(
            "invalid label value {v:?}: must be at most 63 characters of alphanumerics, \
             '-', '_' or '.', beginning and ending with an alphanumeric"
        ))
    }
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}
