//! Opening the store the configuration names: redb in the data dir (one
//! gateway), or PostgreSQL (`[store] url`, several gateways), and
//! `countersign store migrate`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use crate::core::config::Config;
use crate::store::{PgStore, RedbStore, Store};

/// Where the redb ledger of a data dir lives.
pub fn ledger_path(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("ledger.redb")
}

/// This gateway's id: kept in `data_dir/gateway-id`, made (random) on first
/// start. Rows a gateway writes to a shared store carry it, and a gateway
/// recovers only its own after a crash.
pub fn gateway_id(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join("gateway-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_owned()),
        Ok(_) => Err(anyhow::anyhow!(
            "{} is empty: delete it, and a new id is made",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(data_dir)
                .with_context(|| format!("cannot create {}", data_dir.display()))?;
            let id = format!("gw-{:016x}", rand::random::<u64>());
            std::fs::write(&path, format!("{id}\n"))
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(id)
        }
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// The PostgreSQL connection settings of `[store]`, the password resolved.
fn pg_config(config: &Config, url: &str) -> anyhow::Result<tokio_postgres::Config> {
    let mut pg: tokio_postgres::Config = url
        .parse()
        .map_err(|e| anyhow::anyhow!("store.url is not a PostgreSQL connection url: {e}"))?;
    if let Some(password) = &config.store.password {
        let value = crate::upstream::credentials::resolve(password, "store.password")
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        pg.password(value);
    }
    if pg.get_application_name().is_none() {
        pg.application_name("countersign");
    }
    Ok(pg)
}

/// Open the configured store (migrating PostgreSQL when its schema is
/// older). Returns it and a line for the log.
pub async fn open(config: &Config) -> anyhow::Result<(Arc<dyn Store>, String)> {
    match &config.store.url {
        None => {
            let path = ledger_path(&config.gateway.data_dir);
            let store = RedbStore::open(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok((Arc::new(store), format!("redb at {}", path.display())))
        }
        Some(url) => {
            let id = gateway_id(&config.gateway.data_dir)?;
            let (mut store, migrated) =
                PgStore::connect(pg_config(config, url)?, config.store.pool_size, &id)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            let epoch = store
                .start_lease(config.store.lease)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
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

/// `countersign store migrate`: bring a PostgreSQL schema up to date.
pub async fn migrate(config: &Config) -> anyhow::Result<String> {
    let url =
        config.store.url.as_deref().ok_or_else(|| {
            anyhow::anyhow!("no [store] url in the config: redb needs no migration")
        })?;
    let id = gateway_id(&config.gateway.data_dir)?;
    let (_, migrated) = PgStore::connect(pg_config(config, url)?, 1, &id)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(if migrated.from == migrated.to {
        format!("schema already at version {}", migrated.to)
    } else {
        format!(
            "schema migrated from version {} to {}",
            migrated.from, migrated.to
        )
    })
}
