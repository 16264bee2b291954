"""The load rule of speculation, shared by the engine's policy and the gateway's router."""

from __future__ import annotations


class LoadSwitch:
    """Speculation on or off by load, with hysteresis: off above `load_off`, back on below `load_on`,
    at most one switch per `cooldown_s` (the engine's policy and the gateway's router share it;
    the caller holds its own lock)."""

    def __init__(self, load_off: float, load_on: float, cooldown_s: float) -> None:
        self.load_off, self.load_on, self.cooldown_s = load_off, load_on, cooldown_s
        self.allows = True
        self._last_switch = float("-inf")

    def update(self, load: float, now: float) -> bool | None:
        """The new state when `load` switches it now, else None."""
        want = self.allows
        if self.allows and load > self.load_off:
            want = False
        elif not self.allows and load < self.load_on:
            want = True
        if want != self.allows and now - self._last_switch >= self.cooldown_s:
            self.allows, self._last_switch = want, now
            return want
        return None
