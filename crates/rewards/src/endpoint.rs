//! Where a network reward may send its requests: `http://` or `https://` URLs, credentials never
//! in the clear beyond loopback, and the TLS client with the roots it trusts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::CertificateError;
use url::{Host, Url};

use crate::RewardError;

mod pinned;

/// Checks the `url` of reward `name`, whether TLS is used. `credential` names the setting that adds
/// an `Authorization` header, if any; a credential (or a `user:password@` in the URL) over plain
/// `http://` to a host that is not loopback is refused. Decided from the URL alone, before any
/// connection.
pub(crate) fn check_url(
    name: &str,
    url: &str,
    credential: Option<&str>,
) -> Result<bool, RewardError> {
    let bad = |m: String| Err(RewardError::Config(format!("reward `{name}`: {m}")));
    let parsed = match Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => u,
        _ => return bad(format!("url {url:?} must be http://host… or https://host…")),
    };
    let tls = parsed.scheme() == "https";
    let in_url = !parsed.username().is_empty() || parsed.password().is_some();
    if let Some(setting) = credential.or(in_url.then_some("the user:password in url")) {
        if !tls && !is_loopback(&parsed) {
            return bad(format!(
                "{setting} would send credentials in the clear: url {url:?} is plain http:// to a \
                 host that is not loopback; use https:// (plain http:// is allowed only to \
                 localhost, 127.0.0.0/8 and ::1)"
            ));
        }
    }
    Ok(tls)
}

/// `localhost`, 127.0.0.0/8 or ::1 (also as an IPv4-mapped address).
fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(Host::Domain(d)) => matches!(d, "localhost" | "localhost."),
        Some(Host::Ipv4(ip)) => ip.is_loopback(),
        Some(Host::Ipv6(ip)) => std::net::IpAddr::V6(ip).to_canonical().is_loopback(),
        None => false,
    }
}

/// The extra CA bundles, labelled by where they were named: `http.ca_file`, `$SSL_CERT_FILE`,
/// `$REQUESTS_CA_BUNDLE` (each once).
fn ca_bundles(
    ca_file: Option<&Path>,
    env: impl Fn(&str) -> Option<OsString>,
) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = vec![];
    let named = ca_file.map(|p| ("http.ca_file".to_string(), p.to_path_buf()));
    let from_env = ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"]
        .into_iter()
        .filter_map(|v| env(v).filter(|p| !p.is_empty()).map(|p| (format!("${v}"), p.into())));
    for (label, path) in named.into_iter().chain(from_env) {
        if !out.iter().any(|(_, p)| *p == path) {
            out.push((label, path));
        }
    }
    out
}

/// The TLS client of reward `name`: it trusts the bundled Mozilla roots, the system's, and every
/// certificate in the bundles of [`ca_bundles`], also as the server's own when that is a CA
/// ([`pinned`]); an unreadable or empty bundle is an error.
pub(crate) fn tls_config(
    name: &str,
    ca_file: Option<&Path>,
) -> Result<Arc<rustls::ClientConfig>, RewardError> {
    let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    let mut listed = vec![];
    for (label, path) in ca_bundles(ca_file, |v| std::env::var_os(v)) {
        let certs = CertificateDer::pem_file_iter(&path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>());
        let why = match certs {
            Ok(certs) => {
                if roots.add_parsable_certificates(certs.iter().cloned()).0 > 0 {
                    listed.extend(certs);
                    continue;
                }
                "it holds no PEM CA certificate".to_string()
            }
            Err(e) => e.to_string(),
        };
        let rule = if path.is_relative() {
            let cwd = std::env::current_dir().unwrap_or_default();
            format!("; a relative path is taken from the working directory, {}", cwd.display())
        } else {
            String::new()
        };
        return Err(RewardError::Config(format!(
            "reward `{name}`: CA bundle {} ({label}{rule}): {why}",
            path.display()
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let standard = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .expect("the bundled roots are never empty");
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports TLS 1.2 and 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(pinned::Verifier { standard, listed }))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The TLS failure behind `e`, if it is one: a refused certificate or a failed handshake, which
/// would fail the same way again.
pub(crate) fn tls_failure(e: &ureq::Error) -> Option<String> {
    let io = std::error::Error::source(e)?.downcast_ref::<std::io::Error>()?;
    let tls = io.get_ref()?.downcast_ref::<rustls::Error>()?;
    const TRUST: &str = "http.ca_file, $SSL_CERT_FILE or $REQUESTS_CA_BUNDLE";
    Some(if pinned::ca_as_end_entity(tls) {
        format!(
            "TLS handshake failed: the server presents a CA certificate as its own, accepted \
             only when that very certificate is listed in {TRUST}"
        )
    } else if matches!(tls, rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)) {
        format!("TLS handshake failed: {tls} (trust the server's CA with {TRUST})")
    } else {
        format!("TLS handshake failed: {tls}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No test here opens a connection: `check_url` looks at the URL only.
    #[test]
    fn credentials_go_in_the_clear_only_to_loopback() {
        let key = Some("vlm.api_key_env");
        for url in [
            "http://127.0.0.1:8000/v1/chat/completions",
            "http://127.3.2.1/x",
            "http://localhost:8000/x",
            "http://LOCALHOST/x",
            "http://[::1]:8000/x",
            "http://[::ffff:127.0.0.1]/x",
            "https://judge.example/v1/chat/completions",
            "https://10.1.2.3/x",
        ] {
            assert!(check_url("vlm_judge", url, key).is_ok(), "{url}");
        }
        assert!(check_url("http", "https://judge.example/x", None).unwrap(), "TLS");
        assert!(!check_url("http", "http://10.1.2.3/score", None).unwrap(), "plain, no key");
        for (url, key) in [
            ("http://judge.example/v1/chat/completions", key),
            ("http://10.1.2.3:8000/x", key),
            ("http://127.0.0.1.judge.example/x", key),
            ("http://localhost.judge.example/x", key),
            ("http://[::2]/x", key),
            ("http://user:pw@judge.example/score", None),
        ] {
            let err = check_url("vlm_judge", url, key).unwrap_err().to_string();
            let setting = key.unwrap_or("the user:password in url");
            assert!(
                err.contains(&format!("{setting} would send credentials in the clear"))
                    && err.contains(url)
                    && err.contains("use https://"),
                "{err}"
            );
        }
        for url in ["ftp://judge.example/x", "judge.example:8000", "http://", "file:///tmp/x"] {
            let err = check_url("http", url, None).unwrap_err().to_string();
            assert!(err.contains("must be http://host… or https://host…"), "{err}");
        }
    }

    #[test]
    fn ca_bundles_come_from_the_setting_and_both_variables_once_each() {
        let env = |v: &str| match v {
            "SSL_CERT_FILE" => Some("/etc/ssl/certs/ca-certificates.crt".into()),
            "REQUESTS_CA_BUNDLE" => Some("/etc/ssl/certs/ca-certificates.crt".into()),
            _ => None,
        };
        let labels = |b: Vec<(String, PathBuf)>| -> Vec<String> {
            b.into_iter().map(|(l, p)| format!("{l}={}", p.display())).collect()
        };
        assert_eq!(
            labels(ca_bundles(Some(Path::new("corp.pem")), env)),
            ["http.ca_file=corp.pem", "$SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"]
        );
        let only_requests = |v: &str| (v == "REQUESTS_CA_BUNDLE").then(|| OsString::from("ca.pem"));
        assert_eq!(labels(ca_bundles(None, only_requests)), ["$REQUESTS_CA_BUNDLE=ca.pem"]);
        assert!(ca_bundles(None, |_| Some(OsString::new())).is_empty());
    }

    #[test]
    fn an_unreadable_or_empty_ca_file_is_a_setting_error() {
        let missing = Path::new("/nonexistent/flowtune-ca.pem");
        let err = tls_config("http", Some(missing)).unwrap_err().to_string();
        assert!(err.contains("CA bundle /nonexistent/flowtune-ca.pem (http.ca_file): "), "{err}");
        let err = tls_config("http", Some(Path::new("no-such-ca.pem"))).unwrap_err().to_string();
        let cwd = std::env::current_dir().unwrap();
        let rule =
            format!("a relative path is taken from the working directory, {}", cwd.display());
        assert!(
            err.contains(&format!("CA bundle no-such-ca.pem (http.ca_file; {rule}): ")),
            "{err}"
        );
        let empty =
            std::env::temp_dir().join(format!("flowtune-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = tls_config("http", Some(&empty)).unwrap_err().to_string();
        std::fs::remove_file(&empty).unwrap();
        assert!(err.contains("holds no PEM CA certificate"), "{err}");
    }
}
