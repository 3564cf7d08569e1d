"""Incremental detokenisation: pieces concatenate to the full text, split characters wait."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from edgespec.edge.detok import IncrementalDecoder


def byte_level_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(["def f(x):\n    return x + 1\n"] * 20, trainer=trainer)
    return tokenizer


def test_pieces_join_to_the_decoded_text():
    tokenizer = byte_level_tokenizer()
    ids = tokenizer.encode("def f(x):\n    return x + 1\n").ids
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push([token]) for token in ids]
    assert "".join(pieces) + decoder.flush() == tokenizer.decode(ids)
    assert decoder.text == tokenizer.decode(ids)


def test_a_character_split_across_tokens_waits_for_its_last_byte():
    tokenizer = byte_level_tokenizer()
    ids = tokenizer.encode("é").ids  # not in the training text: one token per UTF-8 byte
    assert len(ids) == 2
    decoder = IncrementalDecoder(tokenizer)
    assert decoder.push(ids[:1]) == ""  # half a character is not emitted
    assert decoder.push(ids[1:]) == "é"
    assert decoder.flush() == ""
