/**
 * Replays a planner script (JSON lines from tests/clients/test_typescript.py: events and decide
 * calls) through the TypeScript planner and prints each decision as a JSON line, so the test can
 * compare it with edge/planner.py's on the same script.
 *
 *     npx tsx conformance/planner_replay.ts script.jsonl
 */

import { readFileSync } from "node:fs";
import { Planner, type Event, type Path, type PlannerMode } from "../src/planner.js";

interface Step {
  mode?: PlannerMode;
  event?: Event;
  decide?: { current: Path | null; remaining: number };
}

const lines = readFileSync(process.argv[2]!, "utf8").split("\n").filter((l) => l.trim());
let planner = new Planner("auto");
const out: string[] = [];
for (const line of lines) {
  const step = JSON.parse(line) as Step;
  if (step.mode) planner = new Planner(step.mode);
  if (step.event) planner.observe(step.event);
  if (step.decide) {
    const d = planner.decide(step.decide.current, step.decide.remaining);
    out.push(JSON.stringify({ path: d.path, k: d.k, depth: d.depth, spec_ms: d.specMs, cloud_ms: d.cloudMs, reason: d.reason }));
  }
}
process.stdout.write(out.join("\n") + "\n");
