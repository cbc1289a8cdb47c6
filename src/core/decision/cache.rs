//! The entity sets kept per identity and tool: a call's principal and tool
//! entities are built once for what they are made of, not on every call.
use super::*;

pub(super) type CachedEntities = std::sync::Arc<(Entities, EntityUid, EntityUid)>;

/// What a call's entities are built from (`entities`), as a cache key:
/// each text length-prefixed and each list count-prefixed, so no two
/// different sets of inputs share a key (a group named `a,b` is not the
/// groups `a` and `b`; no client is not an empty client). Written by hand:
/// serializing a tuple cost as much as the rest of a cached decision.
pub(super) fn entity_key(call: &Call<'_>) -> String {
    fn text(key: &mut String, t: &str) {
        key.push_str(itoa::Buffer::new().format(t.len()));
        key.push(':');
        key.push_str(t);
    }
    fn list(key: &mut String, items: &[String]) {
        key.push_str(itoa::Buffer::new().format(items.len()));
        key.push('#');
        for t in items {
            text(key, t);
        }
    }
    let id = call.identity;
    let a = call.annotations;
    let mut key = String::with_capacity(96);
    text(&mut key, &id.principal);
    text(&mut key, &id.tenant);
    list(&mut key, &id.groups);
    list(&mut key, &id.scopes);
    match &id.client {
        Some(c) => {
            key.push('+');
            text(&mut key, c);
        }
        None => key.push('-'),
    }
    text(&mut key, call.server);
    text(&mut key, call.tool);
    for flag in [
        a.read_only,
        a.destructive,
        a.idempotent,
        a.open_world,
        call.definition_changed,
    ] {
        key.push(if flag { '1' } else { '0' });
    }
    key
}

/// Most cached entity sets before the cache starts over.
pub(super) const ENTITY_CACHE_MAX: usize = 4096;
