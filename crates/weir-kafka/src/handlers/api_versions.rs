//! ApiVersions: what this broker implements (see [`crate::versions`]).

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::ResponseError;

use crate::context::{Client, Ctx};
use crate::versions;

fn api_keys() -> Vec<ApiVersion> {
    versions::all()
        .into_iter()
        .map(|(key, range)| {
            ApiVersion::default().with_api_key(key as i16).with_min_version(range.min).with_max_version(range.max)
        })
        .collect()
}

pub(crate) async fn handle(_ctx: &Ctx, _client: &Client, _request: ApiVersionsRequest) -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(api_keys())
}

/// The v0 answer to an ApiVersions request of a version this broker does not know.
pub(crate) fn unsupported_version_response() -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_error_code(ResponseError::UnsupportedVersion.code()).with_api_keys(api_keys())
}
