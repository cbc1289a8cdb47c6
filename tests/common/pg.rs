//! A PostgreSQL schema of a test's own in the local server (127.0.0.1:5432,
//! trust auth, database `test`), dropped at the end.

use std::process::Command;

use super::{psql, Gateway, Options};

/// A schema of its own, dropped at the end.
pub struct Schema(pub String);

impl Schema {
    pub fn new() -> Schema {
        let name = format!("cs_e2e_{:016x}", rand::random::<u64>());
        psql(&format!("CREATE SCHEMA {name}"));
        Schema(name)
    }

    /// `[store]` for the gateway: the schema through the connection options.
    pub fn store_table(&self) -> String {
        format!(
            "\n[store]\nurl = \"postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3D{}\"\npool_size = 4\n",
            self.0
        )
    }
}

/// A gateway on `schema`, with `opts` besides.
pub fn on(schema: &Schema, opts: Options) -> Gateway {
    Gateway::start_with(Options {
        extra: format!("{}{}", schema.store_table(), opts.extra),
        ..opts
    })
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc"])
            .arg(format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0))
            .output();
    }
}
