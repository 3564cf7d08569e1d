"""How likely a draft is to be worth speculating with, and what a block of k drafts commits.

Terms (as ``policy``): a round sends k drafts; n are accepted; it commits n + 1 tokens (the
recovered or bonus token included). Position i of a block is *reached* when drafts 1..i-1 were
accepted; its draft is then accepted or not. A round with n < k reached positions 1..n+1 and
accepted 1..n; with n = k it reached and accepted all k.

Two views of the same counts, rounds verified or replayed over a stream (``Replay``):

- pooled, over the last ``ROUNDS``: the per-position acceptance a with Jeffreys' prior,

      a | rounds ~ Beta(1/2 + accepted drafts, 1/2 + rejected drafts)

  Jeffreys' prior is U-shaped: a draft is usually a model of the target (a ~ 0.6-0.9) or not
  one at all (a near 0), rarely in between. Speculation can only win if a reaches the link's
  break-even a* (``Forecast.break_even``): the chance it can win is the Beta's upper tail at a*.
- by position, over the last ``LONG_ROUNDS`` (the recent ``ROUNDS`` counted twice):
  c_i = P(draft i accepted | position i reached), each shrunk towards the pooled
  mean by ``SHRINK`` pseudo-observations (a position seldom reached says little; one never
  reached is the pooled mean). A round of k drafts then commits on average

      E[tokens | k] = 1 + sum_{i=1..k} c_1 c_2 ... c_i      (``forecast.tokens_and_holds``)

  which, unlike the geometric (1 - a^(k+1)) / (1 - a), keeps what bursty text does: a draft
  that got the first tokens of a passage right tends to get the next ones right too, so a
  longer block commits more than a round of the first, short probing blocks suggests.

And one view over texts: each request's own acceptance (its rounds and replays, accepted over
reached), the last ``TEXTS`` of them. Pooling rounds across texts concentrates the posterior on
the mean acceptance, but texts differ (an easy one at 0.9 after a hard one at 0.4): whether a
*new* text can win is the share of the last texts that reached a* (none of them: a draft
that never won a text is not tried on the next one for hope alone). Whether *this* text can
win is its own rounds' posterior from a prior that is what the last texts did, mixed with
Jeffreys' for a text unlike them (``text_chance_at_least``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

PRIOR = 0.5  # Jeffreys' prior: Beta(1/2, 1/2)
ROUNDS = 16  # recent rounds (verified, or replayed over a stream) the posterior is computed over
LONG_ROUNDS = 64  # rounds acceptance by position is computed over (the recent ones count twice)
SHRINK = 4.0  # pseudo-observations pulling each position's acceptance towards the pooled mean
TEXTS = 16  # texts (requests) a new text's chance is judged from
TEXT_DRAFTS = 8  # drafts a text must have had observed to count as one
TEXT_PRIOR_TEXTS = 4  # texts ended before they, not Jeffreys' prior, are a new text's prior
TEXT_PRIOR_DRAFTS = 8.0  # ...worth at most this many drafts of the text's own
TEXT_PRIOR_MIN_VARIANCE = 0.0025  # ...and never surer of a text's acceptance than a spread of 0.05


@dataclass
class Acceptance:
    """The last ``LONG_ROUNDS`` rounds, each as (reached, accepted) counts per position
    (fractional for rounds replayed from acceptance chances). The posterior is the last
    ``ROUNDS``' (it must notice a draft gone bad within a few rounds); acceptance by position
    counts the recent rounds twice and the older ones once (a forecast halfway between the
    recent text and the long run: a hard passage does not last, nor an easy one)."""

    history: deque = field(default_factory=lambda: deque(maxlen=LONG_ROUNDS))
    texts: deque = field(default_factory=lambda: deque(maxlen=TEXTS))  # each ended text's acceptance
    _text: list = field(default_factory=lambda: [0.0, 0.0])  # this text's drafts (reached, accepted)
    _text_rounds: int = 0  # this text's rounds (the last of ``history``)
    _segment: list = field(default_factory=lambda: [0, 0.0])  # rounds and drafts since ``begin_segment``
    _posterior: tuple[float, float] | None = field(default=None, repr=False, compare=False)  # once per round added
    # Per position, (reached, accepted) summed over ``history`` and over its last ``ROUNDS``, kept
    # as rounds come and go (a forecast asks for acceptance by position several times a round:
    # summing 80 rounds each time was a fifth of a millisecond of the device's Python).
    _sums: tuple = field(default_factory=lambda: ([], [], [], []), repr=False, compare=False)
    _by_k: dict = field(default_factory=dict, repr=False, compare=False)  # by_position(k), until a round is added

    @property
    def rounds(self) -> list:
        """The last ``ROUNDS`` rounds."""
        return list(self.history)[-ROUNDS:]

    def add(self, accepted: int, k: int) -> None:
        """A verified round: ``accepted`` of ``k`` drafts."""
        reached = min(accepted + 1, k)
        self._append(([1.0] * reached, [1.0] * accepted))
        self._counted(reached, accepted)

    def add_counts(self, reached: list[float], accepted: list[float]) -> None:
        """A replayed round (or an expected one): per position, how often reached and accepted."""
        self._append((list(reached), list(accepted)))
        self._counted(sum(reached), sum(accepted))

    def _append(self, counts: tuple[list[float], list[float]]) -> None:
        all_r, all_a, recent_r, recent_a = self._sums
        if len(self.history) == self.history.maxlen:
            _move(self.history[0], all_r, all_a, -1.0)  # the oldest round leaves the history
        if len(self.history) >= ROUNDS:
            _move(self.history[-ROUNDS], recent_r, recent_a, -1.0)  # ...and this one the recent rounds
        self.history.append(counts)
        _move(counts, all_r, all_a, 1.0)
        _move(counts, recent_r, recent_a, 1.0)
        self._by_k.clear()

    def _counted(self, reached: float, accepted: float) -> None:
        self._text[0] += reached
        self._text[1] += accepted
        self._text_rounds += 1
        self._segment[0] += 1
        self._segment[1] += reached
        self._posterior = None

    def end_text(self) -> None:
        """The request ends (the next one is another text): its acceptance joins ``texts`` if
        it observed at least ``TEXT_DRAFTS`` drafts."""
        reached, accepted = self._text
        if reached >= TEXT_DRAFTS:
            self.texts.append(accepted / reached)
        self._text, self._text_rounds = [0.0, 0.0], 0

    def text_chance_at_least(self, a: float) -> float:
        """P(acceptance >= a) under the posterior of this text's own rounds (the last ``ROUNDS``
        of them; the prior alone before any): whether the draft suits this text, whatever the
        last one did.

        The prior is what the last texts did (``text_prior``), mixed with Jeffreys' for a text
        unlike any of them (weight 1 / (texts + 1)); the rounds weigh the two by how well each
        foresaw them. Two early misses of a draft right on 0.9-0.98 of every earlier text are
        no verdict on this one: with Jeffreys' prior alone they left it at P 0.02-0.09 and came
        back a dozen tokens later, two switches for nothing (replayed on 40 held-out texts, 5G:
        222-242 switches over 160 requests). A text far below the last ones (0.3 after texts at
        0.92) is left as soon as before: its rounds leave the fitted prior no weight. And a
        draft that no earlier text suited is left as fast."""
        rounds = list(self.history)[-min(self._text_rounds, ROUNDS):] if self._text_rounds else []
        accepted, rejected = _counts(rounds)
        fitted = self.text_prior()
        unlike = 1.0 / (len(self.texts) + 1) if fitted is not None else 1.0
        priors = [(unlike, (PRIOR, PRIOR))] + ([(1 - unlike, fitted)] if fitted is not None else [])
        log_weights = [math.log(share) + _log_evidence(prior, accepted, rejected) for share, prior in priors]
        weights = [math.exp(w - max(log_weights)) for w in log_weights]
        return sum(w * beta_upper_tail(a, alpha + accepted, beta + rejected)
                   for w, (_, (alpha, beta)) in zip(weights, priors)) / sum(weights)

    def text_prior(self) -> tuple[float, float] | None:
        """The last texts' acceptances as a Beta(alpha, beta), fitted by their mean and spread
        and worth at most ``TEXT_PRIOR_DRAFTS`` drafts (texts alike give a firm prior, texts
        that differ a loose one); None until ``TEXT_PRIOR_TEXTS`` texts ended."""
        if len(self.texts) < TEXT_PRIOR_TEXTS:
            return None
        values = list(self.texts)
        mean = min(max(sum(values) / len(values), 0.01), 0.99)
        spread = max(sum((v - mean) ** 2 for v in values) / (len(values) - 1), TEXT_PRIOR_MIN_VARIANCE)
        strength = min(max(mean * (1 - mean) / spread - 1, 2 * PRIOR), TEXT_PRIOR_DRAFTS)
        return mean * strength, (1 - mean) * strength

    def new_text_chance_at_least(self, a: float) -> float | None:
        """P(a new text's acceptance >= a): the share of the last texts that reached it (the
        module docstring); None before any text ended."""
        if not self.texts:
            return None
        return sum(1 for mean in self.texts if mean >= a) / len(self.texts)

    @property
    def posterior(self) -> tuple[float, float]:
        """The pooled Beta posterior's (alpha, beta) parameters."""
        if self._posterior is None:
            self._posterior = pooled_posterior(self.rounds)
        return self._posterior

    @property
    def mean(self) -> float:
        alpha, beta = self.posterior
        return alpha / (alpha + beta)

    def chance_at_least(self, a: float) -> float:
        """P(acceptance >= a) under the pooled posterior."""
        return beta_upper_tail(a, *self.posterior)

    def long_run_chance_at_least(self, a: float) -> float:
        """P(acceptance >= a) under the posterior pooled over every round kept (``LONG_ROUNDS``):
        what the draft does over texts, not over the last passage."""
        return beta_upper_tail(a, *pooled_posterior(self.history))

    def by_position(self, k: int) -> list[float]:
        """c_1..c_k: each position's acceptance given it was reached (see the module docstring)."""
        if k not in self._by_k:
            all_r, all_a, recent_r, recent_a = self._sums
            at = lambda sums, i: max(sums[i], 0.0) if i < len(sums) else 0.0  # noqa: E731 (>= 0: float round-off)
            self._by_k[k] = _shrunk([at(all_r, i) + at(recent_r, i) for i in range(k)],
                                    [at(all_a, i) + at(recent_a, i) for i in range(k)])
        return list(self._by_k[k])

    def begin_segment(self) -> None:
        """The path changed (or a text began): ``segment_by_position`` counts from here."""
        self._segment = [0, 0.0]

    def segment_by_position(self, k: int) -> list[float] | None:
        """c_1..c_k over the rounds since ``begin_segment`` alone (the last ``LONG_ROUNDS`` of
        them), each shrunk towards their pooled mean; None before the first. What speculating on
        the rest of the text would do where it differs from what came before (an easy text after
        a hard one, the easy rest of a text after a hard passage): acceptance by position, over
        every round kept, leans on the hard part's many short rounds long after it ended."""
        if not self._segment[0]:
            return None
        reached: list[float] = []
        accepted: list[float] = []
        for counts in list(self.history)[-min(self._segment[0], LONG_ROUNDS):]:
            _move(counts, reached, accepted, 1.0)
        pad = lambda sums: (sums + [0.0] * k)[:k]  # noqa: E731
        return _shrunk(pad(reached), pad(accepted))

    def segment_drafts(self) -> float:
        """Drafts observed (verified or replayed) since ``begin_segment``."""
        return self._segment[1]

    def __len__(self) -> int:
        return min(len(self.history), ROUNDS)


def _move(counts: tuple[list[float], list[float]], reached_sums: list[float], accepted_sums: list[float],
          sign: float) -> None:
    """Adds (sign 1) or takes away (-1) one round's per-position counts to running sums."""
    for values, sums in zip(counts, (reached_sums, accepted_sums)):
        if len(sums) < len(values):
            sums.extend([0.0] * (len(values) - len(sums)))
        for i, value in enumerate(values):
            sums[i] += sign * value


def _shrunk(reached: list[float], accepted: list[float]) -> list[float]:
    """Per position, accepted over reached, shrunk towards the pooled mean by ``SHRINK``
    pseudo-observations (the module docstring)."""
    mean = (sum(accepted) + PRIOR) / (sum(reached) + 2 * PRIOR)
    # NOTE: clamped below 1: a position measured always right is no proof of certainty.
    return [min((a + SHRINK * mean) / (r + SHRINK), 0.995) for r, a in zip(reached, accepted)]


def _log_evidence(prior: tuple[float, float], accepted: float, rejected: float) -> float:
    """log P(these drafts' outcomes, in their order | a ~ Beta(prior)): the Beta-Bernoulli
    marginal likelihood, B(alpha + accepted, beta + rejected) / B(alpha, beta)."""
    alpha, beta = prior
    return _log_beta(alpha + accepted, beta + rejected) - _log_beta(alpha, beta)


def _log_beta(x: float, y: float) -> float:
    return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)


def pooled_posterior(rounds) -> tuple[float, float]:
    """The Beta posterior's (alpha, beta) over ``rounds`` of (reached, accepted) counts, with
    Jeffreys' prior: every draft reached is accepted or rejected."""
    accepted, rejected = _counts(rounds)
    return PRIOR + accepted, PRIOR + rejected


def _counts(rounds) -> tuple[float, float]:
    """Drafts accepted and rejected over ``rounds`` of (reached, accepted) counts."""
    accepted = sum(sum(a) for _, a in rounds)
    return accepted, max(sum(sum(r) for r, _ in rounds) - accepted, 0.0)


class Replay:
    """Rounds of ``k`` drafts replayed over a stream of tokens the device did not draft, from
    each token's chance that a draft there would have been accepted (greedy: 1 where the draft
    predicted the streamed token, else 0; sampled: see ``Planner.record_shadow_sampled``).

    The state is the chance of each block position (and of the bonus token) at the next token,
    so a chance of 0.6 sends 0.6 of the block on and ends 0.4 of it; with chances of 0 and 1
    this is the exact replay of greedy rounds. Counts are handed out a round's worth at a time."""

    def __init__(self, k: int):
        self.k = max(1, int(k))
        self.mass = [1.0] + [0.0] * (self.k - 1)  # mass[i]: i drafts of the block accepted so far
        self.bonus = 0.0  # the block was accepted whole: the next token is its bonus
        self._reset_counts()

    def _reset_counts(self) -> None:
        self.reached, self.accepted = [0.0] * self.k, [0.0] * self.k
        self.ended = self.tokens = 0.0  # rounds ended, and the tokens they committed

    def feed(self, chances: list[float]) -> list[tuple[list[float], list[float], float]]:
        """Advances over the tokens; returns each full round's worth of (reached, accepted,
        tokens committed) counts."""
        out = []
        k = self.k
        for chance in chances:
            p = min(max(float(chance), 0.0), 1.0)
            mass, new = self.mass, [0.0] * k
            new[0] = self.bonus  # the bonus token ends its round without a draft of its own
            ended, tokens = self.bonus, self.bonus * (k + 1)
            bonus = 0.0
            for i, m in enumerate(mass):
                if m <= 0.0:
                    continue
                self.reached[i] += m
                self.accepted[i] += m * p
                new[0] += m * (1 - p)  # rejected: the streamed token is the round's correction
                ended += m * (1 - p)
                tokens += m * (1 - p) * (i + 1)
                if i + 1 < k:
                    new[i + 1] += m * p
                else:
                    bonus += m * p
            self.mass, self.bonus = new, bonus
            self.ended += ended
            self.tokens += tokens
            if self.ended >= 1.0:
                out.append((self.reached, self.accepted, self.tokens / self.ended))
                self._reset_counts()
        return out

    def restart(self) -> tuple[list[float], list[float], float] | None:
        """A gap in the stream (the shadow rested): the next token starts a fresh block. Returns
        the counts of the round in progress (what was observed of it holds), if any."""
        self.mass, self.bonus = [1.0] + [0.0] * (self.k - 1), 0.0
        pending = None
        if sum(self.reached) > 0:
            pending = (self.reached, self.accepted, self.tokens / self.ended if self.ended else 0.0)
        self._reset_counts()
        return pending


def bisect_acceptance(wins) -> float:
    """The least a in [0, 1] with ``wins(a)`` true, for a ``wins`` that turns true once: 1 if
    it never does."""
    if not wins(0.999):
        return 1.0
    low, high = 0.0, 0.999
    for _ in range(30):  # ~1e-9
        mid = 0.5 * (low + high)
        low, high = (low, mid) if wins(mid) else (mid, high)
    return high


def beta_upper_tail(x: float, a: float, b: float) -> float:
    """P(X >= x) for X ~ Beta(a, b): 1 - I_x(a, b), the regularised incomplete beta function by
    its continued fraction (Numerical Recipes 6.4); the edge has no scipy."""
    if x <= 0.0:
        return 1.0
    if x >= 1.0:
        return 0.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    # NOTE: the continued fraction converges fast only below the mean; above it, use the symmetry
    # I_x(a, b) = 1 - I_{1-x}(b, a).
    if x < (a + 1.0) / (a + b + 2.0):
        return 1.0 - math.exp(log_front) * _continued_fraction(x, a, b) / a
    return math.exp(log_front) * _continued_fraction(1.0 - x, b, a) / b


def _continued_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300  # NOTE: keeps Lentz's method from dividing by zero
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return result
