//! `[review]`: the reviewer web console (DESIGN.md section 21).

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{duration, invalid, ConfigError};

/// `[review]`: the console under `/review/` on the gateway's listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReviewConfig {
    /// Serve the console.
    pub enabled: bool,
    /// The console's origin (`https://gw.example.com`). Default: the
    /// origin of `gateway.public_url`; without one, on a loopback listener,
    /// `http://localhost:PORT` (a WebAuthn relying party is a domain, never
    /// an IP address).
    pub origin: Option<String>,
    /// The WebAuthn relying party id. Default: the origin's host.
    pub rp_id: Option<String>,
    /// How long a sign-in lasts (at most 12 h).
    #[serde(deserialize_with = "duration")]
    pub session_ttl: Duration,
    /// How long an enrolment link is good for when `reviewer invite` is
    /// given no `--ttl`.
    #[serde(deserialize_with = "duration")]
    pub invite_ttl: Duration,
}

impl Default for ReviewConfig {
    fn default() -> Self {
        ReviewConfig {
            enabled: false,
            origin: None,
            rp_id: None,
            session_ttl: Duration::from_secs(12 * 3600),
            invite_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

impl ReviewConfig {
    /// `[review]`: a session of at most 12 h; an origin and rp id that can
    /// be a WebAuthn relying party.
    pub(super) fn check(&self, path: &Path) -> Result<(), ConfigError> {
        if self.session_ttl.is_zero() || self.session_ttl > Duration::from_secs(12 * 3600) {
            return Err(invalid(
                path,
                "review.session_ttl must be more than 0s and at most 12h".into(),
            ));
        }
        if let Some(o) = &self.origin {
            console_origin(o, self.rp_id.as_deref()).map_err(|e| invalid(path, e))?;
        }
        Ok(())
    }
}

/// The console's origin and relying party id, checked: `origin` is
/// `scheme://host[:port]` with nothing after it, its host a domain name
/// (never an IP address: WebAuthn refuses those as relying parties), and
/// `rp_id` (default: the host) the host or a domain it belongs to. `http`
/// only for `localhost`.
pub fn console_origin(origin: &str, rp_id: Option<&str>) -> Result<(String, String), String> {
    let origin = origin.trim_end_matches('/');
    let (scheme, rest) = origin
        .split_once("://")
        .ok_or_else(|| format!("review.origin `{origin}` is not scheme://host[:port]"))?;
    let host = match rest.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) && !port.is_empty() => h,
        _ => rest,
    };
    if host.is_empty() || rest.contains('/') || rest.contains('?') || rest.contains('#') {
        return Err(format!(
            "review.origin `{origin}` is not scheme://host[:port] (no path)"
        ));
    }
    if host.starts_with('[') || host.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!(
            "the review console needs a domain name, and its origin `{origin}` is an IP address: a WebAuthn relying party id is a domain (use `localhost` on loopback, or set gateway.public_url or review.origin to a name)"
        ));
    }
    match scheme {
        "https" => {}
        "http" if host == "localhost" => {}
        _ => {
            return Err(format!(
                "review.origin `{origin}` must be https:// (http:// only on localhost): browsers offer passkeys to secure origins only"
            ))
        }
    }
    let rp = rp_id.unwrap_or(host).to_ascii_lowercase();
    let lower = host.to_ascii_lowercase();
    if !(lower == rp || lower.ends_with(&format!(".{rp}"))) {
        return Err(format!(
            "review.rp_id `{rp}` is not `{host}` or a domain it belongs to"
        ));
    }
    Ok((origin.to_owned(), rp))
}

/// The console's origin and relying party id for a gateway listening on
/// `listening` (with TLS when `tls`): `review.origin`, else the origin of a
/// configured `gateway.public_url`, else, on a loopback listener,
/// `http(s)://localhost:PORT`.
pub fn console_of(
    cfg: &super::Config,
    listening: std::net::SocketAddr,
    tls: bool,
) -> Result<(String, String), String> {
    let rp = cfg.review.rp_id.as_deref();
    if let Some(o) = &cfg.review.origin {
        return console_origin(o, rp);
    }
    if let Some(url) = &cfg.gateway.public_url {
        let origin = match url.split_once("://") {
            Some((scheme, rest)) => format!("{scheme}://{}", rest.split('/').next().unwrap_or("")),
            None => url.clone(),
        };
        return console_origin(&origin, rp);
    }
    if listening.ip().is_loopback() {
        let scheme = if tls { "https" } else { "http" };
        return console_origin(&format!("{scheme}://localhost:{}", listening.port()), rp);
    }
    Err(format!(
        "the review console needs a domain name to be a WebAuthn relying party, and the gateway listens on {listening}: set gateway.public_url (or review.origin) to its https:// name"
    ))
}

#[cfg(test)]
mod tests {
    use super::console_origin;

    #[test]
    fn an_origin_is_a_domain_and_its_rp_id_contains_it() {
        assert_eq!(
            console_origin("http://localhost:7373", None).unwrap(),
            ("http://localhost:7373".into(), "localhost".into())
        );
        assert_eq!(
            console_origin("https://review.example.com/", Some("example.com"))
                .unwrap()
                .1,
            "example.com"
        );
        for bad in [
            "http://127.0.0.1:7373",
            "https://[::1]:7373",
            "http://gw.example.com",
            "https://a.example.com/review",
        ] {
            assert!(console_origin(bad, None).is_err(), "{bad}");
        }
        let e = console_origin("http://127.0.0.1:7373", None).unwrap_err();
        assert!(e.contains("IP address") && e.contains("localhost"), "{e}");
        assert!(console_origin("https://a.example.com", Some("other.com")).is_err());
    }
}
