//! `countersign reviewer enrolled --append FILE`: a finished enrolment's
//! `[[reviewers]]` entry merged into a reviewers file. A reviewer the file
//! lists already (an ed25519 reviewer adding a passkey) gets the passkey
//! added to their entry, which keeps its groups and tenants (the file is the
//! trust root; the invitation's are said, not applied); a new reviewer's
//! entry is appended. The file's comments and layout are kept (`toml_edit`).

use anyhow::Context as _;
use toml_edit::{Array, ArrayOfTables, DocumentMut, Item, Table, Value};

/// What merging one entry did, for the operator.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Merged {
    /// A new reviewer's entry, appended.
    Added(String),
    /// The passkey added to a listed reviewer, whose entry keeps its
    /// groups and tenants; with the invitation's when they differ.
    Joined {
        name: String,
        kept: String,
        asked: Option<String>,
    },
    /// The passkey was in the entry already.
    Already(String),
}

fn list(t: &Table, key: &str) -> Vec<String> {
    t.get(key)
        .and_then(Item::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn groups_and_tenants(t: &Table) -> String {
    format!(
        "groups [{}], tenants [{}]",
        list(t, "groups").join(", "),
        list(t, "tenants").join(", ")
    )
}

/// Merge the enrolment `entry` (one `[[reviewers]]` table) into the
/// reviewers file's text `file`: the new text and what was done.
pub(crate) fn merge(file: &str, entry: &str) -> anyhow::Result<(String, Merged)> {
    let mut doc: DocumentMut = file.parse().context("the reviewers file does not parse")?;
    let new: DocumentMut = entry
        .parse()
        .context("the enrolment entry does not parse")?;
    let Some(new) = new
        .get("reviewers")
        .and_then(Item::as_array_of_tables)
        .and_then(|a| a.get(0))
        .cloned()
    else {
        anyhow::bail!("the enrolment entry holds no [[reviewers]] table");
    };
    let name = new
        .get("name")
        .and_then(Item::as_str)
        .ok_or_else(|| anyhow::anyhow!("the enrolment entry has no name"))?
        .to_owned();
    let keys: Vec<Value> = new
        .get("passkeys")
        .and_then(Item::as_array)
        .map(|a| a.iter().cloned().collect())
        .unwrap_or_default();
    if keys.is_empty() {
        anyhow::bail!("the enrolment entry of `{name}` holds no passkey");
    }
    let reviewers = doc
        .entry("reviewers")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| {
            anyhow::anyhow!("`reviewers` in the reviewers file is not [[reviewers]] tables")
        })?;
    let listed: Vec<usize> = reviewers
        .iter()
        .enumerate()
        .filter(|(_, t)| t.get("name").and_then(Item::as_str) == Some(name.as_str()))
        .map(|(i, _)| i)
        .collect();
    let merged = match listed.as_slice() {
        [] => {
            // After every table of the file (its place in the entry's own
            // text would put it among them), a blank line before it.
            let mut new = new;
            new.set_position(None);
            new.decor_mut().set_prefix("\n");
            reviewers.push(new);
            Merged::Added(name)
        }
        [i] => {
            let t = reviewers
                .get_mut(*i)
                .ok_or_else(|| anyhow::anyhow!("reviewer `{name}` vanished"))?;
            let id_of = |v: &Value| {
                v.as_inline_table()
                    .and_then(|k| k.get("id"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            let passkeys = t
                .entry("passkeys")
                .or_insert(Item::Value(Value::Array(Array::new())))
                .as_array_mut()
                .ok_or_else(|| anyhow::anyhow!("`passkeys` of reviewer `{name}` is not a list"))?;
            let have: Vec<String> = passkeys.iter().filter_map(id_of).collect();
            let mut added = false;
            for k in keys {
                if id_of(&k).is_some_and(|id| !have.contains(&id)) {
                    passkeys.push(k);
                    added = true;
                }
            }
            if !added {
                Merged::Already(name)
            } else {
                let (kept, asked) = (groups_and_tenants(t), groups_and_tenants(&new));
                Merged::Joined {
                    name,
                    asked: (asked != kept).then_some(asked),
                    kept,
                }
            }
        }
        _ => anyhow::bail!(
            "reviewer `{name}` is listed more than once in the reviewers file: make it one entry first"
        ),
    };
    Ok((doc.to_string(), merged))
}

impl std::fmt::Display for Merged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Merged::Added(n) => write!(f, "reviewer `{n}` added"),
            Merged::Already(n) => write!(
                f,
                "reviewer `{n}` has this passkey already: nothing changed"
            ),
            Merged::Joined { name, kept, asked } => {
                write!(f, "reviewer `{name}` is listed already: the passkey is added to that entry, which keeps its {kept}")?;
                if let Some(a) = asked {
                    write!(
                        f,
                        " (the invitation asked for {a}: edit the entry if those should apply)"
                    )?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE_ED25519: &str = "# who may approve\n[[reviewers]]\nname = \"alice\" # lead\ngroups = [\"finance\"]\ntenants = [\"acme\"]\npublic_key = \"ed25519:AAAA\"\n\n[[reviewers]]\nname = \"bob\"\npublic_key = \"ed25519:BBBB\"\n";

    fn enrolled(name: &str, id: &str) -> String {
        format!("[[reviewers]]\nname = \"{name}\"\ngroups = [\"leads\"]\ntenants = [\"acme\"]\npasskeys = [{{ id = \"{id}\", public_key = \"pk\", alg = \"ES256\" }}]\n")
    }

    #[test]
    fn a_listed_reviewer_gets_the_passkey_and_keeps_their_groups_and_the_files_comments() {
        let (text, merged) = merge(ALICE_ED25519, &enrolled("alice", "cred-1")).unwrap();
        assert_eq!(
            merged.to_string(),
            "reviewer `alice` is listed already: the passkey is added to that entry, which keeps its groups [finance], tenants [acme] (the invitation asked for groups [leads], tenants [acme]: edit the entry if those should apply)"
        );
        assert!(text.starts_with("# who may approve\n"), "{text}");
        assert!(text.contains("name = \"alice\" # lead"), "{text}");
        let parsed: toml::Value = toml::from_str(&text).unwrap();
        let alice = &parsed["reviewers"][0];
        assert_eq!(alice["public_key"].as_str(), Some("ed25519:AAAA"));
        assert_eq!(alice["groups"][0].as_str(), Some("finance"));
        assert_eq!(alice["passkeys"][0]["id"].as_str(), Some("cred-1"));
        assert_eq!(parsed["reviewers"].as_array().unwrap().len(), 2);
        // The same enrolment twice changes nothing.
        let (again, merged) = merge(&text, &enrolled("alice", "cred-1")).unwrap();
        assert_eq!(merged, Merged::Already("alice".into()));
        assert_eq!(again, text);
    }

    #[test]
    fn a_new_reviewer_is_appended_and_a_reviewer_listed_twice_is_refused() {
        let (text, merged) = merge(ALICE_ED25519, &enrolled("carol", "cred-2")).unwrap();
        assert_eq!(merged, Merged::Added("carol".into()), "{text}");
        let parsed: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(parsed["reviewers"][2]["name"].as_str(), Some("carol"));
        assert!(text.ends_with("\n\n[[reviewers]]\nname = \"carol\"\ngroups = [\"leads\"]\ntenants = [\"acme\"]\npasskeys = [{ id = \"cred-2\", public_key = \"pk\", alg = \"ES256\" }]\n"), "{text}");
        let (empty, _) = merge("", &enrolled("dave", "cred-3")).unwrap();
        assert!(
            toml::from_str::<toml::Value>(&empty).unwrap()["reviewers"][0]["passkeys"].is_array()
        );
        let twice = format!("{ALICE_ED25519}\n[[reviewers]]\nname = \"alice\"\n");
        assert!(merge(&twice, &enrolled("alice", "cred-1"))
            .unwrap_err()
            .to_string()
            .contains("listed more than once"));
        assert!(merge("reviewers = 3", &enrolled("alice", "c"))
            .unwrap_err()
            .to_string()
            .contains("not [[reviewers]] tables"));
    }
}
