"""Stop strings: cut a stream of text pieces at the first occurrence of any of them.

Used by the device server (OpenAI's ``stop``) and ``edgespec generate --stop``. A piece that
might be the start of a stop string is held back until the next piece shows whether it is.
"""

from __future__ import annotations


class StopMatcher:
    """Cuts a text stream at the first stop string; holds back what might begin one."""

    def __init__(self, stops: list[str]):
        if not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {stops!r}")
        self.stops = list(stops)
        self.text = ""  # everything generated so far
        self.sent = 0  # characters already released
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The newly releasable text after ``piece`` (nothing once a stop string was seen)."""
        if self.stopped:
            return ""
        self.text += piece
        found = [at for stop in self.stops if (at := self.text.find(stop, max(0, self.sent - len(stop) + 1))) >= 0]
        if found:  # the earliest of them, whichever stop string it is
            self.stopped = True
            self.text = self.text[: min(found)]
        hold = 0 if self.stopped else max((len(s) - 1 for s in self.stops), default=0)
        # Release all but a tail that could be the start of a stop string.
        end = len(self.text)
        if hold:
            for n in range(min(hold, end - self.sent), 0, -1):
                if any(s.startswith(self.text[end - n :]) for s in self.stops):
                    end -= n
                    break
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out

    def flush(self) -> str:
        """What was held back, once the stream ended (it began no stop string after all)."""
        out, self.sent = self.text[self.sent :], len(self.text)
        return out
