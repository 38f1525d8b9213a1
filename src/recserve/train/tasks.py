"""What each model brings to the shared trainer: its config, its LightningModule and its validation metric.

Lightning is imported inside the builders, so that importing recserve needs no Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from recserve.data.datasets import PreparedData
from recserve.errors import DataError
from recserve.train.schedule import cosine_with_warmup

MODELS = ("bert4rec", "multvae")


@dataclass(frozen=True)
class Task:
    model_cfg: Any  # Bert4RecConfig or MultVAEConfig
    module: Any  # the LightningModule
    monitor: str  # the validation metric that picks the best checkpoint and stops early
    protocol: dict  # how validation (and later test) is measured, for metrics.json


def build_task(model: str, data: PreparedData, overrides: dict, cfg, refit: bool = False) -> Task:
    """The task of ``model`` (one of ``MODELS``) on a prepared data folder.

    Args:
        refit: BERT4Rec only (``train`` refuses it for other models before it starts): train on every item
            but the test one (the validation item included).
    """
    if model == "bert4rec":
        return _bert4rec_task(data, overrides, cfg, data.sequences.truncated(1) if refit else data.train)
    if model == "multvae":
        return _multvae_task(data, overrides, cfg)
    raise DataError(f"model {model!r}: expected one of {', '.join(MODELS)}")


def optimizer_with_schedule(opt: torch.optim.Optimizer, cfg, total_steps: int):
    """The optimizer alone (constant LR), or with a per-step cosine schedule after a 5% linear warm-up."""
    if cfg.lr_schedule == "constant":
        return opt
    return {"optimizer": opt, "lr_scheduler": {"scheduler": cosine_with_warmup(opt, total_steps), "interval": "step"}}


def _bert4rec_task(data: PreparedData, overrides: dict, cfg, train_seq) -> Task:
    import lightning as L

    from recserve.models.bert4rec import Bert4Rec, Bert4RecConfig
    from recserve.train.cloze import ClozeBatches, ClozeSettings
    from recserve.train.evaluate import rank_targets
    from recserve.train.metrics import ranking_metrics

    if train_seq.lengths.sum() == 0:
        raise DataError(f"{data.info['folder']}: the training split is empty (every user has fewer than 3 items)")
    model_cfg = Bert4RecConfig(num_items=data.vocab.num_items, **overrides)
    model_cfg.validate()
    valid_inputs, valid_targets = data.sequences.truncated(2), data.sequences.last(2)

    class Bert4RecModule(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = Bert4Rec(model_cfg)

        def train_dataloader(self):
            settings = ClozeSettings(model_cfg.window, model_cfg.mask_index, model_cfg.mask_prob, cfg.last_item_rate)
            batches = ClozeBatches(train_seq, settings, cfg.batch_size, cfg.samples_per_user, cfg.seed)
            batches.rank, batches.world = self.global_rank, self.trainer.world_size
            return torch.utils.data.DataLoader(batches, batch_size=None)

        def val_dataloader(self):
            return torch.utils.data.DataLoader([0], batch_size=None)  # one step that ranks every user

        def training_step(self, batch, _):
            loss = self.model.cloze_loss(*batch, exclude_seen=cfg.loss_exclude_seen)
            self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, _batch, _):
            ranks = rank_targets(
                self.model, valid_inputs, valid_targets, model_cfg.window, model_cfg.mask_index,
                data.popularity, device=self.device, protocols=("full",),
            )["full"]
            metrics = ranking_metrics(ranks)
            self.log("val_ndcg@10", metrics["ndcg@10"], prog_bar=True, batch_size=1)
            self.log("val_hr@10", metrics["hr@10"], prog_bar=True, batch_size=1)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
            return optimizer_with_schedule(opt, cfg, self.trainer.estimated_stepping_batches)

    protocol = {"name": "leave-one-out", "ranking": "full, seen items excluded"}
    return Task(model_cfg, Bert4RecModule(), "val_ndcg@10", protocol)


def _multvae_task(data: PreparedData, overrides: dict, cfg) -> Task:
    import lightning as L

    from recserve.models.multvae import MultVAE, MultVAEConfig
    from recserve.train.heldout import FED_SHARE, MultiHotBatches, evaluate_fold, split_heldout

    model_cfg = MultVAEConfig(num_items=data.vocab.num_items, **overrides)
    model_cfg.validate()
    split = split_heldout(data.sequences, cfg.heldout_share, seed=cfg.seed)

    class MultVAEModule(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = MultVAE(model_cfg)

        def train_dataloader(self):
            batches = MultiHotBatches(split.train, model_cfg.vocab_size, cfg.batch_size, cfg.seed)
            batches.rank, batches.world = self.global_rank, self.trainer.world_size
            return torch.utils.data.DataLoader(batches, batch_size=None)

        def val_dataloader(self):
            return torch.utils.data.DataLoader([0], batch_size=None)

        def training_step(self, batch, _):
            beta = self.model.beta(self.global_step)
            loss, nll = self.model.loss(batch, beta)
            self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True)
            self.log("beta", beta, on_step=False, on_epoch=True)
            return loss

        def validation_step(self, _batch, _):
            metrics = evaluate_fold(self.model, split.valid, model_cfg.vocab_size, device=self.device)
            for key in ("ndcg@100", "recall@20", "recall@50"):
                self.log(f"val_{key}", metrics[key], prog_bar=key != "recall@50", batch_size=1)

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
            return optimizer_with_schedule(opt, cfg, self.trainer.estimated_stepping_batches)

    protocol = {"name": "held-out users", "heldout_share": cfg.heldout_share, "fed_share": FED_SHARE, "seed": cfg.seed,
                "ranking": "full, fed items excluded"}
    return Task(model_cfg, MultVAEModule(), "val_ndcg@100", protocol)
