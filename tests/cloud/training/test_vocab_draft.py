"""Drafts with a reduced vocabulary (vocab_draft), the replies corpus (target_replies) and
distillation on it (distill_replies), on a tiny random chat target."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from edgespec.cloud.training.distill_replies import (
    RepliesDistillConfig,
    distillation_loss,
    distill_on_replies,
    load_examples,
    tau_from_hits,
)
from edgespec.cloud.training.target_replies import RepliesConfig, chat_ids, generate_replies, load_replies, reply_batch
from edgespec.cloud.training.tiny import build_tiny_pair
from edgespec.cloud.training.draft_vocab import MASKED_LOGIT, DraftVocab, VocabMappedLM
from edgespec.edge.eos import eos_token_ids
from edgespec.cloud.training.vocab_draft import build_draft, choose_vocab, expand_to_target_vocab, load_draft

pytestmark = pytest.mark.slow
torch.set_num_threads(1)
TEMPLATE = "{% for m in messages %}<|endoftext|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
INSTRUCTIONS = [(f"i{i}", text) for i, text in enumerate(
    ["def main():", "Explain the json module.", "class Parser:", "import os", "Write a loop.", "return value"])]


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory) -> Path:
    """The tiny pair's 4-layer target with a chat template."""
    root = tmp_path_factory.mktemp("chat")
    target = build_tiny_pair(root).target_dir
    (target / "chat_template.jinja").write_text(TEMPLATE)
    return target


# ---- pure logic ----------------------------------------------------------------------------


def test_tau_from_hits_counts_rounds_as_the_verifier_does():
    # k=2: [hit hit | bonus] [miss -> correction] [hit miss -> correction] ...
    rounds, committed, accepted_at = tau_from_hits([True, True, False, False, True, False, True, True], 2)
    assert (rounds, committed, accepted_at) == (3, 6, [2, 1])  # rounds commit 3, 1, 2 tokens


def test_choose_vocab_keeps_specials_and_unknown_in_target_order():
    counts = Counter({5: 10, 3: 8, 9: 1, 7: 5})
    vocab = choose_vocab(counts, 4, always=[0], unknown=1, target_vocab_size=12)
    assert vocab.draft_to_target == [0, 1, 3, 5]
    assert vocab.draft_to_target[vocab.unknown_draft_id] == 1
    table = vocab.target_to_draft()
    assert table[5] == 3 and table[7] == vocab.unknown_draft_id


# ---- on a tiny target ----------------------------------------------------------------------


def test_a_draft_with_every_layer_gives_the_targets_logits_on_its_vocabulary(chat_target, tmp_path):
    target = AutoModelForCausalLM.from_pretrained(chat_target).eval()
    vocab_size = target.config.vocab_size
    keep = list(range(0, vocab_size, 3))  # a third of the vocabulary
    vocab = DraftVocab(vocab_size, keep, 0)
    draft = load_draft(build_draft(chat_target, vocab, list(range(target.config.num_hidden_layers)), tmp_path / "d"))
    assert isinstance(draft, VocabMappedLM)
    ids = torch.tensor([[0, 3, 6, 9, 12, 15]])  # all inside the draft vocabulary
    with torch.no_grad():
        full, mapped = target(input_ids=ids).logits, draft(input_ids=ids).logits
    assert mapped.shape == full.shape
    torch.testing.assert_close(mapped[..., keep], full[..., keep], atol=1e-5, rtol=1e-5)
    outside = [i for i in range(vocab_size) if i not in set(keep)]
    assert bool((mapped[..., outside] == MASKED_LOGIT).all())
    with torch.no_grad():  # an id outside the draft vocabulary enters as the unknown token
        assert torch.equal(draft(input_ids=torch.tensor([[1]])).logits, draft(input_ids=torch.tensor([[0]])).logits)


def test_an_expanded_draft_proposes_what_the_mapped_one_does(chat_target, tmp_path):
    vocab_size = AutoModelForCausalLM.from_pretrained(chat_target).config.vocab_size
    vocab = DraftVocab(vocab_size, list(range(0, vocab_size, 2)), 0)
    directory = build_draft(chat_target, vocab, [0, 1], tmp_path / "d")
    mapped, full = load_draft(directory), AutoModelForCausalLM.from_pretrained(expand_to_target_vocab(directory, tmp_path / "full"))
    ids = torch.tensor([[0, 2, 4, 7, 9, 12]])  # 7 and 9 are outside: both enter as the unknown token
    with torch.no_grad():
        a, b = mapped(input_ids=ids).logits, full(input_ids=ids).logits
    torch.testing.assert_close(b[..., ::2], a[..., ::2], atol=1e-5, rtol=1e-5)
    assert bool((b[..., 1::2] == 0).all())


def test_batched_replies_equal_each_prompt_alone_and_stop_at_eos(chat_target):
    model = AutoModelForCausalLM.from_pretrained(chat_target).eval()
    tokenizer = AutoTokenizer.from_pretrained(chat_target)
    stop = eos_token_ids(chat_target)
    prompts = [chat_ids(tokenizer, text) for _, text in INSTRUCTIONS[:3]]
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    batched = reply_batch(model, prompts, max_new_tokens=12, stop=stop, top_k=4, pad=stop[0])
    for prompt, (reply, tops, logprobs) in zip(prompts, batched):
        alone = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=stop, pad_token_id=stop[0])
        assert reply == alone[0, len(prompt) :].tolist()
        assert tops.shape == (len(reply), 4) and (tops[:, 0] == reply).all()
        assert (logprobs[:, :-1] >= logprobs[:, 1:]).all()  # most likely first


def test_replies_resume_and_refuse_other_settings_then_distillation_learns(chat_target, tmp_path):
    config = RepliesConfig(target=chat_target, out_dir=tmp_path / "replies", replies=4, batch=2, max_new_tokens=24,
                           top_k=8, dtype="float32")
    generate_replies(config, INSTRUCTIONS, log=lambda _: None)
    assert len(list(load_replies(config.out_dir))) == 4
    again = RepliesConfig(**{**config.__dict__, "replies": 6})
    assert generate_replies(again, INSTRUCTIONS, log=lambda _: None)["started_at_reply"] == 4  # resumed, not redone
    assert len(list(load_replies(config.out_dir))) == 6
    with pytest.raises(ValueError, match="other settings"):
        generate_replies(RepliesConfig(**{**config.__dict__, "top_k": 4}), INSTRUCTIONS)

    counts = Counter(t for p, r, _, _ in load_replies(config.out_dir) for t in list(p) + list(r))
    vocab = choose_vocab(counts, 64, always=eos_token_ids(chat_target), unknown=0,
                         target_vocab_size=AutoModelForCausalLM.from_pretrained(chat_target).config.vocab_size)
    init = build_draft(chat_target, vocab, [0], tmp_path / "init")
    examples = load_examples(config.out_dir, vocab)
    sums = torch.cat([e.top_weights.sum(-1) for e in examples])
    # p renormalised over the top tokens the draft has: 1, or 0 where it has none of them
    assert bool(((sums - 1).abs() < 1e-4).logical_or(sums == 0).all()) and float((sums > 0).float().mean()) > 0.5
    result = distill_on_replies(RepliesDistillConfig(draft=init, replies=config.out_dir, out=tmp_path / "distill", minutes=0,
                                                     tokens=3000, batch_sequences=2, lr=3e-3, warmup_tokens=10,
                                                     validation_share=0.3, bf16=False, eval_replies=config.out_dir))
    readouts = [json.loads(line) for line in (tmp_path / "distill" / "readouts.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in readouts] == ["start", "curve", "curve", "end"] and result["tokens"] >= 3000
    curve = json.loads((tmp_path / "distill" / "curve.json").read_text())  # the start and each checkpoint
    assert [p["step"] for p in curve] == [0, result["step"]] and curve[-1]["agreement"] > curve[0]["agreement"]
    assert (Path(result["final"]) / "draft_vocab.json").is_file()
    with torch.no_grad():  # the distillation loss on the corpus fell
        before = distillation_loss(AutoModelForCausalLM.from_pretrained(init), examples, bf16=False)[0]
        after = distillation_loss(AutoModelForCausalLM.from_pretrained(result["final"]), examples, bf16=False)[0]
    assert float(after) < 0.8 * float(before)
