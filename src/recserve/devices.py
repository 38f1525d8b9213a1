"""One device vocabulary for every command: ``cpu`` or ``gpu`` (``auto`` where a command can choose), and
``cuda``, PyTorch's word, taken for ``gpu``. Serving speaks Triton's word (instances of KIND_GPU), training
and export PyTorch's; these two functions are the only translation between them."""

from __future__ import annotations

from recserve.errors import ConfigError

_WORDS = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "auto": "auto"}


def serving_device(word: str, allow_auto: bool = False) -> str:
    """``cpu`` or ``gpu`` (or ``auto``) for ``word``; ``cuda`` is ``gpu``. Anything else is a ConfigError."""
    kind = _WORDS.get(word.strip().lower())
    if kind is None or (kind == "auto" and not allow_auto):
        expected = "auto, cpu or gpu" if allow_auto else "cpu or gpu"
        raise ConfigError(f"device {word!r}: expected {expected} (cuda is taken for gpu)")
    return kind


def torch_device(word: str, allow_auto: bool = False) -> str:
    """PyTorch's name for ``word``: ``cpu`` or ``cuda`` (or ``auto``); ``gpu`` is ``cuda``."""
    kind = serving_device(word, allow_auto)
    return "cuda" if kind == "gpu" else kind
