//! A tiny evaluator for the CEL shapes these tests send, written for the model only
//! (deliberately not the `cel` crate the server uses, so the two cannot share a bug):
//!
//! - literals `'x'`, `"x"`, `true`, `false`, integers, lists `[a, b]`;
//! - variables (`group`, `resource`, `name`, `labels`, `obj`, ...), member access
//!   `a.b`, index `a['k']`;
//! - `!`, `==`, `!=`, `&&`, `||`, `in` (list membership, map key), parentheses.
//!
//! Anything else panics: it is a test written beyond what the model knows, not a
//! server bug. Runtime errors (a missing field) are `Err`, which the model treats
//! as "not matched".

use serde_json::{Map, Value};

/// A parsed expression.
#[derive(Clone, Debug)]
pub enum Expr {
    Lit(Value),
    Var(String),
    List(Vec<Expr>),
    Member(Box<Expr>, String),
    Index(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Eq(Box<Expr>, Box<Expr>),
    Ne(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    In(Box<Expr>, Box<Expr>),
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Str(String),
    Int(i64),
    Ident(String),
    Sym(&'static str),
}

fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '\'' || ch == '"' {
            let mut s = String::new();
            i += 1;
            while i < c.len() && c[i] != ch {
                if c[i] == '\\' && i + 1 < c.len() {
                    i += 1;
                }
                s.push(c[i]);
                i += 1;
            }
            assert!(i < c.len(), "expr: unterminated string in {src:?}");
            i += 1;
            out.push(Tok::Str(s));
        } else if ch.is_ascii_digit() {
            let start = i;
            while i < c.len() && c[i].is_ascii_digit() {
                i += 1;
            }
            let s: String = c[start..i].iter().collect();
            out.push(Tok::Int(s.parse().unwrap()));
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(c[start..i].iter().collect()));
        } else {
            let two: String = c[i..(i + 2).min(c.len())].iter().collect();
            let sym = match two.as_str() {
                "==" => Some("=="),
                "!=" => Some("!="),
                "&&" => Some("&&"),
                "||" => Some("||"),
                _ => None,
            };
            if let Some(s) = sym {
                out.push(Tok::Sym(s));
                i += 2;
                continue;
            }
            let one = match ch {
                '!' => "!",
                '(' => "(",
                ')' => ")",
                '[' => "[",
                ']' => "]",
                ',' => ",",
                '.' => ".",
                _ => panic!("expr: the model does not know {ch:?} in {src:?}"),
            };
            out.push(Tok::Sym(one));
            i += 1;
        }
    }
    out
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    src: String,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn eat(&mut self, sym: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Sym(s)) if *s == sym) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, sym: &str) {
        assert!(self.eat(sym), "expr: expected {sym:?} in {:?}", self.src);
    }

    fn or(&mut self) -> Expr {
        let mut l = self.and();
        while self.eat("||") {
            l = Expr::Or(Box::new(l), Box::new(self.and()));
        }
        l
    }

    fn and(&mut self) -> Expr {
        let mut l = self.rel();
        while self.eat("&&") {
            l = Expr::And(Box::new(l), Box::new(self.rel()));
        }
        l
    }

    fn rel(&mut self) -> Expr {
        let l = self.unary();
        if self.eat("==") {
            Expr::Eq(Box::new(l), Box::new(self.unary()))
        } else if self.eat("!=") {
            Expr::Ne(Box::new(l), Box::new(self.unary()))
        } else if self.peek() == Some(&Tok::Ident("in".into())) {
            self.pos += 1;
            Expr::In(Box::new(l), Box::new(self.unary()))
        } else {
            l
        }
    }

    fn unary(&mut self) -> Expr {
        if self.eat("!") {
            return Expr::Not(Box::new(self.unary()));
        }
        let mut e = self.primary();
        loop {
            if self.eat(".") {
                match self.peek().cloned() {
                    Some(Tok::Ident(f)) => {
                        self.pos += 1;
                        e = Expr::Member(Box::new(e), f);
                    }
                    t => panic!("expr: field name expected, got {t:?} in {:?}", self.src),
                }
            } else if self.eat("[") {
                let idx = self.or();
                self.expect("]");
                e = Expr::Index(Box::new(e), Box::new(idx));
            } else {
                return e;
            }
        }
    }

    fn primary(&mut self) -> Expr {
        let t = self.peek().cloned();
        self.pos += 1;
        match t {
            Some(Tok::Str(s)) => Expr::Lit(Value::String(s)),
            Some(Tok::Int(i)) => Expr::Lit(Value::from(i)),
            Some(Tok::Ident(id)) if id == "true" => Expr::Lit(Value::Bool(true)),
            Some(Tok::Ident(id)) if id == "false" => Expr::Lit(Value::Bool(false)),
            Some(Tok::Ident(id)) => Expr::Var(id),
            Some(Tok::Sym("(")) => {
                let e = self.or();
                self.expect(")");
                e
            }
            Some(Tok::Sym("[")) => {
                let mut items = Vec::new();
                if !self.eat("]") {
                    loop {
                        items.push(self.or());
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",");
                    }
                }
                Expr::List(items)
            }
            t => panic!("expr: unexpected {t:?} in {:?}", self.src),
        }
    }
}

/// Parse `src`; panics on shapes the model does not know.
pub fn parse(src: &str) -> Expr {
    let mut p = Parser {
        toks: lex(src),
        pos: 0,
        src: src.to_owned(),
    };
    let e = p.or();
    assert!(p.pos == p.toks.len(), "expr: trailing input in {src:?}");
    e
}

/// Evaluate `e` with `vars`; `Err` for a runtime error (missing field, wrong type).
pub fn eval(e: &Expr, vars: &Map<String, Value>) -> Result<Value, String> {
    Ok(match e {
        Expr::Lit(v) => v.clone(),
        Expr::Var(name) => vars
            .get(name)
            .cloned()
            .ok_or_else(|| format!("undeclared reference to '{name}'"))?,
        Expr::List(items) => Value::Array(
            items
                .iter()
                .map(|i| eval(i, vars))
                .collect::<Result<_, _>>()?,
        ),
        Expr::Member(obj, field) => match eval(obj, vars)? {
            Value::Object(m) => m
                .get(field)
                .cloned()
                .ok_or_else(|| format!("no such key: {field}"))?,
            v => return Err(format!("member access on {v}")),
        },
        Expr::Index(obj, idx) => match (eval(obj, vars)?, eval(idx, vars)?) {
            (Value::Object(m), Value::String(k)) => m
                .get(&k)
                .cloned()
                .ok_or_else(|| format!("no such key: {k}"))?,
            (Value::Array(a), Value::Number(n)) => a
                .get(n.as_u64().unwrap_or(u64::MAX) as usize)
                .cloned()
                .ok_or_else(|| "index out of range".to_owned())?,
            (o, i) => return Err(format!("cannot index {o} with {i}")),
        },
        Expr::Not(x) => Value::Bool(!boolean(eval(x, vars)?)?),
        Expr::Eq(a, b) => Value::Bool(eval(a, vars)? == eval(b, vars)?),
        Expr::Ne(a, b) => Value::Bool(eval(a, vars)? != eval(b, vars)?),
        // CEL's && and || are commutative about errors; the shapes used here never
        // depend on that.
        Expr::And(a, b) => Value::Bool(boolean(eval(a, vars)?)? && boolean(eval(b, vars)?)?),
        Expr::Or(a, b) => Value::Bool(boolean(eval(a, vars)?)? || boolean(eval(b, vars)?)?),
        Expr::In(x, coll) => {
            let x = eval(x, vars)?;
            match eval(coll, vars)? {
                Value::Array(a) => Value::Bool(a.contains(&x)),
                Value::Object(m) => Value::Bool(x.as_str().is_some_and(|k| m.contains_key(k))),
                c => return Err(format!("'in' on {c}")),
            }
        }
    })
}

fn boolean(v: Value) -> Result<bool, String> {
    v.as_bool().ok_or_else(|| format!("not a bool: {v}"))
}

/// Evaluate to a bool; runtime errors and non-bool results are "not matched".
pub fn matches(e: &Expr, vars: &Map<String, Value>) -> bool {
    matches!(eval(e, vars), Ok(Value::Bool(true)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vars(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_shapes_the_tests_use() {
        let v = vars(
            json!({"group": "apps", "resource": "deployments", "version": "v1",
            "namespaced": true, "labels": {"app": "web"}, "obj": {"status": {"phase": "Running"}}}),
        );
        for (src, want) in [
            ("group == 'apps' && resource == 'deployments'", true),
            ("group == \"\" || resource in ['pods', 'deployments']", true),
            ("!(resource in ['pods'])", true),
            ("'app' in labels && labels['app'] == 'web'", true),
            ("obj.status.phase == 'Running'", true),
            ("namespaced && version != 'v1'", false),
            ("true", true),
        ] {
            assert_eq!(matches(&parse(src), &v), want, "{src}");
        }
        assert!(!matches(&parse("obj.spec.x == 'y'"), &v));
        assert!(!matches(&parse("resource"), &v));
    }
}
