// A real OpenID provider for the tests: npm's `oidc-provider` (a certified
// implementation), issuing JWT access tokens (RFC 9068) for whatever
// resource indicator (RFC 8707) a client asks for.
//
//   node oidc_provider.mjs PORT KEYS_FILE KID
//
// Clients:
// - `agent-svc` / `agent-secret`: client credentials (an agent service);
//   its tokens carry `tid` = `acme` and scope `pay:use`.
// The signing key is read from KEYS_FILE, or made (P-256, named KID) and
// written there when the file does not exist: a test rotates the key by
// restarting the provider with another file.
// Prints "listening" once it accepts connections.
import crypto from 'node:crypto';
import fs from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

// Installed by .ci/setup-peers under .ci/cache/oidc; OIDC_DIR names it.
const { default: Provider } = await import(
  pathToFileURL(join(process.env.OIDC_DIR, 'node_modules/oidc-provider/lib/index.js')).href
);

const [port, keysFile, kid] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
if (!fs.existsSync(keysFile)) {
  const { privateKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const jwk = { ...privateKey.export({ format: 'jwk' }), kid, alg: 'ES256', use: 'sig' };
  fs.writeFileSync(keysFile, JSON.stringify({ keys: [jwk] }));
}
const jwks = JSON.parse(fs.readFileSync(keysFile, 'utf8'));

const provider = new Provider(issuer, {
  jwks,
  clients: [
    {
      client_id: 'agent-svc',
      client_secret: 'agent-secret',
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      scope: 'pay:use',
      id_token_signed_response_alg: 'ES256',
    },
  ],
  scopes: ['pay:use'],
  features: {
    clientCredentials: { enabled: true },
    devInteractions: { enabled: false },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resourceIndicator) => ({
        scope: 'pay:use',
        audience: resourceIndicator,
        accessTokenTTL: 300,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'ES256' } },
      }),
    },
  },
  extraTokenClaims: () => ({ tid: 'acme' }),
});

provider.listen(Number(port), '127.0.0.1', () => {
  console.log('listening');
});
