//! Unit tests of `MakeRequest`'s URL escaping and upgrade detection.

use std::collections::HashMap;

use super::outbound::is_upgrade;
use super::url::{Mode, encode_query, escape, path_escape};
use podgate_agent::httpz::parse_query;
use podgate_agent::proto::gitlab::agent::prototool::Values;

fn values(v: &[&str]) -> Values {
    Values {
        value: v.iter().map(|s| (*s).to_owned()).collect(),
    }
}

#[test]
fn escaping_is_go_net_url() {
    // url.PathEscape
    assert_eq!(path_escape("remote_development"), "remote_development");
    assert_eq!(
        path_escape("a b/c;d,e?f$g&h+i:j=k@l"),
        "a%20b%2Fc%3Bd%2Ce%3Ff$g&h+i:j=k@l"
    );
    // url.URL.String() re-escapes the % of an escaped segment.
    assert_eq!(escape("/m/a%2Fb/x y?", Mode::Path), "/m/a%252Fb/x%20y%3F");
    // url.Values.Encode
    let mut q = HashMap::new();
    q.insert("b".to_owned(), values(&["x y", "1&2"]));
    q.insert("a".to_owned(), values(&["é"]));
    assert_eq!(encode_query(&q), "a=%C3%A9&b=x+y&b=1%262");
    let parsed = parse_query("b=x+y&b=1%262&a=%C3%A9&bad=%zz");
    assert_eq!(parsed["b"].value, ["x y", "1&2"]);
    assert_eq!(parsed["a"].value, ["é"]);
    assert!(!parsed.contains_key("bad"));
}

#[test]
fn upgrades_are_recognised() {
    let mut h = HashMap::new();
    h.insert("Connection".to_owned(), values(&["keep-alive, Upgrade"]));
    assert!(is_upgrade(&h));
    let mut h = HashMap::new();
    h.insert("upgrade".to_owned(), values(&["websocket"]));
    assert!(is_upgrade(&h));
    let mut h = HashMap::new();
    h.insert("Connection".to_owned(), values(&["keep-alive"]));
    assert!(!is_upgrade(&h));
}
