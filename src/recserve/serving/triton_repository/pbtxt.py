"""config.pbtxt from typed settings, one small function per section, through Triton's own protobuf schema."""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from recserve.artifacts.served import TensorSpec


@dataclass(frozen=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0: unbounded
    timeout_microseconds: int = 0  # 0: no timeout
    reject_on_timeout: bool = True  # a timed-out request gets an error instead of running late


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 100
    default_queue_policy: QueuePolicy | None = None


@dataclass(frozen=True)
class InstanceGroup:
    count: int = 1
    kind: str = "KIND_CPU"  # KIND_CPU or KIND_GPU
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class EnsembleStep:
    model_name: str
    input_map: dict[str, str]  # the step model's input name -> ensemble tensor
    output_map: dict[str, str]  # the step model's output name -> ensemble tensor
    model_version: int = -1


@dataclass(frozen=True)
class TritonModelConfig:
    """What one config.pbtxt holds; ``backend`` is empty for ensembles (``platform`` is set instead)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    backend: str = "python"
    platform: str = ""
    max_batch_size: int = 0
    dynamic_batching: DynamicBatching | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()
    ensemble_steps: tuple[EnsembleStep, ...] = ()
    version_policy_latest: int | None = None  # serve the newest N versions; None: Triton's default (latest 1)
    response_cache: bool = False
    parameters: dict[str, str] = field(default_factory=dict)


def _tensor(spec: TensorSpec, message):
    message.name = spec.name
    # config.pbtxt calls the BYTES tensor type TYPE_STRING
    message.data_type = pb.DataType.Value("TYPE_STRING" if spec.data_type == "BYTES" else f"TYPE_{spec.data_type}")
    message.dims.extend(spec.dims)
    if spec.optional:
        message.optional = True
    if spec.allow_ragged_batch:
        message.allow_ragged_batch = True


def _queue_policy(policy: QueuePolicy, message) -> None:
    message.max_queue_size = policy.max_queue_size
    message.default_timeout_microseconds = policy.timeout_microseconds
    message.allow_timeout_override = False
    message.timeout_action = pb.ModelQueuePolicy.REJECT if policy.reject_on_timeout else pb.ModelQueuePolicy.DELAY


def _dynamic_batching(settings: DynamicBatching, message) -> None:
    message.preferred_batch_size.extend(settings.preferred_batch_size)
    message.max_queue_delay_microseconds = settings.max_queue_delay_microseconds
    if settings.default_queue_policy is not None:
        _queue_policy(settings.default_queue_policy, message.default_queue_policy)


def _instance_group(group: InstanceGroup, message) -> None:
    message.count = group.count
    message.kind = pb.ModelInstanceGroup.Kind.Value(group.kind)
    message.gpus.extend(group.gpus)


def _ensemble_step(step: EnsembleStep, message) -> None:
    message.model_name = step.model_name
    message.model_version = step.model_version
    message.input_map.update(step.input_map)
    message.output_map.update(step.output_map)


def to_proto(config: TritonModelConfig) -> pb.ModelConfig:
    message = pb.ModelConfig(name=config.name, max_batch_size=config.max_batch_size)
    if config.platform:
        message.platform = config.platform
    else:
        message.backend = config.backend
    for spec in config.inputs:
        _tensor(spec, message.input.add())
    for spec in config.outputs:
        _tensor(spec, message.output.add())
    if config.dynamic_batching is not None:
        _dynamic_batching(config.dynamic_batching, message.dynamic_batching)
    for group in config.instance_groups:
        _instance_group(group, message.instance_group.add())
    for step in config.ensemble_steps:
        _ensemble_step(step, message.ensemble_scheduling.step.add())
    if config.version_policy_latest is not None:
        message.version_policy.latest.num_versions = config.version_policy_latest
    if config.response_cache:
        message.response_cache.enable = True
    for key, value in config.parameters.items():
        message.parameters[key].string_value = value
    return message


def to_pbtxt(config: TritonModelConfig) -> str:
    """The config.pbtxt text of ``config``."""
    return text_format.MessageToString(to_proto(config))


def parse_pbtxt(text: str) -> pb.ModelConfig:
    """Parses config.pbtxt with Triton's schema (raises on any unknown field)."""
    return text_format.Parse(text, pb.ModelConfig())
