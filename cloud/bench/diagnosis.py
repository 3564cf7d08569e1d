"""Diagnosis: where the draft loses, by draft position and by the kind of token it had to guess.

A drafted position is *evaluated* when every draft before it in its block was accepted; its
*true token* is then what the target emitted there (the draft itself if accepted, the
recovered token if not). Positions after the first rejection were never judged and are not
counted. Token kinds come from Python's own tokenizer run over the decoded text (the demo
workload is Python code): identifier, keyword, number, whitespace (newlines and indentation
included), punctuation (operators and brackets), string, comment, other.
"""

from __future__ import annotations

import io
import keyword
import tokenize
from collections import Counter
from dataclasses import dataclass, field

CATEGORIES = ("identifier", "keyword", "number", "whitespace", "punctuation", "string", "comment", "other")
_KINDS = {
    tokenize.NUMBER: "number",
    tokenize.STRING: "string",
    tokenize.COMMENT: "comment",
    tokenize.OP: "punctuation",
    tokenize.NEWLINE: "whitespace",
    tokenize.NL: "whitespace",
    tokenize.INDENT: "whitespace",
    tokenize.DEDENT: "whitespace",
}


def char_categories(text: str) -> list[str]:
    """The token kind of every character of ``text`` (best effort on incomplete code).

    Samples start and end mid-file: a dedent below the sample's first indentation makes
    Python's tokenizer stop, so tokenizing restarts at the offending line, which becomes
    the new base indentation.
    """
    kinds = ["whitespace" if ch.isspace() else "other" for ch in text]
    line_starts = [0]
    for line in text.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    first_line = 0  # where the current tokenizer run starts, as an index into line_starts
    while first_line < len(line_starts) - 1:
        failed_at = _classify_from(text, line_starts, first_line, kinds)
        if failed_at is None:
            break
        # Restart at the failing line (or after it, when it is the run's first line).
        first_line = failed_at if failed_at > first_line else first_line + 1
    return kinds


def _classify_from(text: str, line_starts: list[int], first_line: int, kinds: list[str]) -> int | None:
    """Tokenizes from ``first_line``; returns the line index where an indentation error stopped it."""
    base = line_starts[first_line]
    offsets = [start - base for start in line_starts[first_line:]]
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text[base:]).readline):
            if tok.type == tokenize.NAME:
                kind = "keyword" if keyword.iskeyword(tok.string) or keyword.issoftkeyword(tok.string) else "identifier"
            else:
                kind = _KINDS.get(tok.type)
            if kind is None or tok.start[0] > len(offsets) - 1:
                continue
            start = base + offsets[tok.start[0] - 1] + tok.start[1]
            end = base + offsets[min(tok.end[0], len(offsets)) - 1] + tok.end[1]
            for i in range(start, min(end, len(text))):
                if not (kind == "whitespace" and not text[i].isspace()):
                    kinds[i] = kind
    except IndentationError as exc:
        return first_line + max((exc.lineno or 1) - 1, 0)
    except tokenize.TokenError as exc:
        # Unfinished code at the end of a sample: keep what was classified; a string still open
        # at the end (a docstring being written) is a string up to the end.
        where = exc.args[1] if len(exc.args) > 1 else None
        if "string" in str(exc.args[0]) and isinstance(where, tuple) and where[0] <= len(offsets) - 1:
            for i in range(base + offsets[where[0] - 1] + where[1], len(text)):
                if not text[i].isspace():
                    kinds[i] = "string"
    except SyntaxError:
        pass
    return None


def token_categories(decode, context_ids: list[int], token_ids: list[int]) -> list[str]:
    """Kind of each of ``token_ids`` (decoded after ``context_ids``): its first non-space character's."""
    prefix = decode(context_ids)
    text = decode(context_ids + token_ids)
    kinds = char_categories(text)
    out = []
    previous = len(prefix)
    for i in range(1, len(token_ids) + 1):
        end = len(decode(context_ids + token_ids[:i]))
        span = range(previous, min(end, len(text)))
        chosen = "whitespace"
        for j in span:
            if not text[j].isspace():
                chosen = kinds[j]
                break
        out.append(chosen)
        previous = max(previous, end)
    return out


@dataclass
class Diagnosis:
    evaluated_by_position: Counter = field(default_factory=Counter)
    accepted_by_position: Counter = field(default_factory=Counter)
    evaluated_by_kind: Counter = field(default_factory=Counter)
    accepted_by_kind: Counter = field(default_factory=Counter)
    rejected_true_tokens: Counter = field(default_factory=Counter)
    evaluated_true_tokens: Counter = field(default_factory=Counter)

    def add(self, decode, prompt_ids: list[int], generated: list[int], rounds) -> None:
        """Accounts one generation: its committed tokens and its RoundRecords, in order."""
        kinds = token_categories(decode, prompt_ids, generated)
        offset = 0  # index in ``generated`` of the round's first emitted token
        for record in rounds:
            emitted = list(record.drafts[: record.accepted]) + [record.next_token]
            judged = record.accepted + (1 if record.accepted < record.k else 0)
            for i in range(judged):
                index = offset + i
                if index >= len(generated):
                    break
                accepted = i < record.accepted
                true_token = generated[index]
                kind = kinds[index]
                self.evaluated_by_position[i + 1] += 1
                self.evaluated_by_kind[kind] += 1
                self.evaluated_true_tokens[true_token] += 1
                if accepted:
                    self.accepted_by_position[i + 1] += 1
                    self.accepted_by_kind[kind] += 1
                else:
                    self.rejected_true_tokens[true_token] += 1
            offset += len(emitted)

    def by_position(self) -> dict[int, float]:
        return {p: self.accepted_by_position[p] / n for p, n in sorted(self.evaluated_by_position.items()) if n}

    def by_kind(self) -> dict[str, dict[str, float]]:
        return {
            kind: {"evaluated": n, "acceptance": self.accepted_by_kind[kind] / n}
            for kind, n in sorted(self.evaluated_by_kind.items(), key=lambda item: -item[1])
            if n
        }

    def most_rejected(self, decode, top: int = 15) -> list[dict]:
        rows = []
        for token, rejections in self.rejected_true_tokens.most_common(top):
            evaluated = self.evaluated_true_tokens[token]
            rows.append(
                {"token_id": token, "text": decode([token]), "rejections": rejections, "rejection_rate": rejections / evaluated}
            )
        return rows
