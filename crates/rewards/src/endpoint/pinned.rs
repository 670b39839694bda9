//! Certificates the user lists by name. webpki refuses a CA certificate as a server's own, but
//! `openssl req -x509` marks its self-signed certificates CA:TRUE and OpenSSL-based clients
//! (curl, Python) accept one that the user trusts. So does [`Verifier`], for exactly the
//! certificates of the user's bundles, still checking the host name and the dates.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

/// rustls's standard verifier, and the certificates of the bundles the user named.
#[derive(Debug)]
pub(super) struct Verifier {
    pub(super) standard: Arc<WebPkiServerVerifier>,
    pub(super) listed: Vec<CertificateDer<'static>>,
}

/// Whether `e` is webpki's refusal of a CA certificate as the server's own (rustls passes it on
/// as `Other`, which displays the variant's name).
pub(super) fn ca_as_end_entity(e: &Error) -> bool {
    matches!(e, Error::InvalidCertificate(CertificateError::Other(o))
        if o.to_string() == "CaUsedAsEndEntity")
}

impl ServerCertVerifier for Verifier {
    /// The standard verdict, except that a server certificate refused only for being a CA passes
    /// when it is byte for byte one the user listed, valid for `server_name` and at `now`.
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let verdict = self.standard.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match verdict {
            Err(e) if ca_as_end_entity(&e) && self.listed.iter().any(|c| c == end_entity) => {
                verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)?;
                check_dates(end_entity, now)?;
                Ok(ServerCertVerified::assertion())
            }
            verdict => verdict,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.standard.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.standard.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.standard.supported_verify_schemes()
    }
}

/// Refuses `cert` before its notBefore or after its notAfter, with webpki's errors.
fn check_dates(cert: &[u8], now: UnixTime) -> Result<(), Error> {
    let (not_before, not_after) = validity(cert).ok_or(CertificateError::BadEncoding)?;
    if now < not_before {
        return Err(CertificateError::NotValidYetContext { time: now, not_before }.into());
    }
    if now > not_after {
        return Err(CertificateError::ExpiredContext { time: now, not_after }.into());
    }
    Ok(())
}

/// The notBefore and notAfter of a DER certificate (RFC 5280: Certificate → TBSCertificate →
/// [0] version, serialNumber, signature, issuer, validity).
fn validity(cert: &[u8]) -> Option<(UnixTime, UnixTime)> {
    let (_, cert, _) = tlv(cert)?;
    let (_, mut tbs, _) = tlv(cert)?;
    if tbs.first() == Some(&0xa0) {
        tbs = tlv(tbs)?.2;
    }
    for _ in 0..3 {
        tbs = tlv(tbs)?.2;
    }
    let (_, dates, _) = tlv(tbs)?;
    let (tag, not_before, rest) = tlv(dates)?;
    let not_before = time(tag, not_before)?;
    let (tag, not_after, _) = tlv(rest)?;
    Some((not_before, time(tag, not_after)?))
}

/// The first DER element of `der`: its tag, its contents and what follows it.
fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        0..=0x7f => (usize::from(first), rest),
        0x81..=0x84 => {
            let (bytes, rest) = rest.split_at_checked(usize::from(first & 0x7f))?;
            (bytes.iter().fold(0, |n, &b| n << 8 | usize::from(b)), rest)
        }
        _ => return None,
    };
    let (contents, rest) = rest.split_at_checked(len)?;
    Some((tag, contents, rest))
}

/// A UTCTime (tag 0x17, `YYMMDDHHMMSSZ`, 1950–2049) or GeneralizedTime (0x18, `YYYYMMDDHHMMSSZ`),
/// the forms RFC 5280 allows; a time before 1970 counts as 1970.
fn time(tag: u8, text: &[u8]) -> Option<UnixTime> {
    let digits = text.strip_suffix(b"Z").filter(|d| d.iter().all(u8::is_ascii_digit))?;
    let number = |at: usize, len: usize| {
        digits[at..at + len].iter().fold(0, |n, &d| n * 10 + i64::from(d - b'0'))
    };
    let (year, at) = match (tag, digits.len()) {
        (0x17, 12) => (number(0, 2) + if number(0, 2) < 50 { 2000 } else { 1900 }, 2),
        (0x18, 14) => (number(0, 4), 4),
        _ => return None,
    };
    let field = |i: usize| number(at + 2 * i, 2);
    let (month, day) = (field(0), field(1));
    // Days since 1970-01-01 of the proleptic Gregorian date (Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let (era, year_of_era) = (y.div_euclid(400), y.rem_euclid(400));
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + year_of_era * 365 + year_of_era / 4 - year_of_era / 100
        + day_of_year
        - 719_468;
    let seconds = days * 86_400 + field(2) * 3600 + field(3) * 60 + field(4);
    Some(UnixTime::since_unix_epoch(Duration::from_secs(seconds.max(0).unsigned_abs())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Certificate dates as UTCTime (up to 2049) and GeneralizedTime (from 2050), against
    /// `date -u -d … +%s`.
    #[test]
    fn validity_reads_both_time_forms() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
        params.not_before = rcgen::date_time_ymd(1975, 3, 1);
        params.not_after = rcgen::date_time_ymd(2050, 2, 28);
        let cert = params.self_signed(&key).unwrap();
        let (not_before, not_after) = validity(cert.der()).unwrap();
        assert_eq!((not_before.as_secs(), not_after.as_secs()), (162_864_000, 2_529_619_200));
        assert_eq!(time(0x17, b"491231235959Z").unwrap().as_secs(), 2_524_607_999);
        assert_eq!(time(0x17, b"500101000000Z").unwrap().as_secs(), 0, "1950 counts as 1970");
        assert_eq!(time(0x18, b"20000229120000Z").unwrap().as_secs(), 951_825_600);
        for bad in [&b"0001010000Z"[..], b"491231235959", b"4912312359+9Z"] {
            assert!(time(0x17, bad).is_none(), "{bad:?}");
        }
    }
}
