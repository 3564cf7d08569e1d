"""The eval stage of ``edgespec make-draft``: the shipped figures of a draft on the held-out prompts.

On the held-out prompts (``prompts/chat-heldout.jsonl``), the target's own float32 greedy
replies: the exported graphs' greedy agreement, model-only tau and acceptance by position (one
teacher-forced pass each), tau with context lookup (the torch draft, simulated as the device
drafts), and ms per drafted token of each graph against one target decode step, one thread each.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path



def _eval_texts(config, target):
    """The held-out prompts and the target's own float32 greedy replies to them."""
    from transformers import AutoTokenizer

    from edgespec.cloud.training.chat_format import chat_format
    from edgespec.cloud.training.target_replies import reply_batch

    tokenizer = AutoTokenizer.from_pretrained(config.target, local_files_only=True)
    form = chat_format(config.target, tokenizer, config.chat_template)
    stop = list(form.stop_ids)
    rows = [json.loads(line) for line in config.heldout_prompts.read_text().splitlines() if line.strip()][: config.eval_prompts]
    prompts = [form.ids(tokenizer, row.get("messages") or row["prompt"]) for row in rows]
    replies = []
    for start in range(0, len(prompts), 16):
        batch = prompts[start : start + 16]
        replies += [r for r, _, _ in reply_batch(target, batch, max_new_tokens=config.eval_new_tokens, stop=stop, top_k=1, pad=stop[0])]
    return prompts, replies


def _draft_ms(draft_dir: Path, context: list[int], k: int, rounds: int = 40) -> float:
    from edgespec.edge.draft import DraftModel

    draft = DraftModel(draft_dir, threads=1)
    times = []
    for _ in range(3):
        draft.reset(context)
        draft.propose(1)
        draft.rollback_to(len(context))
        started = time.perf_counter()
        for _ in range(rounds):
            draft.propose(k)
            draft.rollback_to(len(context))
        times.append((time.perf_counter() - started) * 1e3 / (rounds * k))
    return statistics.median(times)


def _target_step_ms(target, context: list[int], steps: int = 20) -> float:
    import torch

    with torch.inference_mode():
        out = target(input_ids=torch.tensor([context]), use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        started = time.perf_counter()
        for _ in range(steps):
            out = target(input_ids=token, cache=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    return (time.perf_counter() - started) * 1e3 / steps


def _onnx_acceptance(draft_dir: Path, prompts, replies, k: int) -> dict:
    """Greedy agreement and model-only tau of an exported graph on the replies: a greedy draft
    keeps drafting only while it agrees, so one teacher-forced pass gives each round exactly."""
    from edgespec.cloud.training.distill_replies import tau_from_hits
    from edgespec.edge.draft import DraftModel

    draft = DraftModel(draft_dir, threads=1)
    hits_total = positions = rounds = committed = 0
    accepted_at = [0] * k
    for prompt, reply in zip(prompts, replies):
        logits = draft.logits_for_context(prompt + reply[:-1])[len(prompt) - 1 :]
        hits = [int(a) == int(b) for a, b in zip(logits.argmax(-1), reply)]
        hits_total, positions = hits_total + sum(hits), positions + len(hits)
        r, c, a = tau_from_hits(hits, k)
        rounds, committed = rounds + r, committed + c
        accepted_at = [x + y for x, y in zip(accepted_at, a)]
    return {"greedy_agreement": hits_total / max(positions, 1), "tau": committed / max(rounds, 1),
            "acceptance_by_position": [a / max(rounds, 1) for a in accepted_at], "rounds": rounds}


def stage_eval(config, log) -> dict:
    """``config``: make-draft's ``MakeDraftConfig``; ``log``: where the figures are reported."""
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.cloud.training.simulate_acceptance import Acceptance, simulate_greedy
    from edgespec.cloud.training.loop import configure_threads
    from edgespec.cloud.training.vocab_draft import load_draft
    from edgespec.edge.lookup import LookupConfig

    configure_threads(config.threads)
    target = AutoModelForCausalLM.from_pretrained(config.target, dtype=torch.float32, local_files_only=True).eval()
    prompts, replies = _eval_texts(config, target)
    graphs = {name: _onnx_acceptance(config.out / "export" / name, prompts, replies, config.k) for name in ("fp32", "int8")}
    draft = load_draft(config.out / "distill" / "final")
    with_lookup = Acceptance(config.k)  # the device's greedy drafting: the model and context lookup
    with torch.no_grad():
        for prompt, reply in zip(prompts, replies):
            simulate_greedy(draft, torch.tensor(prompt), torch.tensor(reply), config.k, with_lookup, LookupConfig())
    context = prompts[0] + replies[0]
    costs = {name: _draft_ms(config.out / "export" / name, context, config.k) for name in ("fp32", "int8")}
    target_ms = _target_step_ms(target, context)
    metrics = {
        "prompts": len(prompts), "reply_tokens": sum(len(r) for r in replies), "k": config.k,
        "onnx": graphs,
        "tau_with_lookup": with_lookup.tau, "acceptance_by_position_with_lookup": with_lookup.per_position,
        "draft_ms_per_token": costs, "target_decode_step_ms": target_ms,
        "draft_cost_vs_target_step": {name: ms / target_ms for name, ms in costs.items()},
    }
    (config.out / "eval").mkdir(parents=True, exist_ok=True)
    (config.out / "eval" / "metrics.json").write_text(json.dumps(metrics, indent=1))
    log(f"eval: {json.dumps(metrics)}")
    return metrics
