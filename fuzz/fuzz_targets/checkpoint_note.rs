//! C2SP signed notes, checkpoints and verifier keys (read from witnesses,
//! `--checkpoint` files and exports): never a panic; a note that parses
//! renders back to the same text, and no signature verifies for a key that
//! did not make it.
#![no_main]

use countersign::audit::note::{parse_vkey, Checkpoint, Note};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_vkey(text);
    let _ = Checkpoint::parse(text);
    if let Ok(note) = Note::parse(text) {
        assert_eq!(Note::parse(&note.render()).as_ref(), Ok(&note));
        let _ = Checkpoint::parse(&note.text);
        let key = ed25519_dalek::SigningKey::from_bytes(&[1; 32]).verifying_key();
        assert!(note.verify("countersign/fuzz", &key).is_err());
        let witness = parse_vkey(&countersign::audit::note::witness_vkey("w", &key)).unwrap();
        assert!(!matches!(note.cosigned_by(&witness), Ok(Some(_))));
    }
});
