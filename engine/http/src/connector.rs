//! The HTTP connector every spate HTTP client uses (the ClickHouse writer,
//! the schema registry client): one place that decides TCP and TLS
//! settings, so both clients connect alike.

use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;

/// The connector every spate HTTP client uses (the writer, the schema
/// registry client): plain TCP for `http://`, rustls for `https://` with
/// `tls` (`None`: the system's roots, as the TLS module loads them), HTTP/1.1,
/// `connect_timeout` on establishing the TCP connection, no Nagle.
pub fn https_connector(
    connect_timeout: Duration,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> HttpsConnector<HttpConnector> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    // The TLS layer below needs to see https:// URLs.
    connector.enforce_http(false);
    match tls.or_else(crate::tls::system_default) {
        Some(tls) => hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(Arc::unwrap_or_clone(tls))
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector),
        // No roots anywhere: https:// URLs fail at connect with rustls'
        // "no trust anchors" error, http:// ones work.
        None => hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
            )
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector),
    }
}
