//! Server-side filtering by tag: a subscription's expression (`*`, `TagA`, `TagA || TagB`)
//! becomes the core's [`TagFilter`], which decides which messages of a queue a receive hands
//! out (matching a record's tag is the core's). SQL92 expressions are refused as not supported.

use weir_messaging::pop::TagFilter;

use crate::proto::{self, Code, FilterType};
use crate::status::status;

/// The filter `expression` asks for (every message when there is none), or the status
/// refusing it.
pub(crate) fn parse(expression: Option<&proto::FilterExpression>) -> Result<TagFilter, proto::Status> {
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
    let filter = TagFilter::Tags(tags);
    filter.check();
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expr(text: &str) -> proto::FilterExpression {
        proto::FilterExpression { r#type: FilterType::Tag as i32, expression: text.into() }
    }

    #[test]
    fn tag_expressions_name_their_tags() {
        assert_eq!(parse(Some(&expr("TagA || TagB"))), Ok(TagFilter::Tags(vec!["TagA".into(), "TagB".into()])));
        assert_eq!(parse(Some(&expr(" TagA "))), Ok(TagFilter::Tags(vec!["TagA".into()])));
        assert_eq!(parse(Some(&expr("*"))), Ok(TagFilter::All));
        assert_eq!(parse(Some(&expr(""))), Ok(TagFilter::All));
        assert_eq!(parse(None), Ok(TagFilter::All));
    }

    #[test]
    fn sql_and_malformed_expressions_are_refused() {
        let sql = proto::FilterExpression { r#type: FilterType::Sql as i32, expression: "a > 1".into() };
        assert_eq!(parse(Some(&sql)).map_err(|s| s.code), Err(Code::Unsupported as i32));
        for bad in ["TagA ||", "|| TagA", "TagA || *"] {
            assert_eq!(parse(Some(&expr(bad))).map_err(|s| s.code), Err(Code::IllegalFilterExpression as i32), "{bad}");
        }
        let unknown = proto::FilterExpression { r#type: 99, expression: "TagA".into() };
        assert_eq!(parse(Some(&unknown)).map_err(|s| s.code), Err(Code::IllegalFilterExpression as i32));
    }
}
