// Drives the review console in Debian's Chromium with Playwright
// (playwright-core, nobody here wrote either) and a CDP virtual authenticator
// (ctap2, internal, resident keys, user verification): a real browser doing
// the real WebAuthn ceremonies against the real gateway.
//
// usage: node console_browser.mjs PLAN_JSON
// (run with .ci/cache/browser as the working directory, where
// .ci/setup-peers installs playwright-core)
//
// The plan: { "state": FILE, "base": "http://localhost:PORT", "steps": [...] }.
// `state` keeps the authenticator's credentials and the browser's cookies
// between runs (a run ends, the test changes reviewers.toml, the next run
// goes on). Steps, each answered by one entry of the printed JSON array:
//   {"goto": PATH}                    -> {url, status (data-role=status), title}
//   {"click": ACTION}                 -> clicks [data-action=ACTION]; waits for
//                                        the status line or a navigation
//   {"fill": {NAME: VALUE, ...}}      -> fills inputs by name
//   {"tab_to": ACTION_OR_NAME}        -> presses Tab (at most 40 times) until the focused
//                                        element has that data-action or name; {focused, presses}
//   {"type": TEXT}                    -> types into the focused element
//   {"press": KEY}                    -> presses KEY (e.g. "Enter"), then as for click
//   {"text": SELECTOR}                -> {text} of the first match
//   {"count": SELECTOR}               -> {count} of the matches
//   {"uv": BOOL}                      -> the authenticator's user verification
//   {"viewport": [W, H]}              -> resizes the page
//   {"screenshot": FILE}              -> writes a PNG of the page
//   {"layout": ACTION}                -> {scrollWidth, clientWidth, visible, bottom} of the page and the control
//   {"box": SELECTOR}                 -> {top, bottom} of the first match, in page pixels
//   {"capture": ID}                   -> clicks approve on proposal ID and keeps the
//                                        decide request's body instead of sending it
//   {"post": {"path": P, "body": B, "origin": O?, "csrf": BOOL}}
//                                     -> a POST from the page's context (B "captured"
//                                        is the captured decide body); {status, body}
//   {"assertion": {"path": P, "decision": D, "uv": "required"|"discouraged", "elsewhere": URL?}}
//                                     -> asks P/statement for a statement, makes the
//                                        assertion itself (at URL's origin when given),
//                                        posts it to P/decide; {status, body}
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const here = createRequire(pathToFileURL(process.cwd() + '/'));
const pw = await import(pathToFileURL(here.resolve('playwright-core')));
const chromium = pw.chromium ?? pw.default.chromium;

const plan = JSON.parse(process.argv[2]);
const saved = plan.state && existsSync(plan.state) ? JSON.parse(readFileSync(plan.state, 'utf8')) : {};

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const context = await browser.newContext(saved.cookies ? { storageState: { cookies: saved.cookies, origins: [] } } : {});
const page = await context.newPage();
const cdp = await context.newCDPSession(page);
await cdp.send('WebAuthn.enable');
const { authenticatorId } = await cdp.send('WebAuthn.addVirtualAuthenticator', {
  options: { protocol: 'ctap2', transport: 'internal', hasResidentKey: true, hasUserVerification: true, isUserVerified: true },
});
for (const credential of saved.credentials || []) {
  await cdp.send('WebAuthn.addCredential', { authenticatorId, credential });
}

// Another origin on this host, for a phishing page: localhost on another
// port is another origin with the same relying party id.
let elsewhere = null;
async function phishingOrigin() {
  if (elsewhere) return elsewhere;
  const server = createServer((_, res) => { res.setHeader('content-type', 'text/html'); res.end('<!doctype html><title>not the console</title>'); });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  elsewhere = { server, url: `http://localhost:${server.address().port}/` };
  return elsewhere;
}

// Polled from here, not by a function in the page: the console's CSP
// forbids the eval a page-side wait would need.
async function settled(before) {
  const deadline = Date.now() + 15000;
  while (Date.now() < deadline) {
    if (page.url() !== before) {
      await page.waitForLoadState('load').catch(() => {});
      return;
    }
    const text = await statusText();
    if (text && !/^Waiting/.test(text)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
}

const statusText = async () => (await page.locator('[data-role="status"]').first().textContent({ timeout: 2000 }).catch(() => '')) || '';
let captured = null;
const results = [];
for (const step of plan.steps) {
  if (step.goto !== undefined) {
    const resp = await page.goto(plan.base + step.goto);
    results.push({ url: page.url(), code: resp ? resp.status() : 0, status: await statusText(), title: await page.title() });
  } else if (step.click !== undefined) {
    const before = page.url();
    await page.locator(`[data-action="${step.click}"]`).first().click();
    await settled(before);
    results.push({ url: page.url(), status: await statusText(), entry: await page.locator('[data-role="reviewer-entry"]').first().textContent({ timeout: 200 }).catch(() => null) });
  } else if (step.fill !== undefined) {
    for (const [name, value] of Object.entries(step.fill)) await page.fill(`[name="${name}"]`, value);
    results.push({});
  } else if (step.tab_to !== undefined) {
    // The keyboard alone: is the control reachable in tab order?
    const focusedIs = (want) => page.evaluate((w) => {
      const e = document.activeElement;
      return !!e && (e.getAttribute('data-action') === w || e.getAttribute('name') === w);
    }, want);
    let presses = 0;
    let focused = false;
    while (presses < 40 && !(focused = await focusedIs(step.tab_to))) {
      await page.keyboard.press('Tab');
      presses += 1;
    }
    results.push({ focused, presses });
  } else if (step.type !== undefined) {
    await page.keyboard.type(step.type);
    results.push({});
  } else if (step.press !== undefined) {
    const before = page.url();
    await page.keyboard.press(step.press);
    await settled(before);
    results.push({ url: page.url(), status: await statusText() });
  } else if (step.text !== undefined) {
    results.push({ text: await page.locator(step.text).first().textContent({ timeout: 5000 }).catch(() => null) });
  } else if (step.count !== undefined) {
    results.push({ count: await page.locator(step.count).count() });
  } else if (step.uv !== undefined) {
    await cdp.send('WebAuthn.setUserVerified', { authenticatorId, isUserVerified: step.uv });
    results.push({});
  } else if (step.viewport !== undefined) {
    await page.setViewportSize({ width: step.viewport[0], height: step.viewport[1] });
    results.push({});
  } else if (step.screenshot !== undefined) {
    await page.screenshot({ path: step.screenshot, fullPage: true });
    results.push({});
  } else if (step.layout !== undefined) {
    const box = await page.locator(`[data-action="${step.layout}"]`).first().boundingBox();
    const widths = await page.evaluate(() => ({ scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth }));
    results.push({ ...widths, visible: !!box && box.x >= 0 && box.x + box.width <= widths.clientWidth, bottom: box ? box.y + box.height : null });
  } else if (step.box !== undefined) {
    const box = await page.locator(step.box).first().boundingBox();
    results.push(box ? { top: box.y, bottom: box.y + box.height } : {});
  } else if (step.capture !== undefined) {
    await page.goto(`${plan.base}/review/p/${step.capture}`);
    await page.route('**/decide', async (route) => {
      captured = route.request().postData();
      await route.abort();
    });
    await page.locator('[data-action="approve"]').click();
    await settled(page.url());
    await page.unroute('**/decide');
    results.push({ captured: captured !== null });
  } else if (step.post !== undefined) {
    const p = step.post;
    const body = p.body === 'captured' ? captured : JSON.stringify(p.body || {});
    const answer = await page.evaluate(async ({ path, body, csrf }) => {
      const token = document.querySelector('meta[name="csrf-token"]');
      const headers = { 'content-type': 'application/json' };
      if (csrf && token) headers['x-csrf-token'] = token.content;
      const r = await fetch(path, { method: 'POST', credentials: 'include', headers, body });
      return { status: r.status, body: await r.text() };
    }, { path: (p.origin || '') + p.path, body, csrf: p.csrf !== false });
    results.push(answer);
  } else if (step.assertion !== undefined) {
    const a = step.assertion;
    const made = await page.evaluate(async ({ path, decision }) => {
      const token = document.querySelector('meta[name="csrf-token"]').content;
      const r = await fetch(path + '/statement', { method: 'POST', credentials: 'same-origin', headers: { 'content-type': 'application/json', 'x-csrf-token': token }, body: JSON.stringify({ decision, reason: 'test', ttl: '' }) });
      return r.json();
    }, { path: a.path, decision: a.decision });
    const console_url = page.url();
    if (a.elsewhere) {
      const other = await phishingOrigin();
      await page.goto(other.url);
    }
    const assertion = await page.evaluate(async ({ s, uv }) => {
      const dec = (t) => Uint8Array.from(atob(t.replace(/-/g, '+').replace(/_/g, '/') + '==='.slice((t.length + 3) % 4)), (c) => c.charCodeAt(0));
      const enc = (b) => btoa(String.fromCharCode(...new Uint8Array(b))).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
      const cred = await navigator.credentials.get({ publicKey: { challenge: dec(s.challenge), rpId: s.rpId, userVerification: uv, allowCredentials: s.allowCredentials.map((c) => ({ type: 'public-key', id: dec(c.id) })) } });
      return { credential_id: enc(cred.rawId), authenticator_data: enc(cred.response.authenticatorData), client_data_json: enc(cred.response.clientDataJSON), signature: enc(cred.response.signature) };
    }, { s: made, uv: a.uv || 'required' });
    if (a.elsewhere) await page.goto(console_url);
    const answer = await page.evaluate(async ({ path, body }) => {
      const token = document.querySelector('meta[name="csrf-token"]').content;
      const r = await fetch(path + '/decide', { method: 'POST', credentials: 'same-origin', headers: { 'content-type': 'application/json', 'x-csrf-token': token }, body: JSON.stringify(body) });
      return { status: r.status, body: await r.text() };
    }, { path: a.path, body: { statement: made.statement, assertion } });
    results.push(answer);
  }
}
if (plan.state) {
  const { credentials } = await cdp.send('WebAuthn.getCredentials', { authenticatorId });
  const { cookies } = await context.storageState();
  writeFileSync(plan.state, JSON.stringify({ credentials, cookies }));
}
if (elsewhere) elsewhere.server.close();
await browser.close();
process.stdout.write(JSON.stringify(results) + '\n');
