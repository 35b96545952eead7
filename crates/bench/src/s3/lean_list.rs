//! The pages of the lean client's listings (`--list-client lean`, see `lean`): a ListObjectsV2 or
//! ListObjectVersions answer is scanned for what the walk needs (entries counted, common prefixes, the
//! next page's markers) instead of deserialized into SDK types.

use super::client::ListPage;
use quick_xml::events::Event;

/// Elements nested deeper than this in a listing are refused (a listing nests three deep).
const DEPTH_MAX: usize = 16;

/// A text the walk needs.
#[derive(Clone, Copy, PartialEq)]
enum Field {
    IsTruncated,
    NextKeyMarker,
    NextVersionIdMarker,
    NextContinuationToken,
    CommonPrefix,
}

/// The field an element at `depth` (the root is 1) holds, given its parent's name.
fn field_of(depth: usize, parent: &[u8], name: &[u8]) -> Option<Field> {
    match (depth, parent, name) {
        (2, _, b"IsTruncated") => Some(Field::IsTruncated),
        (2, _, b"NextKeyMarker") => Some(Field::NextKeyMarker),
        (2, _, b"NextVersionIdMarker") => Some(Field::NextVersionIdMarker),
        (2, _, b"NextContinuationToken") => Some(Field::NextContinuationToken),
        (3, b"CommonPrefixes", b"Prefix") => Some(Field::CommonPrefix),
        _ => None,
    }
}

fn is_entry(depth: usize, name: &[u8]) -> bool {
    depth == 2 && matches!(name, b"Contents" | b"Version" | b"DeleteMarker")
}

/// The entries, common prefixes and next page of a ListObjectsV2 or ListObjectVersions answer.
///
/// A page without CDATA, comments or a doctype (what S3 servers write) is scanned tag by tag
/// (`scan_page`); any other page, or one the scan refuses, is read by quick-xml's parser, which is the
/// reference: both give the same answer on every page the scan accepts (tested).
pub fn parse_page(xml: &[u8], versions: bool) -> Result<ListPage, String> {
    if memchr::memmem::find(xml, b"<!").is_none()
        && let Ok(page) = scan_page(xml, versions)
    {
        return Ok(page);
    }
    parse_page_events(xml, versions)
}

/// What a walk learns from the elements of a page outside its entries.
#[derive(Default)]
struct PageFields {
    truncated: bool,
    next_key: Option<String>,
    next_version: Option<String>,
    next_token: Option<String>,
    prefixes: Vec<String>,
}

impl PageFields {
    fn set(&mut self, field: Field, value: String) {
        match field {
            Field::IsTruncated => self.truncated = value == "true",
            Field::NextKeyMarker => self.next_key = Some(value),
            Field::NextVersionIdMarker => self.next_version = Some(value),
            Field::NextContinuationToken => self.next_token = Some(value),
            Field::CommonPrefix => self.prefixes.push(value),
        }
    }

    fn into_page(self, keys: u64, versions: bool) -> Result<ListPage, String> {
        let next = match (self.truncated, versions) {
            (false, _) => None,
            (true, true) => {
                let key = self.next_key.ok_or("a truncated page without NextKeyMarker")?;
                Some(format!("{key}\0{}", self.next_version.unwrap_or_default()))
            }
            (true, false) => Some(self.next_token.ok_or("a truncated page without NextContinuationToken")?),
        };
        Ok(ListPage { keys, prefixes: self.prefixes, next })
    }
}

/// An element's name without its namespace prefix.
fn local_name(qualified: &[u8]) -> &[u8] {
    qualified.iter().rposition(|&b| b == b':').map_or(qualified, |i| &qualified[i + 1..])
}

/// The fast path of `parse_page`, for a page without `<!` (checked by the caller): every `<` in a text is
/// escaped, so each `<` begins a tag, and an entry holds no element of its own name, so the scan jumps from
/// an entry's start tag to its end tag instead of reading the 20 or so tags inside. A page is 400 KB for
/// 1,000 versions; quick-xml's events take about 1.4 ms on it here, the scan a small fraction of that.
fn scan_page(xml: &[u8], versions: bool) -> Result<ListPage, String> {
    let entry_ends = [
        (&b"Version"[..], memchr::memmem::Finder::new(b"</Version>")),
        (&b"DeleteMarker"[..], memchr::memmem::Finder::new(b"</DeleteMarker>")),
        (&b"Contents"[..], memchr::memmem::Finder::new(b"</Contents>")),
    ];
    let mut open: Vec<&[u8]> = Vec::with_capacity(DEPTH_MAX);
    let mut fields = PageFields::default();
    // The field being read and where its text begins.
    let mut field: Option<(Field, usize)> = None;
    let mut keys = 0u64;
    let mut pos = 0;
    while let Some(lt) = memchr::memchr(b'<', &xml[pos..]).map(|i| pos + i) {
        let gt = memchr::memchr(b'>', &xml[lt..]).map(|i| lt + i).ok_or("a tag that does not end")?;
        let tag = &xml[lt + 1..gt];
        pos = gt + 1;
        match tag.first() {
            Some(b'?') if tag.len() > 1 && tag.ends_with(b"?") => {}
            Some(b'?') => return Err("a processing instruction that does not end".into()),
            Some(b'/') => {
                let name = tag[1..].trim_ascii_end();
                if open.pop() != Some(name) {
                    return Err("an end tag that does not match its start".into());
                }
                if let Some((f, start)) = field.take() {
                    // A field holds only text; anything else is left to the parser.
                    if memchr::memchr(b'<', &xml[start..lt]).is_some() {
                        return Err("an element inside a field".into());
                    }
                    let raw = std::str::from_utf8(&xml[start..lt]).map_err(|e| e.to_string())?;
                    fields.set(f, quick_xml::escape::unescape(raw).map_err(|e| e.to_string())?.into_owned());
                }
            }
            Some(_) => {
                let empty = tag.ends_with(b"/");
                let inner = if empty { &tag[..tag.len() - 1] } else { tag };
                let qualified = inner.split(u8::is_ascii_whitespace).next().unwrap_or_default();
                if !are_attributes(&inner[qualified.len()..]) {
                    return Err("a tag the scan does not read".into());
                }
                let name = local_name(qualified);
                let depth = open.len() + 1;
                if depth > DEPTH_MAX {
                    return Err(format!("elements nested more than {DEPTH_MAX} deep"));
                }
                if is_entry(depth, name) {
                    keys += 1;
                    let end = entry_ends.iter().find(|(n, _)| *n == qualified).map(|(_, f)| f);
                    if !empty && let Some(end) = end {
                        field = None;
                        let at = end.find(&xml[pos..]).ok_or("an entry that does not end")?;
                        pos += at + end.needle().len();
                        continue;
                    }
                }
                if !empty {
                    let parent = open.last().map_or(&[][..], |p| local_name(p));
                    field = field_of(depth, parent, name).map(|f| (f, pos));
                    open.push(qualified);
                }
            }
            None => return Err("an empty tag".into()),
        }
    }
    if !open.is_empty() {
        return Err("the document ends inside an element".into());
    }
    fields.into_page(keys, versions)
}

/// Whether the rest of a start tag after its name is only `name="value"` attributes (a root's xmlns).
fn are_attributes(mut rest: &[u8]) -> bool {
    loop {
        rest = rest.trim_ascii_start();
        if rest.is_empty() {
            return true;
        }
        let Some(eq) = memchr::memchr(b'=', rest) else { return false };
        let name = &rest[..eq];
        if name.is_empty() || name.iter().any(|b| b.is_ascii_whitespace() || matches!(b, b'"' | b'\'' | b'<')) {
            return false;
        }
        let quote = match rest.get(eq + 1) {
            Some(&q @ (b'"' | b'\'')) => q,
            _ => return false,
        };
        let value = &rest[eq + 2..];
        let Some(end) = memchr::memchr(quote, value) else { return false };
        if memchr::memchr2(b'<', b'&', &value[..end]).is_some() {
            return false;
        }
        rest = &value[end + 1..];
        if rest.first().is_some_and(|b| !b.is_ascii_whitespace()) {
            return false;
        }
    }
}

/// `parse_page` by quick-xml's events: any well-formed page.
fn parse_page_events(xml: &[u8], versions: bool) -> Result<ListPage, String> {
    let mut reader = quick_xml::Reader::from_reader(xml);
    // The names of the open elements, and the field being read with its text so far.
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut field: Option<Field> = None;
    let mut text = String::new();
    let mut keys = 0u64;
    let mut fields = PageFields::default();
    loop {
        match reader.read_event().map_err(|e| e.to_string())? {
            Event::Start(e) => {
                if path.len() == DEPTH_MAX {
                    return Err(format!("elements nested more than {DEPTH_MAX} deep"));
                }
                let name = e.local_name();
                let depth = path.len() + 1;
                keys += u64::from(is_entry(depth, name.as_ref()));
                field = field_of(depth, path.last().map_or(&[][..], Vec::as_slice), name.as_ref());
                text.clear();
                path.push(name.as_ref().to_vec());
            }
            Event::Empty(e) => keys += u64::from(is_entry(path.len() + 1, e.local_name().as_ref())),
            Event::Text(t) if field.is_some() => text.push_str(&t.decode().map_err(|e| e.to_string())?),
            Event::GeneralRef(g) if field.is_some() => {
                // An entity inside a text (`&amp;`): quick-xml reports it apart from the text around it.
                let raw = format!("&{};", String::from_utf8_lossy(&g));
                text.push_str(&quick_xml::escape::unescape(&raw).map_err(|e| e.to_string())?);
            }
            Event::End(_) => {
                path.pop();
                if let Some(f) = field.take() {
                    fields.set(f, std::mem::take(&mut text));
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !path.is_empty() {
        return Err("the document ends inside an element".into());
    }
    fields.into_page(keys, versions)
}

/// The `Code` of an S3 error answer.
pub(super) fn error_code(xml: &[u8]) -> Option<String> {
    let mut reader = quick_xml::Reader::from_reader(xml);
    let mut in_code = false;
    loop {
        match reader.read_event().ok()? {
            Event::Start(e) => in_code = e.local_name().as_ref() == b"Code",
            Event::Text(t) if in_code => return t.decode().ok().map(|s| s.into_owned()),
            Event::End(_) => in_code = false,
            Event::Eof => return None,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ListPage, parse_page, parse_page_events, scan_page};
    use proptest::prelude::*;

    #[test]
    fn a_versions_page_counts_versions_and_markers_and_names_the_next_page() {
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?><ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><IsTruncated>true</IsTruncated><KeyMarker></KeyMarker><NextKeyMarker>a&amp;b</NextKeyMarker><NextVersionIdMarker>v1</NextVersionIdMarker><Prefix></Prefix><Version><Key>a</Key><Owner><ID>x</ID></Owner></Version><Version><Key>a&amp;b</Key></Version><DeleteMarker><Key>c</Key></DeleteMarker><CommonPrefixes><Prefix>d/</Prefix></CommonPrefixes></ListVersionsResult>"#;
        let page = parse_page(xml, true).unwrap();
        assert_eq!(page.keys, 3);
        assert_eq!(page.prefixes, ["d/"]);
        assert_eq!(page.next.as_deref(), Some("a&b\0v1"));
    }

    #[test]
    fn a_last_v2_page_has_no_next_and_a_truncated_one_needs_its_token() {
        let last = br#"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key></Contents><Contents><Key>l</Key></Contents></ListBucketResult>"#;
        let page = parse_page(last, false).unwrap();
        assert_eq!((page.keys, page.next), (2, None));
        let cut =
            br#"<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>k</Key></Contents></ListBucketResult>"#;
        assert!(parse_page(cut, false).is_err());
        let more = br#"<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>t</NextContinuationToken></ListBucketResult>"#;
        assert_eq!(parse_page(more, false).unwrap().next.as_deref(), Some("t"));
    }

    #[test]
    fn broken_or_too_deep_xml_is_an_error() {
        assert!(parse_page(b"<a><b></a>", true).is_err());
        let deep = "<a>".repeat(40) + &"</a>".repeat(40);
        assert!(parse_page(deep.as_bytes(), true).is_err());
    }

    /// One page as a server might write it: entries, prefixes, markers, and how the XML is laid out.
    #[derive(Debug, Clone)]
    struct Model {
        versions: bool,
        entries: Vec<(u8, String)>,
        prefixes: Vec<String>,
        next: Option<(String, String)>,
        namespace_prefix: bool,
        spaces: bool,
        declaration: bool,
    }

    fn escaped(text: &str) -> String {
        quick_xml::escape::escape(text).into_owned()
    }

    fn render(m: &Model) -> String {
        let ns = if m.namespace_prefix { "s3:" } else { "" };
        let gap = if m.spaces { "\n  " } else { "" };
        let el = |name: &str, text: &str| format!("{gap}<{ns}{name}>{}</{ns}{name}>", escaped(text));
        let root = if m.versions { "ListVersionsResult" } else { "ListBucketResult" };
        let mut xml = String::new();
        if m.declaration {
            xml.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
        }
        xml.push_str(&format!(
            "<{ns}{root} xmlns{}=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
            if m.namespace_prefix { ":s3" } else { "" }
        ));
        xml.push_str(&el("IsTruncated", if m.next.is_some() { "true" } else { "false" }));
        xml.push_str(&el("Name", "b<&>"));
        if let Some((key, version)) = &m.next {
            if m.versions {
                xml.push_str(&el("NextKeyMarker", key));
                xml.push_str(&el("NextVersionIdMarker", version));
            } else {
                xml.push_str(&el("NextContinuationToken", key));
            }
        }
        for (kind, key) in &m.entries {
            let name = match (m.versions, kind % 3) {
                (false, _) => "Contents",
                (true, 0) => "DeleteMarker",
                (true, _) => "Version",
            };
            if kind % 5 == 4 {
                xml.push_str(&format!("{gap}<{ns}{name}/>"));
                continue;
            }
            xml.push_str(&format!("{gap}<{ns}{name}>"));
            xml.push_str(&el("Key", key));
            xml.push_str(&format!("{gap}<{ns}Owner>{}{}</{ns}Owner>", el("ID", "x"), el("DisplayName", key)));
            xml.push_str(&el("Prefix", key));
            xml.push_str(&format!("{gap}</{ns}{name}>"));
        }
        for p in &m.prefixes {
            xml.push_str(&format!("{gap}<{ns}CommonPrefixes>{}</{ns}CommonPrefixes>", el("Prefix", p)));
        }
        xml.push_str(&format!("{gap}</{ns}{root}>"));
        xml
    }

    fn expected(m: &Model) -> ListPage {
        let next = m.next.as_ref().map(|(k, v)| if m.versions { format!("{k}\0{v}") } else { k.clone() });
        ListPage { keys: m.entries.len() as u64, prefixes: m.prefixes.clone(), next }
    }

    fn model() -> impl Strategy<Value = Model> {
        let text = "[a-z0-9/<>&'\" .=-]{0,12}";
        (
            any::<bool>(),
            prop::collection::vec((any::<u8>(), text), 0..20),
            prop::collection::vec(text, 0..4),
            prop::option::of((text, "[0-9a-f]{0,8}")),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(versions, entries, prefixes, next, namespace_prefix, spaces, declaration)| Model {
                versions,
                entries,
                prefixes,
                next,
                namespace_prefix,
                spaces,
                declaration,
            })
    }

    proptest! {
        /// The scan and the parser both read every page a server may write exactly as it was written.
        #[test]
        fn the_scan_and_the_parser_read_a_page_as_written(m in model()) {
            let xml = render(&m);
            prop_assert_eq!(scan_page(xml.as_bytes(), m.versions), Ok(expected(&m)));
            prop_assert_eq!(parse_page_events(xml.as_bytes(), m.versions), Ok(expected(&m)));
        }

        /// On a damaged page neither panics, and when both read it they agree (the scan is more lenient
        /// than the parser: it does not look inside the entries it jumps over).
        #[test]
        fn on_a_damaged_page_the_scan_refuses_or_agrees_with_the_parser(
            m in model(),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in prop::sample::select(b"<>/!?&;x \"".to_vec()),
        ) {
            let mut xml = render(&m).into_bytes();
            let at = flip.index(xml.len());
            xml[at] = byte;
            xml.truncate(xml.len() - cut.index(xml.len() / 4 + 1));
            if let (Ok(scanned), Ok(parsed)) = (scan_page(&xml, m.versions), parse_page_events(&xml, m.versions)) {
                prop_assert_eq!(scanned, parsed);
            }
            let _ = parse_page(&xml, m.versions);
        }
    }
}
