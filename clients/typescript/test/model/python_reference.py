"""What the Python SDK computes, as JSON on stdout: the TypeScript model tests compare against it.

    .venv/bin/python clients/typescript/test/model/python_reference.py tokenizer MODEL_DIR
    .venv/bin/python clients/typescript/test/model/python_reference.py draft MODEL_DIR
    .venv/bin/python clients/typescript/test/model/python_reference.py sampling

tokenizer: the fingerprint, and per held-out prompt (prompts/heldout.jsonl, chat-heldout.jsonl)
its ids and their decoded text; with a chat template, each chat prompt's template ids.
draft: greedy (and coupled) proposals over a scripted run with rollbacks (DRAFT_SCRIPT), as
edge/draft.py's DraftModel drafts them. sampling: processed distributions and coupled draws
for fixed logits and seeds (edge/sampling.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from edgespec.edge.draft import DraftModel
from edgespec.edge.eos import chat_template_of
from edgespec.edge.lookup import LookupConfig
from edgespec.edge.lookup_draft import LookupDraft
from edgespec.edge.openai_request import render_chat
from edgespec.edge.params import SamplingParams
from edgespec.edge.sampling import PositionDraws, position_key, position_uniforms, probs_from_logits, sample, truncate_top_n
from edgespec.edge.tokenizer import fingerprint, load_tokenizer

REPO = Path(__file__).resolve().parents[4]
EXTRA_TEXTS = [
    "", " ", "a\u0085\u0085b\ufeff\ufeffc\u00a0 x", "tabs\t\t\tand\n\n\nnewlines  \n", "it's they'll we'VE",
    "naïve café 東京 😀👍🏽 ١٢٣ ½", "<|endoftext|>plain<|im_start|>user\nhi<|im_end|>", "x = [1, 2.5e-3]  # ok\r\n",
]
DRAFT_PROMPTS = 3  # held-out prompts the draft script runs over


def heldout() -> list[dict]:
    rows = []
    for name in ("heldout.jsonl", "chat-heldout.jsonl"):
        rows += [json.loads(line) for line in (REPO / "prompts" / name).read_text().splitlines() if line.strip()]
    return rows


def tokenizer_reference(model_dir: Path) -> dict:
    tokenizer = load_tokenizer(model_dir)
    texts = [row["prompt"] for row in heldout()] + EXTRA_TEXTS
    encoded = [tokenizer.encode(text).ids for text in texts]
    out = {
        "fingerprint": fingerprint(model_dir),
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "texts": texts,
        "ids": encoded,
        "decoded": [tokenizer.decode(ids, skip_special_tokens=True) for ids in encoded],
        "decoded_special": [tokenizer.decode(ids, skip_special_tokens=False) for ids in encoded],
        "chat": [],
    }
    template = chat_template_of(model_dir)
    if template is not None:
        from transformers import AutoTokenizer  # the reference apply_chat_template (test-only)

        hf = AutoTokenizer.from_pretrained(str(model_dir))
        conversations = [row["messages"] for row in heldout() if "messages" in row]
        conversations += [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]]
        for messages in conversations:
            ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
            rendered = render_chat(template, messages)
            assert tokenizer.encode(rendered).ids == ids, "the SDK's render_chat and transformers disagree"
            out["chat"].append({"messages": messages, "text": rendered, "ids": ids})
    return out


# Each step: [op, argument]; the TypeScript test replays the same script.
DRAFT_SCRIPT = [
    ["propose", 4], ["rollback_keep", 2], ["append", 42], ["propose", 5], ["rollback_keep", 0],
    ["propose", 3], ["propose_lookup", 4], ["observe", [13, 220, 220]], ["propose", 2],
    ["rollback_keep", -3], ["propose_coupled", 4], ["propose_coupled_top8", 3], ["observe_chances_coupled", [13, 220, 30, 30]],
    ["lookup_only", 6], ["lookup_only_observe", [30, 198, 220, 30, 13]],
]


def draft_reference(model_dir: Path) -> dict:
    draft = DraftModel(model_dir)
    prompts = [row["prompt"] for row in heldout()[:DRAFT_PROMPTS]] + [heldout()[-1]["prompt"]]
    runs = []
    for text in prompts:
        ids = draft.tokenizer.encode(text).ids[:96]
        draft.reset(ids)
        results = []
        for op, arg in DRAFT_SCRIPT:
            results.append(_step(draft, len(ids), op, arg))
        teacher_forced = draft.logits_for_context(ids).argmax(-1).tolist()  # the argmax after each prompt position
        runs.append({"prompt_ids": ids, "results": results, "tokens": list(draft.tokens), "teacher_forced": teacher_forced})
    return {"script": DRAFT_SCRIPT, "runs": runs, "eos_token_ids": draft.eos_token_ids}


def _step(draft: DraftModel, prompt_len: int, op: str, arg):
    sampling = SamplingParams(temperature=0.8, seed=7)
    if op == "propose":
        return draft.propose(arg).tokens
    if op == "propose_lookup":
        return draft.propose(arg, lookup=LookupConfig()).tokens
    if op == "propose_coupled":
        return draft.propose(arg, sampling=sampling, rng=PositionDraws(7)).tokens
    if op == "propose_coupled_top8":
        return draft.propose(arg, sampling=sampling, rng=PositionDraws(7), top_n=8).tokens
    if op == "rollback_keep":  # keep the prompt plus arg drafts (negative: fewer than the prompt)
        draft.rollback_to(prompt_len + arg)
        return len(draft.tokens)
    if op == "append":
        draft.append([arg])
        return len(draft.tokens)
    if op == "observe":
        return draft.observe(arg)
    if op == "observe_chances_coupled":
        return draft.observe_chances(arg, sampling=sampling, draws=PositionDraws(7))
    if op == "lookup_only":  # a lookup-only drafter over the prompt (edge/lookup_draft.py)
        only = LookupDraft(draft)
        only.reset(draft.tokens[:prompt_len])
        return only.propose(arg).tokens
    if op == "lookup_only_observe":
        only = LookupDraft(draft)
        only.reset(draft.tokens[:prompt_len])
        return only.observe(arg)
    raise ValueError(op)


def sampling_reference() -> dict:
    rng = np.random.default_rng(1234)
    cases = []
    settings = [(0.8, 0, 1.0), (1.0, 40, 1.0), (0.7, 0, 0.9), (1.3, 20, 0.8), (0.0, 0, 1.0)]
    for i, (temperature, top_k, top_p) in enumerate(settings * 2):
        logits = (rng.standard_normal(300) * 3).astype(np.float32)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
        probs = probs_from_logits(logits, params)
        top_n = [0, 8][i % 2]
        dist = truncate_top_n(probs, top_n)
        seed, positions = [0, 7, 2**64 - 1, 2**63 + 5][i % 4], [0, 1, 17, 4096, 123456]
        draws = [sample(dist, PositionDraws(seed), p) for p in positions]
        cases.append({
            "logits": logits.tolist(), "temperature": temperature, "top_k": top_k, "top_p": top_p, "top_n": top_n,
            "probs": probs.tolist(), "q_ids": dist.token_ids.tolist(), "q_probs": dist.probs.tolist(),
            "seed": str(seed), "positions": positions, "draws": draws,
        })
    uniforms = [{"seed": str(seed), "position": p, "key": f"{position_key(seed, p):016x}",
                 "u": position_uniforms(seed, p, np.array([0, 2, 49151, 262143])).tolist()}
                for seed in (0, 1, 2**64 - 1) for p in (0, 7, 123456)]
    return {"cases": cases, "uniforms": uniforms}


def main() -> None:
    what = sys.argv[1]
    if what == "tokenizer":
        out = tokenizer_reference(Path(sys.argv[2]))
    elif what == "draft":
        out = draft_reference(Path(sys.argv[2]))
    elif what == "sampling":
        out = sampling_reference()
    else:
        raise SystemExit(f"unknown reference {what!r}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
