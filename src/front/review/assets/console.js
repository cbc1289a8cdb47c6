// countersign review console: WebAuthn only. Every page works as plain HTML;
// this script runs the passkey ceremonies and posts their results. No inline
// script anywhere (the console's Content-Security-Policy forbids it).
"use strict";

const b64u = {
  enc(buf) {
    const bytes = new Uint8Array(buf);
    let s = "";
    for (const b of bytes) s += String.fromCharCode(b);
    return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  },
  dec(text) {
    const s = atob(text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4));
    return Uint8Array.from(s, (c) => c.charCodeAt(0));
  },
};

function status(text, ok) {
  const el = document.querySelector('[data-role="status"]');
  if (el) {
    el.textContent = text;
    el.className = ok ? "ok" : "error";
  }
}

function csrf() {
  const m = document.querySelector('meta[name="csrf-token"]');
  return m ? m.content : "";
}

async function post(url, body) {
  const resp = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json", "x-csrf-token": csrf() },
    body: body === undefined ? "{}" : JSON.stringify(body),
  });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    throw new Error((data.error && data.error.message) || "HTTP " + resp.status);
  }
  return data;
}

function assertionOf(cred) {
  return {
    credential_id: b64u.enc(cred.rawId),
    authenticator_data: b64u.enc(cred.response.authenticatorData),
    client_data_json: b64u.enc(cred.response.clientDataJSON),
    signature: b64u.enc(cred.response.signature),
  };
}

async function getAssertion(o) {
  const cred = await navigator.credentials.get({
    publicKey: {
      challenge: b64u.dec(o.challenge),
      rpId: o.rpId,
      timeout: o.timeout,
      userVerification: o.userVerification,
      allowCredentials: (o.allowCredentials || []).map((c) => ({ type: "public-key", id: b64u.dec(c.id) })),
    },
  });
  return assertionOf(cred);
}

async function signIn() {
  status("Waiting for your passkey…", true);
  const o = await post("/review/sign-in/options");
  const done = await post("/review/sign-in", await getAssertion(o));
  location.assign(done.redirect || "/review/");
}

async function enrol() {
  status("Waiting for your device…", true);
  const path = location.pathname.replace(/\/$/, "");
  const o = await post(path + "/options");
  const cred = await navigator.credentials.create({
    publicKey: {
      challenge: b64u.dec(o.challenge),
      rp: o.rp,
      user: { id: b64u.dec(o.user.id), name: o.user.name, displayName: o.user.displayName },
      pubKeyCredParams: o.pubKeyCredParams,
      authenticatorSelection: o.authenticatorSelection,
      attestation: o.attestation,
      timeout: o.timeout,
      extensions: o.extensions,
    },
  });
  const ext = cred.getClientExtensionResults ? cred.getClientExtensionResults() : {};
  const done = await post(path, {
    credential_id: b64u.enc(cred.rawId),
    client_data_json: b64u.enc(cred.response.clientDataJSON),
    attestation_object: b64u.enc(cred.response.attestationObject),
    resident_key: ext.credProps && typeof ext.credProps.rk === "boolean" ? ext.credProps.rk : null,
  });
  document.querySelector('[data-role="reviewer-entry"]').textContent = done.entry;
  // Finished: the link is used up, so nothing is left to press.
  const button = document.querySelector('[data-action="enrol"]');
  if (button) button.remove();
  status("Enrolled. Add the entry below to reviewers.toml; the passkey counts once it is there.", true);
}

async function decide(verdict) {
  const form = document.querySelector("form.decide");
  const id = form.dataset.proposal;
  const reason = form.querySelector('[name="reason"]').value;
  const ttl = form.querySelector('[name="ttl"]').value;
  status("Waiting for your passkey…", true);
  const s = await post("/review/p/" + encodeURIComponent(id) + "/statement", { decision: verdict, reason, ttl });
  const assertion = await getAssertion(s);
  const done = await post("/review/p/" + encodeURIComponent(id) + "/decide", { statement: s.statement, assertion });
  status(done.message, true);
  if (done.state && done.state !== "pending") {
    // Decided: no control is left to press; the reload shows who decided.
    form.remove();
    const state = document.querySelector('[data-role="state"]');
    if (state) state.textContent = done.state;
  }
  setTimeout(() => location.reload(), 1500);
}

async function withdraw() {
  const id = document.querySelector("form.decide").dataset.proposal;
  const done = await post("/review/p/" + encodeURIComponent(id) + "/withdraw");
  status(done.message, true);
  setTimeout(() => location.reload(), 1500);
}

const actions = {
  "sign-in": signIn,
  enrol: enrol,
  approve: () => decide("approve"),
  deny: () => decide("deny"),
  withdraw: withdraw,
};

document.addEventListener("click", (ev) => {
  const el = ev.target.closest("[data-action]");
  const run = el && el.tagName === "BUTTON" && el.type === "button" && actions[el.dataset.action];
  if (!run) return;
  ev.preventDefault();
  if (!window.PublicKeyCredential && el.dataset.action !== "withdraw") {
    status("This browser offers no passkeys: use one that does, or the countersign CLI.", false);
    return;
  }
  el.disabled = true;
  run().catch((e) => status(e.message || String(e), false)).finally(() => { el.disabled = false; });
});

// Times: the page says UTC; the reviewer's own zone goes in front of it.
for (const t of document.querySelectorAll('time[data-role="time"]')) {
  const d = new Date(t.getAttribute("datetime"));
  if (!Number.isNaN(d.getTime())) {
    t.textContent = d.toLocaleString() + " (" + t.getAttribute("datetime") + ")";
  }
}
