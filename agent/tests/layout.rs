//! kas and agentk are siblings: neither imports the other (`docs/architecture.md`).
//! What both use lives below them (`httpz`, `task`, `proto`, `auth`, `transport`,
//! `graph`, `selector`). Checked on the source until they are crates of their own,
//! where Cargo will refuse the import instead.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("a readable source directory") {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The lines of `code` (comments left out) that name module `module` of the agent
/// crate by path: `crate::module`, `super::…::module` or `podgate_agent::module`.
fn references(code: &str, module: &str) -> Vec<String> {
    code.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .filter(|l| {
            ["crate::", "podgate_agent::", "super::"]
                .iter()
                .any(|root| {
                    l.match_indices(root).any(|(at, _)| {
                        let rest = l[at + root.len()..].trim_start_matches("super::");
                        rest.strip_prefix(module).is_some_and(|after| {
                            !after.starts_with(|c: char| c.is_alphanumeric() || c == '_')
                        })
                    })
                })
        })
        .map(|l| l.trim().to_owned())
        .collect()
}

/// Every reference from the files under `src/<from>` to module `to`.
fn imports(from: &str, to: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(from);
    let files = sources(&root);
    assert!(!files.is_empty(), "no sources under {}", root.display());
    files
        .iter()
        .flat_map(|f| {
            let code = std::fs::read_to_string(f).expect("a readable source file");
            references(&code, to)
                .into_iter()
                .map(move |l| format!("{}: {l}", f.display()))
        })
        .collect()
}

#[test]
fn the_reference_finder_sees_paths_and_skips_comments() {
    assert_eq!(
        references("use crate::agentk::AbortOnDrop;", "agentk").len(),
        1
    );
    assert_eq!(
        references("    super::super::agentk::run(x)", "agentk").len(),
        1
    );
    assert_eq!(references("use podgate_agent::kas::Kas;", "kas").len(), 1);
    assert!(references("// crate::agentk::run, as agentk does", "agentk").is_empty());
    assert!(references("use crate::agentk_extra::X;", "agentk").is_empty());
    assert!(references("use crate::proto::kas::X;", "kas").is_empty());
}

#[test]
fn kas_does_not_import_agentk() {
    let found = imports("kas", "agentk");
    assert!(
        found.is_empty(),
        "kas imports agentk:\n{}",
        found.join("\n")
    );
}

#[test]
fn agentk_does_not_import_kas() {
    let found = imports("agentk", "kas");
    assert!(
        found.is_empty(),
        "agentk imports kas:\n{}",
        found.join("\n")
    );
}
