"""What each model brings to the shared trainer: its config, its LightningModule and its validation metric.

Batches are built on the module's device (``train.batches``, ``train.heldout.BagEpochs``), validation ranks
every user there, and nothing in a training step waits for the host; on one GPU a sequence model's step is a
CUDA graph's replay (``train.graph_step``). Only the trainer imports this module,
so that importing recserve needs no Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

import lightning as L
import torch

from recserve.data.datasets import PreparedData
from recserve.data.sequences import Sequences
from recserve.errors import DataError, EvaluationError
from recserve.models.attribute_codes import AttributeCodes, attribute_codes
from recserve.models.model_configs import Bert4RecConfig, MultVAEConfig, SASRecConfig
from recserve.models.multvae import MultVAE
from recserve.models.registry import model_entry
from recserve.models.sasrec import dropout_for
from recserve.train.batches import ClozeSettings, NextItemSettings, PositionBatch, WindowEpochs
from recserve.train.graph_step import GraphStep, ReplayedAdamW
from recserve.train.heldout import FED_SHARE, BagEpochs, HeldOutSplit, evaluate_fold, split_heldout
from recserve.train.leave_one_out import Ranker, history_counts
from recserve.train.losses import CatalogueLoss
from recserve.train.metrics import ranking_metrics
from recserve.train.objectives import cloze_loss, next_item_loss
from recserve.train.schedule import cosine_with_warmup
from recserve.train.train_config import TrainConfig


@dataclass(frozen=True)
class Task:
    model_cfg: Any  # Bert4RecConfig, SASRecConfig or MultVAEConfig
    module: L.LightningModule
    monitor: str  # the validation metric that picks the best checkpoint and stops early
    protocol: dict[str, Any]  # how validation (and later test) is measured, for metrics.json


def build_task(model: str, data: PreparedData, overrides: dict, cfg: TrainConfig, refit: bool = False) -> Task:
    """The task of ``model`` (an entry of the model registry) on a prepared data folder.

    Args:
        cfg: the trainer's ``TrainConfig``.
        refit: BERT4Rec and SASRec (``train`` refuses it for Mult-VAE before it starts): train on every item
            but the test one (the validation item included).
    """
    entry = model_entry(model)
    cfg.check_model(model)
    if entry.sequential:
        train_seq = data.refit_train if refit else data.train
        if train_seq.lengths.sum() == 0:
            raise DataError(
                f"{data.info['folder']}: the training split is empty (every user has fewer than 3 items, or no "
                "event lies before the validation cut)"
            )
        if entry.dropout_from_data and "dropout" not in overrides:
            overrides = overrides | {"dropout": dropout_for(train_seq.lengths)}
        sequence_cfg = cast(Bert4RecConfig | SASRecConfig, entry.config(num_items=data.vocab.num_items, **overrides))
        sequence_cfg, codes = with_attribute_table(sequence_cfg, data)
        sequence_cfg.validate()
        protocol: dict[str, Any] = {"name": entry.protocol, "ranking": "full, seen items excluded"}
        module = SequenceModule(model, sequence_cfg, data, train_seq, cfg, codes)
        return Task(sequence_cfg, module, "val_ndcg@10", protocol)
    model_cfg = MultVAEConfig(num_items=data.vocab.num_items, **overrides)  # the bag of items
    model_cfg.validate()
    split = split_heldout(data.bags, cfg.heldout_share, seed=cfg.seed)
    protocol = {
        "name": entry.protocol,
        "heldout_share": cfg.heldout_share,
        "fed_share": FED_SHARE,
        "seed": cfg.seed,
        "ranking": "full, fed items excluded",
    }
    return Task(model_cfg, MultVAEModule(model_cfg, split, cfg), "val_ndcg@100", protocol)


def with_attribute_table(
    cfg: Bert4RecConfig | SASRecConfig, data: PreparedData
) -> tuple[Bert4RecConfig | SASRecConfig, AttributeCodes | None]:
    """``cfg`` with its attribute table's size, and the codes the model learns (``models.attribute_codes``),
    where it learns the item table's attributes and the data has any to learn from; else with none, and None."""
    codes = attribute_codes(data.attributes()) if cfg.item_attributes else None
    if codes is None or not codes.rows:
        return replace(cfg, attribute_columns=0, attribute_rows=0), None
    return replace(cfg, attribute_columns=len(codes.names), attribute_rows=codes.rows), codes


def optimizer_with_schedule(opt: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    """The optimizer alone (constant LR), or with a per-step cosine schedule after a 5% linear warm-up."""
    if cfg.lr_schedule == "constant":
        return opt
    return {"optimizer": opt, "lr_scheduler": {"scheduler": cosine_with_warmup(opt, total_steps), "interval": "step"}}


def fused_on(device: torch.device) -> dict[str, bool]:
    """Adam's one fused kernel on a GPU: at catalogue scale the optimizer updates the whole item table every
    step, a cost that a second GPU does not share (1.6 ms less a step at 1M items: docs/benchmarks.md)."""
    return {"fused": True} if device.type == "cuda" else {}


class _DeviceBatchesModule(L.LightningModule):
    """Batches that are already on the device: Lightning's transfer is skipped, each epoch reseeds them."""

    batches: WindowEpochs | BagEpochs

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch

    def on_train_epoch_start(self) -> None:
        self.batches.set_epoch(self.current_epoch)
        self._loss_sum, self._steps = torch.zeros((), device=self.device), 0

    def _add_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Sums the step's loss on the device for the epoch's mean: a ``self.log`` a step ran about 1,900
        Python calls of host time (docs/benchmarks.md), as much as a small step's own work."""
        self._loss_sum += loss.detach()
        self._steps += 1
        return loss

    def on_train_epoch_end(self) -> None:
        """Logs ``train_loss``: the mean over the epoch's steps and (under DDP) over the ranks."""
        mean = self.trainer.strategy.reduce(self._loss_sum / max(self._steps, 1), reduce_op="mean")
        self.log("train_loss", mean, prog_bar=True, batch_size=1)

    def _share(self, count: int) -> tuple[int, int]:
        """This DDP rank's contiguous share of ``count`` validation users: (first, stop)."""
        rank, world = self.global_rank, self.trainer.world_size
        return count * rank // world, count * (rank + 1) // world

    def _log_means(self, metrics: dict[str, float], users: int, shown: dict[str, bool]) -> None:
        """Logs ``val_<name>`` for each of ``shown`` (True: on the progress bar): the mean over every rank's
        users, from this rank's means over its ``users``."""
        values = [metrics[name] if users else 0.0 for name in shown] + [1.0]
        sums = torch.tensor(values, dtype=torch.float64, device=self.device) * users
        sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
        for name, total, bar in zip(shown, sums, shown.values()):
            self.log(f"val_{name}", float(total / sums[-1].clamp(min=1)), prog_bar=bar, batch_size=1)

    def _loader(self, batches) -> torch.utils.data.DataLoader:
        self.batches = batches
        return torch.utils.data.DataLoader(batches, batch_size=None)


class SequenceModule(_DeviceBatchesModule):
    """BERT4Rec on the Cloze task or SASRec on the next item; validation ranks every user's second-to-last
    item."""

    def __init__(
        self,
        name: str,
        model_cfg: Bert4RecConfig | SASRecConfig,
        data: PreparedData,
        train_seq: Sequences,
        cfg: TrainConfig,
        codes: AttributeCodes | None = None,
    ):
        """codes: the item attributes' codes the model learns (``with_attribute_table``), or None."""
        super().__init__()
        entry = model_entry(name)
        self.model = entry.module_class()(model_cfg)
        self.model_cfg, self.data, self.train_seq, self.cfg = model_cfg, data, train_seq, cfg
        self.counts = history_counts(train_seq, model_cfg.vocab_size)  # (V,) each item's training events
        self.trained = self.counts > 0
        self.trained[[0, -1]] = True  # padding and the mask token keep their own rows
        if self.model.attributes is not None and codes is not None:
            self.model.attributes.set_codes(codes, self.trained)
        self.loss_settings = cfg.loss_settings.resolve(model_cfg.num_items)
        objective = cloze_loss if entry.task == "cloze" else next_item_loss
        self.step_loss = torch.compile(objective) if cfg.compile else objective
        # one GPU: the whole step a CUDA graph (under DDP the gradients' all-reduce sits between its parts)
        self.graphed = cfg.cuda_graphs and cfg.accelerator == "gpu" and cfg.devices == 1
        self.graph_step: GraphStep | None = None

    def setup(self, stage: str) -> None:
        # with attributes, an item no training event holds is left out of every softmax: its ID row is never
        # trained, and it is ranked by its attributes alone (models.transformer.ItemAttributeEmbedding)
        untrained = ~self.trained if self.model.attributes is not None else None
        self.catalogue_loss = CatalogueLoss(
            self.loss_settings, self.counts, self.model_cfg.mask_index, self.device, left_out=untrained
        )
        self.generator = torch.Generator(self.device).manual_seed(self.cfg.seed * 7919 + self.global_rank)
        valid = self.data.valid()
        self.ranker = Ranker(
            valid.inputs,
            valid.targets,
            history_counts(valid.inputs, self.model_cfg.vocab_size),
            self.model_cfg.window,
            self.model_cfg.mask_index,
            device=self.device,
        )

    def train_dataloader(self):
        c = self.model_cfg
        if isinstance(c, Bert4RecConfig):
            settings = ClozeSettings(c.window, c.mask_index, c.mask_prob, self.cfg.last_item_rate)
        else:
            settings = NextItemSettings(c.window, self.cfg.input_mask, c.mask_index)
        return self._loader(
            WindowEpochs(
                self.train_seq,
                settings,
                self.cfg.batch_size,
                self.cfg.samples_per_user,
                self.cfg.seed,
                self.device,
                self.global_rank,
                self.trainer.world_size,
            )
        )

    def val_dataloader(self):
        return torch.utils.data.DataLoader([0], batch_size=None)  # one step that ranks every user

    def training_step(self, batch, _):
        if self.graphed:  # the step's backward and update are the graph's: Lightning's closure runs it alone
            if self.graph_step is None:
                optimizer = cast(ReplayedAdamW, self.optimizers().optimizer)
                self.graph_step = GraphStep(self._step_body, optimizer, (self.generator,))
            self._add_loss(self.graph_step(batch))
            return None
        negatives = self.catalogue_loss.draw(self.generator)  # outside the compiled step: it takes no generator
        return self._add_loss(self.step_loss(self.model, batch, self.catalogue_loss, negatives))

    def _step_body(self, batch: PositionBatch) -> torch.Tensor:
        """A graphed step's forward and backward: the autocast of Lightning's precision without its cache of
        cast weights (a capture cannot keep them); returns the loss."""
        cuda = self.device.type
        autocast = torch.autocast(
            cuda, torch.get_autocast_dtype(cuda), enabled=torch.is_autocast_enabled(cuda), cache_enabled=False
        )
        with autocast:
            negatives = self.catalogue_loss.draw(self.generator)
            loss = self.step_loss(self.model, batch, self.catalogue_loss, negatives)
        loss.backward()
        return loss.detach()

    def validation_step(self, _batch, _):
        """Each DDP rank ranks its share of the users; the metrics are the means over all of them."""
        with torch.autocast(self.device.type, enabled=False):  # bf16 scores would tie far more often
            try:
                ranks = self.ranker.ranks(self.model, ("full",), self._share(self.ranker.user_count))["full"]
            except EvaluationError as err:  # training stops here: no checkpoint of this epoch is kept
                raise EvaluationError(f"validation after epoch {self.current_epoch + 1}: {err}") from err
        metrics = ranking_metrics(ranks) if len(ranks) else {}
        self._log_means(metrics, len(ranks), {"ndcg@10": True, "hr@10": True})

    def configure_optimizers(self):
        if self.graphed:
            opt: torch.optim.Optimizer = ReplayedAdamW(
                list(self.model.parameters()), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
            )
        else:
            opt = torch.optim.AdamW(
                self.model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay, **fused_on(self.device)
            )
        return optimizer_with_schedule(opt, self.cfg, self.trainer.estimated_stepping_batches)


class MultVAEModule(_DeviceBatchesModule):
    """Mult-VAE on the training users' bags of items; validation ranks for the held-out validation users."""

    def __init__(self, model_cfg: MultVAEConfig, split: HeldOutSplit, cfg: TrainConfig):
        super().__init__()
        self.model = MultVAE(model_cfg)
        self.model_cfg, self.split, self.cfg = model_cfg, split, cfg

    def train_dataloader(self):
        return self._loader(
            BagEpochs(
                self.split.train,
                self.cfg.batch_size,
                self.cfg.seed,
                self.device,
                self.global_rank,
                self.trainer.world_size,
            )
        )

    def val_dataloader(self):
        return torch.utils.data.DataLoader([0], batch_size=None)

    def training_step(self, batch, _):
        loss, _nll = self.model.loss(batch, self.model.beta(self.global_step))
        return self._add_loss(loss)

    def on_train_epoch_end(self) -> None:
        super().on_train_epoch_end()
        self.log("beta", self.model.beta(self.global_step), batch_size=1)  # the KL weight the epoch ended at

    def validation_step(self, _batch, _):
        """Each DDP rank scores its share of the validation users; the metrics are the means over all of them."""
        fold = self.split.valid.share(*self._share(self.split.valid.fed.num_users))
        with torch.autocast(self.device.type, enabled=False):
            metrics = evaluate_fold(self.model, fold, self.model_cfg.vocab_size, device=self.device)
        self._log_means(metrics, metrics["users"], {"ndcg@100": True, "recall@20": True, "recall@50": False})

    def configure_optimizers(self):
        opt = torch.optim.Adam(
            self.model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay, **fused_on(self.device)
        )
        return optimizer_with_schedule(opt, self.cfg, self.trainer.estimated_stepping_batches)
