"""Training batches built on the training device: histories as two flat tensors, windows, Cloze masks and
next-item targets sliced from them with tensor operations, an epoch a permutation of users. No per-sample
Python, and on a GPU no host-device synchronisation a step (the count of scored positions is bounded, not
read back).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences
from recserve.train.tensors import SequenceTensors

LOSS_CAPACITY_SIGMAS = 4.0  # scored positions a GPU batch keeps: the mean plus this many standard deviations


@dataclass(frozen=True)
class ClozeSettings:
    """BERT4Rec's samples: windows with random items masked, the masked ones to predict."""

    window: int  # tokens per sample
    mask_index: int  # the mask token
    mask_prob: float  # each real item is masked with this probability
    last_item_rate: float  # share of samples that mask only the last item, as at serving time

    def batch(
        self,
        seq: SequenceTensors,
        users: torch.Tensor,
        generator: torch.Generator,
        capacity: int | None = None,
        rank: int = 0,
        world: int = 1,
    ) -> PositionBatch:
        return cloze_batch(seq, users, self, generator, capacity, rank, world)

    def capacity(self, lengths: np.ndarray, rows: int) -> int:
        return masked_capacity(lengths, self, rows)


@dataclass(frozen=True)
class NextItemSettings:
    """SASRec's samples: windows whose every position predicts the item after it."""

    window: int  # items per sample: window - 1 inputs, each with its next item
    input_mask: float = 0.0  # augmentation: share of input items replaced by ``mask_index`` (targets unchanged)
    mask_index: int = 0  # the reserved token (N + 1) that replaces them

    def batch(
        self,
        seq: SequenceTensors,
        users: torch.Tensor,
        generator: torch.Generator,
        capacity: int | None = None,
        rank: int = 0,
        world: int = 1,
    ) -> PositionBatch:
        return next_item_batch(seq, users, self, generator, capacity, rank, world)

    def capacity(self, lengths: np.ndarray, rows: int) -> int:
        return next_item_capacity(lengths, self, rows)


@dataclass
class PositionBatch:
    """One batch of samples and the positions whose loss counts (Cloze: the masked ones; next item: every
    position with a real input and a real next item).

    Attributes:
        tokens: (B, L) inputs (Cloze: masked positions set to the mask token).
        items: (B, W) the sample's window of original items.
        rows: (C,) the sample row of each scored position (C: the batch's capacity, or the count on a CPU).
        cols: (C,) its position in the row.
        targets: (C,) the item to predict there; padding (0) in capacity slots left unused.
        weight: () 1 / the scored positions of the whole batch over every rank, times the rank count, so
            that the sum of the per-position losses times ``weight``, averaged over ranks by DDP, is the
            single-process mean.
    """

    tokens: torch.Tensor
    items: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    targets: torch.Tensor
    weight: torch.Tensor

    @property
    def kept(self) -> torch.Tensor:
        """(C,) True at slots that hold a scored position."""
        return self.targets != PAD_INDEX


def random_ends(lengths: torch.Tensor, window: int, generator: torch.Generator) -> torch.Tensor:
    """(B,) where each sample's window ends: anywhere from the first full window to the sequence's end."""
    lowest = lengths.clamp(max=window)
    draw = torch.rand(lengths.shape, generator=generator, device=lengths.device)
    return lowest + (draw * (lengths - lowest + 1)).long().clamp(max=(lengths - lowest))


def cloze_masks(items: torch.Tensor, s: ClozeSettings, generator: torch.Generator) -> torch.Tensor:
    """(B, L) True at masked positions: real items with probability ``mask_prob``; a ``last_item_rate`` share
    of samples mask only their last item; every sample masks at least its last item. Never padding."""
    shape, device = items.shape, items.device
    masked = (torch.rand(shape, generator=generator, device=device) < s.mask_prob) & (items != PAD_INDEX)
    last_only = torch.rand(shape[0], generator=generator, device=device) < s.last_item_rate
    masked &= ~last_only[:, None]
    masked[:, -1] |= last_only | ~masked.any(1)
    return masked


def select_positions(masked: torch.Tensor, capacity: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, column) of the masked positions, row-major.

    With a ``capacity``, exactly that many slots: the first masked positions, then slots marked by
    ``masked[row, col]`` being False. A stable sort, not ``nonzero``, so that a GPU never waits for the
    host to learn the count. Without one (on the CPU, where nothing waits), every masked position.
    """
    if capacity is None:
        rows, cols = masked.nonzero(as_tuple=True)
        return rows, cols
    flat = masked.flatten()
    order = torch.argsort((~flat).to(torch.uint8), stable=True)[:capacity]
    return order // masked.shape[1], order % masked.shape[1]


def cloze_batch(
    seq: SequenceTensors,
    users: torch.Tensor,
    s: ClozeSettings,
    generator: torch.Generator,
    capacity: int | None = None,
    rank: int = 0,
    world: int = 1,
) -> PositionBatch:
    """Masked windows of ``users`` (the whole batch over all ranks); this rank keeps rows ``rank::world``.

    Every rank draws the same batch from the same generator state and keeps its share, so the ranks see
    disjoint samples and together exactly the single-process batch.
    """
    ends = random_ends(seq.lengths[users], s.window, generator)
    items = seq.windows(users, ends, s.window)  # (B, L) left-padded
    masked = cloze_masks(items, s, generator)
    total = masked.sum()
    items, masked = items[rank::world], masked[rank::world]
    rows, cols = select_positions(masked, capacity)
    targets = torch.where(masked[rows, cols], items[rows, cols], PAD_INDEX)
    tokens = torch.where(masked, s.mask_index, items)
    return PositionBatch(tokens, items, rows, cols, targets, world / total.clamp(min=1).float())


def capacity_for(per_user_mean: np.ndarray, per_user_second: np.ndarray, rows: int, width: int) -> int:
    """How many scored positions a batch of ``rows`` samples keeps room for.

    The batch's mean plus ``LOSS_CAPACITY_SIGMAS`` standard deviations, from each user's expected count of
    scored positions and its second moment (every user equally likely in a batch): a batch rarely has more,
    and the few extra positions of one that does are left out of that step's loss (the step's mean still
    counts them in its denominator).
    """
    mean = per_user_mean.mean() if per_user_mean.size else 1.0
    variance = max(per_user_second.mean() - mean**2, 1.0) if per_user_second.size else 1.0
    capacity = rows * mean + LOSS_CAPACITY_SIGMAS * math.sqrt(rows * variance) + 8
    return int(min(rows * width, math.ceil(capacity)))


def masked_capacity(lengths: np.ndarray, s: ClozeSettings, rows: int) -> int:
    """``capacity_for`` Cloze samples: Binomial(real, mask_prob) masked positions (at least one), or only the
    last item with probability ``last_item_rate``, where real = min(length, window)."""
    real = np.minimum(lengths[lengths > 0], s.window).astype(np.float64)
    p, r = s.mask_prob, s.last_item_rate
    mean = (1 - r) * p * real + r
    second = (1 - r) * (real * p * (1 - p) + (real * p) ** 2) + r
    return capacity_for(mean, second, rows, s.window)


def next_item_batch(
    seq: SequenceTensors,
    users: torch.Tensor,
    s: NextItemSettings,
    generator: torch.Generator,
    capacity: int | None = None,
    rank: int = 0,
    world: int = 1,
) -> PositionBatch:
    """Windows of ``window`` items: the first ``window - 1`` are the inputs, each position's target is the
    item after it; positions with a real input and a real target count. Ranks split rows as ``cloze_batch``."""
    ends = random_ends(seq.lengths[users], s.window, generator)
    items = seq.windows(users, ends, s.window)  # (B, W) left-padded
    inputs, following = items[:, :-1], items[:, 1:]
    scored = (inputs != PAD_INDEX) & (following != PAD_INDEX)
    total = scored.sum()
    if s.input_mask:  # an input known only as "some item": the position still predicts the next one
        # drawn for the whole batch before the ranks take their rows, so every rank's generator stays in step
        hidden = torch.rand(inputs.shape, generator=generator, device=inputs.device) < s.input_mask
        inputs = torch.where(hidden & (inputs != PAD_INDEX), s.mask_index, inputs)
    items, inputs, following, scored = (t[rank::world] for t in (items, inputs, following, scored))
    rows, cols = select_positions(scored, capacity)
    targets = torch.where(scored[rows, cols], following[rows, cols], PAD_INDEX)
    return PositionBatch(inputs, items, rows, cols, targets, world / total.clamp(min=1).float())


def next_item_capacity(lengths: np.ndarray, s: NextItemSettings, rows: int) -> int:
    """``capacity_for`` next-item samples: min(length, window) - 1 scored positions each."""
    scored = np.minimum(lengths[lengths > 0], s.window).astype(np.float64) - 1
    return capacity_for(scored, scored**2, rows, s.window - 1)


class WindowEpochs(torch.utils.data.IterableDataset):
    """An epoch is every user with a history ``samples_per_user`` times, shuffled, in batches of
    ``batch_size`` samples over all ranks; each rank builds the same batches and keeps its rows.

    ``settings`` decides the samples: ``ClozeSettings`` (BERT4Rec) or ``NextItemSettings`` (SASRec).
    """

    def __init__(
        self,
        seq: Sequences,
        settings: ClozeSettings | NextItemSettings,
        batch_size: int,
        samples_per_user: int,
        seed: int,
        device: str | torch.device = "cpu",
        rank: int = 0,
        world: int = 1,
    ):
        self.tensors = SequenceTensors.from_sequences(seq, device)
        self.users = torch.as_tensor(np.flatnonzero(seq.lengths > 0), device=device).repeat(samples_per_user)
        self.settings, self.batch_size, self.seed = settings, batch_size, seed
        self.rank, self.world, self.epoch = rank, world, 0
        self.device = torch.device(device)
        rows = -(-batch_size // world)
        self.capacity = settings.capacity(seq.lengths, rows) if self.device.type == "cuda" else None

    def __len__(self) -> int:
        return int(-(-self.users.numel() // self.batch_size))

    def set_epoch(self, epoch: int) -> None:
        """Each epoch draws its own order and samples, from the seed and the epoch alone (resuming repeats none)."""
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + self.epoch)
        order = self.users[torch.randperm(self.users.numel(), generator=generator, device=self.device)]
        for start in range(0, order.numel(), self.batch_size):
            yield self.settings.batch(
                self.tensors, order[start : start + self.batch_size], generator, self.capacity, self.rank, self.world
            )
