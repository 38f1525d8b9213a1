"""The exceptions recserve raises: one base class and one subclass per kind of problem."""


class RecserveError(Exception):
    """Base class: every error recserve raises on purpose derives from it."""


class DataError(RecserveError):
    """An input file or prepared data folder is missing, malformed or inconsistent."""


class ConfigError(RecserveError):
    """A setting is out of range or settings contradict each other."""


class ExportError(RecserveError):
    """An export could not be built or failed its parity check."""


class EvaluationError(RecserveError):
    """Scores that cannot be ranked: NaN or infinite for an item that could be recommended."""


class ServingError(RecserveError):
    """The server, a model repository or a request is not as expected."""


class RequestError(ServingError):
    """A single request is malformed; the message names the field and what is allowed."""


class BuildError(RecserveError):
    """A native backend's sources or build step are missing, unverifiable or failed."""


class StoreError(ServingError):
    """The session store cannot be reached, answered too slowly or refused recserve's credentials."""
