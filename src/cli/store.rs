//! Opening the store the configuration names: redb in the data dir (one
//! gateway), or PostgreSQL (`[store] url`, several gateways), and
//! `countersign store migrate`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use crate::core::config::Config;
use crate::store::{PgStore, RedbStore, Store};

/// Where the redb ledger of a data dir lives.
pub(crate) fn ledger_path(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("ledger.redb")
}

/// This gateway's id: kept in `data_dir/gateway-id`, made (random) on first
/// start. Rows a gateway writes to a shared store carry it, and a gateway
/// recovers only its own after a crash.
///
/// The id is written durably (file and folder fsynced) before it is used.
/// An empty file is one an older release wrote without an fsync and a power
/// cut took back before it was on disk: the id in it was never durable, so
/// a new one is made, and the gateway comes back on its own.
pub(crate) fn gateway_id(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join("gateway-id");
    let make = || -> anyhow::Result<String> {
        crate::store::durable::dir_all(data_dir)
            .with_context(|| format!("cannot create {}", data_dir.display()))?;
        let id = format!("gw-{:016x}", rand::random::<u64>());
        crate::store::durable::write(&path, format!("{id}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(id)
    };
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_owned()),
        Ok(_) => {
            let id = make()?;
            tracing::warn!(path = %path.display(), %id, "the gateway id file was empty (a power cut before it reached the disk): a new id is made");
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => make(),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// The PostgreSQL connection settings of `[store]`, the password resolved,
/// and the TLS client configuration when the url asks for TLS.
///
/// `sslmode=require` (or libpq's `verify-full` and `verify-ca`) is TLS with
/// the certificate checked against `[store.tls]` and the host name always
/// verified (stricter than libpq's `require` and `verify-ca`). Without
/// `sslmode`, or with `disable`, the connection is plain TCP. `prefer` is
/// refused: it falls back to plain TCP, which anyone on the path can read
/// and change, without saying so.
fn pg_config(
    config: &Config,
    url: &str,
) -> anyhow::Result<(tokio_postgres::Config, Option<Arc<rustls::ClientConfig>>)> {
    let (url, mode) = sslmode(url)?;
    let mut pg: tokio_postgres::Config = url
        .parse()
        .context("store.url is not a PostgreSQL connection url")?;
    if let Some(password) = &config.store.password {
        let value = crate::upstream::credentials::resolve(password, "store.password")
            .map_err(anyhow::Error::msg)?;
        pg.password(value);
    }
    if pg.get_application_name().is_none() {
        pg.application_name("countersign");
    }
    let tls = if mode == Some("require") {
        pg.ssl_mode(tokio_postgres::config::SslMode::Require);
        Some(crate::upstream::tls::store_config(
            config.store.tls.as_ref(),
        )?)
    } else {
        pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
        if config.store.tls.is_some() {
            anyhow::bail!(
                "[store.tls] is set but store.url does not ask for TLS: add sslmode=require to the url"
            );
        }
        None
    };
    Ok((pg, tls))
}

/// The url with libpq's `verify-full`/`verify-ca` read as `require` (which
/// verifies fully here), and the `sslmode` it names. `prefer` and `allow`
/// are refused.
fn sslmode(url: &str) -> anyhow::Result<(String, Option<&'static str>)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut mode = None;
    let mut params = Vec::new();
    for param in query.split('&') {
        match param.strip_prefix("sslmode=") {
            None => params.push(param.to_owned()),
            Some("disable") => mode = Some("disable"),
            Some("require" | "verify-full" | "verify-ca") => mode = Some("require"),
            Some(other @ ("prefer" | "allow")) => anyhow::bail!(
                "store.url: sslmode={other} falls back to plain TCP without saying so: use sslmode=require (TLS, certificate and host name checked), or sslmode=disable on a trusted network"
            ),
            Some(other) => anyhow::bail!(
                "store.url: sslmode=`{other}` is not known: use require or disable"
            ),
        }
    }
    let url = if params.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", params.join("&"))
    };
    Ok((url, mode))
}

/// A store error, with what to set when it is a TLS handshake failure.
fn worded(e: &crate::store::StoreError) -> String {
    let text = e.to_string();
    let hint = if text.contains("UnknownIssuer") {
        " (the database's certificate is not signed by a trusted CA: set [store.tls] ca_file to the CA that signed it)"
    } else if text.contains("NotValidForName") {
        " (the database's certificate is not valid for the host name in store.url: use the name it was issued for)"
    } else if text.contains("server does not support TLS") {
        " (the database does not offer TLS: turn on `ssl` in its configuration)"
    } else {
        ""
    };
    format!("{text}{hint}")
}

/// Whether every host of `pg` is this machine (loopback or a Unix socket).
fn local(pg: &tokio_postgres::Config) -> bool {
    pg.get_hosts().iter().all(|h| match h {
        tokio_postgres::config::Host::Tcp(name) => {
            name == "localhost"
                || name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => true,
    })
}

/// Open the configured store (migrating PostgreSQL when its schema is
/// older). Returns it and a line for the log.
pub(crate) async fn open(config: &Config) -> anyhow::Result<(Arc<dyn Store>, String)> {
    match &config.store.url {
        None => {
            let path = ledger_path(&config.gateway.data_dir);
            let store = RedbStore::open(&path)?;
            Ok((Arc::new(store), format!("redb at {}", path.display())))
        }
        Some(url) => {
            let id = gateway_id(&config.gateway.data_dir)?;
            let (pg, tls) = pg_config(config, url)?;
            if tls.is_none() && !local(&pg) {
                tracing::warn!("the connection to PostgreSQL is plain TCP to another host: add sslmode=require to store.url");
            }
            let (mut store, migrated) = PgStore::connect(pg, tls, config.store.pool_size, &id)
                .await
                .map_err(|e| anyhow::anyhow!("{}", worded(&e)))?;
            let epoch = store.start_lease(config.store.lease).await?;
            let id = format!("{id} (lease epoch {epoch})");
            let said = if migrated.from == migrated.to {
                format!(
                    "PostgreSQL, schema version {}, as gateway {id}",
                    migrated.to
                )
            } else {
                format!(
                    "PostgreSQL, schema migrated from version {} to {}, as gateway {id}",
                    migrated.from, migrated.to
                )
            };
            Ok((Arc::new(store), said))
        }
    }
}

/// The PostgreSQL store the config names, for a command that writes the
/// state gateways share (an invitation); none on redb, whose file the
/// running gateway holds. No lease: the command dispatches nothing.
pub(crate) async fn shared(config: &Config) -> anyhow::Result<Option<PgStore>> {
    let Some(url) = config.store.url.as_deref() else {
        return Ok(None);
    };
    let id = gateway_id(&config.gateway.data_dir)?;
    let (pg, tls) = pg_config(config, url)?;
    let (store, _) = PgStore::connect(pg, tls, 1, &id)
        .await
        .map_err(|e| anyhow::anyhow!("{}", worded(&e)))?;
    Ok(Some(store))
}

/// `countersign store migrate`: bring a PostgreSQL schema up to date.
pub(crate) async fn migrate(config: &Config) -> anyhow::Result<String> {
    let url =
        config.store.url.as_deref().ok_or_else(|| {
            anyhow::anyhow!("no [store] url in the config: redb needs no migration")
        })?;
    let id = gateway_id(&config.gateway.data_dir)?;
    let (pg, tls) = pg_config(config, url)?;
    let (_, migrated) = PgStore::connect(pg, tls, 1, &id)
        .await
        .map_err(|e| anyhow::anyhow!("{}", worded(&e)))?;
    Ok(if migrated.from == migrated.to {
        format!("schema already at version {}", migrated.to)
    } else {
        format!(
            "schema migrated from version {} to {}",
            migrated.from, migrated.to
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{gateway_id, sslmode};

    /// Power loss (F2): an id file an older release left empty (a cut before
    /// it reached the disk) no longer keeps the gateway down until a person
    /// deletes it: a new id is made, durably, and kept.
    #[test]
    fn an_empty_gateway_id_is_made_again_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = gateway_id(dir.path()).unwrap();
        assert!(first.starts_with("gw-") && first.len() == 19, "{first}");
        assert_eq!(gateway_id(dir.path()).unwrap(), first, "kept");
        std::fs::write(dir.path().join("gateway-id"), "").unwrap();
        let again = gateway_id(dir.path()).unwrap();
        assert!(again.starts_with("gw-") && again != first, "{again}");
        assert_eq!(gateway_id(dir.path()).unwrap(), again);
    }

    #[test]
    fn sslmode_is_read_from_the_url_and_prefer_is_refused() {
        let (url, mode) =
            sslmode("postgres://u@h/db?options=-c%20x%3Dy&sslmode=verify-full").unwrap();
        assert_eq!(url, "postgres://u@h/db?options=-c%20x%3Dy");
        assert_eq!(mode, Some("require"));
        assert_eq!(sslmode("postgres://u@h/db").unwrap().1, None);
        assert_eq!(
            sslmode("postgres://u@h/db?sslmode=disable").unwrap(),
            ("postgres://u@h/db".to_owned(), Some("disable"))
        );
        for bad in ["prefer", "allow"] {
            let e = sslmode(&format!("postgres://u@h/db?sslmode={bad}")).unwrap_err();
            assert!(e.to_string().contains("falls back to plain TCP"), "{e}");
        }
        let e = sslmode("postgres://u@h/db?sslmode=maybe").unwrap_err();
        assert!(e.to_string().contains("`maybe` is not known"), "{e}");
    }
}
