//! Server-side filtering by tag: a subscription's expression (`*`, `TagA`, `TagA || TagB`)
//! decides which messages of a queue a receive hands out; the others are skipped (done for the
//! group) without being sent. SQL92 expressions are refused as not supported.

use weir_broker::message::headers;
use weir_broker::storage::records::Record;

use crate::proto::{self, Code, FilterType};
use crate::status::status;

/// Which tags a receive takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagFilter {
    /// `*` (or no expression): every message, tagged or not.
    All,
    /// Messages with one of these tags; untagged ones never match.
    Tags(Vec<String>),
}

impl TagFilter {
    pub fn parse(expression: Option<&proto::FilterExpression>) -> Result<TagFilter, proto::Status> {
        let Some(expression) = expression else { return Ok(TagFilter::All) };
        match FilterType::try_from(expression.r#type) {
            Ok(FilterType::Sql) => {
                return Err(status(Code::Unsupported, "SQL92 filter expressions are not supported; filter by tag"))
            }
            Ok(FilterType::Tag | FilterType::Unspecified) => {}
            Err(_) => return Err(status(Code::IllegalFilterExpression, "unknown filter type")),
        }
        let text = expression.expression.trim();
        if text.is_empty() || text == "*" {
            return Ok(TagFilter::All);
        }
        let tags: Vec<String> = text.split("||").map(|t| t.trim().to_string()).collect();
        if tags.iter().any(|t| t.is_empty() || t == "*") {
            return Err(status(
                Code::IllegalFilterExpression,
                format!("{text:?} is not a tag expression (TagA || TagB, or *)"),
            ));
        }
        Ok(TagFilter::Tags(tags))
    }

    /// Whether `record`'s tag passes. Reads the tag header only.
    pub fn matches(&self, record: &Record) -> bool {
        match self {
            TagFilter::All => true,
            TagFilter::Tags(tags) => record
                .header(headers::TAG)
                .and_then(|h| h.value.as_deref())
                .is_some_and(|tag| tags.iter().any(|t| t.as_bytes() == tag)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use weir_broker::storage::records::Header;

    fn expr(text: &str) -> proto::FilterExpression {
        proto::FilterExpression { r#type: FilterType::Tag as i32, expression: text.into() }
    }

    fn tagged(tag: Option<&str>) -> Record {
        let mut record = Record::new(0, None, Some(Bytes::from_static(b"v")));
        if let Some(tag) = tag {
            record.headers.push(Header::new(headers::TAG, Some(Bytes::from(tag.to_string()))));
        }
        record
    }

    #[test]
    fn tag_expressions_pick_their_tags() {
        let filter = TagFilter::parse(Some(&expr("TagA || TagB"))).expect("valid");
        assert!(filter.matches(&tagged(Some("TagA"))));
        assert!(filter.matches(&tagged(Some("TagB"))));
        assert!(!filter.matches(&tagged(Some("TagC"))));
        assert!(!filter.matches(&tagged(None)));
        let all = TagFilter::parse(Some(&expr("*"))).expect("valid");
        assert!(all.matches(&tagged(None)) && all.matches(&tagged(Some("x"))));
        assert_eq!(TagFilter::parse(None), Ok(TagFilter::All));
    }

    #[test]
    fn sql_and_malformed_expressions_are_refused() {
        let sql = proto::FilterExpression { r#type: FilterType::Sql as i32, expression: "a > 1".into() };
        assert_eq!(TagFilter::parse(Some(&sql)).map_err(|s| s.code), Err(Code::Unsupported as i32));
        assert_eq!(
            TagFilter::parse(Some(&expr("TagA ||"))).map_err(|s| s.code),
            Err(Code::IllegalFilterExpression as i32)
        );
    }
}
