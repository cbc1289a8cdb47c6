//! The gateway's HTTP routes in process, for the fuzz targets
//! (`fuzz/fuzz_targets/console.rs`): a gateway over the memory store, with
//! the shipped policies, one reviewer and the review console on, whose
//! router is called directly (no socket). Not an interface of the product.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use http_body_util::BodyExt;

/// The routes of a gateway with its console, and an enrolment link made for
/// them (so that the enrolment routes are reached past the link's check).
pub struct Routes {
    router: axum::Router,
    /// `/review/enrol/TOKEN` of a live invitation.
    pub enrol_path: String,
}

/// The configuration: the console's origin is `http://localhost:9`.
const CONFIG: &str = r#"
[gateway]
listen = "127.0.0.1:0"
data_dir = "DATA"
policies = "POLICIES"
public_url = "http://localhost:9"

[review]
enabled = true

[[identities]]
token_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
principal = "agent-7"
tenant = "acme"
"#;

impl Routes {
    /// Build them under `dir` (which must outlive them), or say what
    /// could not be made.
    pub async fn new(dir: &Path) -> Result<Routes, String> {
        let io = |what: &'static str| move |e: std::io::Error| format!("{what}: {e}");
        let policies = dir.join("policies");
        let data = dir.join("data");
        std::fs::create_dir_all(&policies).map_err(io("a policy folder"))?;
        std::fs::create_dir_all(&data).map_err(io("a data folder"))?;
        std::fs::write(
            policies.join("default.cedar"),
            include_str!("../../policies/default.cedar"),
        )
        .map_err(io("policies"))?;
        std::fs::write(
            policies.join("schema.cedarschema"),
            include_str!("../../policies/schema.cedarschema"),
        )
        .map_err(io("schema"))?;
        let text = CONFIG
            .replace("DATA", &data.display().to_string())
            .replace("POLICIES", &policies.display().to_string());
        let config = crate::core::config::Config::parse(&text, Path::new("fuzz.toml"))
            .map_err(|e| e.to_string())?;
        let loaded = crate::cli::files::load_policies(&policies, None)
            .map_err(|e| format!("the policies: {e:?}"))?;
        let store: Arc<dyn crate::store::Store> = Arc::new(crate::store::MemoryStore::default());
        let gw = crate::front::gateway::Gateway::new(config, store, loaded, None);
        let (token, _) = crate::front::review::invite::write_invite(
            &gw.config().gateway.data_dir.join("review"),
            "fuzz",
            &["leads".to_owned()],
            &["acme".to_owned()],
            std::time::Duration::from_secs(3600),
            crate::core::time::now_ms(),
        )
        .map_err(io("an invitation"))?;
        let console = crate::front::review::console::Console::open(
            Arc::clone(&gw),
            "http://localhost:9".into(),
            "localhost".into(),
        );
        Ok(Routes {
            router: crate::front::http::router(gw, Some(console)),
            enrol_path: format!("/review/enrol/{token}"),
        })
    }

    /// Send one request; the status and the body of the answer.
    pub async fn send(&self, request: http::Request<Body>) -> (u16, Vec<u8>) {
        let response = tower::ServiceExt::oneshot(self.router.clone(), request)
            .await
            .unwrap_or_else(|e| match e {});
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default();
        (status, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The harness reaches the console: its pages answer, and junk sent to
    /// the sign-in and enrolment routes is refused with a 4xx.
    #[tokio::test]
    async fn the_routes_answer_and_refuse_junk() {
        let dir = tempfile::tempdir().unwrap();
        let routes = Routes::new(dir.path()).await.unwrap();
        let req = |method: &str, path: &str, body: &'static str| {
            http::Request::builder()
                .method(method)
                .uri(path)
                .header("origin", "http://localhost:9")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap()
        };
        let (status, _) = routes.send(req("GET", "/review/sign-in", "")).await;
        assert_eq!(status, 200);
        let (status, _) = routes.send(req("GET", &routes.enrol_path, "")).await;
        assert_eq!(status, 200, "the invitation's page");
        for path in ["/review/sign-in", routes.enrol_path.as_str()] {
            let (status, body) = routes.send(req("POST", path, "{\"id\":1}")).await;
            assert!(
                (400..500).contains(&status),
                "{path}: {status} {}",
                String::from_utf8_lossy(&body)
            );
        }
    }
}
