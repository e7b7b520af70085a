//! TLS for `https://` replica URLs: a rustls client config (ring crypto,
//! TLS 1.2 and 1.3) that trusts either the system's root certificates or
//! the CAs of one PEM file, and that skips verification only when asked by
//! name ([`TlsOptions::insecure`]).
//!
//! Plain `http://` URLs do not touch TLS at all; the same writer serves both.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Where trust for `https://` endpoints comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// A PEM file of CA certificates to trust instead of the system's roots
    /// (a private CA, or a self-signed server certificate).
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate without verifying it. Anyone on the
    /// path can then read and change the data; for tests and first trials
    /// only. Never on unless set.
    pub insecure: bool,
}

/// A TLS setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA file could not be read or holds no usable certificate.
    #[error("TLS CA file {path}: {reason}")]
    CaFile {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// No root certificate is available: the system store is empty and no
    /// CA file is set.
    #[error("no trusted root certificates: the system store is empty; set a CA file")]
    NoRoots,
    /// rustls refused the config.
    #[error("TLS config: {0}")]
    Rustls(#[from] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls client config for `options`.
///
/// # Errors
/// [`TlsError::CaFile`] when the CA file cannot be read or holds no
/// certificate, [`TlsError::NoRoots`] when neither the file nor the system
/// store gives a root.
pub fn client_config(options: &TlsOptions) -> Result<Arc<ClientConfig>, TlsError> {
    let builder =
        ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let config = if options.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
            .with_no_client_auth()
    } else {
        builder
            .with_root_certificates(roots(options)?)
            .with_no_client_auth()
    };
    Ok(Arc::new(config))
}

/// The config for `https://` URLs when none is given: the system's roots,
/// loaded once per process on first use. `None` when the system store
/// yields no root (then `https://` URLs fail to connect, naming TLS).
pub(crate) fn system_default() -> Option<Arc<ClientConfig>> {
    static DEFAULT: OnceLock<Option<Arc<ClientConfig>>> = OnceLock::new();
    DEFAULT
        .get_or_init(|| match client_config(&TlsOptions::default()) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!("https:// endpoints will not connect: {e}");
                None
            }
        })
        .clone()
}

fn roots(options: &TlsOptions) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    if let Some(path) = &options.ca_file {
        let ca_err = |reason: String| TlsError::CaFile {
            path: path.display().to_string(),
            reason,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| ca_err(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ca_err(e.to_string()))?;
        if certs.is_empty() {
            return Err(ca_err("holds no PEM certificate".into()));
        }
        for c in certs {
            store.add(c).map_err(|e| ca_err(e.to_string()))?;
        }
        return Ok(store);
    }
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!("system root certificates: {e}");
    }
    let (_, _) = store.add_parsable_certificates(native.certs);
    if store.is_empty() {
        return Err(TlsError::NoRoots);
    }
    Ok(store)
}

/// Accepts every certificate; signatures are still checked so the
/// handshake itself is sound. Only built for [`TlsOptions::insecure`].
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ca_file_is_named() {
        let e = client_config(&TlsOptions {
            ca_file: Some("/nonexistent/ca.pem".into()),
            insecure: false,
        })
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("spate-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("empty.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = client_config(&TlsOptions {
            ca_file: Some(path.clone()),
            insecure: false,
        })
        .unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn insecure_builds_without_roots() {
        client_config(&TlsOptions {
            ca_file: None,
            insecure: true,
        })
        .unwrap();
    }
}
