"""Check one exported passkey approval offline with code nobody here wrote:
py_webauthn (Duo Labs) for the WebAuthn assertion, and Trail of Bits'
rfc8785 for the statement's canonical form.

The challenge the passkey signed must be SHA-256(JCS(statement)); the
assertion must verify for the recorded origin and relying party id, with
user verification, under the public key that reviewers.toml lists for that
reviewer and credential.

usage: verify_passkey_approval.py ENTRY.json reviewers.toml
(ENTRY.json: one `approval_granted` line of `audit export --format jsonl`)
"""

import hashlib
import json
import sys
import tomllib

import rfc8785
from webauthn import verify_authentication_response
from webauthn.helpers import base64url_to_bytes

with open(sys.argv[1]) as f:
    entry = json.load(f)
with open(sys.argv[2], "rb") as f:
    reviewers = tomllib.load(f)

approval = entry["approval"]
statement = approval["statement"]
proof = approval["passkey"]
challenge = hashlib.sha256(rfc8785.dumps(statement)).digest()

keys = [
    k
    for r in reviewers.get("reviewers", [])
    if r["name"] == statement["reviewer"]
    for k in r.get("passkeys", [])
    if k["id"] == proof["credential_id"]
]
if not keys:
    sys.exit(f"credential {proof['credential_id']} is not {statement['reviewer']}'s in reviewers.toml")

verified = verify_authentication_response(
    credential={
        "id": proof["credential_id"],
        "rawId": proof["credential_id"],
        "type": "public-key",
        "response": {
            "authenticatorData": proof["authenticator_data"],
            "clientDataJSON": proof["client_data_json"],
            "signature": proof["signature"],
        },
    },
    expected_challenge=challenge,
    expected_rp_id=proof["rp_id"],
    expected_origin=proof["origin"],
    credential_public_key=base64url_to_bytes(keys[0]["public_key"]),
    credential_current_sign_count=0,
    require_user_verification=True,
)
print(
    f"verified: {statement['reviewer']} approved {statement['proposal_id']} "
    f"({statement['server']}/{statement['tool']}, {statement['call_digest']}) "
    f"with passkey {proof['credential_id']}, sign count {verified.new_sign_count}"
)
