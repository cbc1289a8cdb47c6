//! `[auth]`: the identity providers whose access tokens are accepted (DESIGN.md section 17), and their checks.

use super::*;

/// `[auth]`: the gateway as an OAuth 2.1 resource server (DESIGN.md section
/// 17). Each `[[auth.issuers]]` is an identity provider whose JWT access
/// tokens are accepted beside the static `[[identities]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The identity providers.
    pub issuers: Vec<IssuerConfig>,
    /// How far `exp` and `nbf` may be off (clock skew between the provider
    /// and the gateway).
    #[serde(deserialize_with = "duration")]
    pub leeway: Duration,
    /// The least time between two fetches of one issuer's keys: a token
    /// naming an unknown `kid` fetches them again at most this often, so a
    /// flood of forged `kid`s cannot turn the gateway against the provider.
    #[serde(deserialize_with = "duration")]
    pub refetch_interval: Duration,
    /// Keys older than this are fetched again on the next token (the cached
    /// ones stay in use while the provider cannot be reached).
    #[serde(deserialize_with = "duration")]
    pub keys_max_age: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            issuers: Vec::new(),
            leeway: Duration::from_secs(30),
            refetch_interval: Duration::from_secs(30),
            keys_max_age: Duration::from_secs(3600),
        }
    }
}

/// One `[[auth.issuers]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// A short name: principals from this issuer are `NAME:SUBJECT`.
    pub name: String,
    /// The issuer identifier, compared with `iss` exactly. `https://`, or
    /// `http://` on a loopback host (a local provider in tests).
    pub issuer: String,
    /// The issuer's keys from a file (a JWKS document) instead of discovery.
    pub jwks_file: Option<PathBuf>,
    /// The JWKS URL instead of discovery (`/.well-known/openid-configuration`,
    /// then `/.well-known/oauth-authorization-server`).
    pub jwks_uri: Option<String>,
    /// The audiences accepted; default: the gateway's public URL and the
    /// server's resource URL (`{public_url}/mcp/{server}`).
    #[serde(default)]
    pub audience: Vec<String>,
    /// The claim naming the principal.
    #[serde(default = "default_principal_claim")]
    pub principal_claim: String,
    /// The claim naming the tenant (`tenant`, `org_id`, `tid`, ...).
    pub tenant_claim: Option<String>,
    /// A fixed tenant for every token of this issuer (a single-tenant
    /// provider), instead of `tenant_claim`.
    pub tenant: Option<String>,
    /// The tenants this issuer may speak for (empty: any). A token naming
    /// another tenant is refused (401): one provider cannot mint tokens for
    /// a tenant another provider serves.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// The claim listing the principal's groups (`groups`, `roles`).
    pub groups_claim: Option<String>,
    /// Scopes a server requires of this issuer's tokens, by server name
    /// (`"*"`: every server without an entry of its own).
    #[serde(default)]
    pub scopes: BTreeMap<String, Vec<String>>,
    /// Accept `typ: JWT` (or none) as well as `at+jwt`: for providers that
    /// do not yet mark access tokens as RFC 9068 asks.
    #[serde(default)]
    pub accept_plain_jwt: bool,
    /// How the provider's certificate is checked when its metadata and keys
    /// are fetched (`ca_file` for a provider behind a private CA, `roots`,
    /// a client certificate); the same settings as `[servers.S.tls]`.
    pub tls: Option<UpstreamTls>,
}

fn default_principal_claim() -> String {
    "sub".into()
}

/// Whether `url` is `https://`, or `http://` on a loopback host.
pub fn https_or_loopback(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

impl AuthConfig {
    /// `[auth]`: issuers with plain, distinct names, https (or loopback),
    /// one source of keys at most, a tenant from a claim or fixed, and
    /// static principals that cannot be mistaken for an issuer's.
    pub(super) fn check(
        &self,
        identities: &[IdentityConfig],
        path: &Path,
    ) -> Result<(), ConfigError> {
        let mut names = std::collections::BTreeSet::new();
        for (i, iss) in self.issuers.iter().enumerate() {
            let at = format!("auth.issuers[{i}] (`{}`)", iss.name);
            plain_new_name(&mut names, &iss.name, &at, path)?;
            // Keys fetched over plain HTTP from afar could be anyone's.
            let urls = [
                Some(("issuer", &iss.issuer)),
                iss.jwks_uri.as_ref().map(|u| ("jwks_uri", u)),
            ];
            if let Some((field, url)) = urls
                .into_iter()
                .flatten()
                .find(|(_, u)| !https_or_loopback(u))
            {
                return Err(invalid(
                    path,
                    format!(
                        "{at}: {field} `{url}` must be https:// (http:// only on a loopback host)"
                    ),
                ));
            }
            if iss.jwks_uri.is_some() && iss.jwks_file.is_some() {
                return Err(invalid(
                    path,
                    format!("{at}: set jwks_uri or jwks_file, not both"),
                ));
            }
            if iss.tenant_claim.is_some() == iss.tenant.is_some() {
                return Err(invalid(
                    path,
                    format!("{at}: set exactly one of tenant_claim (the claim naming the tenant) and tenant (one tenant for every token)"),
                ));
            }
            if iss.principal_claim.is_empty() {
                return Err(invalid(
                    path,
                    format!("{at}: principal_claim may not be empty"),
                ));
            }
        }
        if !self.issuers.is_empty() {
            // `NAME:SUBJECT` is an issuer's principal: a static one with a
            // `:` could pass for it.
            if let Some(id) = identities.iter().find(|i| i.principal.contains(':')) {
                return Err(invalid(
                    path,
                    format!(
                        "identities: principal `{}` contains `:`, which names an issuer's principals (NAME:SUBJECT) once [[auth.issuers]] are configured",
                        id.principal
                    ),
                ));
            }
        }
        if self.refetch_interval < Duration::from_secs(1) {
            return Err(invalid(
                path,
                "auth.refetch_interval must be at least 1s".into(),
            ));
        }
        if self.leeway > Duration::from_secs(300) {
            return Err(invalid(path, "auth.leeway must be at most 5m".into()));
        }
        Ok(())
    }
}
