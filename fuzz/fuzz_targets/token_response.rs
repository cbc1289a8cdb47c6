//! A token endpoint's answer to a token exchange: never a panic; only a
//! Bearer access token is accepted, neither its `Debug` form nor its audit
//! evidence shows the token, and the recorded scopes are among those asked
//! for.
#![no_main]

use countersign::upstream::delegation::exchange::read_answer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let status = [200u16, 201, 400, 401, 500][usize::from(first) % 5];
    let requested = ["repo".to_owned(), "read:org".to_owned()];
    if let Ok(t) = read_answer(status, body, 1_700_000_000_000, &requested) {
        assert!((200..300).contains(&status));
        assert!(!t.access_token.is_empty());
        if t.access_token.len() >= 8 {
            assert!(!format!("{t:?}").contains(&t.access_token));
            assert!(!t.evidence().to_string().contains(&t.access_token));
        }
        if let Some(scope) = &t.scope {
            assert!(scope.split_whitespace().all(|s| requested.iter().any(|r| r == s)));
        }
    }
});
