// A real OpenID provider for the tests: npm's `oidc-provider` (a certified
// implementation), issuing JWT access tokens (RFC 9068) for whatever
// resource indicator (RFC 8707) a client asks for.
//
//   node oidc_provider.mjs PORT KEYS_FILE KID
//
// Clients:
// - `agent-svc` / `agent-secret`: client credentials (an agent service);
//   its tokens carry `tid` = `acme` and scope `pay:use`, or `tid` = `globex`
//   when asked with scope `pay:use tenant:globex` (one person, two tenants).
// - `agent-bob` / `bob-secret`: the same, a second person (the `sub` of a
//   client credentials token is the client), whose tokens carry `email` =
//   `Bob@acme.example`.
// Access tokens are valid ACCESS_TTL seconds (default 300).
// - any client that registers itself (RFC 7591 dynamic registration, as MCP
//   clients do): authorization code with PKCE, signing in through the
//   provider's development login and consent pages, which accept any login
//   (the login becomes `sub`). Its tokens carry `tid` = `acme` too.
// - `countersign` / `exchange-secret`: OAuth 2.0 Token Exchange (RFC 8693),
//   registered with the provider's `registerGrantType`: a subject token this
//   provider issued (checked: signature, issuer, expiry) is traded for a JWT
//   access token for the requested `audience`, naming the same `sub` and the
//   client as the actor (`act.sub`), with the requested `scope`, valid
//   EXCHANGE_TTL seconds (default 300). Each exchange appends a line to
//   EXCHANGE_LOG when set (`sub audience scope`), so a test sees when the
//   provider was asked; EXCHANGE_REFUSE=1 refuses every exchange
//   (`invalid_grant`); a subject listed, one per line, in the file
//   EXCHANGE_REVOKED is refused (`invalid_grant`, as a provider refuses a
//   person whose sign-in it revoked).
// - `countersign-jwt`: the same exchange, the client authenticated with
//   `private_key_jwt` (RFC 7523): with CLIENT_KEY_FILE set, a P-256 key is
//   made, written there (PKCS#8 PEM) and its public half registered as the
//   client's key, `kid` `gw-1`.
// The signing key is read from KEYS_FILE, or made (P-256, named KID) and
// written there when the file does not exist: a test rotates the key by
// restarting the provider with another file.
// With OIDC_TLS_CERT and OIDC_TLS_KEY (PEM files, a certificate for
// `localhost`) it serves HTTPS, as `https://localhost:PORT`.
// Prints "listening" once it accepts connections.
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

// Installed by .ci/setup-peers under .ci/cache/oidc; OIDC_DIR names it.
const { default: Provider } = await import(
  pathToFileURL(join(process.env.OIDC_DIR, 'node_modules/oidc-provider/lib/index.js')).href
);
const jose = await import(
  pathToFileURL(join(process.env.OIDC_DIR, 'node_modules/jose/dist/webapi/index.js')).href
);

const [port, keysFile, kid] = process.argv.slice(2);
const tls = process.env.OIDC_TLS_CERT
  ? { cert: fs.readFileSync(process.env.OIDC_TLS_CERT), key: fs.readFileSync(process.env.OIDC_TLS_KEY) }
  : null;
const issuer = tls ? `https://localhost:${port}` : `http://127.0.0.1:${port}`;
if (!fs.existsSync(keysFile)) {
  const { privateKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const jwk = { ...privateKey.export({ format: 'jwk' }), kid, alg: 'ES256', use: 'sig' };
  fs.writeFileSync(keysFile, JSON.stringify({ keys: [jwk] }));
}
const jwks = JSON.parse(fs.readFileSync(keysFile, 'utf8'));
const jwtClients = [];
if (process.env.CLIENT_KEY_FILE) {
  const { privateKey, publicKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
  fs.writeFileSync(process.env.CLIENT_KEY_FILE, privateKey.export({ format: 'pem', type: 'pkcs8' }));
  jwtClients.push({
    client_id: 'countersign-jwt',
    token_endpoint_auth_method: 'private_key_jwt',
    token_endpoint_auth_signing_alg: 'ES256',
    jwks: { keys: [{ ...publicKey.export({ format: 'jwk' }), kid: 'gw-1', alg: 'ES256', use: 'sig' }] },
    grant_types: ['urn:ietf:params:oauth:grant-type:token-exchange'],
    redirect_uris: [],
    response_types: [],
    scope: 'pay:use repo',
    id_token_signed_response_alg: 'ES256',
  });
}

const provider = new Provider(issuer, {
  jwks,
  clients: [
    {
      client_id: 'countersign',
      client_secret: 'exchange-secret',
      grant_types: ['urn:ietf:params:oauth:grant-type:token-exchange'],
      redirect_uris: [],
      response_types: [],
      scope: 'pay:use repo',
      id_token_signed_response_alg: 'ES256',
    },
    {
      client_id: 'agent-svc',
      client_secret: 'agent-secret',
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      scope: 'pay:use tenant:globex',
      id_token_signed_response_alg: 'ES256',
    },
    {
      client_id: 'agent-bob',
      client_secret: 'bob-secret',
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      scope: 'pay:use',
      id_token_signed_response_alg: 'ES256',
    },
    ...jwtClients,
  ],
  scopes: ['openid', 'offline_access', 'pay:use', 'repo', 'tenant:globex'],
  // The provider signs with its one P-256 key: registered clients too.
  clientDefaults: { id_token_signed_response_alg: 'ES256' },
  features: {
    clientCredentials: { enabled: true },
    devInteractions: { enabled: true },
    registration: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resourceIndicator) => ({
        scope: 'pay:use tenant:globex',
        audience: resourceIndicator,
        accessTokenTTL: Number(process.env.ACCESS_TTL || 300),
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'ES256' } },
      }),
    },
  },
  // agent-bob's tokens also carry his email (a person's second name).
  // A token asked with scope `tenant:globex` is for tenant globex: the same
  // person in a second tenant.
  extraTokenClaims: (ctx, token) => ({
    tid: String(token.scope || '').split(' ').includes('tenant:globex') ? 'globex' : 'acme',
    ...(token.clientId === 'agent-bob' ? { email: 'Bob@acme.example' } : {}),
  }),
});

// RFC 8693 token exchange, registered on the provider.
const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN = 'urn:ietf:params:oauth:token-type:access_token';
const signing = jwks.keys[0];
const privateKey = await jose.importJWK(signing, 'ES256');
const publicKey = await jose.importJWK(
  { kty: signing.kty, crv: signing.crv, x: signing.x, y: signing.y },
  'ES256',
);
const ttl = Number(process.env.EXCHANGE_TTL || 300);
provider.registerGrantType(
  TOKEN_EXCHANGE,
  async (ctx) => {
    const p = ctx.oidc.params;
    const refuse = (error, description) => {
      ctx.status = 400;
      ctx.body = { error, error_description: description };
    };
    if (process.env.EXCHANGE_REFUSE === '1') return refuse('invalid_grant', 'exchanges are refused');
    if (p.subject_token_type !== ACCESS_TOKEN) return refuse('invalid_request', 'subject_token_type');
    if (!p.audience) return refuse('invalid_target', 'no audience');
    let subject;
    try {
      ({ payload: subject } = await jose.jwtVerify(p.subject_token, publicKey, { issuer }));
    } catch (e) {
      return refuse('invalid_grant', `subject token: ${e.code || e.message}`);
    }
    const revoked = process.env.EXCHANGE_REVOKED && fs.existsSync(process.env.EXCHANGE_REVOKED)
      ? fs.readFileSync(process.env.EXCHANGE_REVOKED, 'utf8').split('\n')
      : [];
    if (revoked.includes(subject.sub)) return refuse('invalid_grant', 'the subject\'s grant was revoked');
    const now = Math.floor(Date.now() / 1000);
    const token = await new jose.SignJWT({
      scope: p.scope || '',
      client_id: ctx.oidc.client.clientId,
      act: { sub: ctx.oidc.client.clientId },
      tid: subject.tid,
    })
      .setProtectedHeader({ alg: 'ES256', kid: signing.kid, typ: 'at+jwt' })
      .setIssuer(issuer)
      .setSubject(subject.sub)
      .setAudience(p.audience)
      .setJti(crypto.randomUUID())
      .setIssuedAt(now)
      .setExpirationTime(now + ttl)
      .sign(privateKey);
    if (process.env.EXCHANGE_LOG) {
      fs.appendFileSync(process.env.EXCHANGE_LOG, `${subject.sub} ${p.audience} ${p.scope || ''}\n`);
    }
    ctx.body = {
      access_token: token,
      issued_token_type: ACCESS_TOKEN,
      token_type: 'Bearer',
      expires_in: ttl,
      scope: p.scope || '',
    };
  },
  ['subject_token', 'subject_token_type', 'requested_token_type', 'audience', 'scope', 'actor_token', 'actor_token_type'],
);

// The test reads the first line only and then closes the pipe: what the
// provider prints later (its development pages log to stdout) is dropped,
// not a crash on EPIPE.
process.stdout.on('error', () => {});
const server = tls ? https.createServer(tls, provider.callback()) : provider;
const listening = server.listen(Number(port), '127.0.0.1', () => {
  console.log('listening');
});
// Node closes an idle keep-alive connection after 5 s, the very time after
// which Python's httpx stops reusing one: a request sent at that moment
// meets a closed socket ("Server disconnected without sending a
// response"). Idle connections are kept longer than any client keeps them.
listening.keepAliveTimeout = 65_000;
listening.headersTimeout = 66_000;
