// python_reference.py's DRAFT_SCRIPT replayed on a TypeScript draft: in Node (draft.test.ts) and,
// serialised with Function.prototype.toString, inside the browser page (test/browser). So it
// refers to nothing outside itself: the model module comes in as `lib`.

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;

/** Per run: the result of each step and the context at the end (what the Python reference records). */
export async function replayScript(draft: Any, lib: Any, script: [string, unknown][], prompts: number[][]): Promise<{ results: unknown[]; tokens: number[] }[]> {
  const sampling = { temperature: 0.8, topK: 0, topP: 1, seed: BigInt(7) };
  const runs = [];
  for (const prompt of prompts) {
    draft.reset(prompt);
    const results: unknown[] = [];
    for (const [op, arg] of script) {
      const k = arg as number;
      if (op === "propose") results.push((await draft.propose(k)).tokens);
      else if (op === "propose_lookup") results.push((await draft.propose(k, { lookup: lib.lookupConfig() })).tokens);
      else if (op === "propose_coupled") results.push((await draft.propose(k, { sampling, rng: new lib.PositionDraws(7) })).tokens);
      else if (op === "propose_coupled_top8") results.push((await draft.propose(k, { sampling, rng: new lib.PositionDraws(7), topN: 8 })).tokens);
      else if (op === "rollback_keep") {
        draft.rollbackTo(prompt.length + k);
        results.push(draft.tokens.length);
      } else if (op === "append") {
        draft.append([k]);
        results.push(draft.tokens.length);
      } else if (op === "observe") results.push(await draft.observe(arg));
      else if (op === "observe_chances_coupled") results.push(await draft.observeChances(arg, { sampling, draws: new lib.PositionDraws(7) }));
      else if (op === "lookup_only") {
        const only = new lib.LookupDraft(draft);
        only.reset(draft.tokens.slice(0, prompt.length));
        results.push((await only.propose(k)).tokens);
      } else if (op === "lookup_only_observe") {
        const only = new lib.LookupDraft(draft);
        only.reset(draft.tokens.slice(0, prompt.length));
        results.push(await only.observe(arg));
      }
      else throw new Error(`unknown step ${op}`);
    }
    runs.push({ results, tokens: [...draft.tokens] });
  }
  return runs;
}
