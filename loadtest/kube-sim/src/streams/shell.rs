//! A container's processes: kube-sim runs no images, so `exec` and `attach`
//! reach this small built-in shell. As a command (`kubectl exec pod -- echo hi`)
//! it knows `echo [-n]`, `cat` (stdin to stdout until end of input), `env`,
//! `hostname`, `true`, `false` and `sh -c 'SCRIPT'`; a script adds `exit N`,
//! `;`, `&&`, `||`, quotes and `$NAME`. Inside a script an unknown command prints
//! `sh: NAME: not found` and has status 127, as busybox and dash do; as the
//! command itself it is a failure to start, which the kubelet reports as an
//! internal error rather than an exit code (see `channels`).

use std::collections::BTreeMap;

use bytes::Bytes;
use tokio::sync::mpsc;

/// Where a process reads and writes.
pub(super) struct Io {
    /// Standard input: chunks until the sender is dropped (end of input).
    pub(super) stdin: Option<mpsc::Receiver<Bytes>>,
    /// Standard output.
    pub(super) stdout: mpsc::Sender<Bytes>,
    /// Standard error.
    pub(super) stderr: mpsc::Sender<Bytes>,
}

impl Io {
    async fn out(&self, s: impl Into<Bytes>) {
        let _ = self.stdout.send(s.into()).await;
    }

    async fn err(&self, s: impl Into<Bytes>) {
        let _ = self.stderr.send(s.into()).await;
    }
}

/// How a process ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// It ran and exited with this status.
    Exited(i32),
    /// Its executable does not exist: it never started.
    NotFound(String),
}

/// The environment of a container's processes.
pub(super) struct Env {
    /// Variables, as `env` prints them.
    pub(super) vars: BTreeMap<String, String>,
}

impl Env {
    /// A container's environment: `PATH`, `HOSTNAME` (the Pod's name), `HOME`,
    /// then the container spec's `env` values.
    pub(super) fn of(pod: &str, container: &serde_json::Value) -> Self {
        let mut vars = BTreeMap::new();
        vars.insert(
            "PATH".to_owned(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        );
        vars.insert("HOSTNAME".to_owned(), pod.to_owned());
        vars.insert("HOME".to_owned(), "/root".to_owned());
        for e in container["env"].as_array().into_iter().flatten() {
            if let (Some(n), Some(v)) = (e["name"].as_str(), e["value"].as_str()) {
                vars.insert(n.to_owned(), v.to_owned());
            }
        }
        Env { vars }
    }
}

/// Run `argv` as a container's process.
pub(super) async fn run(argv: &[String], env: &Env, io: &mut Io) -> Outcome {
    match builtin(argv, env, io).await {
        Some(code) => Outcome::Exited(code),
        None => Outcome::NotFound(argv.first().cloned().unwrap_or_default()),
    }
}

/// One simple command; `None` when no such command exists.
async fn builtin(argv: &[String], env: &Env, io: &mut Io) -> Option<i32> {
    let (name, args) = argv.split_first()?;
    let name = name.rsplit('/').next().unwrap_or(name);
    Some(match name {
        "echo" => {
            let (newline, words) = match args.first().map(String::as_str) {
                Some("-n") => (false, &args[1..]),
                _ => (true, args),
            };
            let mut s = words.join(" ");
            if newline {
                s.push('\n');
            }
            io.out(s).await;
            0
        }
        "cat" if args.is_empty() || args == ["-"] => {
            if let Some(stdin) = io.stdin.as_mut() {
                while let Some(chunk) = stdin.recv().await {
                    let _ = io.stdout.send(chunk).await;
                }
            }
            0
        }
        "cat" => {
            io.err(format!(
                "cat: can't open '{}': No such file or directory\n",
                args[0]
            ))
            .await;
            1
        }
        "env" => {
            let s: String = env.vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            io.out(s).await;
            0
        }
        "hostname" => {
            let host = env.vars.get("HOSTNAME").cloned().unwrap_or_default();
            io.out(format!("{host}\n")).await;
            0
        }
        "true" => 0,
        "false" => 1,
        "sh" | "bash" | "ash" => match args {
            [c, script, ..] if c == "-c" => Box::pin(script_run(script, env, io)).await,
            [c] if c == "-c" => {
                io.err(format!("{name}: -c requires an argument\n")).await;
                2
            }
            [] => Box::pin(interactive(env, io)).await,
            [file, ..] => {
                io.err(format!(
                    "{name}: can't open '{file}': No such file or directory\n"
                ))
                .await;
                2
            }
        },
        _ => return None,
    })
}

/// `sh` with no script: read commands from stdin, one a line, until its end or
/// `exit`.
async fn interactive(env: &Env, io: &mut Io) -> i32 {
    let Some(mut stdin) = io.stdin.take() else {
        return 0;
    };
    let mut pending = Vec::new();
    let mut status = 0;
    while let Some(chunk) = stdin.recv().await {
        pending.extend_from_slice(&chunk);
        while let Some(at) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            let line = String::from_utf8_lossy(&line).into_owned();
            match script(&line, env, io, &mut status).await {
                Flow::Exit(code) => return code,
                Flow::Go => {}
            }
        }
    }
    status
}

enum Flow {
    Go,
    Exit(i32),
}

async fn script_run(text: &str, env: &Env, io: &mut Io) -> i32 {
    let mut status = 0;
    match script(text, env, io, &mut status).await {
        Flow::Exit(code) => code,
        Flow::Go => status,
    }
}

/// Run a script: commands separated by `;`, newlines, `&&` and `||`, each
/// expanded when it runs (so `$?` is the status before it).
async fn script(text: &str, env: &Env, io: &mut Io, status: &mut i32) -> Flow {
    let commands = match split(text) {
        Ok(c) => c,
        Err(e) => {
            io.err(format!("sh: syntax error: {e}\n")).await;
            *status = 2;
            return Flow::Go;
        }
    };
    for (sep, command) in commands {
        let run_it = match sep {
            Sep::Always => true,
            Sep::And => *status == 0,
            Sep::Or => *status != 0,
        };
        if !run_it {
            continue;
        }
        let words = match parse(&command, env, *status) {
            Ok(w) => w,
            Err(e) => {
                io.err(format!("sh: syntax error: {e}\n")).await;
                *status = 2;
                return Flow::Go;
            }
        };
        if words.is_empty() {
            continue;
        }
        if words[0] == "exit" {
            let code = words
                .get(1)
                .map_or(Some(*status), |c| c.parse::<i32>().ok());
            return Flow::Exit(code.map_or(2, |c| c & 0xff));
        }
        *status = match Box::pin(builtin(&words, env, io)).await {
            Some(code) => code,
            None => {
                io.err(format!("sh: {}: not found\n", words[0])).await;
                127
            }
        };
    }
    Flow::Go
}

/// Split a script into commands, each with the separator before it; quotes,
/// escapes and comments are respected, not yet interpreted.
fn split(text: &str) -> Result<Vec<(Sep, String)>, String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut sep = Sep::Always;
    let mut chars = text.chars().peekable();
    let mut quote: Option<char> = None;
    let mut word_start = true;
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            current.push(c);
            if c == q {
                quote = None;
            } else if c == '\\' && q == '"' {
                current.extend(chars.next());
            }
            continue;
        }
        match c {
            '\'' | '"' => {
                quote = Some(c);
                current.push(c);
            }
            '\\' => {
                current.push(c);
                current.extend(chars.next());
            }
            '#' if word_start => {
                while chars.peek().is_some_and(|c| *c != '\n') {
                    chars.next();
                }
            }
            ';' | '\n' | '&' | '|' => {
                let next = match c {
                    '&' if chars.peek() == Some(&'&') => Sep::And,
                    '|' if chars.peek() == Some(&'|') => Sep::Or,
                    '&' | '|' => return Err(format!("unexpected \"{c}\"")),
                    _ => Sep::Always,
                };
                if next != Sep::Always {
                    chars.next();
                    if current.trim().is_empty() {
                        return Err(format!("unexpected \"{c}{c}\""));
                    }
                }
                out.push((sep, std::mem::take(&mut current)));
                sep = next;
            }
            c => current.push(c),
        }
        word_start = matches!(c, ' ' | '\t' | ';' | '\n' | '&' | '|');
    }
    if quote.is_some() {
        return Err("unterminated quoted string".into());
    }
    out.push((sep, current));
    Ok(out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sep {
    Always,
    And,
    Or,
}

/// One command's words: single and double quotes, backslash escapes, `$NAME`,
/// `${NAME}` and `$?`.
fn parse(text: &str, env: &Env, status: i32) -> Result<Vec<String>, String> {
    let mut words: Vec<String> = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = text.chars().peekable();
    let var = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| -> String {
        if chars.peek() == Some(&'?') {
            chars.next();
            return status.to_string();
        }
        let braced = chars.peek() == Some(&'{');
        if braced {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                chars.next();
            } else {
                break;
            }
        }
        if braced && chars.peek() == Some(&'}') {
            chars.next();
        }
        if name.is_empty() && !braced {
            return "$".to_owned();
        }
        env.vars.get(&name).cloned().unwrap_or_default()
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("unterminated quoted string".into()),
                    }
                }
            }
            '"' => {
                word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$')) => word.as_mut().unwrap().push(c),
                            Some(c) => word.as_mut().unwrap().extend(['\\', c]),
                            None => return Err("unterminated quoted string".into()),
                        },
                        Some('$') => {
                            let v = var(&mut chars);
                            word.as_mut().unwrap().push_str(&v);
                        }
                        Some(c) => word.as_mut().unwrap().push(c),
                        None => return Err("unterminated quoted string".into()),
                    }
                }
            }
            '\\' => {
                if let Some(c) = chars.next() {
                    word.get_or_insert_with(String::new).push(c);
                }
            }
            '$' => {
                let v = var(&mut chars);
                word.get_or_insert_with(String::new).push_str(&v);
            }
            ' ' | '\t' => words.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word.take());
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn sh(argv: &[&str], input: &[&str]) -> (Outcome, String, String) {
        let (in_tx, in_rx) = mpsc::channel(16);
        let (out_tx, mut out_rx) = mpsc::channel(64);
        let (err_tx, mut err_rx) = mpsc::channel(64);
        for i in input {
            in_tx.send(Bytes::from(i.to_string())).await.unwrap();
        }
        drop(in_tx);
        let mut io = Io {
            stdin: Some(in_rx),
            stdout: out_tx,
            stderr: err_tx,
        };
        let env = Env::of(
            "web-1",
            &serde_json::json!({"env": [{"name": "GREETING", "value": "hello there"}]}),
        );
        let argv: Vec<String> = argv.iter().map(|s| (*s).to_owned()).collect();
        let outcome = run(&argv, &env, &mut io).await;
        drop(io);
        let mut out = String::new();
        while let Some(b) = out_rx.recv().await {
            out.push_str(&String::from_utf8_lossy(&b));
        }
        let mut err = String::new();
        while let Some(b) = err_rx.recv().await {
            err.push_str(&String::from_utf8_lossy(&b));
        }
        (outcome, out, err)
    }

    #[tokio::test]
    async fn commands_print_and_exit_with_their_status() {
        assert_eq!(
            sh(&["echo", "hi", "there"], &[]).await,
            (Outcome::Exited(0), "hi there\n".into(), String::new())
        );
        assert_eq!(sh(&["cat"], &["a", "b\n"]).await.1, "ab\n");
        assert_eq!(sh(&["hostname"], &[]).await.1, "web-1\n");
        assert!(sh(&["env"], &[]).await.1.contains("GREETING=hello there\n"));
        assert_eq!(
            sh(&["/bin/false"], &[]).await.0,
            Outcome::Exited(1),
            "a path names the same command"
        );
        assert_eq!(
            sh(&["nope", "x"], &[]).await.0,
            Outcome::NotFound("nope".into())
        );
    }

    #[tokio::test]
    async fn scripts_chain_quote_expand_and_exit() {
        let (o, out, err) = sh(
            &[
                "sh",
                "-c",
                "echo \"$GREETING\" 'a  b'; nope && echo no || echo $?; exit 3; echo never",
            ],
            &[],
        )
        .await;
        assert_eq!(o, Outcome::Exited(3));
        assert_eq!(out, "hello there a  b\n127\n");
        assert_eq!(err, "sh: nope: not found\n");
        assert_eq!(sh(&["sh", "-c", "false"], &[]).await.0, Outcome::Exited(1));
        let (o, _, err) = sh(&["sh", "-c", "echo 'open"], &[]).await;
        assert_eq!(o, Outcome::Exited(2));
        assert!(err.contains("unterminated"), "{err}");
    }

    #[tokio::test]
    async fn an_interactive_shell_runs_each_line_until_exit() {
        let (o, out, _) = sh(&["sh"], &["echo one\necho t", "wo\nexit 4\necho never\n"]).await;
        assert_eq!(o, Outcome::Exited(4));
        assert_eq!(out, "one\ntwo\n");
    }
}
