"""What a block of k drafts commits: the planner's one acceptance estimator.

Terms: a round sends k drafts and n are accepted; it commits n + 1 tokens (the recovered or bonus
token included). Position i of a block is *reached* when drafts 1..i-1 were accepted; its draft
is then accepted or not. A round with n < k reached positions 1..n+1 and accepted 1..n; with
n = k it reached and accepted all k.

Per position, decayed counts of reached and accepted (rounds verified, or replayed over a
stream by ``Replay``) give c_i = P(draft i accepted | position i reached). A round of k drafts
commits on average

    E[tokens | k] = 1 + sum_{i=1..k} c_1 c_2 ... c_i

and a block of k sent ahead holds (all k accepted and the bonus guessed) with c_1 ... c_(k+1).
Unlike the geometric (1 - a^(k+1)) / (1 - a) this keeps what bursty text does: a draft right
on a passage's first tokens tends to be right on the next ones too.

Each c_i is shrunk towards c_(i-1) (c_1 towards the prior) by ``shrink`` pseudo-drafts: a
position seldom reached follows the deepest measured one, so k can grow. Blocks sent ahead that
held make one long block with the block after them, so short blocks measure deep positions too.
"""

from __future__ import annotations

MAX_C = 0.99  # NOTE: a position always accepted so far is no proof of certainty


class Acceptance:
    """Per-position (reached, accepted) counts, each round's weight decaying by ``decay``."""

    def __init__(self, decay: float, shrink: float, prior: float):
        self.decay, self.shrink, self.prior = decay, shrink, prior
        self.reached: list[float] = []
        self.accepted: list[float] = []
        self.seen = 0.0  # drafts ever observed: whether the draft is known at all

    def add(self, accepted: int, k: int, after: int = 0, limit: int | None = None) -> None:
        """A verified round: ``accepted`` of ``k`` drafts, after ``after`` positions of blocks
        that held (the last, their bonus guessed); positions past ``limit`` are not kept."""
        lead = [0.0] * (after - 1) + [1.0] if after else []  # (the last bonus guess: reached, accepted)
        reached, hits = lead + [1.0] * min(accepted + 1, k), lead + [1.0] * accepted
        self.add_counts(reached[:limit], hits[:limit])

    def add_counts(self, reached: list[float], accepted: list[float], rounds: float = 1.0) -> None:
        """Per-position counts of ``rounds`` rounds (fractional for replayed ones): what was
        there before weighs ``decay ** rounds``."""
        self.seen += sum(reached)
        decay, size = self.decay ** rounds, max(len(reached), len(self.reached))
        self.reached = [decay * r for r in self.reached] + [0.0] * (size - len(self.reached))
        self.accepted = [decay * a for a in self.accepted] + [0.0] * (size - len(self.accepted))
        for i, (r, a) in enumerate(zip(reached, list(accepted) + [0.0] * len(reached))):
            self.reached[i] += r
            self.accepted[i] += a

    def forget(self, weight: float) -> None:
        """Counts so far weigh ``weight`` (a new text: the last one says less of it)."""
        self.reached = [weight * r for r in self.reached]
        self.accepted = [weight * a for a in self.accepted]

    def drafts(self) -> float:  # drafts observed, decayed: what the estimates rest on
        return sum(self.reached)

    def by_position(self, n: int) -> list[float]:
        """c_1..c_n, each shrunk towards the one before it."""
        out, previous = [], self.prior
        for i in range(n):
            r = self.reached[i] if i < len(self.reached) else 0.0
            a = self.accepted[i] if i < len(self.accepted) else 0.0
            previous = min((a + self.shrink * previous) / (r + self.shrink), MAX_C)
            out.append(previous)
        return out

    def tokens_and_holds(self, max_k: int) -> tuple[list[float], list[float]]:
        """Per k (index k, 1..max_k): E[tokens | k] and the chance a block of k sent ahead holds."""
        c = self.by_position(max_k + 1)
        tokens, holds, survive = [1.0], [0.0], 1.0
        for k in range(1, max_k + 1):
            survive *= c[k - 1]
            tokens.append(tokens[-1] + survive)
            holds.append(survive * c[k])
        return tokens, holds


class Replay:
    """Rounds of ``k`` drafts replayed over streamed tokens, from each token's chance that a
    draft there would have been accepted. The state is the chance of each block position (and
    of the bonus) at the next token: a chance of 0.6 sends 0.6 of the block on and ends 0.4 of
    it; with chances of 0 and 1 this is the exact replay of greedy rounds."""

    def __init__(self, k: int):
        self.k = max(1, int(k))
        self.restart()

    def restart(self) -> None:
        """A gap in the stream (the shadow rested): the next token starts a fresh block."""
        self.mass, self.bonus = [1.0] + [0.0] * (self.k - 1), 0.0

    def feed(self, chances: list[float]) -> tuple[list[float], list[float], float]:
        """Advances over the tokens; returns their per-position (reached, accepted) counts and
        the rounds they ended."""
        reached, accepted, ended = [0.0] * self.k, [0.0] * self.k, 0.0
        for chance in chances:
            p, new = min(max(float(chance), 0.0), 1.0), [0.0] * self.k
            new[0], bonus = self.bonus, 0.0  # a bonus token ends its round, no draft of its own
            ended += self.bonus
            for i, m in enumerate(self.mass):
                reached[i] += m
                accepted[i] += m * p
                new[0] += m * (1 - p)  # rejected: the streamed token was the round's correction
                ended += m * (1 - p)
                if i + 1 < self.k:
                    new[i + 1] += m * p
                else:
                    bonus += m * p
            self.mass, self.bonus = new, bonus
        return reached, accepted, ended
