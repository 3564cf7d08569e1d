"""Instructions for a chat target: what the real pair's draft is distilled on and measured with.

A chat model's draft only ever guesses the target's replies, so it is trained on the target's
own replies to instructions like the ones users send. No hub is reachable, so the
instructions are made here, deterministically, from two sources every machine has:

- **code tasks** from the Python standard library: each documented function becomes "write a
  function that <its docstring's first sentence>", "explain this function" (its source) or
  "complete this code" (its header and docstring). The stdlib's split by file
  (``corpus.split_of``) keeps held-out files out of training, as for the demo pair;
- **general chat**: task templates (explain, list, compare, write a short text...) crossed
  with subjects from a fixed list. A subject's split is a hash of the subject, so a held-out
  prompt's subject never appears in training under any template.

``instruction_sets()`` returns the training instructions (these two, interleaved with the
requests composed from hand-written pieces, ``chat_requests.py``) and the held-out and tuning
prompt sets (``prompts/chat-heldout.jsonl``, ``prompts/chat-tuning.jsonl``).
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import textwrap
from pathlib import Path

from edgespec.cloud.training.corpus import list_corpus, stdlib_root
from edgespec.cloud.training.instruction import Instruction

SUBJECTS = """
photosynthesis; black holes; the water cycle; volcanoes; earthquakes; the moon landing;
the printing press; the Roman empire; ancient Egypt; the French revolution; the industrial revolution;
the internet; electricity; magnets; gravity; rainbows; the seasons; ocean tides; climate change;
recycling; solar power; wind turbines; nuclear energy; electric cars; bicycles; trains; airplanes;
submarines; bridges; skyscrapers; coffee; tea; chocolate; bread baking; pasta; sushi; vegetarian cooking;
healthy breakfasts; sleep; exercise; running; swimming; yoga; meditation; stress; friendship; kindness;
teamwork; leadership; time management; procrastination; public speaking; job interviews; writing a resume;
learning a language; reading habits; libraries; museums; chess; football; basketball; the Olympic games;
music theory; the piano; the guitar; jazz; classical music; painting; photography; movies; poetry;
Shakespeare; fairy tales; dragons; robots; artificial intelligence; machine learning; neural networks;
databases; spreadsheets; passwords; computer viruses; cloud computing; smartphones; batteries; lasers;
the human heart; the brain; vaccines; bacteria; dinosaurs; bees; ants; whales; dolphins; elephants;
penguins; cats; dogs; houseplants; gardening; forests; deserts; rivers; mountains; islands; the Arctic;
the solar system; Mars; Jupiter; comets; telescopes; the speed of light; atoms; chemical reactions;
prime numbers; fractions; probability; statistics; budgeting; saving money; interest rates; inflation;
taxes; voting; democracy; the United Nations; maps; compasses; the metric system; calendars; clocks;
weather forecasts; hurricanes; snow; umbrellas; camping; hiking; travel packing; hotels; birthdays;
weddings; holidays; gift ideas; board games; video games; cartoons; comics; podcasts; newspapers;
email etiquette; online safety; open source software; version control; the Python language; recursion;
sorting algorithms; binary numbers; encryption; compression; operating systems; keyboards; 3D printing;
the wheel; paper; glass; steel; plastic pollution; clean water; farming; honey; cheese; apples; potatoes
"""

CHAT_TEMPLATES = (
    "Explain {s} to a ten-year-old.",
    "What is {s}? Answer in two sentences.",
    "Give me three interesting facts about {s}.",
    "Write a short poem about {s}.",
    "List five key words related to {s}.",
    "Write a short paragraph about {s}.",
    "What are the advantages and disadvantages of {s}?",
    "Give three tips for someone interested in {s}.",
    "Summarize the main ideas of {s} in a few bullet points.",
    "Write a haiku about {s}.",
    "Why is {s} important?",
    "Tell me a short story involving {s}.",
    "Write a quiz question about {s} with its answer.",
    "How would you describe {s} to someone who has never heard of it?",
    "Write a tweet about {s}.",
    "What are common misconceptions about {s}?",
)

CODE_TEMPLATES = (
    "Write a Python function `{name}({args})` that {doc}",
    "Explain what this Python function does:\n```python\n{source}\n```",
    "Complete this Python function:\n```python\n{header}\n```",
)

CHAT_SHARE = 0.4  # of training instructions, while general chat lasts
HELDOUT_PERCENT = 10  # of subjects (general chat); code follows the stdlib's file split


def subjects() -> list[str]:
    return [s.strip() for s in SUBJECTS.replace("\n", " ").split(";") if s.strip()]


def subject_split(subject: str) -> str:
    bucket = int.from_bytes(hashlib.sha256(subject.encode()).digest()[:4], "big") % 100
    return "heldout" if bucket < HELDOUT_PERCENT else "train"


def _first_sentence(doc: str) -> str | None:
    line = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    sentence = line.split(". ")[0].rstrip(".")
    words = sentence.split()
    if not 4 <= len(words) <= 30 or not sentence[0].isalpha():
        return None
    verb = words[0].lower()
    # "Return x" -> "returns x": docstrings are mostly imperative, the instruction reads "that returns".
    if verb in ("a", "an", "the", "this", "if", "for", "when") or not verb.isalpha():
        return None
    if not verb.endswith("s") or verb.endswith("ss"):
        verb += "es" if verb.endswith(("ss", "sh", "ch", "x")) else "s"
    return " ".join([verb] + words[1:]) + "."


def _functions(source: str):
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            body = lines[node.lineno - 1 : node.end_lineno]
            if doc and 3 <= len(body) <= 40:
                yield node, doc, textwrap.dedent("\n".join(body))


def code_instructions(split: str) -> list[Instruction]:
    """Three kinds of code task per documented public function of the stdlib files in ``split``."""
    out: list[Instruction] = []
    root = stdlib_root()
    for corpus_file in list_corpus(root):
        if corpus_file.split != split:
            continue
        try:
            source = (root / corpus_file.relpath).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for node, doc, body in _functions(source):
            sentence = _first_sentence(doc)
            args = ", ".join(a.arg for a in node.args.args)
            key = f"{corpus_file.relpath}:{node.lineno}"
            if sentence:
                out.append(Instruction(f"{key}:write", "code", CODE_TEMPLATES[0].format(name=node.name, args=args, doc=sentence)))
            out.append(Instruction(f"{key}:explain", "code", CODE_TEMPLATES[1].format(source=body)))
            header = "\n".join(body.splitlines()[: 1 + len(doc.splitlines()) + 1])
            out.append(Instruction(f"{key}:complete", "code", CODE_TEMPLATES[2].format(header=header)))
    return out


def chat_instructions(split: str) -> list[Instruction]:
    return [
        Instruction(f"{subject}:{t}", "chat", template.format(s=subject))
        for subject in subjects()
        if subject_split(subject) == split
        for t, template in enumerate(CHAT_TEMPLATES)
    ]


def _interleave(chat: list[Instruction], code: list[Instruction], chat_share: float, rng: random.Random) -> list[Instruction]:
    """Both lists shuffled and merged so that any prefix holds about ``chat_share`` chat (until
    one list runs out): a replies corpus cut short by its time budget keeps the mix."""
    rng.shuffle(chat)
    rng.shuffle(code)
    out, i, j = [], 0, 0
    while i < len(chat) or j < len(code):
        take_chat = j >= len(code) or (i < len(chat) and i < chat_share * (i + j + 1))
        if take_chat:
            out.append(chat[i])
            i += 1
        else:
            out.append(code[j])
            j += 1
    return out


def instruction_sets(seed: int = 0, heldout: int = 48, tuning: int = 32, requests: int = 4096,
                     requests_share: float = 0.5) -> dict[str, list[Instruction]]:
    """``train`` (everything not held out, shuffled; any prefix holds about ``requests_share``
    of composed requests), ``heldout`` and ``tuning`` (half chat, half code; chat from held-out
    subjects, disjoint between the two; code from the held-out and the validation files)."""
    from edgespec.cloud.training.chat_requests import chat_requests

    rng = random.Random(seed)
    train = _interleave(chat_instructions("train"), code_instructions("train"), CHAT_SHARE, rng)
    if requests:
        # its own generator: the held-out and tuning sets below draw the same as without requests
        train = _interleave(chat_requests(requests, seed + 1), train, requests_share, random.Random(seed + 1))
    chat = chat_instructions("heldout")
    rng.shuffle(chat)
    sets = {"train": train}
    # Code: held-out files for reported figures, validation files for tuning (as the demo pair).
    for name, count, files in (("heldout", heldout, "heldout"), ("tuning", tuning, "validation")):
        code = code_instructions(files)
        rng.shuffle(code)
        sets[name] = chat[: count // 2] + code[: count - count // 2]
        chat = chat[count // 2 :]
    return sets


def write_prompt_set(path: Path, instructions: list[Instruction]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for instruction in instructions:
            f.write(json.dumps(instruction.to_json()) + "\n")
