// The Python SDK's answers (python_reference.py run by the repository's .venv), for the model tests.
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
export const DEMO_DRAFT = join(REPO, "models/demo/draft");
export const REAL_DRAFT = join(REPO, "models/smollm2-135m/draft");
const PYTHON = join(REPO, ".venv/bin/python");

export async function pythonReference<T>(...args: string[]): Promise<T> {
  if (!existsSync(PYTHON)) throw new Error(`${PYTHON} not found: run make setup at the repository's root first`);
  const script = join(dirname(fileURLToPath(import.meta.url)), "python_reference.py");
  const { stdout } = await promisify(execFile)(PYTHON, [script, ...args], {
    cwd: REPO, maxBuffer: 64 << 20, timeout: 300_000, env: { ...process.env, OMP_NUM_THREADS: "1" },
  });
  return JSON.parse(stdout) as T;
}
