//! The entity sets kept per identity and tool: a call's principal and tool
//! entities are built once for what they are made of, not on every call.
use super::*;

pub(super) type CachedEntities = std::sync::Arc<(Entities, EntityUid, EntityUid)>;

/// What a call's entities are built from (`entities`), as a cache key.
pub(super) fn entity_key(call: &Call<'_>) -> String {
    let a = call.annotations;
    // A JSON array (unambiguous), serialized from the fields as they are:
    // no `Value` is built on the hot path.
    serde_json::to_string(&(
        &call.identity.principal,
        &call.identity.tenant,
        &call.identity.groups,
        &call.identity.scopes,
        &call.identity.client,
        call.server,
        call.tool,
        [
            a.read_only,
            a.destructive,
            a.idempotent,
            a.open_world,
            call.definition_changed,
        ],
    ))
    .unwrap_or_default()
}

/// Most cached entity sets before the cache starts over.
pub(super) const ENTITY_CACHE_MAX: usize = 4096;
