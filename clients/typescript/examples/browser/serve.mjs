// A static server for the browser example (plain Node, no packages):
//   /        examples/browser (index.html, dist/main.js: build it first with build.mjs)
//   /ort/    onnxruntime-web's .wasm and glue
//   /draft/  a draft directory (--draft, default models/demo/draft)
//   /models/ with --models DIR, that directory (several drafts: the page's ?draft=/models/NAME/draft/)
// Usage: node examples/browser/serve.mjs [--port 8080] [--draft DIR] [--models DIR]; prints "serving http://127.0.0.1:PORT/".
import { createReadStream, statSync } from "node:fs";
import { createServer } from "node:http";
import { dirname, extname, join, normalize, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const option = (name, fallback) => (args.includes(name) ? args[args.indexOf(name) + 1] : fallback);
const roots = {
  "/ort/": resolve(here, "../../node_modules/onnxruntime-web/dist"),
  "/draft/": resolve(option("--draft", resolve(here, "../../../../models/demo/draft"))),
  ...(args.includes("--models") ? { "/models/": resolve(option("--models")) } : {}),
  "/": here,
};
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm", ".json": "application/json", ".jinja": "text/plain" };

const server = createServer((request, response) => {
  const path = decodeURIComponent(new URL(request.url ?? "/", "http://x").pathname);
  const prefix = Object.keys(roots).find((p) => path.startsWith(p));
  const root = roots[prefix];
  const file = normalize(join(root, path.slice(prefix.length) || "index.html"));
  let size = -1;
  try {
    if (file === root || file.startsWith(root + sep)) size = statSync(file).isFile() ? statSync(file).size : -1;
  } catch {
    size = -1;
  }
  if (size < 0) {
    response.writeHead(404).end("not found");
    return;
  }
  response.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream", "content-length": size, "cache-control": "no-store" });
  createReadStream(file).pipe(response);
});
server.listen(Number(option("--port", "8080")), "127.0.0.1", () => {
  console.log(`serving http://127.0.0.1:${server.address().port}/`);
});
