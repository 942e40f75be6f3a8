"""The public API for plugin authors: the one module a plugin imports (``from rl_core.api import ...``).

Everything here is light to import (no torch, Ray or transformers at import time), so an entry-point module can
import it. What is not re-exported here is internal and may change between minor versions; tests use
``rl_core.testing`` as well (fixtures, conformance checks, ``certify``).

- Registration: ``hookimpl`` and the records a registration hook returns (``TrainingBackendSpec``, ``TaskSpec``, ...).
- Contracts: the protocols a component implements and the records it exchanges with the core.
- Batches: the ``batch`` helpers module (layout, shards, micro-batches, padding) and its ``TypedDict``s; ``tokens``
  (log-probabilities from logits, packing, shared-prefix splits) for backends that run the model themselves. Every batch: ``input_ids`` [B, T] long (right
  padded), ``attention_mask`` [B, T], ``loss_mask`` [B, T] float (1 where the loss counts); policy-gradient rows add
  ``advantages``, ``generation_logprobs``, ``prev_logprobs``, ``reference_logprobs`` ([B, T] each) and
  ``sample_mask`` [B]; DPO rows (chosen, rejected interleaved) add ``reference_logprobs``.
- Weight refit: ``RefitSender`` (trainer side), ``receive_weights`` (engine side), the payload records. An engine's
  ``update_weights`` returns ``replicas_stats([received_stats(...) for each engine process], seconds)``: a
  ``RefitStats`` even for one process.
- Workers: ``RankWorker`` and ``ReplicaWorker`` (or ``AsyncReplicaWorker``), what the one class a group backend or engine plugin writes
  implements (``GroupBackend`` / ``GroupEngine`` drive them; ``start_ranks`` / ``start_replicas`` start them).
- Ray: ``WorkerGroup`` and the layouts that place a backend's ranks and an engine's replicas (colocated or not).
- LoRA: ``lora`` (the ``peft`` config from ``policy.lora``, wrapping a model, which weights are adapters, merging
  them into plain weights) and ``LoraConfig``.
- Config: the core's sections a plugin reads, and ``structure_section`` to validate options.
- Models: ``resolve_model_path`` (``tiny:NAME`` included), ``check_model_folder``, ``cache_root``.
- Algorithms: an outside algorithm (``rl_algorithms`` -> ``AlgorithmSpec``) gets the ``RunContext`` (config,
  backend, engine, rewards, tokenizer) and builds its loop from the pieces the core's own loops use: ``run_loop``
  (data, resume, validation, logging, checkpoints), ``RolloutLoopConfig`` (the shared knobs); the on-policy loop
  ``run_on_policy`` with ``step_seed``, ``sample_on_policy`` / ``update_on_policy`` (a step's two halves, as
  REINFORCE, distillation and PPO use them), ``refit_metrics`` and ``step_metrics``; the supervised loop
  ``run_supervised`` with ``SupervisedLoopConfig``, ``encode_sft``, ``encode_pairs`` and ``validation_loss``; ``sampling``,
  ``generate_and_score``, ``rollout_batch``, ``refit``, ``validate_rollouts``, ``rollout_metrics``, ``Phases``,
  the losses (``ClippedPGLoss``, ``NLLLoss``) and ``advantages``. ``docs/plugins.md`` has a complete one.
"""

from __future__ import annotations

from rl_core.base.errors import ConfigError, InputError, PluginError, RLCoreError
from rl_core.base.paths import cache_root
from rl_core.base.schema import (
    Config,
    EnvironmentConfig,
    LoraConfig,
    LossConfig,
    OptimizerConfig,
    PolicyConfig,
    RolloutLoopConfig,
    SchedulerConfig,
)
from rl_core.config.loader import structure_section
from rl_core.contracts import batch, lora, tokens
from rl_core.contracts.batch import Batch, PolicyGradientBatch, PreferenceBatch, TokenBatch
from rl_core.contracts.protocols import (
    DrivenEpisodes,
    Environment,
    EpisodeDriver,
    FinishReason,
    LossFunction,
    MetricsLogger,
    Reward,
    RewardSource,
    Rollout,
    RolloutEngine,
    SamplingParams,
    TrainingBackend,
    Transition,
)
from rl_core.contracts.refit import (
    BroadcastWeights,
    CudaIpcWeights,
    FileWeights,
    HostShmWeights,
    ObjectStoreWeights,
    RefitPayload,
    RefitRoute,
    RefitSender,
    RefitStats,
    RouteKind,
    checksum,
    receive_weights,
    received_stats,
    replicas_stats,
)
from rl_core.contracts.workers import AsyncReplicaWorker, RankWorker, ReplicaWorker, Sample
from rl_core.data.models import check_model_folder, resolve_model_path
from rl_core.data.prompts import EpochSampler, Example, chat_ids, render_prompt
from rl_core.distributed.cluster import WorkerDiedError, WorkerGroup, free_port, node_address
from rl_core.distributed.driver import GroupBackend, GroupEngine, start_ranks, start_replicas
from rl_core.distributed.placement import (
    Device,
    GroupLayout,
    colocated,
    detected_device,
    engine_layout,
    policy_layout,
    thread_budget,
)
from rl_core.plugins.hookspecs import hookimpl
from rl_core.plugins.registry import Registry
from rl_core.plugins.specs import (
    AlgorithmSpec,
    CliCommandSpec,
    ComponentSpec,
    EnvironmentSpec,
    LoggerSpec,
    RewardSourceSpec,
    RolloutEngineSpec,
    TaskSpec,
    TrainingBackendSpec,
    lazy,
)
from rl_core.rewards.sources import check_reward_inputs
from rl_core.training import advantages
from rl_core.training.context import Phases, RunContext
from rl_core.training.episodes import turn_seed
from rl_core.training.loops import prefixed, run_loop
from rl_core.training.losses import ClippedPGLoss, NLLLoss
from rl_core.training.onpolicy import (
    OnPolicyBatch,
    refit_metrics,
    run_on_policy,
    sample_on_policy,
    step_metrics,
    step_seed,
    update_on_policy,
)
from rl_core.training.optim import lr_multiplier, make_optimizer, make_scheduler
from rl_core.training.rollouts import (
    ScoredRollouts,
    generate_and_score,
    refit,
    rollout_batch,
    rollout_metrics,
    sampling,
    validate_rollouts,
)
from rl_core.training.supervised import SupervisedLoopConfig, encode_pairs, encode_sft, run_supervised, validation_loss
from rl_core.training.transcripts import Call, episode_rollouts

__all__ = [
    "EnvironmentConfig",
    "episode_rollouts",
    "Call",
    "turn_seed",
    "render_prompt",
    "chat_ids",
    "EpisodeDriver",
    "DrivenEpisodes",
    "AlgorithmSpec",
    "AsyncReplicaWorker",
    "Batch",
    "BroadcastWeights",
    "CliCommandSpec",
    "ClippedPGLoss",
    "ComponentSpec",
    "Config",
    "ConfigError",
    "CudaIpcWeights",
    "Device",
    "Environment",
    "EnvironmentSpec",
    "TaskSpec",
    "EpochSampler",
    "Example",
    "FileWeights",
    "FinishReason",
    "GroupBackend",
    "GroupEngine",
    "GroupLayout",
    "HostShmWeights",
    "InputError",
    "LoggerSpec",
    "LoraConfig",
    "LossConfig",
    "LossFunction",
    "MetricsLogger",
    "NLLLoss",
    "ObjectStoreWeights",
    "OptimizerConfig",
    "Phases",
    "PluginError",
    "PolicyConfig",
    "PolicyGradientBatch",
    "PreferenceBatch",
    "RLCoreError",
    "RankWorker",
    "RefitPayload",
    "RefitRoute",
    "RefitSender",
    "RefitStats",
    "Registry",
    "ReplicaWorker",
    "Reward",
    "RewardSource",
    "RewardSourceSpec",
    "Rollout",
    "RolloutEngine",
    "RolloutEngineSpec",
    "RolloutLoopConfig",
    "RouteKind",
    "RunContext",
    "Sample",
    "SamplingParams",
    "SchedulerConfig",
    "ScoredRollouts",
    "TokenBatch",
    "TrainingBackend",
    "TrainingBackendSpec",
    "Transition",
    "WorkerDiedError",
    "WorkerGroup",
    "advantages",
    "batch",
    "cache_root",
    "check_model_folder",
    "check_reward_inputs",
    "checksum",
    "colocated",
    "detected_device",
    "engine_layout",
    "free_port",
    "generate_and_score",
    "hookimpl",
    "lr_multiplier",
    "make_optimizer",
    "make_scheduler",
    "node_address",
    "policy_layout",
    "prefixed",
    "receive_weights",
    "received_stats",
    "refit",
    "replicas_stats",
    "resolve_model_path",
    "rollout_batch",
    "rollout_metrics",
    "run_loop",
    "OnPolicyBatch",
    "SupervisedLoopConfig",
    "encode_pairs",
    "encode_sft",
    "refit_metrics",
    "run_on_policy",
    "run_supervised",
    "sample_on_policy",
    "step_metrics",
    "step_seed",
    "update_on_policy",
    "validation_loss",
    "sampling",
    "lazy",
    "lora",
    "start_ranks",
    "start_replicas",
    "structure_section",
    "thread_budget",
    "tokens",
    "validate_rollouts",
]
