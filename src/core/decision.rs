//! The policy decision point (DESIGN.md section 4), on Cedar.
//!
//! Pure: the policy folder is read by the caller ([`PolicySources`]); the
//! decision itself is a synchronous function of the policies, the identity,
//! the tool's effective annotations and the canonical arguments.
//!
//! Two phases: evaluate with `approved = false`; Allow → run unattended.
//! Otherwise evaluate with `approved = true`; Allow → a human approval is
//! required; otherwise → `policy_denied`. Default deny. A Cedar evaluation
//! error denies (Cedar skips an erroring policy, which for a `forbid` would
//! fail open), and so does an argument that cannot be mapped.
//!
//! Arguments become Cedar values as [`crate::core::arguments`] says: typed
//! by the policy schema where it declares them, and a value that does not
//! fit its declared type denies the call with the field named.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use cedar_policy::{
    Authorizer, Context, Decision as CedarDecision, Entities, Entity, EntityUid, PolicyId,
    PolicySet, Request, RestrictedExpression, Schema, ValidationMode, Validator,
};
use serde_json::Value;

use crate::core::annotations::Annotations;
use crate::core::arguments::{check_typed, declared, map_value, typed_value, ArgType, At};
use crate::core::identity::Identity;

mod cache;
mod entities;
mod load;
mod slice;

use cache::{entity_key, CachedEntities, ENTITY_CACHE_MAX};
pub use entities::Call;
use entities::{call_context, entities, uid};
use load::{line_col, located, quorum_of, sources_digest};
use slice::{reads_call_context_in, Index, Slice};

/// What the policies say about a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run without a human.
    Allow {
        /// Determining policies (for the audit log only).
        policies: Vec<String>,
    },
    /// Run only with a human approval.
    Approval {
        /// Determining policies (for the audit log only).
        policies: Vec<String>,
    },
    /// Never run.
    Deny {
        /// Determining policies, if a `forbid` matched.
        policies: Vec<String>,
        /// Evaluation or mapping errors that caused a deny.
        errors: Vec<String>,
    },
}

impl std::fmt::Display for Decision {
    /// For log lines: `allow by read-only`, `approval by writes-need-approval`,
    /// `deny by charge-ceiling`, `deny: no policy permits it`,
    /// `deny: <errors>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (word, policies) = match self {
            Decision::Allow { policies } => ("allow", policies),
            Decision::Approval { policies } => ("approval", policies),
            Decision::Deny { policies, errors } => {
                if !errors.is_empty() {
                    return write!(f, "deny: {}", errors.join("; "));
                }
                ("deny", policies)
            }
        };
        if policies.is_empty() {
            match self {
                Decision::Deny { .. } => write!(f, "deny: no policy permits it"),
                _ => write!(f, "{word}"),
            }
        } else {
            write!(f, "{word} by {}", policies.join(", "))
        }
    }
}

/// A problem in the policy folder, with its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{}:{l}:{c}: {}", self.file.display(), self.message),
            (Some(l), None) => write!(f, "{}:{l}: {}", self.file.display(), self.message),
            _ => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

/// The loaded, validated policy set.
#[derive(Debug)]
pub struct Policies {
    set: PolicySet,
    schema: Option<Schema>,
    /// Policy id → file it came from.
    origin: HashMap<String, PathBuf>,
    /// The policies that can apply to `Action::"call"` on a tool, by scope.
    index: Index,
    /// Per-tool slices built from the index on first use.
    slices: parking_lot::Mutex<HashMap<String, std::sync::Arc<Slice>>>,
    /// Decisions of slices that read nothing of a call's own context, per
    /// (identity, tool, annotations): the same inputs give the same
    /// decision, so Cedar is asked once. Exact: the key holds everything
    /// the entities are built from, and a policy reload makes a new
    /// `Policies` (a new, empty cache).
    decision_cache: parking_lot::Mutex<HashMap<String, Decision>>,
    /// How many times Cedar was asked (for tests and benches).
    evaluations: std::sync::atomic::AtomicU64,
    /// Entities per (identity, tool, annotations): building them (with
    /// Cedar's transitive closure) was a third of a decision's time.
    entity_cache: parking_lot::Mutex<HashMap<String, CachedEntities>>,
    /// Some policy may read `context.budgets` (its text names `budgets`;
    /// conservative): only then is a call's budget read before its decision.
    reads_budgets: bool,
    /// `reviewers.toml`: who may decide proposals, loaded and reloaded with
    /// the policies (both live in the policy repository).
    reviewers: crate::core::reviewers::Reviewers,
    /// The declared type of `context.arguments`, per action.
    arguments: ArgumentTypes,
    /// What each policy with quorum annotations asks of reviewers
    /// (`@approvals`, `@approvals_from`, `@denials`), by policy id.
    quorums: HashMap<String, crate::core::approval::Quorum>,
    /// `sha256:` of the policy set: its files, schema and reviewers.
    digest: String,
}

/// The argument types a schema declares for the two actions.
#[derive(Debug, Clone, Default)]
struct ArgumentTypes {
    call: Option<ArgType>,
    approve: Option<ArgType>,
    confirm: Option<ArgType>,
}

/// The `arguments` of a context: typed where the schema declares a type.
fn context_arguments(
    ty: Option<&ArgType>,
    v: &Value,
) -> Result<Option<RestrictedExpression>, String> {
    match ty {
        Some(t) => typed_value(v, t, &At::Root),
        None => map_value(v, &At::Root),
    }
}

/// The schema file in the policy folder.
pub const SCHEMA_FILE: &str = "schema.cedarschema";

/// The text of a policy folder, as read from disk: the `*.cedar` files in
/// name order, `schema.cedarschema` and `reviewers.toml` when present, and
/// the files that could not be read. The reading is the caller's (an I/O
/// layer's); [`Policies::from_sources`] only parses.
#[derive(Debug, Clone, Default)]
pub struct PolicySources {
    /// The folder (for messages).
    pub dir: PathBuf,
    /// `*.cedar` files and their text.
    pub policies: Vec<(PathBuf, String)>,
    /// `schema.cedarschema`, if there is one.
    pub schema: Option<String>,
    /// `reviewers.toml`, if there is one (none: nothing can be approved).
    pub reviewers: Option<String>,
    /// Where the reviewers were read from (for messages): `reviewers.toml`
    /// in the folder, or `approvals.reviewers`.
    pub reviewers_path: Option<PathBuf>,
    /// Files that exist but could not be read: each refuses the whole set.
    pub unreadable: Vec<PolicyError>,
}

impl Policies {
    /// Parse a policy folder's files (read by the caller: see
    /// [`PolicySources`]), give each policy the id `FILE/ID` (`@id("...")`
    /// or its position), and validate against the schema when there is one.
    /// Any error refuses the whole set: a policy set is used whole or not
    /// at all. Pure: no file is read here.
    pub fn from_sources(src: &PolicySources) -> Result<Policies, Vec<PolicyError>> {
        let dir = &src.dir;
        let mut errors = src.unreadable.clone();
        let mut quorums = HashMap::new();
        let mut set = PolicySet::new();
        let mut origin = HashMap::new();
        let mut sources = HashMap::new();
        for (file, text) in &src.policies {
            let parsed = match PolicySet::from_str(text) {
                Ok(p) => p,
                Err(e) => {
                    for d in e.iter() {
                        errors.push(located(file, text, d, d.to_string()));
                    }
                    continue;
                }
            };
            let stem = file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            for (i, p) in parsed.policies().enumerate() {
                let name = p
                    .annotation("id")
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("policy{i}"));
                let id = format!("{stem}/{name}");
                match quorum_of(p) {
                    Ok(Some(q)) => {
                        quorums.insert(id.clone(), q);
                    }
                    Ok(None) => {}
                    Err(message) => errors.push(PolicyError {
                        file: file.clone(),
                        line: None,
                        column: None,
                        message: format!("policy `{id}`: {message}"),
                    }),
                }
                if let Err(e) = set.add(p.new_id(PolicyId::new(&id))) {
                    errors.push(PolicyError {
                        file: file.clone(),
                        line: None,
                        column: None,
                        message: format!("policy `{id}`: {e}"),
                    });
                }
                origin.insert(id, file.clone());
            }
            sources.insert(file.clone(), text.as_str());
        }
        let schema_path = dir.join(SCHEMA_FILE);
        let schema = match &src.schema {
            Some(text) => match Schema::from_cedarschema_str(text) {
                Ok((s, _warnings)) => Some(s),
                Err(e) => {
                    errors.push(located(&schema_path, text, &e, e.to_string()));
                    None
                }
            },
            None => None,
        };
        if let Some(schema) = &schema {
            let result = Validator::new(schema.clone()).validate(&set, ValidationMode::Strict);
            for e in result.validation_errors() {
                let id = e.policy_id().to_string();
                let file = origin.get(&id).cloned().unwrap_or_else(|| dir.to_owned());
                let text = sources.get(&file).copied().unwrap_or("");
                errors.push(located(&file, text, e, format!("policy `{id}`: {e}")));
            }
        }
        let reviewers_path = src
            .reviewers_path
            .clone()
            .unwrap_or_else(|| dir.join(crate::core::reviewers::REVIEWERS_FILE));
        let reviewers = match &src.reviewers {
            Some(text) => match crate::core::reviewers::Reviewers::parse(text) {
                Ok(r) => r,
                Err((span, message)) => {
                    let (line, column) = match span {
                        Some(s) => {
                            let (l, c) = line_col(text, s.start);
                            (Some(l), Some(c))
                        }
                        None => (None, None),
                    };
                    errors.push(PolicyError {
                        file: reviewers_path.clone(),
                        line,
                        column,
                        message,
                    });
                    Default::default()
                }
            },
            // No file: no reviewers, so nothing can be approved (fail closed).
            None => Default::default(),
        };
        // The argument types the schema declares, per action (section 12).
        let mut types = |action: &str| match src.schema.as_deref().map(|t| declared(t, action)) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                errors.push(PolicyError {
                    file: schema_path.clone(),
                    line: None,
                    column: None,
                    message: format!("argument types of `{action}`: {e}"),
                });
                None
            }
            None => None,
        };
        let arguments = ArgumentTypes {
            call: types("call"),
            approve: types("approve"),
            confirm: types("confirm"),
        };
        if errors.is_empty() {
            let index = Index::build(&set);
            let reads_budgets = set.policies().any(|p| p.to_string().contains("budgets"));
            Ok(Policies {
                reads_budgets,
                set,
                schema,
                origin,
                index,
                slices: Default::default(),
                decision_cache: Default::default(),
                evaluations: Default::default(),
                entity_cache: Default::default(),
                reviewers,
                arguments,
                quorums,
                digest: sources_digest(src),
            })
        } else {
            Err(errors)
        }
    }

    /// No policies: every call is denied (default deny).
    pub fn empty() -> Policies {
        Policies {
            reads_budgets: false,
            set: PolicySet::new(),
            schema: None,
            origin: HashMap::new(),
            index: Index::default(),
            slices: Default::default(),
            decision_cache: Default::default(),
            evaluations: Default::default(),
            entity_cache: Default::default(),
            reviewers: Default::default(),
            arguments: ArgumentTypes::default(),
            quorums: HashMap::new(),
            digest: sources_digest(&PolicySources::default()),
        }
    }

    /// A policy's own words for why it asks (`@reason("...")`), by its id
    /// (`FILE/ID`), for reviewers.
    pub fn reason_of(&self, id: &str) -> Option<String> {
        self.set
            .policy(&PolicyId::new(id))
            .and_then(|p| p.annotation("reason"))
            .map(str::to_owned)
    }

    /// Whether some policy may read `context.budgets`.
    pub fn reads_budgets(&self) -> bool {
        self.reads_budgets
    }

    /// `sha256:` of the policy set in force: every `*.cedar` file (by file
    /// name), the schema and the reviewers file. Approval statements name
    /// it, so the evidence says which rules a reviewer approved under; two
    /// gateways with the same files agree on it.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// What the policies that asked for approval (`policies`, the
    /// determining permits of a [`Decision::Approval`]) ask of reviewers:
    /// the strictest of their quorum annotations, one reviewer without any.
    pub fn quorum(&self, policies: &[String]) -> crate::core::approval::Quorum {
        policies
            .iter()
            .filter_map(|id| self.quorums.get(id))
            .fold(crate::core::approval::Quorum::default(), |q, p| {
                q.strictest(p)
            })
    }

    /// The reviewers of `reviewers.toml`.
    pub fn reviewers(&self) -> &crate::core::reviewers::Reviewers {
        &self.reviewers
    }

    /// How many policies are loaded.
    pub fn len(&self) -> usize {
        self.set.policies().count()
    }

    /// Whether no policy is loaded (then everything is denied).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a schema was loaded and the policies validated against it.
    pub fn validated(&self) -> bool {
        self.schema.is_some()
    }

    /// The file a policy came from.
    pub fn origin(&self, id: &str) -> Option<&Path> {
        self.origin.get(id).map(PathBuf::as_path)
    }

    /// Decide a call (section 4's two phases).
    pub fn decide(&self, call: &Call<'_>) -> Decision {
        let slice = self.slice(call.server, call.tool);
        if slice.reads_call_context {
            return self.decide_against(&slice.set, call);
        }
        // A value that does not fit the schema's argument types denies,
        // whatever the policies read: checked on every call (without
        // building the values; the untyped mapping of the rest cannot fail).
        let fits = self
            .arguments
            .call
            .as_ref()
            .map(|t| check_typed(call.arguments, t));
        if let Some(Err(e)) = fits {
            return Decision::Deny {
                policies: Vec::new(),
                errors: vec![e],
            };
        }
        let key = entity_key(call);
        if let Some(d) = self.decision_cache.lock().get(&key) {
            return d.clone();
        }
        let decision = self.decide_against(&slice.set, call);
        let mut cache = self.decision_cache.lock();
        if cache.len() >= ENTITY_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, decision.clone());
        decision
    }

    /// How many times Cedar was asked to authorize a call so far (a
    /// decision asks once or twice: unattended, then approved).
    pub fn evaluations(&self) -> u64 {
        self.evaluations.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The policies that can apply to a call of `server/tool`.
    fn slice(&self, server: &str, tool: &str) -> std::sync::Arc<Slice> {
        // Length-prefixed, so no two (server, tool) pairs share a key; the
        // Cedar uid is built only for a pair not seen yet.
        let mut key = String::with_capacity(server.len() + tool.len() + 8);
        key.push_str(itoa::Buffer::new().format(server.len()));
        key.push(':');
        key.push_str(server);
        key.push_str(tool);
        let mut slices = self.slices.lock();
        if let Some(s) = slices.get(&key) {
            return s.clone();
        }
        let tool_uid = uid("Tool", &format!("{server}/{tool}"))
            .map(|u| u.to_string())
            .unwrap_or_default();
        let server_uid = uid("Server", server)
            .map(|u| u.to_string())
            .unwrap_or_default();
        let mut set = PolicySet::new();
        let parts = self
            .index
            .global
            .iter()
            .chain(self.index.by_server.get(&server_uid).into_iter().flatten())
            .chain(self.index.by_tool.get(&tool_uid).into_iter().flatten());
        let mut reads_call_context = false;
        for p in parts {
            reads_call_context |= reads_call_context_in(&p.to_string());
            // Ids are unique in the full set, so adding cannot collide.
            let _ = set.add(p.clone());
        }
        let slice = std::sync::Arc::new(Slice {
            set,
            reads_call_context,
        });
        // One slice per tool ever called.
        slices.insert(key, slice.clone());
        slice
    }

    fn entities_for(&self, call: &Call<'_>) -> Result<CachedEntities, String> {
        let key = entity_key(call);
        let mut cache = self.entity_cache.lock();
        if let Some(e) = cache.get(&key) {
            return Ok(e.clone());
        }
        let built = std::sync::Arc::new(entities(call)?);
        if cache.len() >= ENTITY_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, built.clone());
        Ok(built)
    }

    /// The groups that policies about `Action::"approve"` name
    /// (`Group::"leads"`), sorted: what a refused reviewer may be missing.
    /// Textual, for the refusal's wording only; never for a decision.
    pub fn approve_groups(&self) -> Vec<String> {
        let mut groups = std::collections::BTreeSet::new();
        for p in self.set.policies() {
            let text = p.to_string();
            if !text.contains("Action::\"approve\"") {
                continue;
            }
            for part in text.split("Group::\"").skip(1) {
                if let Some(name) = part.split('"').next().filter(|n| !n.is_empty()) {
                    groups.insert(name.to_owned());
                }
            }
        }
        groups.into_iter().collect()
    }

    /// May `reviewer` (with `groups`) approve this call of `requester`?
    /// (`Action::"approve"`, DESIGN.md section 4). Default deny, errors deny.
    pub fn may_approve(
        &self,
        reviewer: &str,
        groups: &[String],
        call: &Call<'_>,
    ) -> Result<(), Decision> {
        let deny = |errors: Vec<String>| Decision::Deny {
            policies: Vec::new(),
            errors,
        };
        let build = || -> Result<(Entities, EntityUid, EntityUid), String> {
            let mut list = Vec::new();
            let mut parents = HashSet::new();
            for g in groups {
                let group = uid("Group", g)?;
                parents.insert(group.clone());
                list.push(Entity::new_no_attrs(group, HashSet::new()));
            }
            let principal = uid("Reviewer", reviewer)?;
            let attrs = HashMap::from([(
                "name".to_owned(),
                RestrictedExpression::new_string(reviewer.to_owned()),
            )]);
            list.push(Entity::new(principal.clone(), attrs, parents).map_err(|e| e.to_string())?);
            let (tool_entities, _, tool) = entities(call)?;
            let mut all: Vec<Entity> = tool_entities.iter().cloned().collect();
            all.extend(list);
            Ok((
                Entities::from_entities(all, None).map_err(|e| e.to_string())?,
                principal,
                tool,
            ))
        };
        let (entities, principal, resource) = build().map_err(|e| deny(vec![e]))?;
        let arguments = match context_arguments(self.arguments.approve.as_ref(), call.arguments)
            .map_err(|e| deny(vec![e]))?
        {
            Some(a) => a,
            None => RestrictedExpression::new_record([]).map_err(|e| deny(vec![e.to_string()]))?,
        };
        let context = Context::from_pairs([
            (
                "requester".to_owned(),
                RestrictedExpression::new_string(call.identity.principal.clone()),
            ),
            (
                "tenant".to_owned(),
                RestrictedExpression::new_string(call.identity.tenant.clone()),
            ),
            ("arguments".to_owned(), arguments),
        ])
        .map_err(|e| deny(vec![e.to_string()]))?;
        let action =
            EntityUid::from_str(r#"Action::"approve""#).map_err(|e| deny(vec![e.to_string()]))?;
        let request = Request::new(principal, action, resource, context, None)
            .map_err(|e| deny(vec![e.to_string()]))?;
        self.authorize(&request, &entities).map(|_| ())
    }

    /// One authorization against the whole set: `Ok` with the permitting
    /// policies, or the denial with its policies and errors. An erroring
    /// policy is skipped by Cedar; a skipped `forbid` would fail open, so
    /// any error denies.
    fn authorize(&self, request: &Request, entities: &Entities) -> Result<Vec<String>, Decision> {
        let response = Authorizer::new().is_authorized(request, &self.set, entities);
        let errors: Vec<String> = response
            .diagnostics()
            .errors()
            .map(|e| e.to_string())
            .collect();
        let policies: Vec<String> = response
            .diagnostics()
            .reason()
            .map(ToString::to_string)
            .collect();
        if errors.is_empty() && response.decision() == CedarDecision::Allow {
            Ok(policies)
        } else {
            Err(Decision::Deny { policies, errors })
        }
    }

    /// May the requester answer this call's approval themselves, in the
    /// client? (`Action::"confirm"`, DESIGN.md section 14: principal the
    /// requester, resource the tool, context the call's, with `approved`
    /// false.) `Ok` names the permitting policies. Default deny, errors deny.
    pub fn may_confirm(&self, call: &Call<'_>) -> Result<Vec<String>, Decision> {
        let deny = |errors: Vec<String>| Decision::Deny {
            policies: Vec::new(),
            errors,
        };
        let arguments = match context_arguments(self.arguments.confirm.as_ref(), call.arguments)
            .map_err(|e| deny(vec![e]))?
        {
            Some(a) => a,
            None => RestrictedExpression::new_record([]).map_err(|e| deny(vec![e.to_string()]))?,
        };
        let (entities, principal, resource) = entities(call).map_err(|e| deny(vec![e]))?;
        let context = call_context(call, arguments, false).map_err(|e| deny(vec![e]))?;
        let action =
            EntityUid::from_str(r#"Action::"confirm""#).map_err(|e| deny(vec![e.to_string()]))?;
        let request = Request::new(principal, action, resource, context, None)
            .map_err(|e| deny(vec![e.to_string()]))?;
        self.authorize(&request, &entities)
    }

    /// Decide against every policy, unsliced (for the benchmark and tests).
    pub fn decide_unsliced(&self, call: &Call<'_>) -> Decision {
        self.decide_against(&self.set, call)
    }

    fn decide_against(&self, set: &PolicySet, call: &Call<'_>) -> Decision {
        let arguments = match context_arguments(self.arguments.call.as_ref(), call.arguments) {
            Ok(Some(a)) => a,
            Ok(None) => RestrictedExpression::new_record([])
                .unwrap_or_else(|_| RestrictedExpression::new_bool(false)),
            Err(e) => {
                return Decision::Deny {
                    policies: Vec::new(),
                    errors: vec![e],
                }
            }
        };
        let cached = match self.entities_for(call) {
            Ok(x) => x,
            Err(e) => {
                return Decision::Deny {
                    policies: Vec::new(),
                    errors: vec![e],
                }
            }
        };
        let (entities, principal, resource) = (&cached.0, &cached.1, &cached.2);
        let Ok(action) = EntityUid::from_str(r#"Action::"call""#) else {
            return Decision::Deny {
                policies: Vec::new(),
                errors: vec!["internal: action uid".into()],
            };
        };
        let run = |approved: bool| -> Result<(bool, Vec<String>), Vec<String>> {
            let context = call_context(call, arguments.clone(), approved).map_err(|e| vec![e])?;
            let request = Request::new(
                principal.clone(),
                action.clone(),
                resource.clone(),
                context,
                None,
            )
            .map_err(|e| vec![e.to_string()])?;
            self.evaluations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let response = Authorizer::new().is_authorized(&request, set, entities);
            let errors: Vec<String> = response
                .diagnostics()
                .errors()
                .map(|e| e.to_string())
                .collect();
            if !errors.is_empty() {
                // An erroring policy is skipped by Cedar; a skipped `forbid`
                // would fail open, so any error denies.
                return Err(errors);
            }
            let reasons = response
                .diagnostics()
                .reason()
                .map(ToString::to_string)
                .collect();
            Ok((response.decision() == CedarDecision::Allow, reasons))
        };
        match run(false) {
            Err(errors) => Decision::Deny {
                policies: Vec::new(),
                errors,
            },
            Ok((true, policies)) => Decision::Allow { policies },
            Ok((false, _)) => match run(true) {
                Err(errors) => Decision::Deny {
                    policies: Vec::new(),
                    errors,
                },
                Ok((true, policies)) => Decision::Approval { policies },
                Ok((false, policies)) => Decision::Deny {
                    policies,
                    errors: Vec::new(),
                },
            },
        }
    }
}

#[cfg(test)]
mod tests;
