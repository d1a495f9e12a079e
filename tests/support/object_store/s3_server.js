#!/usr/bin/env node
'use strict';

// An S3-compatible object store on 127.0.0.1 for ferry's remote-shard tests (issue 29), started
// and stopped by tests/support/servers.h:
//
//   NODE_PATH=BUILD/object_store/node_modules node s3_server.js --dir DIR [--bucket NAME]...
//
// It serves @20minutes/s3rver (pinned in package.json; tests/support/object_store/install.sh
// installs it into BUILD/object_store) on a port the OS picks, stores objects under DIR, creates
// the named buckets, and prints one line, "listening 127.0.0.1 PORT", once it accepts
// connections. It exits on SIGTERM, on SIGINT and when its stdin reaches end of file: the test
// holds the write end of a pipe to our stdin, so a test killed with SIGKILL leaves no server
// behind. Run by hand, keep stdin open (a terminal; Ctrl-D stops it).
//
// Credentials: s3rver's built-in account, access key S3RVER, secret S3RVER, any region (the
// region and service are read from the request's credential scope). Requests without an
// Authorization header are served too, as anonymous ones.
//
// What s3rver 4.0.4 does, read from its source and checked with curl --aws-sigv4 and botocore:
// - SigV4 (Authorization header or presigned query) is checked: a wrong secret gets 403
//   SignatureDoesNotMatch as S3 XML; a time more than 15 min off gets 403 RequestTimeTooSkewed.
//   x-amz-content-sha256 must be present (UNSIGNED-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD or
//   64 hex digits) but is not compared with the body, and aws-chunked chunk signatures are not
//   checked. The canonical request uses the headers listed in SignedHeaders as node parsed them
//   (values not re-trimmed, inner spaces not collapsed), the path re-encoded segment by segment
//   (RFC 3986), and the query encoded with encodeURIComponent, which leaves !'()* unescaped where
//   AWS escapes them: keys with those characters in a query (prefix=, start-after=) fail to verify
//   (403). Keys with them in the path verify when sent percent-encoded (%28), as SDKs send them.
//   (curl 7.88's --aws-sigv4, Debian 12's, signs the query as written, unsorted and unencoded:
//   give it parameters sorted, values percent-encoded, "prefix=a%2F", or it gets 403.)
// - Range: only "bytes=START-" and "bytes=START-END". "bytes=-N" (a suffix) is read as 0-N, and
//   "bytes=0-0" returns the whole object (an END of 0 counts as none), both with 206 and a
//   Content-Range naming what was sent. A START past the end gets 416 InvalidRange. Multiple
//   ranges are not supported. Responses carry Accept-Ranges: bytes and Content-Length.
// - ETag: the quoted hex MD5 of the content ("d41d8cd98f00b204e9800998ecf8427e"), also on HEAD
//   and in listings; HEAD sends Content-Length, Last-Modified, no body.
// - ListObjectsV2 (GET /BUCKET?list-type=2): prefix, delimiter (CommonPrefixes), start-after,
//   max-keys (capped at 1000; MaxKeys echoes the request) and continuation-token (an opaque
//   base64 token, NextContinuationToken while IsTruncated is true; send it URL-encoded). KeyCount
//   counts Contents only, not CommonPrefixes as S3 does. encoding-type is ignored. Tokens are
//   made with DES, which OpenSSL 3 lacks: see replaceMissingDes() below.
// - Path-style addressing (http://127.0.0.1:PORT/BUCKET/KEY) always (vhostBuckets is off here);
//   objects live in DIR/BUCKET/KEY._S3rver_object beside metadata files, so a test uploads shards
//   with PUT rather than by copying files into DIR.

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');

function fail(message) {
  process.stderr.write(`s3_server.js: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const options = { dir: undefined, buckets: [] };
  for (let i = 0; i < argv.length; ++i) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) fail(`${arg} needs a value; usage: --dir DIR [--bucket NAME]...`);
      return argv[++i];
    };
    if (arg === '--dir') options.dir = value();
    else if (arg === '--bucket') options.buckets.push(value());
    else fail(`unknown argument "${arg}"; usage: s3_server.js --dir DIR [--bucket NAME]...`);
  }
  if (!options.dir) fail('--dir DIR is required: the folder where objects are stored');
  return options;
}

function loadS3rver() {
  try {
    return require('@20minutes/s3rver');
  } catch (err) {
    if (err.code !== 'MODULE_NOT_FOUND') throw err;
    fail(
      'cannot load @20minutes/s3rver: run tests/support/object_store/install.sh BUILD_DIR and ' +
        'set NODE_PATH=BUILD_DIR/object_store/node_modules',
    );
  }
}

// s3rver makes ListObjectsV2 continuation tokens with DES, which OpenSSL 3 keeps in its legacy
// provider only: without it every truncated listing is a 500 InternalError
// (ERR_OSSL_EVP_UNSUPPORTED). The token is opaque and only s3rver reads it back, so where DES is
// missing it becomes AES-128-CTR (any length, no padding) with the same 8-byte key and IV
// zero-padded. Nothing else in this process asks for DES.
function replaceMissingDes() {
  try {
    crypto.createCipheriv('des', Buffer.alloc(8), Buffer.alloc(8));
    return;
  } catch (err) {
    // DES unavailable: fall through.
  }
  const widen = (bytes) => Buffer.concat([Buffer.from(bytes), Buffer.alloc(16 - bytes.length)]);
  for (const name of ['createCipheriv', 'createDecipheriv']) {
    const original = crypto[name];
    crypto[name] = function (algorithm, key, iv, options) {
      if (algorithm === 'des') {
        return original.call(this, 'aes-128-ctr', widen(key), widen(iv), options);
      }
      return original.apply(this, arguments);
    };
  }
}

async function main() {
  const options = parseArgs(process.argv.slice(2));
  replaceMissingDes();
  const S3rver = loadS3rver();
  const dir = path.resolve(options.dir);
  fs.mkdirSync(dir, { recursive: true });

  const server = new S3rver({
    address: '127.0.0.1',
    port: 0, // the OS picks a free port, so parallel tests never collide
    directory: dir,
    silent: true,
    vhostBuckets: false,
    configureBuckets: options.buckets.map((name) => ({ name })),
  });

  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    // Open keep-alive connections would hold close() for their idle timeout; a test's teardown
    // has no use for them.
    const http = server.httpServer;
    if (!http) process.exit(0);
    http.close(() => process.exit(0));
    if (http.closeAllConnections) http.closeAllConnections(); // node 18.2 and later
    setTimeout(() => process.exit(0), 2000).unref();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);

  const { port } = await server.run();

  // Watch stdin only once listening: stop() before run() resolves could leave run() to bind after.
  process.stdin.on('data', () => {});
  process.stdin.on('end', stop);
  process.stdin.on('error', stop);
  process.stdin.resume();

  // Writes to a pipe are synchronous on Linux, so the line is out before anything else happens.
  process.stdout.write(`listening 127.0.0.1 ${port}\n`);
}

main().catch((err) => {
  process.stderr.write(`s3_server.js: cannot start s3rver: ${err.stack || err}\n`);
  process.exit(1);
});
