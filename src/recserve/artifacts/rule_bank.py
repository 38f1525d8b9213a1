"""The rule bank of a native model on recserve's backend (``constants.RULE_BANK_FILE`` in its version folder;
``layouts/native.py`` writes it, the backend's C++ reads it with ``torch::jit::load``, no Python there, and
``load_rule_bank`` reads it as the backend does): a TorchScript module whose attributes are the catalogue's item
IDs in index order, the stored rules' names, and their masks by vocabulary index."""

from pathlib import Path

import numpy as np
import torch


class RuleBank(torch.nn.Module):  # no postponed annotations in this module: TorchScript reads them
    names: list[str]
    item_ids: torch.Tensor
    masks: torch.Tensor

    def __init__(self, item_ids: torch.Tensor, names: list[str], masks: torch.Tensor):
        super().__init__()
        self.register_buffer("item_ids", item_ids)  # (N,) int64, sorted: ID of vocabulary index i + 1
        self.register_buffer("masks", masks)  # (1 + len(names), N + 2) bool; row r + 1 is names[r]'s
        self.names = names

    def forward(self) -> torch.Tensor:
        return self.masks


def save_rule_bank(target: Path, item_ids: np.ndarray, names: list[str], masks: np.ndarray) -> None:
    bank = RuleBank(torch.from_numpy(np.ascontiguousarray(item_ids)), names, torch.from_numpy(masks))
    torch.jit.save(torch.jit.script(bank), str(target))


def load_rule_bank(path: Path) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(item IDs, names, masks) of a rule bank, as the backend reads them."""
    bank = torch.jit.load(str(path), map_location="cpu")
    return bank.item_ids.numpy(), list(bank.names), bank.masks.numpy()
