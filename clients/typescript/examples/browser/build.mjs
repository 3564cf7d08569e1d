// Bundles the browser example (dist/main.js) and, to report its size, the package alone for
// browsers (dist/edgespec.min.js: the client with the WebSocket transport and the model code,
// without ONNX Runtime Web and without the model). Usage: node examples/browser/build.mjs
import { build } from "esbuild";
import { statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
// Node-only modules the client imports lazily (gRPC, the `ws` package, node:fs for drafts on
// disk): never used in a browser, so each is an empty module here.
const nodeOnly = {
  name: "node-only",
  setup(b) {
    b.onResolve({ filter: /^(@grpc\/grpc-js|ws|node:.*)$/ }, (args) => ({ path: args.path, namespace: "node-only" }));
    b.onLoad({ filter: /.*/, namespace: "node-only" }, () => ({ contents: "module.exports = {};", loader: "js" }));
  },
};
const common = {
  bundle: true, minify: true, format: "esm", platform: "browser", target: "es2022", logLevel: "warning",
  plugins: [nodeOnly], external: [],
  // ONNX Runtime Web's build that loads its .wasm and glue from ort.env.wasm.wasmPaths
  conditions: ["onnxruntime-web-use-extern-wasm"],
};

await build({ ...common, entryPoints: [join(here, "main.ts")], outfile: join(here, "dist/main.js") });
await build({
  ...common, outfile: join(here, "dist/edgespec.min.js"), external: ["onnxruntime-web", "onnxruntime-node"],
  stdin: { contents: 'export * from "./src/index.ts"; export * as model from "./src/model/index.ts";', resolveDir: join(here, "../..") },
});

const kib = (path) => (statSync(path).size / 1024).toFixed(1);
const wasm = join(here, "../../node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.wasm");
console.log(`page bundle (package + onnxruntime-web JS): ${kib(join(here, "dist/main.js"))} KiB minified`);
console.log(`the package alone (client, WebSocket transport, model code; no ONNX Runtime, no model): ${kib(join(here, "dist/edgespec.min.js"))} KiB minified`);
console.log(`fetched at run time from ort.env.wasm.wasmPaths: ${kib(wasm)} KiB WASM + ${kib(wasm.replace(/wasm$/, "mjs"))} KiB glue`);
