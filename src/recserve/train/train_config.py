"""The training settings without torch: ``TrainConfig``, the loss settings, the values where the models' usual
ones differ and which model has which setting."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from recserve.devices import torch_device
from recserve.errors import ConfigError
from recserve.models.registry import MODELS, model_entry
from recserve.option_fields import option

# The training settings where a model's usual values differ from TrainConfig's own (which are BERT4Rec's),
# as the model registry holds them; `recserve train` starts from these, an option given on the command line wins.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {name: entry.defaults for name, entry in MODELS.items()}

LOSSES = ("auto", "full", "sampled-uniform", "sampled-popularity")
FULL_SOFTMAX_MAX_ITEMS = 50_000  # auto: the exact softmax up to this catalogue size (docs/benchmarks.md)


@dataclass(frozen=True)
class LossSettings:
    name: str = "auto"  # one of LOSSES; auto picks full or sampled-uniform by catalogue size
    negatives: int = 8192  # sampled: items drawn per batch, beside as many in-batch targets
    exclude_seen: bool = True  # leave the sample's other items out of each softmax, as serving leaves seen items
    smoothing: float = 0.0  # label smoothing: this share of a target's weight spread over the rankable items

    def validate(self) -> list[str]:
        problems = []
        if self.name not in LOSSES:
            problems.append(f"loss={self.name!r}: expected one of {', '.join(LOSSES)}")
        if self.negatives < 1:
            problems.append(f"negatives={self.negatives}: must be at least 1")
        if not 0.0 <= self.smoothing < 1.0:
            problems.append(f"label_smoothing={self.smoothing}: must be in [0, 1)")
        elif self.smoothing and self.name.startswith("sampled"):
            problems.append(
                f"label_smoothing={self.smoothing}: for the exact softmax only, and this loss is {self.name}; pass "
                f"--loss full (it fits up to about {FULL_SOFTMAX_MAX_ITEMS:,} items)"
            )
        return problems

    def resolve(self, num_items: int) -> LossSettings:
        """``auto`` made concrete for a catalogue of ``num_items``."""
        if self.name != "auto":
            return self
        return replace(self, name="full" if num_items <= FULL_SOFTMAX_MAX_ITEMS else "sampled-uniform")

    def describe(self) -> dict:
        """What metrics.json records."""
        out = {"name": self.name, "exclude_seen": self.exclude_seen}
        if self.smoothing:
            out["label_smoothing"] = self.smoothing
        if self.name.startswith("sampled"):
            out |= {"negatives": self.negatives, "in_batch": True, "log_q_correction": True}
        return out


@dataclass(frozen=True)
class TrainConfig:
    """How a model trains. A field with a help is an option of `recserve train`; the fields in
    ``MODEL_DEFAULTS`` show each model's value there."""

    epochs: int = option(60, "Most epochs; early stopping may end sooner.")
    batch_size: int = option(128, "Samples per step.")
    lr: float = option(1e-3, "Learning rate.")
    weight_decay: float = option(0.01, "Weight decay.")
    lr_schedule: str = option("constant", "constant, or cosine (5% warm-up, then down to 0 at --epochs).")
    samples_per_user: int = option(4, "Windows drawn per user per epoch; a SASRec window predicts at every position.")
    loss: str = option(
        LossSettings.name,
        "BERT4Rec, SASRec: full (exact softmax over the catalogue), sampled-uniform or sampled-popularity "
        "(in-batch plus drawn negatives, log-Q corrected); auto: full up to 50,000 items, else sampled-uniform.",
    )
    negatives: int = option(
        LossSettings.negatives, "Sampled losses: negatives drawn per batch, beside as many in-batch targets."
    )
    loss_exclude_seen: bool = option(
        LossSettings.exclude_seen,
        "BERT4Rec: leave a sample's other items out of each softmax; SASRec: the items up to each position; as "
        "serving leaves seen items out.",
    )
    label_smoothing: float = option(
        LossSettings.smoothing,
        "BERT4Rec, SASRec with the exact softmax: this share of each target's weight spread evenly over the "
        "items its softmax ranks (Szegedy et al. 2016); 0: off.",
    )
    refit: bool = option(
        False,
        "BERT4Rec, SASRec: then train again on every item but the test one, for the epoch count validation "
        "chose, and keep that model (the validated one stays beside it, and the test ranks both); on one device.",
    )
    warm_start: str | None = option(
        None,
        "BERT4Rec, SASRec: a run folder to start from (a newer data folder's catalogue may gain and lose items): "
        "weights carried by item ID, a new item starting from the catalogue's mean; its model and settings must be "
        "this run's.",
    )
    input_mask: float = option(
        0.0,
        "SASRec: share of input items that training replaces by the reserved token, each position still "
        "predicting its next item (an augmentation); 0: off.",
    )
    last_item_rate: float = 0.15  # BERT4Rec: share of samples that mask only the last item
    heldout_share: float = option(0.1, "Mult-VAE: share of users held out for validation, and for test.")
    patience: int = option(8, "Epochs without a better validation metric before stopping.")
    patience_steps: int = option(
        0,
        "Optimizer steps without a better validation metric before stopping, whatever an epoch's size (the data's "
        "users times --samples-per-user over --batch-size); validation runs each epoch, so whole epochs, at least "
        "--patience; 0: --patience alone.",
    )
    max_steps: int = option(
        0, "Most optimizer steps (a budget counted in steps, not epochs of a size that varies); 0: --epochs alone."
    )
    max_minutes: float = option(
        0.0,
        "Most minutes of training (a budget: at the limit training stops, and the best validated weights are "
        "kept and evaluated as after early stopping); 0: no limit.",
    )
    seed: int = option(0, "Random seed.")
    device: str = option(
        "auto", "auto, cpu or gpu (cuda is taken for gpu).", parse=lambda word: torch_device(word, allow_auto=True)
    )
    devices: int = option(
        1,
        "GPUs (or CPU processes) to use; DDP when more than one. --batch-size is the whole step's, split between "
        "them: below about 1,000 rows a GPU each step is bound by launching its kernels, so give a second GPU a "
        "larger batch.",
    )
    ddp_compress: bool = True  # DDP on GPUs with bf16 autocast: gradients travel between GPUs as bf16
    precision: str = option("auto", "auto (bf16 autocast on CUDA, float32 on CPU), bf16 or 32.")
    compile: bool = option(
        False,
        "torch.compile the model and loss: fewer, fused kernels after tens of seconds of compiling (on an H200 "
        "the bare step ran 1.6x as fast at 1M items, batch 512; a whole epoch on video.txt at batch 128, where "
        "Lightning's per-step work dominates, 1.05x).",
        flags=("--compile",),
    )
    cuda_graphs: bool = option(
        True,
        "On one GPU: BERT4Rec's and SASRec's training step (the negatives, forward, backward and AdamW's update) "
        "captured as a CUDA graph and replayed, so that the GPU never waits for the host's launches; "
        "--no-cuda-graphs steps eagerly.",
    )
    ema_epochs: float = option(
        0.0,
        "BERT4Rec, SASRec: validate and keep a moving average of the weights over about this many epochs (an "
        "exponential one, updated every step); 0: off.",
    )
    resume: bool = True  # continue from the run's last checkpoint when there is one

    def validate(self) -> None:
        problems = []
        for name in ("epochs", "batch_size", "samples_per_user", "devices"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)}: must be at least 1")
        for name in ("patience_steps", "max_steps"):
            if getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)}: must be 0 (off) or more")
        if not self.max_minutes >= 0:  # NaN too
            problems.append(f"max_minutes={self.max_minutes}: must be 0 (no limit) or more")
        if self.refit and self.devices > 1:
            problems.append("refit: runs on one device; drop --devices or --refit")
        if not 0 < self.heldout_share < 0.5:
            problems.append(f"heldout_share={self.heldout_share}: must be in (0, 0.5)")
        if self.lr_schedule not in ("constant", "cosine"):
            problems.append(f"lr_schedule={self.lr_schedule!r}: expected constant or cosine")
        if not 0.0 <= self.input_mask < 1.0:
            problems.append(f"input_mask={self.input_mask}: must be in [0, 1)")
        if self.ema_epochs < 0:
            problems.append(f"ema_epochs={self.ema_epochs}: must be 0 (no averaging) or more")
        if self.lr <= 0:
            problems.append(f"lr={self.lr}: must be positive")
        problems += self.loss_settings.validate()
        if self.precision not in ("auto", "bf16", "32"):
            problems.append(f"precision={self.precision!r}: expected auto, bf16 or 32")
        if self.device not in ("auto", "cpu", "cuda"):
            problems.append(f"device={self.device!r}: expected auto, cpu or cuda")
        elif self.device == "cuda" and not _cuda_count():
            problems.append("device='cuda': no CUDA device is available here; use --device cpu")
        elif self.device == "cuda" and self.devices > _cuda_count():
            problems.append(f"devices={self.devices}: only {_cuda_count()} GPUs are visible")
        if problems:
            raise ConfigError("bad training settings: " + "; ".join(problems))

    @classmethod
    def for_model(cls, model: str, given: dict[str, Any]) -> tuple[TrainConfig, list[str]]:
        """The settings of a run of ``model``: its defaults (``MODEL_DEFAULTS``) under the ``given`` ones, and a
        note for each default left out because a given setting rules it out (the refit, the sequence models'
        default, runs on one device: with --devices N it is left out unless --refit is given, which is then
        refused)."""
        defaults, notes = dict(MODEL_DEFAULTS[model]), []
        if defaults.get("refit") and "refit" not in given and given.get("devices", 1) > 1:
            del defaults["refit"]
            notes.append(
                f"--devices {given['devices']}: no refit ({model}'s default trains again on one device after "
                "validation); pass --devices 1 for it"
            )
        return cls(**(defaults | given)), notes

    def patience_epochs(self, steps_per_epoch: int) -> int:
        """The validations without a better metric that end training: --patience, or the epochs that hold
        --patience-steps at ``steps_per_epoch`` when that is more."""
        if not self.patience_steps:
            return self.patience
        return max(self.patience, -(-self.patience_steps // max(steps_per_epoch, 1)))

    def check_model(self, model: str) -> None:
        """Refuses an option given that ``model`` does not take.

        Raises:
            ConfigError: naming the option, the model and which models take it.
        """
        entry = model_entry(model)
        takes = {  # option: (whether the model takes it, what it is and for which models)
            "refit": (
                entry.sequential,
                "only BERT4Rec and SASRec can be refitted; Mult-VAE's held-out users are its validation",
            ),
            "input_mask": (entry.task == "next-item", "SASRec's augmentation of its next-item inputs"),
            "label_smoothing": (entry.sequential, "BERT4Rec's and SASRec's softmax over items"),
            "ema_epochs": (entry.sequential, "BERT4Rec and SASRec average their weights"),
            "warm_start": (entry.sequential, "BERT4Rec's and SASRec's item rows are carried by ID"),
            "patience_steps": (entry.sequential, "BERT4Rec's and SASRec's epochs are windows drawn per user"),
        }
        for name, (taken, what) in takes.items():
            if getattr(self, name) and not taken:
                raise ConfigError(f"--{name.replace('_', '-')}: not a setting of {model} ({what})")

    @property
    def loss_settings(self) -> LossSettings:
        return LossSettings(self.loss, self.negatives, self.loss_exclude_seen, self.label_smoothing)

    @property
    def lightning_precision(self) -> str:
        """Lightning's name for the precision: bf16 autocast on CUDA unless asked otherwise."""
        bf16 = self.precision == "bf16" or (self.precision == "auto" and self.accelerator == "gpu")
        return "bf16-mixed" if bf16 else "32-true"

    def strategy(self):
        """Lightning's strategy: DDP for more than one device, sending bf16 gradients where training is bf16.

        The catalogue's embedding table is most of the gradient (1M items x 64 floats: 256 MB a step), so
        halving the bytes all-reduced each step is what lets a second GPU pay off at catalogue scale.
        """
        if self.devices == 1:
            return "auto"
        from lightning.pytorch.strategies import DDPStrategy

        hook = None
        if self.ddp_compress and self.accelerator == "gpu" and self.lightning_precision == "bf16-mixed":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook as hook
        return DDPStrategy(ddp_comm_hook=hook, gradient_as_bucket_view=True)  # no copy of the table's gradient

    @property
    def accelerator(self) -> str:
        if self.device == "auto":
            return "gpu" if _cuda_count() else "cpu"
        return "gpu" if self.device == "cuda" else "cpu"


def _cuda_count() -> int:
    import torch  # here: the settings and their defaults import without torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def model_settings(model: str, given: dict[str, Any]) -> dict[str, Any]:
    """The options given (None: not given) that ``model``'s config has, to override its defaults; an option
    the model has no field for is a ``ConfigError`` naming both."""
    known = {f.name for f in fields(model_entry(model).config)} - {"num_items"}
    chosen = {name: value for name, value in given.items() if value is not None}
    foreign = sorted(set(chosen) - known)
    if foreign:
        options = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise ConfigError(f"{options}: not a setting of {model} (its settings: {', '.join(sorted(known))})")
    return chosen
