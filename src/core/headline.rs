//! A call in plain words, from an operator's template (DESIGN.md section
//! 21): `[servers.NAME.tools.TOOL] summary = "Charge {currency} {amount} to
//! {account}"`. Each `{name}` is a top-level argument, each `{/a/b}` a JSON
//! pointer into the canonical arguments; `{{` and `}}` are braces. Values
//! are shown as the arguments carry them (a number as its JSON text, never
//! rounded), through [`crate::core::legible`]: a value with terminal or
//! bidi controls is written out, one that could pass for another is marked.
//! A template whose value is missing from a call does not apply to it: the
//! reviewer reads the gateway's own sentence instead, never a blank.

use serde_json::Value;

use super::legible;

/// A template's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    /// A JSON pointer into the arguments.
    Value(String),
}

/// Parse a template; `Err` says what is wrong with it (for the config's
/// error).
fn parse(template: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some('{') | None => {
                            return Err(format!("`{{{name}` is not closed with `}}`"))
                        }
                        Some(c) => name.push(c),
                    }
                }
                let name = name.trim();
                if name.is_empty() {
                    return Err("`{}` names no argument".into());
                }
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Value(if name.starts_with('/') {
                    name.to_owned()
                } else {
                    // A top-level name, as a pointer (RFC 6901 escapes).
                    format!("/{}", crate::core::canonical::pointer_token(name))
                }));
            }
            '}' => return Err("a `}` closes nothing (write `}}` for a brace)".into()),
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    if !parts.iter().any(|p| matches!(p, Part::Value(_))) {
        return Err("it names no argument (`{amount}`, `{/payee/name}`)".into());
    }
    Ok(parts)
}

/// Check a template (the config's load).
pub fn check(template: &str) -> Result<(), String> {
    parse(template).map(|_| ())
}

/// The template filled from `arguments`; `None` when it names a value the
/// call does not carry (or does not parse).
pub fn render(template: &str, arguments: &Value) -> Option<String> {
    let mut out = String::new();
    for part in parse(template).ok()? {
        match part {
            Part::Text(t) => out.push_str(&t),
            Part::Value(pointer) => {
                let v = arguments.pointer(&pointer)?;
                out.push_str(&match v {
                    // A string that does not display itself (a newline, a
                    // bidi override) is shown quoted and escaped.
                    Value::String(s) if legible::text(s) != s.as_str() => legible::value(v),
                    Value::String(s) => legible::marked(s.clone(), v),
                    other => legible::value(other),
                });
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_template_is_filled_with_the_values_as_the_arguments_carry_them() {
        let args = json!({"amount": 1234.5, "currency": "EUR", "account": "acct_42",
            "price": "12.50", "payee": {"name": "ACME GmbH"}});
        assert_eq!(
            render("Charge {currency} {amount} to {account}", &args).unwrap(),
            "Charge EUR 1234.5 to acct_42"
        );
        assert_eq!(
            render("{price} to {/payee/name} {{ok}}", &args).unwrap(),
            "12.50 to ACME GmbH {ok}"
        );
        // A value the call does not carry: the template does not apply.
        assert_eq!(render("Charge {amount} to {iban}", &args), None);
    }

    #[test]
    fn controls_in_a_value_are_written_out_not_obeyed() {
        let args = json!({"account": "acct_1\u{202e}24_tcca", "memo": "line\nbreak"});
        let shown = render("to {account}: {memo}", &args).unwrap();
        assert!(
            !shown.contains('\u{202e}') && !shown.contains('\n'),
            "{shown}"
        );
        // Quoted and escaped, as JSON writes it.
        assert_eq!(shown, r#"to "acct_1\u202e24_tcca": "line\nbreak""#);
    }

    #[test]
    fn a_bad_template_is_refused_precisely() {
        assert!(check("Charge {amount").unwrap_err().contains("not closed"));
        assert!(check("Charge {} now")
            .unwrap_err()
            .contains("names no argument"));
        assert!(check("Charge } now {amount}")
            .unwrap_err()
            .contains("closes nothing"));
        assert!(check("Charge it")
            .unwrap_err()
            .contains("names no argument"));
        assert!(check("Charge {amount} {{literal}}").is_ok());
    }
}
