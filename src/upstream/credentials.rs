//! Resolving the operator's [`Credential`]s for an upstream: read from the
//! gateway's environment or a file each time a connection is made, so a
//! rotated secret is picked up by the next connection without a restart.
//!
//! A value is never put in an error message or a log line: errors name the
//! header or variable, the server and where the value was to come from.

use crate::core::config::{Config, Credential};

/// The value of `c`, for `what` (`header `Authorization` of server `gh``).
pub(crate) fn resolve(c: &Credential, what: &str) -> Result<String, String> {
    match c {
        Credential::Literal(v) => Ok(v.clone()),
        Credential::Env { var, prefix } => match std::env::var(var) {
            Ok(v) if !v.is_empty() => Ok(format!("{prefix}{v}")),
            Ok(_) => Err(format!("{what}: environment variable `{var}` is empty")),
            Err(std::env::VarError::NotPresent) => {
                Err(format!("{what}: environment variable `{var}` is not set"))
            }
            Err(std::env::VarError::NotUnicode(_)) => Err(format!(
                "{what}: environment variable `{var}` is not valid UTF-8"
            )),
        },
        Credential::File { path, prefix } => match std::fs::read_to_string(path) {
            Ok(v) => {
                // `echo token > file` leaves a newline that no server expects.
                let v = v.trim_end_matches(['\n', '\r']);
                if v.is_empty() {
                    Err(format!("{what}: file `{}` is empty", path.display()))
                } else {
                    Ok(format!("{prefix}{v}"))
                }
            }
            Err(e) => Err(format!(
                "{what}: cannot read file `{}`: {e}",
                path.display()
            )),
        },
    }
}

/// Resolve every credential of every server once (at start): a missing
/// variable or file stops `serve` with the reason, rather than failing the
/// first call.
pub(crate) fn check_all(config: &Config) -> Result<(), String> {
    for w in &config.notify.webhooks {
        resolve(&w.secret, &format!("secret of webhook `{}`", w.name))?;
    }
    for (server, s) in &config.servers {
        for (name, c) in &s.headers {
            resolve(c, &format!("header `{name}` of server `{server}`"))?;
        }
        for (name, c) in &s.env {
            resolve(
                c,
                &format!("environment variable `{name}` of server `{server}`"),
            )?;
        }
        if let Some(d) = &s.delegation {
            if let Some(c) = &d.client_secret {
                resolve(c, &format!("delegation client_secret of server `{server}`"))?;
            }
            if let Some(c) = &d.actor_token {
                resolve(c, &format!("delegation actor_token of server `{server}`"))?;
            }
            if let Some(key) = &d.client_key {
                crate::upstream::delegation::assertion::Signer::load(key, d.client_key_id.clone())
                    .map_err(|e| format!("delegation client_key of server `{server}`: {e}"))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_and_file_resolve_and_errors_never_show_a_value() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret-from-file\n").unwrap();
        let c = Credential::File {
            path: file.clone(),
            prefix: "Bearer ".into(),
        };
        assert_eq!(resolve(&c, "h").unwrap(), "Bearer s3cret-from-file");
        std::fs::write(&file, "\n").unwrap();
        assert!(resolve(&c, "h").unwrap_err().contains("is empty"));
        let missing = Credential::Env {
            var: "COUNTERSIGN_TEST_SURELY_UNSET".into(),
            prefix: String::new(),
        };
        let e = resolve(&missing, "header `A` of server `s`").unwrap_err();
        assert_eq!(
            e,
            "header `A` of server `s`: environment variable `COUNTERSIGN_TEST_SURELY_UNSET` is not set"
        );
        let literal = Credential::Literal("s3cret-literal".into());
        assert!(!format!("{literal:?}").contains("s3cret"));
    }
}
