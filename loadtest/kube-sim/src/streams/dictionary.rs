//! The zlib dictionary SPDY/3 header blocks are compressed with: the SPDY/3
//! draft's (section 2.6.10.1,
//! <https://www.chromium.org/spdy/spdy-protocol/spdy-protocol-draft3-1/>), the
//! bytes moby/spdystream's `headerDictionary` holds and kubectl's SPDY framer
//! uses (1,423 bytes, no trailing NUL).

/// The SPDY/3 header dictionary.
pub(super) const DICTIONARY: &[u8] = b"\
    \x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put\x00\x00\x00\x06delete\x00\x00\x00\x05\
    trace\x00\x00\x00\x06accept\x00\x00\x00\x0eaccept-charset\x00\x00\x00\x0faccept-enco\
    ding\x00\x00\x00\x0faccept-language\x00\x00\x00\x0daccept-ranges\x00\x00\x00\x03age\x00\
    \x00\x00\x05allow\x00\x00\x00\x0dauthorization\x00\x00\x00\x0dcache-control\x00\x00\x00\x0aco\
    nnection\x00\x00\x00\x0ccontent-base\x00\x00\x00\x10content-encoding\x00\x00\x00\x10\
    content-language\x00\x00\x00\x0econtent-length\x00\x00\x00\x10content-lo\
    cation\x00\x00\x00\x0bcontent-md5\x00\x00\x00\x0dcontent-range\x00\x00\x00\x0cconten\
    t-type\x00\x00\x00\x04date\x00\x00\x00\x04etag\x00\x00\x00\x06expect\x00\x00\x00\x07expires\x00\x00\x00\x04f\
    rom\x00\x00\x00\x04host\x00\x00\x00\x08if-match\x00\x00\x00\x11if-modified-since\x00\x00\x00\x0d\
    if-none-match\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unmodified-since\
    \x00\x00\x00\x0dlast-modified\x00\x00\x00\x08location\x00\x00\x00\x0cmax-forwards\x00\x00\x00\
    \x06pragma\x00\x00\x00\x12proxy-authenticate\x00\x00\x00\x13proxy-authoriza\
    tion\x00\x00\x00\x05range\x00\x00\x00\x07referer\x00\x00\x00\x0bretry-after\x00\x00\x00\x06serve\
    r\x00\x00\x00\x02te\x00\x00\x00\x07trailer\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgra\
    de\x00\x00\x00\x0auser-agent\x00\x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warning\x00\x00\x00\x10ww\
    w-authenticate\x00\x00\x00\x06method\x00\x00\x00\x03get\x00\x00\x00\x06status\x00\x00\x00\x06200\
    \x20OK\x00\x00\x00\x07version\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06public\x00\x00\x00\x0as\
    et-cookie\x00\x00\x00\x0akeep-alive\x00\x00\x00\x06origin100101201202205\
    206300302303304305306307402405406407408409410411\
    412413414415416417502504505203 Non-Authoritative\
    \x20Information204 No Content301 Moved Permanently4\
    00 Bad Request401 Unauthorized403 Forbidden404 N\
    ot Found500 Internal Server Error501 Not Impleme\
    nted503 Service UnavailableJan Feb Mar Apr May J\
    un Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, W\
    ed, Thu, Fri, Sat, Sun, GMTchunked,text/html,ima\
    ge/png,image/jpg,image/gif,application/xml,appli\
    cation/xhtml+xml,text/plain,text/javascript,publ\
    icprivatemax-age=gzip,deflate,sdchcharset=utf-8c\
    harset=iso-8859-1,utf-,*,enq=0.\
";
