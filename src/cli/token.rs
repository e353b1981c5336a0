//! `podgate token …`: keygen, mint, mint-gitlab, inspect, demo.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use podgate_tokens::gitlab::{self, RoutingKeys};
use podgate_tokens::keys::{self, Algorithm};
use podgate_tokens::{
    Classification, Classifier, ClassifierConfig, KeySet, MintRequest, PodId, RunnerType,
    TokenKind, unix_now,
};

use super::{EXIT_INVALID, parse_duration_secs};

/// `podgate token` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Generate a signing key: `<kid>.private.pem` and `<kid>.pem` (or `<kid>.hs256`).
    Keygen {
        /// ed25519, es256, rs256 or hs256.
        #[arg(long, default_value = "ed25519", value_parser = parse_alg)]
        alg: Algorithm,
        /// Key id written into tokens' headers; defaults to `<alg>-<date>`.
        #[arg(long)]
        kid: Option<String>,
        /// Directory to write the key files into (created if missing).
        #[arg(long, default_value = ".")]
        out: PathBuf,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
    /// Mint a JWT routable token.
    Mint(MintArgs),
    /// Mint a GitLab routable token, format v1 (as GitLab.com issues them).
    MintGitlab(MintGitlabArgs),
    /// Decode, verify and classify a token; prints one JSON object.
    ///
    /// Exit code 0 for a routable or unroutable token, 1 for an invalid one.
    Inspect {
        /// The token, or `-` to read it from standard input (keeps it out of `ps`).
        token: String,
        /// Verification keys: a key file or a directory of them (repeatable).
        #[arg(long)]
        keys: Vec<PathBuf>,
        /// Require this JWT audience.
        #[arg(long)]
        audience: Option<String>,
        /// Require this JWT issuer.
        #[arg(long)]
        issuer: Option<String>,
        /// Clock skew tolerated on `exp`/`nbf`, in seconds.
        #[arg(long, default_value_t = 60)]
        leeway: u64,
    },
    /// Show every token format at work: keys, minted tokens and their verdicts.
    Demo,
}

/// Routing ids shared by both mint commands.
#[derive(Debug, Args)]
pub(crate) struct RoutingArgs {
    /// Organization id (`o`).
    #[arg(long)]
    org: Option<u64>,
    /// Group id (`g`).
    #[arg(long)]
    group: Option<u64>,
    /// Project id (`p`).
    #[arg(long)]
    project: Option<u64>,
    /// User id (`u`).
    #[arg(long)]
    user: Option<u64>,
    /// Runner type (`t`): 1 instance, 2 group, 3 project.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3))]
    runner_type: Option<u64>,
}

/// `podgate token mint`.
#[derive(Debug, Args)]
pub(crate) struct MintArgs {
    /// runner, runner-registration, job, agent, personal-access or other.
    #[arg(long)]
    kind: TokenKind,
    /// The Pod the token routes to.
    #[arg(long)]
    pod: PodId,
    /// Lifetime: 90s, 15m, 1h, 7d.
    #[arg(long, default_value = "1h", value_parser = parse_duration_secs)]
    ttl: u64,
    /// Private key file (`.private.pem`, `.pem`, `.hs256`) or a directory of keys.
    #[arg(long)]
    key: PathBuf,
    /// Which key to sign with when `--key` holds several.
    #[arg(long)]
    kid: Option<String>,
    /// Agent id (`a`).
    #[arg(long)]
    agent: Option<u64>,
    #[command(flatten)]
    ids: RoutingArgs,
    /// Subject (`sub`).
    #[arg(long)]
    subject: Option<String>,
    /// Audience (`aud`).
    #[arg(long)]
    audience: Option<String>,
    /// Issuer (`iss`).
    #[arg(long)]
    issuer: Option<String>,
    /// Prefix before the JWT, e.g. `glcbt-`; `auto` picks the kind's GitLab prefix.
    #[arg(long)]
    prefix: Option<String>,
}

/// `podgate token mint-gitlab`.
#[derive(Debug, Args)]
pub(crate) struct MintGitlabArgs {
    /// Token prefix, e.g. `glrt-`, `glpat-`, `acme-glcbt-`.
    #[arg(long, default_value = "glrt-")]
    prefix: String,
    /// Cell (Pod) id (`c`); leave out for a token that routes nowhere in particular.
    #[arg(long)]
    cell: Option<u64>,
    #[command(flatten)]
    ids: RoutingArgs,
    /// The 16 random bytes as 32 hex digits (for reproducible test tokens only).
    #[arg(long, value_parser = parse_random_hex)]
    random_hex: Option<[u8; gitlab::RANDOM_BYTES]>,
}

fn parse_alg(s: &str) -> Result<Algorithm, String> {
    Algorithm::from_cli(s).ok_or_else(|| format!("{s:?}: expected ed25519, es256, rs256 or hs256"))
}

fn parse_random_hex(s: &str) -> Result<[u8; gitlab::RANDOM_BYTES], String> {
    let mut out = [0u8; gitlab::RANDOM_BYTES];
    hex::decode_to_slice(s, &mut out)
        .map_err(|_| format!("expected {} hex digits", gitlab::RANDOM_BYTES * 2))?;
    Ok(out)
}

/// Run a `podgate token` subcommand.
pub(crate) fn run(cmd: TokenCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TokenCommand::Keygen {
            alg,
            kid,
            out,
            force,
        } => keygen(alg, kid, &out, force),
        TokenCommand::Mint(a) => {
            println!("{}", mint(&a)?);
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::MintGitlab(a) => {
            let keys = RoutingKeys {
                cell: a.cell,
                organization: a.ids.org,
                group: a.ids.group,
                project: a.ids.project,
                user: a.ids.user,
                runner_type: a.ids.runner_type,
                other: Default::default(),
            };
            let random = a.random_hex.unwrap_or_else(gitlab::random_bytes);
            println!("{}", gitlab::encode(&a.prefix, &keys, &random)?);
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::Inspect {
            token,
            keys,
            audience,
            issuer,
            leeway,
        } => {
            let token = if token == "-" {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                s.trim().to_owned()
            } else {
                token
            };
            let set = if keys.is_empty() {
                KeySet::new()
            } else {
                KeySet::load_all(&keys)?
            };
            let config = ClassifierConfig {
                audience,
                issuer,
                leeway_secs: leeway,
                cache_capacity: 0,
                ..ClassifierConfig::default()
            };
            let report = Classifier::new(config, set)?.inspect(&token);
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(if report.status == "invalid" {
                ExitCode::from(EXIT_INVALID)
            } else {
                ExitCode::SUCCESS
            })
        }
        TokenCommand::Demo => demo(),
    }
}

fn keygen(
    alg: Algorithm,
    kid: Option<String>,
    out: &Path,
    force: bool,
) -> anyhow::Result<ExitCode> {
    let kid = kid.unwrap_or_else(|| {
        let days = unix_now() / 86_400;
        format!("{}-{days}", alg.as_str().to_ascii_lowercase())
    });
    if kid.is_empty()
        || !kid
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
    {
        return Err(super::usage(format!(
            "--kid {kid:?}: use letters, digits, '-', '_' and '.' only"
        )));
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let key = keys::generate(alg).map_err(anyhow::Error::msg)?;
    let (private_path, public_path) = match alg {
        Algorithm::HS256 => (out.join(format!("{kid}.hs256")), None),
        _ => (
            out.join(format!("{kid}.private.pem")),
            Some(out.join(format!("{kid}.pem"))),
        ),
    };
    for p in std::iter::once(&private_path).chain(public_path.as_ref()) {
        if p.exists() && !force {
            return Err(super::usage(format!(
                "{} exists; pass --force to overwrite",
                p.display()
            )));
        }
    }
    write_private(&private_path, key.private.as_bytes())?;
    if let (Some(p), Some(pem)) = (&public_path, &key.public) {
        std::fs::write(p, pem).with_context(|| format!("writing {}", p.display()))?;
    }
    let report = serde_json::json!({
        "kid": kid,
        "alg": alg.as_str(),
        "private": private_path,
        "public": public_path,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(ExitCode::SUCCESS)
}

/// Write a secret file readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}

fn mint(a: &MintArgs) -> anyhow::Result<String> {
    let mut set = KeySet::load(&a.key)?;
    if let Some(kid) = &a.kid {
        set.set_signing(kid)?;
    }
    let key = set.signing_key()?;
    let mut req = MintRequest::new(a.kind, a.pod, a.ttl);
    req.subject = a.subject.clone();
    req.organization = a.ids.org;
    req.group = a.ids.group;
    req.project = a.ids.project;
    req.user = a.ids.user;
    req.agent = a.agent;
    req.runner_type = a.ids.runner_type.and_then(RunnerType::from_code);
    req.audience = a.audience.clone();
    req.issuer = a.issuer.clone();
    req.prefix = match a.prefix.as_deref() {
        Some("auto") => {
            Some(a.kind.gitlab_prefix().to_owned()).filter(|_| a.kind != TokenKind::Other)
        }
        other => other.map(str::to_owned),
    };
    Ok(podgate_tokens::mint(&req, key, unix_now())?)
}

fn demo() -> anyhow::Result<ExitCode> {
    let dir = tempfile_dir()?;
    println!("podgate token demo: keys in {}\n", dir.display());
    let mut set = KeySet::new();
    for (kid, alg) in [
        ("ed-1", Algorithm::EdDSA),
        ("es-1", Algorithm::ES256),
        ("rs-1", Algorithm::RS256),
    ] {
        let key = keys::generate(alg).map_err(anyhow::Error::msg)?;
        std::fs::write(
            dir.join(format!("{kid}.pem")),
            key.public.as_deref().unwrap_or(""),
        )?;
        set.merge(keys::keyset_from_generated(kid, &key)?)?;
    }
    let classifier = Classifier::with_keys(KeySet::load(&dir)?);
    let now = unix_now();
    let mut samples: Vec<(String, String)> = Vec::new();
    for (kid, kind, pod, prefix) in [
        ("ed-1", TokenKind::Runner, 1, None),
        ("es-1", TokenKind::Job, 2, Some("glcbt-")),
        ("rs-1", TokenKind::Agent, 3, None),
    ] {
        let mut s = set.clone();
        s.set_signing(kid)?;
        let mut req = MintRequest::new(kind, PodId::new(pod).expect("positive"), 3600);
        req.prefix = prefix.map(str::to_owned);
        samples.push((
            format!("JWT {kid} {kind}"),
            podgate_tokens::mint(&req, s.signing_key()?, now)?,
        ));
    }
    let v1 = "glrt-AAAAAAAAAAAAAAAAAAAAAGM6MgpnOjlpeApvOjEKdToxNhI.01.1b0zz5pn1";
    samples.push(("GitLab v1 (reference vector)".into(), v1.into()));
    samples.push((
        "GitLab v1, one char changed".into(),
        v1.replace("GM6Mg", "GM6Mw"),
    ));
    samples.push((
        "legacy runner token".into(),
        "glrt-t1_RandomLegacyValue42".into(),
    ));
    let (head, _) = samples[0].1.rsplit_once('.').expect("a JWT has dots");
    samples.push(("JWT, forged signature".into(), format!("{head}.AAAA")));

    println!(
        "{:<32} {:<10} {:<11} {:>4}  {:<16} reason",
        "token", "format", "status", "pod", "fingerprint"
    );
    for (label, token) in &samples {
        let r = classifier.inspect(token);
        println!(
            "{:<32} {:<10} {:<11} {:>4}  {:<16} {}",
            label,
            r.format.as_str(),
            r.status,
            r.pod.map_or("-".into(), |p| p.to_string()),
            r.fingerprint,
            r.reason.unwrap_or_default()
        );
    }
    let routed = samples
        .iter()
        .filter(|(_, t)| matches!(classifier.classify(t), Classification::Routable(_)))
        .count();
    println!(
        "\n{routed} of {} tokens routable. Try: podgate token inspect --keys {} <token>",
        samples.len(),
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("podgate-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::parse_random_hex;

    #[test]
    fn random_hex_takes_32_hex_digits_and_refuses_anything_else() {
        let ok = parse_random_hex("000102030405060708090a0b0c0d0eff").unwrap();
        assert_eq!(ok[1], 1);
        assert_eq!(ok[15], 0xff);
        // 32 bytes, but a two-byte character across a digit pair: an error, not a
        // panic.
        let odd = format!("0\u{e9}{}", "0".repeat(29));
        assert_eq!(odd.len(), 32);
        for bad in [odd.as_str(), "0g0102030405060708090a0b0c0d0eff", "00"] {
            assert_eq!(
                parse_random_hex(bad).unwrap_err(),
                "expected 32 hex digits",
                "{bad:?}"
            );
        }
    }
}
