// The browser example in headless Chromium (Debian's, through playwright-core): build it, serve
// it, open it. Shared by the Node test here and tests/clients/test_browser.py (which drives
// this file's `main` to generate against a real verifier).
import { type ChildProcess, execFile, execFileSync, spawn } from "node:child_process";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { type Browser, type Page, chromium } from "playwright-core";

export const EXAMPLE = resolve(dirname(fileURLToPath(import.meta.url)), "../../examples/browser");
const TIMEOUT_MS = 120_000;

/**
 * Ends this process after `ms` whatever is still pending (a hung page, Chromium or server would
 * otherwise keep it, and `make test` with it, alive forever); `cleanup` first.
 */
export function watchdog(ms: number, cleanup: () => void): void {
  setTimeout(() => {
    console.error(`the browser test ran past ${ms / 1000} s: stopped`);
    cleanup();
    process.exit(1);
  }, ms).unref();
}

export function chromiumPath(): string {
  for (const name of ["chromium", "chromium-browser"]) {
    try {
      return execFileSync("which", [name], { encoding: "utf8" }).trim();
    } catch {
      // try the next name
    }
  }
  throw new Error("no chromium on PATH: the project's set-up installs Debian's chromium (apt-get install chromium)");
}

export async function buildExample(): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, [join(EXAMPLE, "build.mjs")], { timeout: TIMEOUT_MS });
  return stdout;
}

/** Serves the example (serve.mjs) on a free port; resolves with its base URL and the process. */
export function serveExample(draft: string, models?: string): Promise<{ url: string; server: ChildProcess }> {
  const args = [join(EXAMPLE, "serve.mjs"), "--port", "0", "--draft", draft, ...(models ? ["--models", models] : [])];
  const server = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolvePromise, reject) => {
    const timer = setTimeout(() => reject(new Error("the example's server did not start within 30 s")), 30_000);
    server.stdout!.on("data", (chunk: Buffer) => {
      const match = /serving (http:\/\/\S+)/.exec(chunk.toString());
      if (match) {
        clearTimeout(timer);
        resolvePromise({ url: match[1], server });
      }
    });
    server.on("exit", (code) => reject(new Error(`the example's server exited with ${code}`)));
    process.once("exit", () => server.kill()); // (never outlives the test: a live child would hold the runner)
  });
}

/** Opens the page at `url` in headless Chromium and waits for the draft to load (WASM). */
export async function openPage(url: string): Promise<{ browser: Browser; page: Page }> {
  const browser = await chromium.launch({ executablePath: chromiumPath(), headless: true, args: ["--no-sandbox"], timeout: TIMEOUT_MS });
  try {
    const page = await browser.newPage();
    page.setDefaultTimeout(TIMEOUT_MS);
    // An error before the page's script runs (a module that fails to load) never sets data-ready: fail at once.
    const failed = new Promise<never>((_, reject) => page.on("pageerror", (error) => reject(new Error(`the page failed: ${error}`))));
    await Promise.race([page.goto(url, { timeout: TIMEOUT_MS }), failed]);
    await Promise.race([page.waitForSelector("body[data-ready]", { timeout: TIMEOUT_MS }), failed]);
    const state = await page.evaluate(() => [document.body.dataset.ready, document.body.dataset.error]);
    if (state[0] !== "true") throw new Error(`the page failed to load its draft: ${state[1]}`);
    return { browser, page };
  } catch (error) {
    await browser.close();
    throw error;
  }
}
