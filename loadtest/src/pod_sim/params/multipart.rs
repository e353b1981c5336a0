//! `multipart/form-data` bodies as Rack 2.2 turns them into parameters
//! (`lib/rack/multipart/parser.rb` and `lib/rack/multipart.rb`, 2-2-stable).
//!
//! [`multer`] frames the parts and streams them; everything Rack decides is done
//! here from Rack's source: the field name is read from the part head with Rack's
//! `MULTIPART_CONTENT_DISPOSITION` expression (the header name and `name=` matched
//! case-insensitively, the value quoted or a token), falling back to `Content-ID`,
//! then to the file name, then to `<content type>[]`; a part with a file name becomes
//! a file (a hash of `filename`, `type`, `name`, `tempfile`, `head`), kept on disk and
//! hashed as it arrives, never held in memory; a part with an empty file name is
//! dropped; other parts are strings. Names nest through Rack's `normalize_params`, so
//! a repeated field keeps its last value.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use bytes::Bytes;
use futures_util::Stream;
use regex::bytes::Regex;
use serde_json::{Map, Value, json};
use sha2::Digest;
use tokio::io::AsyncWriteExt;

use super::{Error, rack};

/// Rack's `BUFFERED_UPLOAD_BYTESIZE_LIMIT`: part heads and non-file parts kept in
/// memory, in all.
const RETAINED_LIMIT: usize = 16 * 1024 * 1024;

/// `Rack::Multipart::MULTIPART`: the boundary of a `multipart/*` content type.
static MULTIPART: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?i-u)\Amultipart/.*?boundary(\s*)="?([^";,]+)"?"#).expect("valid regex")
});
/// `data.post_match =~ /boundary\s*=/i`.
static SECOND_BOUNDARY: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i-u)boundary\s*=").expect("valid regex"));
/// `MULTIPART_CONTENT_DISPOSITION = /Content-Disposition:[^:]*;\s*name=(#{VALUE})/ni`.
static DISPOSITION_NAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?i-u)Content-Disposition:[^:]*;\s*name=("(?:\\"|[^"])*"|[^\s()<>,;:\\"/\[\]?=]+)"#,
    )
    .expect("valid regex")
});
/// `MULTIPART_CONTENT_ID = /Content-ID:\s*([^#{EOL}]*)/ni`.
static CONTENT_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i-u)Content-ID:\s*([^\r\n]*)").expect("valid regex"));
/// `MULTIPART_CONTENT_TYPE = /Content-Type: (.*)#{EOL}/ni`.
static CONTENT_TYPE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i-u)Content-Type: (.*)\r\n").expect("valid regex"));
/// `BROKEN = /^#{CONDISP}.*;\s*filename=(#{VALUE})/i` (which, for the heads clients
/// send, finds the same file name as the RFC 2183 branch of `get_filename`).
static FILENAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?im-u)^Content-Disposition:\s*[^\s()<>,;:\\"/\[\]?=]+\s*.*;\s*filename=("(?:\\"|[^"])*"|[^\s()<>,;:\\"/\[\]?=]+)"#,
    )
    .expect("valid regex")
});
/// RFC 2231 `filename*=charset'lang'value`, used when there is no `filename=`.
static FILENAME_EXT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?im-u)^Content-Disposition:.*;\s*filename\*=([^;\s]*)"#).expect("valid regex")
});

/// The boundary of a multipart content type, as Rack finds it (`Ok(None)`: no
/// boundary, and Rack parses the body as a URL-encoded form instead). Whitespace
/// before `=` or a second `boundary=` is an error (`parse_boundary`, Rack 2.2).
pub(crate) fn boundary(content_type: &str) -> Result<Option<String>, Error> {
    let Some(c) = MULTIPART.captures(content_type.as_bytes()) else {
        return Ok(None);
    };
    if !c[1].is_empty() {
        return Err(Error::BadRequest(
            "whitespace between boundary parameter name and equal sign".into(),
        ));
    }
    let rest = &content_type.as_bytes()[c.get(0).map_or(0, |m| m.end())..];
    if SECOND_BOUNDARY.is_match(rest) {
        return Err(Error::BadRequest(
            "multiple boundary parameters found in multipart content type".into(),
        ));
    }
    Ok(Some(lossy(&c[2])))
}

/// A file part stored on disk.
#[derive(Debug)]
pub(crate) struct Upload {
    /// Where it is; deleted when dropped unless persisted.
    pub path: tempfile::TempPath,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, hex.
    pub sha256: String,
    /// The file name Rack reports (the basename of the part's `filename`).
    pub filename: String,
}

/// The files of one request. A file parameter names its file by a marker only this
/// request knows, so a form field cannot pose as an upload.
#[derive(Debug, Default)]
pub(crate) struct Uploads {
    nonce: u64,
    files: Vec<Option<Upload>>,
}

impl Uploads {
    fn marker(&self, i: usize) -> String {
        format!("#<podsim-upload {:016x}:{i}>", self.nonce)
    }

    /// Take the file a parameter value names (a file hash made by this parse).
    pub(crate) fn take(&mut self, value: Option<&Value>) -> Option<Upload> {
        let marker = value?.get("tempfile")?.as_str()?;
        let i = (0..self.files.len()).find(|&i| self.marker(i) == marker)?;
        self.files[i].take()
    }
}

/// Parse a multipart body into `params` (Rack's POST hash), storing file parts under
/// `dir`. `max_file` bounds each file part (413 above).
pub(crate) async fn parse<S>(
    body: S,
    boundary: &str,
    dir: &Path,
    max_file: u64,
) -> Result<(Map<String, Value>, Uploads), Error>
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    let mut params = Map::new();
    let mut uploads = Uploads {
        nonce: rand_nonce(),
        files: Vec::new(),
    };
    let mut retained = 0usize;
    let mut multipart = multer::Multipart::new(body, boundary);
    while let Some(mut field) = multipart.next_field().await.map_err(bad_body)? {
        let head = head_of(field.headers());
        retained += head.len();
        let content_type = CONTENT_TYPE.captures(head.as_bytes()).map(|c| lossy(&c[1]));
        let mut name = DISPOSITION_NAME
            .captures(head.as_bytes())
            .map(|c| dequote(&lossy(&c[1])))
            .or_else(|| CONTENT_ID.captures(head.as_bytes()).map(|c| lossy(&c[1])));
        let filename = filename(&head);
        if name.as_deref().is_none_or(str::is_empty) {
            name = Some(filename.clone().unwrap_or_else(|| {
                format!("{}[]", content_type.as_deref().unwrap_or("text/plain"))
            }));
        }
        let name = name.unwrap_or_default();
        let value = match &filename {
            // "filename is blank which means no file has been selected": dropped.
            Some(f) if f.is_empty() => {
                while field.chunk().await.map_err(bad_body)?.is_some() {}
                continue;
            }
            Some(f) => {
                let upload = store(&mut field, dir, max_file, basename(f)).await?;
                let i = uploads.files.len();
                let value = json!({
                    "filename": upload.filename,
                    "type": content_type,
                    "name": name,
                    "tempfile": uploads.marker(i),
                    "head": head,
                });
                uploads.files.push(Some(upload));
                value
            }
            None => {
                let mut data = Vec::new();
                while let Some(chunk) = field.chunk().await.map_err(bad_body)? {
                    retained += chunk.len();
                    if retained > RETAINED_LIMIT {
                        return Err(Error::BadRequest(
                            "multipart data over retained size limit".into(),
                        ));
                    }
                    data.extend_from_slice(&chunk);
                }
                Value::String(String::from_utf8_lossy(&data).into_owned())
            }
        };
        rack::normalize(&mut params, &name, value)?;
    }
    Ok((params, uploads))
}

/// Stream one file part to a temporary file, hashing it.
async fn store(
    field: &mut multer::Field<'static>,
    dir: &Path,
    max_file: u64,
    filename: String,
) -> Result<Upload, Error> {
    let (file, path) = tempfile::Builder::new()
        .prefix("upload-")
        .tempfile_in(dir)?
        .into_parts();
    let mut file = tokio::fs::File::from_std(file);
    let mut hasher = sha2::Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = field.chunk().await.map_err(bad_body)? {
        size += chunk.len() as u64;
        if size > max_file {
            return Err(Error::TooLarge);
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await?;
    }
    file.flush().await?;
    Ok(Upload {
        path,
        size,
        sha256: hex(&hasher.finalize()),
        filename,
    })
}

fn bad_body(e: multer::Error) -> Error {
    match e {
        multer::Error::FieldSizeExceeded { .. } | multer::Error::StreamSizeExceeded { .. } => {
            Error::TooLarge
        }
        // Rack raises EOFError ("bad content body"); Grape answers 400.
        e => Error::BadRequest(format!("bad multipart body: {e}")),
    }
}

/// The part head as text, one `Name: value` line each (what Rack's expressions scan).
fn head_of(headers: &http::HeaderMap) -> String {
    let mut head = String::new();
    for (k, v) in headers {
        head.push_str(k.as_str());
        head.push_str(": ");
        head.push_str(&String::from_utf8_lossy(v.as_bytes()));
        head.push_str("\r\n");
    }
    head
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `Rack::Auth::Digest::Params.dequote` (from WEBrick): strip the quotes, then drop
/// every backslash escape.
fn dequote(s: &str) -> String {
    let inner = s
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or(s);
    unescape_backslashes(inner)
}

fn unescape_backslashes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\'
            && let Some(next) = chars.next()
        {
            out.push(next);
        } else {
            out.push(c);
        }
    }
    out
}

/// `get_filename(head)` (Rack 2.2): the quoted or token value, `%XX` decoded when
/// every `%` is a valid escape, backslash escapes removed unless it looks like a
/// Windows path.
fn filename(head: &str) -> Option<String> {
    let mut name = if let Some(c) = FILENAME.captures(head.as_bytes()) {
        let v = lossy(&c[1]);
        match v.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
            Some(inner) => inner.to_owned(),
            None => v,
        }
    } else {
        let c = FILENAME_EXT.captures(head.as_bytes())?;
        let v = lossy(&c[1]);
        v.splitn(3, '\'').nth(2).unwrap_or_default().to_owned()
    };
    let percent_ok = name.match_indices('%').all(|(i, _)| {
        let b = name.as_bytes();
        b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
            && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
    });
    if percent_ok {
        name = percent_encoding::percent_decode_str(&name)
            .decode_utf8_lossy()
            .into_owned();
    }
    // `filename !~ /\\[^\\"]/`: no backslash before anything but `\` or `"`.
    let windows_path = name
        .as_bytes()
        .windows(2)
        .any(|w| w[0] == b'\\' && w[1] != b'\\' && w[1] != b'"');
    if !windows_path {
        name = unescape_backslashes(&name);
    }
    Some(name)
}

/// `filename.split(/[\/\\]/).last` (Internet Explorer sends whole paths).
fn basename(filename: &str) -> String {
    filename
        .split(['/', '\\'])
        .rfind(|s| !s.is_empty())
        .unwrap_or_default()
        .to_owned()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn rand_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}

/// A path inside `dir` for a stored artifact.
pub(crate) fn artifact_path(dir: &Path, job: u64) -> PathBuf {
    dir.join(format!("job-{job}.artifact"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of(head: &str) -> Option<String> {
        DISPOSITION_NAME
            .captures(head.as_bytes())
            .map(|c| dequote(&lossy(&c[1])))
    }

    #[test]
    fn field_names_as_rack_reads_them() {
        assert_eq!(
            name_of("content-disposition: form-data; name=\"token\"\r\n").as_deref(),
            Some("token")
        );
        // The header name and `name=` are matched case-insensitively (the `i` flag).
        assert_eq!(
            name_of("content-disposition: form-data; NAME=token\r\n").as_deref(),
            Some("token")
        );
        assert_eq!(
            name_of("content-disposition: form-data; name=\"file\"; filename=\"a.zip\"\r\n")
                .as_deref(),
            Some("file")
        );
        // An unquoted value stops at Rack's token characters: `[` is not one.
        assert_eq!(
            name_of("content-disposition: form-data; name=tag_list[]\r\n").as_deref(),
            Some("tag_list")
        );
        assert_eq!(
            name_of("content-disposition: form-data; name=\"a\\\"b\"\r\n").as_deref(),
            Some("a\"b")
        );
        assert_eq!(name_of("content-disposition: form-data\r\n"), None);
    }

    #[test]
    fn file_names_as_rack_reads_them() {
        let f = |h: &str| {
            filename(&format!(
                "content-disposition: form-data; name=\"file\"; {h}\r\n"
            ))
        };
        assert_eq!(
            f("filename=\"artifacts.zip\"").as_deref(),
            Some("artifacts.zip")
        );
        assert_eq!(f("filename=\"a%20b.zip\"").as_deref(), Some("a b.zip"));
        assert_eq!(f("filename=\"\"").as_deref(), Some(""));
        assert_eq!(f("filename*=UTF-8''r%C3%A9.zip").as_deref(), Some("ré.zip"));
        assert_eq!(
            filename("content-disposition: form-data; name=\"x\"\r\n"),
            None
        );
        assert_eq!(basename("C:\\Users\\me\\out.zip"), "out.zip");
        let b = |ct: &str| boundary(ct).map_err(|e| e.to_string());
        assert_eq!(
            b("multipart/form-data; boundary=\"abc\""),
            Ok(Some("abc".into()))
        );
        assert_eq!(
            b("Multipart/Form-Data;Boundary=x;charset=utf-8"),
            Ok(Some("x".into()))
        );
        assert_eq!(b("multipart/form-data"), Ok(None));
        assert!(b("multipart/form-data; boundary =x").is_err());
        assert!(b("multipart/form-data; boundary=x; boundary=y").is_err());
    }
}
