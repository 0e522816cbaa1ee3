//! The OpenAI error body, `{"error": {"message", "type", "param", "code"}}` (`serving-anchors.md`
//! §1.3): all four keys are always present; `param` and `code` may be null.

use serde::{Deserialize, Serialize};

/// The whole error response body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong, in OpenAI's shape. The SDK unwraps `error` and keeps `type`, `param` and `code`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, or null.
    pub param: Option<String>,
    /// A stable machine-readable code, or null.
    pub code: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nulls_are_written_not_skipped() {
        let body = ErrorBody {
            error: ErrorDetail { message: "m".into(), kind: "invalid_request_error".into(), param: None, code: None },
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"error":{"message":"m","type":"invalid_request_error","param":null,"code":null}}"#
        );
    }
}
