//! The object store: where it is (`object.store.url`), how to reach it, and the one handle the
//! tier uses for it.
//!
//! `file:///dir` (the default is `<data-dir>/objects`) keeps objects as files under `dir`;
//! `s3://bucket/prefix` is any S3-compatible service, reached at `object.store.endpoint` (AWS
//! itself when empty) with static credentials. Every key the tier writes is under the URL's
//! path, so several clusters (or tests) can share one bucket.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use crate::error::TierError;

/// How to reach the object store: the broker's `object.store.*` settings.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoreSettings {
    /// `object.store.url`: `file:///dir` or `s3://bucket/prefix`; empty is `<data-dir>/objects`.
    pub url: String,
    /// `object.store.endpoint`: an S3-compatible service's address (`http://127.0.0.1:9000`);
    /// empty is AWS.
    pub endpoint: String,
    /// `object.store.region`.
    pub region: String,
    /// `object.store.access.key.id` and `object.store.secret.access.key`; empty for both signs
    /// nothing (a public bucket).
    pub access_key_id: String,
    pub secret_access_key: String,
    /// `object.store.path.style`: address the bucket as `endpoint/bucket/key` (MinIO, most
    /// self-hosted services) instead of `bucket.endpoint/key`.
    pub path_style: bool,
}

impl std::fmt::Debug for StoreSettings {
    // The secret never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("url", &self.url)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &if self.secret_access_key.is_empty() { "" } else { "<set>" })
            .field("path_style", &self.path_style)
            .finish()
    }
}

/// Where a store's URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    Directory(std::path::PathBuf),
    S3 { bucket: String, prefix: String },
}

impl StoreSettings {
    /// Checks the settings without reaching the store: the URL's scheme and form, and that S3
    /// credentials come in pairs. The message names the setting at fault.
    pub fn validate(&self) -> Result<(), TierError> {
        self.location(Path::new("/")).map(|_| ())
    }

    fn location(&self, data_dir: &Path) -> Result<Location, TierError> {
        let url = self.url.trim();
        let bad = |reason: &str| TierError::Config {
            name: "object.store.url".into(),
            value: url.to_string(),
            reason: reason.to_string(),
        };
        let location = if url.is_empty() {
            Location::Directory(data_dir.join("objects"))
        } else if let Some(dir) = url.strip_prefix("file://") {
            if !dir.starts_with('/') {
                return Err(bad("a file:// URL needs an absolute path, as in file:///var/lib/weir/objects"));
            }
            Location::Directory(dir.into())
        } else if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("an s3:// URL names a bucket, as in s3://bucket/prefix"));
            }
            Location::S3 { bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string() }
        } else {
            return Err(bad("expected file:///path or s3://bucket/prefix"));
        };
        if matches!(location, Location::S3 { .. }) && self.access_key_id.is_empty() != self.secret_access_key.is_empty()
        {
            return Err(TierError::Config {
                name: "object.store.access.key.id".into(),
                value: self.access_key_id.clone(),
                reason: "object.store.access.key.id and object.store.secret.access.key are set together".into(),
            });
        }
        if !self.endpoint.is_empty() && !self.endpoint.starts_with("http://") && !self.endpoint.starts_with("https://")
        {
            return Err(TierError::Config {
                name: "object.store.endpoint".into(),
                value: self.endpoint.clone(),
                reason: "expected an http:// or https:// address".into(),
            });
        }
        Ok(location)
    }
}

/// The object store and the key prefix everything of this cluster lives under.
pub struct Store {
    pub(crate) objects: Arc<dyn ObjectStore>,
    pub(crate) root: ObjectPath,
    /// What logs and `weir topic describe` name the store by (no credentials).
    description: String,
    /// A service every broker reaches (S3), rather than a directory, which may be each
    /// broker's own.
    shared: bool,
    /// A directory store: its objects are files that reads use in place.
    directory: Option<Arc<LocalFileSystem>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description)
    }
}

impl Store {
    /// Whether every broker of a cluster sees the same store: an S3 service. A directory may
    /// be each broker's own (the default, `<log.dirs>/objects`, is), so a replica cannot count
    /// on finding there what its leader uploaded.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// The file holding object `key`, when the store is a directory.
    pub(crate) fn local_file(&self, key: &ObjectPath) -> Option<std::path::PathBuf> {
        self.directory.as_ref()?.path_to_filesystem(key).ok()
    }

    /// Opens the store the settings name (`data_dir` places the default directory, which is
    /// created). Nothing is read yet: a store that is down is found out at its first use, and
    /// the tier retries then, so a broker starts while its store is away.
    pub fn open(settings: &StoreSettings, data_dir: &Path) -> Result<Store, TierError> {
        match settings.location(data_dir)? {
            Location::Directory(dir) => {
                std::fs::create_dir_all(&dir).map_err(|e| TierError::Config {
                    name: "object.store.url".into(),
                    value: dir.display().to_string(),
                    reason: format!("cannot create the directory: {e}"),
                })?;
                let objects = LocalFileSystem::new_with_prefix(&dir).map_err(|e| TierError::Config {
                    name: "object.store.url".into(),
                    value: dir.display().to_string(),
                    reason: e.to_string(),
                })?;
                let objects = Arc::new(objects);
                Ok(Store {
                    objects: Arc::clone(&objects) as Arc<dyn ObjectStore>,
                    root: ObjectPath::default(),
                    description: format!("file://{}", dir.display()),
                    shared: false,
                    directory: Some(objects),
                })
            }
            Location::S3 { bucket, prefix } => {
                // A pass that fails is retried at the next pass anyway: a request gives up within
                // seconds rather than the crate's three minutes, so a store that is down shows in
                // the figures while it is down (and a pass does not hold its partition long).
                let retry =
                    RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(15), ..Default::default() };
                let client = ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(60));
                let mut builder = AmazonS3Builder::new()
                    .with_retry(retry)
                    .with_client_options(client)
                    .with_bucket_name(&bucket)
                    .with_region(if settings.region.is_empty() { "us-east-1" } else { &settings.region })
                    .with_virtual_hosted_style_request(!settings.path_style);
                if !settings.endpoint.is_empty() {
                    builder = builder
                        .with_endpoint(&settings.endpoint)
                        .with_allow_http(settings.endpoint.starts_with("http://"));
                }
                builder = if settings.access_key_id.is_empty() {
                    builder.with_skip_signature(true)
                } else {
                    builder
                        .with_access_key_id(&settings.access_key_id)
                        .with_secret_access_key(&settings.secret_access_key)
                };
                let objects = builder.build().map_err(|e| TierError::Config {
                    name: "object.store.url".into(),
                    value: settings.url.clone(),
                    reason: e.to_string(),
                })?;
                let endpoint = if settings.endpoint.is_empty() { "AWS" } else { settings.endpoint.as_str() };
                Ok(Store {
                    objects: Arc::new(objects),
                    root: ObjectPath::from(prefix.as_str()),
                    description: format!("s3://{bucket}/{prefix} at {endpoint}"),
                    shared: true,
                    directory: None,
                })
            }
        }
    }

    /// The key `parts` name under the store's prefix.
    pub(crate) fn key(&self, parts: &[&str]) -> ObjectPath {
        let mut path = self.root.clone();
        for part in parts {
            path = path.join(*part);
        }
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_url(url: &str) -> StoreSettings {
        StoreSettings { url: url.into(), ..Default::default() }
    }

    #[test]
    fn urls_are_checked_and_name_the_setting() {
        for good in ["", "file:///tmp/objects", "s3://bucket", "s3://bucket/a/b/"] {
            assert!(with_url(good).validate().is_ok(), "{good}");
        }
        for bad in ["file://relative/dir", "s3://", "s3:///prefix", "gs://bucket", "/tmp/objects"] {
            let error = with_url(bad).validate().expect_err(bad).to_string();
            assert!(error.contains("object.store.url"), "{bad}: {error}");
        }
        let half = StoreSettings { access_key_id: "id".into(), ..with_url("s3://b") };
        assert!(half.validate().expect_err("half credentials").to_string().contains("set together"));
        let endpoint = StoreSettings { endpoint: "127.0.0.1:9000".into(), ..with_url("s3://b") };
        assert!(endpoint.validate().expect_err("endpoint").to_string().contains("object.store.endpoint"));
    }

    #[test]
    fn the_secret_is_not_printed() {
        let settings = StoreSettings { secret_access_key: "hunter2".into(), ..with_url("s3://b") };
        assert!(!format!("{settings:?}").contains("hunter2"));
    }

    #[test]
    fn the_default_store_is_a_directory_in_the_data_dir() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(&StoreSettings::default(), dir.path()).expect("open");
        assert!(dir.path().join("objects").is_dir());
        assert_eq!(store.key(&["t", "0"]).as_ref(), "t/0");
        let s3 = Store::open(&with_url("s3://bucket/weir/prod"), dir.path()).expect("open s3");
        assert_eq!(s3.key(&["t", "0"]).as_ref(), "weir/prod/t/0");
    }
}
