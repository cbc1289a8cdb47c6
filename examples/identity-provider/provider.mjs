// A local OpenID provider for trying countersign: npm's oidc-provider (a
// certified implementation) in its development mode. Keys and clients live
// in memory; any login is accepted. Not for production.
//
//   npm install && node provider.mjs        (Node.js 22; PORT, default 4000)
//
// It issues JWT access tokens (RFC 9068, typed at+jwt) for the resource a
// client asks for (RFC 8707), each with a tenant claim `tid` = `acme`:
// - `agent-svc` / `agent-secret`: an agent service, client credentials,
//   scope `payments`;
// - any client that registers itself (RFC 7591, as MCP clients do, e.g.
//   mcp-remote): authorization code with PKCE through the development login
//   page, whose login becomes the subject;
// - `countersign` / `exchange-secret`: the gateway's own client, allowed
//   OAuth 2.0 Token Exchange (RFC 8693): a token this provider issued is
//   traded for one for the requested `audience` and `scope`, naming the same
//   subject and the gateway as the actor (`act.sub`). Every exchange is
//   printed, so you see when the gateway asked.
import crypto from 'node:crypto';
import Provider from 'oidc-provider';
import * as jose from 'jose';

const port = Number(process.env.PORT || 4000);
// `localhost`, not 127.0.0.1: the gateway's public URL is on localhost
// too (a passkey's relying party is a name, never an IP address).
const issuer = `http://localhost:${port}`;

// One P-256 signing key, made at start: for the provider's own tokens and
// for the exchanged ones, so the gateway checks both with the same JWKS.
const { privateKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
const signing = { ...privateKey.export({ format: 'jwk' }), kid: 'local-1', alg: 'ES256', use: 'sig' };
const signingKey = await jose.importJWK(signing, 'ES256');
const verifyKey = await jose.importJWK(
  { kty: signing.kty, crv: signing.crv, x: signing.x, y: signing.y },
  'ES256',
);

const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN = 'urn:ietf:params:oauth:token-type:access_token';

const provider = new Provider(issuer, {
  jwks: { keys: [signing] },
  clients: [
    {
      client_id: 'agent-svc',
      client_secret: 'agent-secret',
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      scope: 'payments',
    },
    {
      client_id: 'countersign',
      client_secret: 'exchange-secret',
      grant_types: [TOKEN_EXCHANGE],
      redirect_uris: [],
      response_types: [],
      scope: 'payments',
    },
  ],
  scopes: ['openid', 'offline_access', 'payments'],
  clientDefaults: { id_token_signed_response_alg: 'ES256' },
  features: {
    clientCredentials: { enabled: true },
    devInteractions: { enabled: true },
    registration: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource) => ({
        scope: 'payments',
        audience: resource,
        accessTokenTTL: 300,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'ES256' } },
      }),
    },
  },
  // countersign needs a tenant in every token (`tenant_claim = "tid"`).
  extraTokenClaims: () => ({ tid: 'acme' }),
  // Refresh tokens for clients that ask for offline_access (mcp-remote).
  issueRefreshToken: async (ctx, client, code) =>
    client.grantTypeAllowed('refresh_token') && code.scopes.has('offline_access'),
});

// RFC 8693 token exchange, for the gateway's client.
provider.registerGrantType(
  TOKEN_EXCHANGE,
  async (ctx) => {
    const p = ctx.oidc.params;
    const refuse = (error, description) => {
      console.log(`exchange refused: ${error} (${description})`);
      ctx.status = 400;
      ctx.body = { error, error_description: description };
    };
    if (p.subject_token_type !== ACCESS_TOKEN) return refuse('invalid_request', 'subject_token_type');
    if (!p.audience) return refuse('invalid_target', 'no audience');
    let subject;
    try {
      ({ payload: subject } = await jose.jwtVerify(p.subject_token, verifyKey, { issuer }));
    } catch (e) {
      return refuse('invalid_grant', `subject token: ${e.code || e.message}`);
    }
    const now = Math.floor(Date.now() / 1000);
    const ttl = 300;
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
      .sign(signingKey);
    console.log(`exchanged a token of ${subject.sub} for ${p.audience} (scope ${p.scope || ''})`);
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

// A reader of the output that goes away (`| head -1`) is not a crash.
process.stdout.on('error', () => {});
provider.listen(port, 'localhost', () => console.log(`OpenID provider at ${issuer}`));
