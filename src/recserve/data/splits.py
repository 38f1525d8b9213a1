"""How a prepared folder's events divide into training, validation and test.

Leave-one-out: each user's last item is the test target, the one before it the validation target, the rest
training. By time (``recserve data --split time``), as a shop lives: the test target is each user's first event
after the test cut, the validation target the first after the validation cut, and training holds every event up
to the validation cut. Both are one pair of counts per user: how many of the user's items lie before the
validation target and before the test target. A held-out target needs at least one item before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from recserve.data.sequences import Sequences
from recserve.errors import DataError
from recserve.option_fields import option

LEAVE_ONE_OUT = "leave-one-out"
TIME = "time"
SPLITS = (LEAVE_ONE_OUT, TIME)


@dataclass(frozen=True)
class SplitSettings:
    """Which split ``recserve data`` writes."""

    kind: str = option(
        LEAVE_ONE_OUT,
        "leave-one-out (each user's last item the test, the one before it the validation) or time (the test "
        "targets are each user's first event after --test-after, as a shop lives).",
        flags=("--split",),
    )
    test_after: str | None = option(
        None, "The time split's test cut: a timestamp in the log's units, or a share of the events before it: 90%."
    )
    valid_after: str | None = option(
        None, "The time split's validation cut (default: as many events before --test-after as after it)."
    )

    def problems(self) -> list[str]:
        if self.kind not in SPLITS:
            return [f"split={self.kind!r}: expected one of {', '.join(SPLITS)}"]
        if self.kind == TIME and self.test_after is None:
            return ["split=time needs --test-after (a timestamp, or the share of events before it: 90%)"]
        if self.kind != TIME and (self.test_after is not None or self.valid_after is not None):
            return ["--test-after and --valid-after cut a time split: add --split time"]
        return []


@dataclass(frozen=True)
class HeldOut:
    """The users who have a target in one held-out part, their histories before it, and the targets."""

    inputs: Sequences
    targets: np.ndarray  # (users,) item indices
    users: np.ndarray  # (users,) rows of the prepared folder's users


@dataclass(frozen=True)
class Cuts:
    """Per user, how many of their items come before the validation target and before the test target."""

    before_valid: np.ndarray  # (users,) int64
    before_test: np.ndarray  # (users,) int64
    kind: str = LEAVE_ONE_OUT

    @staticmethod
    def leave_one_out(sequences: Sequences) -> Cuts:
        lengths = sequences.lengths
        return Cuts(before_valid=lengths - 2, before_test=lengths - 1)

    def bags(self, sequences: Sequences) -> Sequences:
        """Mult-VAE's events (its protocol holds out users, not targets): every event of a leave-one-out
        folder, those before the test targets of a time split."""
        return self.train(sequences, refit=True) if self.kind == TIME else sequences

    def train(self, sequences: Sequences, refit: bool = False) -> Sequences:
        """What a model learns from: the items before the validation targets (``refit``: before the test's)."""
        return sequences.heads(self.before_test if refit else self.before_valid)

    def valid(self, sequences: Sequences) -> HeldOut:
        return _held_out(sequences, self.before_valid, self.before_valid < self.before_test)

    def test(self, sequences: Sequences) -> HeldOut:
        return _held_out(sequences, self.before_test, self.before_test < sequences.lengths)


def _held_out(sequences: Sequences, before: np.ndarray, has_target: np.ndarray) -> HeldOut:
    users = np.flatnonzero(has_target & (before >= 1))
    chosen = sequences.select(users)
    return HeldOut(inputs=chosen.heads(before[users]), targets=chosen.at(before[users]), users=users)


def cut_time(value: str, times: np.ndarray, option: str) -> float:
    """A cut given as a timestamp (in the log's own units) or as a share of the events before it (``90%``).

    Raises:
        DataError: neither a finite number nor a percentage within 0-100 (exclusive).
    """
    text = value.strip()
    try:
        if text.endswith("%"):
            share = float(text[:-1]) / 100
            if not 0 < share < 1:
                raise ValueError
            return float(np.quantile(times, share, method="lower"))
        number = float(text)
        if not math.isfinite(number):
            raise ValueError
        return number
    except ValueError as err:
        raise DataError(
            f"{option} {value!r}: give a timestamp in the log's units (e.g. 1700000000) or the share of events "
            "before the cut (e.g. 90%)"
        ) from err


def time_cuts(times: np.ndarray, test_after: str, valid_after: str | None) -> tuple[float, float]:
    """The test cut and the validation cut; by default the validation window holds as many events as the
    test window. Every event at or before a cut lies before it.

    Raises:
        DataError: a cut past the last event, or a validation cut not before the test cut.
    """
    ordered = np.sort(times)
    test = cut_time(test_after, ordered, "--test-after")
    after_test = len(ordered) - int(np.searchsorted(ordered, test, side="right"))
    if after_test == 0:
        raise DataError(f"--test-after {test_after}: no event after it (the last is at {ordered[-1]:g})")
    if valid_after is None:
        valid = float(ordered[max(len(ordered) - 2 * after_test - 1, 0)])
    else:
        valid = cut_time(valid_after, ordered, "--valid-after")
    if not valid < test:
        raise DataError(f"--valid-after ({valid:g}) must come before --test-after ({test:g})")
    return test, valid
