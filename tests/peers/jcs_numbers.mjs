// An RFC 8785 canonicalizer nobody here wrote (npm's `canonicalize`, by one
// of the RFC's authors) on every number of a JSON array: reads the array
// from the file named first, parses it with JavaScript's JSON.parse
// (correctly rounded), and prints each element's canonical text, one a line.
// usage: node jcs_numbers.mjs FILE   (run with .ci/cache/jcs as the working
// directory, where .ci/setup-peers installs the package)
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const here = createRequire(pathToFileURL(process.cwd() + '/'));
const { default: canonicalize } = await import(pathToFileURL(here.resolve('canonicalize')));
const numbers = JSON.parse(readFileSync(process.argv[2], 'utf8'));
process.stdout.write(numbers.map((n) => canonicalize(n)).join('\n') + '\n');
