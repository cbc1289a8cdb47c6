//! The facts of one call as Cedar sees them: its entities (the principal
//! with its groups, the tool with its annotations and definition) and its
//! context.

use super::*;

/// The facts of one call.
pub struct Call<'a> {
    /// Who asks.
    pub identity: &'a Identity,
    /// The server.
    pub server: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The tool's effective annotations.
    pub annotations: Annotations,
    /// The listed definition is not the pinned one (DESIGN.md section 12).
    pub definition_changed: bool,
    /// Canonical arguments.
    pub arguments: &'a Value,
    /// `call_digest`.
    pub digest: &'a str,
    /// The resource version, when known.
    pub resource_version: Option<&'a str>,
    /// The budgets the call falls under, as they stand with it
    /// (`context.budgets.NAME`, DESIGN.md section 25).
    pub budgets: Option<&'a [crate::core::guard::Spending]>,
}

/// The context of `Action::"call"` (and `confirm`): `{ arguments, tenant,
/// callDigest, approved, resourceVersion? }`.
pub(super) fn call_context(
    call: &Call<'_>,
    arguments: RestrictedExpression,
    approved: bool,
) -> Result<Context, String> {
    let mut pairs = vec![
        ("arguments".to_owned(), arguments),
        (
            "tenant".to_owned(),
            RestrictedExpression::new_string(call.identity.tenant.clone()),
        ),
        (
            "callDigest".to_owned(),
            RestrictedExpression::new_string(call.digest.to_owned()),
        ),
        (
            "approved".to_owned(),
            RestrictedExpression::new_bool(approved),
        ),
    ];
    if let Some(v) = call.resource_version {
        pairs.push((
            "resourceVersion".to_owned(),
            RestrictedExpression::new_string(v.to_owned()),
        ));
    }
    if let Some(b) = call.budgets.filter(|b| !b.is_empty()) {
        pairs.push(("budgets".to_owned(), crate::core::guard::cedar_budgets(b)?));
    }
    Context::from_pairs(pairs).map_err(|e| e.to_string())
}

pub(super) fn uid(kind: &str, id: &str) -> Result<EntityUid, String> {
    // The id is quoted as a Cedar string literal (JSON escaping is a subset).
    let text = format!("{kind}::{}", Value::String(id.to_owned()));
    EntityUid::from_str(&text).map_err(|e| format!("entity `{text}`: {e}"))
}

pub(super) fn entities(call: &Call<'_>) -> Result<(Entities, EntityUid, EntityUid), String> {
    let tenant = uid("Tenant", &call.identity.tenant)?;
    let server = uid("Server", call.server)?;
    let mut parents = HashSet::from([tenant.clone()]);
    let mut list = vec![
        Entity::new_no_attrs(tenant, HashSet::new()),
        Entity::new_no_attrs(server.clone(), HashSet::new()),
    ];
    for g in &call.identity.groups {
        let group = uid("Group", g)?;
        parents.insert(group.clone());
        list.push(Entity::new_no_attrs(group, HashSet::new()));
    }
    let principal = uid("Principal", &call.identity.principal)?;
    // The token's scopes and OAuth client, for policies that name them
    // (optional in the schema: a schema without them still validates).
    let mut principal_attrs = HashMap::from([(
        "scopes".to_owned(),
        RestrictedExpression::new_set(
            call.identity
                .scopes
                .iter()
                .map(|s| RestrictedExpression::new_string(s.clone())),
        ),
    )]);
    if let Some(client) = &call.identity.client {
        principal_attrs.insert(
            "client".to_owned(),
            RestrictedExpression::new_string(client.clone()),
        );
    }
    list.push(Entity::new(principal.clone(), principal_attrs, parents).map_err(|e| e.to_string())?);
    let tool = uid("Tool", &format!("{}/{}", call.server, call.tool))?;
    let a = call.annotations;
    let attrs = HashMap::from([
        (
            "readOnly".to_owned(),
            RestrictedExpression::new_bool(a.read_only),
        ),
        (
            "destructive".to_owned(),
            RestrictedExpression::new_bool(a.destructive),
        ),
        (
            "idempotent".to_owned(),
            RestrictedExpression::new_bool(a.idempotent),
        ),
        (
            "openWorld".to_owned(),
            RestrictedExpression::new_bool(a.open_world),
        ),
        (
            "definitionChanged".to_owned(),
            RestrictedExpression::new_bool(call.definition_changed),
        ),
    ]);
    list.push(
        Entity::new(tool.clone(), attrs, HashSet::from([server])).map_err(|e| e.to_string())?,
    );
    let entities = Entities::from_entities(list, None).map_err(|e| e.to_string())?;
    Ok((entities, principal, tool))
}
