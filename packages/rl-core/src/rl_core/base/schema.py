"""The configuration schema: the frozen attrs classes of every core section, and nothing else.

This module imports only attrs, cattrs, yaml and ``rl_core.base.errors``: loss functions, the cluster layer and the plugins read their
sections from here without pulling in the YAML loader or the plugin registry (``rl_core.config.loader`` loads and
validates a file into these classes). Plugins contribute their own sections through the ``config_key`` /
``config_class`` of their records; those are reached with ``Config.section(key)``.

A class may declare ``ALIASES`` (old or borrowed key -> canonical key): the loader accepts the alias and files its
value under the canonical key (giving both is an error).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import attrs
import cattrs
import yaml

from rl_core.base.errors import ConfigError

#: field metadata: the loader fills this field from other keys (a plugin's options); it is not a key of its own
LOADER_FILLED = "rl_core_loader_filled"

_pos = attrs.validators.gt(0)
_nonneg = attrs.validators.ge(0)
_pos_float = attrs.validators.gt(0.0)
_optional_pos_float: Any = attrs.validators.optional(_pos_float)
_nonneg_float = attrs.validators.ge(0.0)


@attrs.frozen(kw_only=True)
class OptimizerConfig:
    """AdamW by default; every training backend reads it (with ``policy.scheduler`` and ``policy.max_grad_norm``)."""

    #: ``adamw`` or plain ``sgd`` (momentum 0; certify uses it to read a step's gradient).
    name: Literal["adamw", "sgd"] = "adamw"
    #: the learning rate (the peak, with a schedule).
    lr: float = attrs.field(default=1e-5, validator=_pos_float)
    #: decoupled weight decay (AdamW's; SGD's L2).
    weight_decay: float = attrs.field(default=0.0, validator=_nonneg_float)
    #: AdamW's decay rates of the first and second moments.
    betas: tuple[float, float] = (0.9, 0.999)
    #: AdamW's epsilon, added to the second moment's square root.
    eps: float = 1e-8


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    """Learning-rate schedule over optimizer steps: linear warm-up, then constant, cosine or linear decay."""

    #: ``constant`` after the warm-up, or ``cosine`` / ``linear`` decay over ``total_steps``.
    name: Literal["constant", "cosine", "linear"] = "constant"
    #: optimizer steps of linear warm-up from 0 to ``lr``.
    warmup_steps: int = attrs.field(default=0, validator=_nonneg)
    #: steps over which cosine/linear decay to ``min_lr_ratio * lr``; required for those schedules.
    total_steps: int | None = None
    #: where cosine/linear decay ends, as a fraction of ``lr``.
    min_lr_ratio: float = attrs.field(default=0.0, validator=_nonneg_float)

    def __attrs_post_init__(self) -> None:
        if self.name != "constant" and not self.total_steps:
            raise ValueError(f"policy.scheduler.total_steps is required for the {self.name!r} schedule")


@attrs.frozen(kw_only=True)
class GenerationConfig:
    """Sampling for rollouts. ``backend`` names a rollout engine; unset, the enabled one of highest priority."""

    #: name of a rollout engine; overrides priority selection.
    backend: str | None = None
    #: tokens a response may sample; a response cut there has finish reason ``length``.
    max_new_tokens: int = attrs.field(default=64, validator=_pos)
    #: sampling temperature (0: greedy).
    temperature: float = attrs.field(default=1.0, validator=_nonneg_float)
    #: nucleus sampling: sample from the smallest set of tokens whose probability reaches this (1: all).
    top_p: float = 1.0
    #: -1 for no top-k.
    top_k: int = -1
    #: strings that end a response (not included in it).
    stop_strings: tuple[str, ...] = ()
    #: token ids that end a response besides the tokenizer's EOS.
    stop_token_ids: tuple[int, ...] = ()
    #: engine replicas (each its own Ray actor).
    num_replicas: int = attrs.field(default=1, validator=_pos)
    #: share devices with the trainer: on GPUs, trainer ranks and engine processes sit on the same GPUs (fractional
    #: shares in one placement group) and take turns (the engine sleeps while the trainer trains). On CPU it
    #: changes nothing.
    colocated: bool = True
    #: the refit route (``object_store``, ``host_shm``, ``cuda_ipc``, ``broadcast``); unset, chosen at each refit:
    #: ``cuda_ipc`` on GPUs when colocated, ``broadcast`` on GPUs otherwise, ``host_shm`` on CPU when every engine
    #: process shares the trainer's host (and /dev/shm has room), else ``object_store``.
    weight_transport: Literal["object_store", "host_shm", "cuda_ipc", "broadcast"] | None = None


@attrs.frozen(kw_only=True)
class LoraConfig:
    """``policy.lora``: train low-rank adapters (``peft``) on a frozen base instead of every weight. The reference
    policy is then the base with the adapters disabled (no second copy), engines that take adapters get only the
    adapters' tensors at each refit (others the merged weights), and checkpoints hold the adapters and their
    optimizer state."""

    #: train LoRA adapters instead of every weight.
    enabled: bool = False
    #: the adapters' rank r.
    rank: int = attrs.field(default=16, validator=_pos)
    #: the update is scaled by alpha / r.
    alpha: int = attrs.field(default=32, validator=_pos)
    #: dropout on the adapters' input during training.
    dropout: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.lt(1.0)])
    #: module names (suffixes, as ``peft`` matches them) to adapt; ``[all-linear]``: every linear layer but the
    #: output layer.
    target_modules: tuple[str, ...] = ("all-linear",)
    #: module names never adapted.
    exclude_modules: tuple[str, ...] = ()
    #: a ``peft`` adapter folder to start from (``save_pretrained`` output); unset, fresh adapters (B = 0).
    adapter_path: str | None = None

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@attrs.frozen(kw_only=True)
class PolicyConfig:
    #: a local Hugging Face folder, or ``tiny:NAME`` for a model built on first use by ``rl_core.testing``.
    model_name: str
    #: tokenizer folder; unset, the model's own.
    tokenizer_name: str | None = None
    #: the reference policy's model (a local Hugging Face folder or ``tiny:NAME``, same vocabulary); unset, the
    #: policy's own starting weights (with LoRA: the base, adapters off). On-policy distillation's teacher.
    reference_model_name: str | None = None
    #: ``lm``: a causal LM, trained on its token log-probabilities; ``score``: the same architecture with a
    #: one-output score head (``AutoModelForSequenceClassification``, num_labels 1), trained on the head's
    #: per-token values (``algorithm: reward_model``; exported as a reward model ``rl-reward-server`` serves).
    head: Literal["lm", "score"] = "lm"
    #: name of a training backend; overrides priority selection.
    backend: str | None = None
    #: training ranks (data parallel).
    num_workers: int = attrs.field(default=1, validator=_pos)
    #: rows per optimizer step (a larger rollout batch makes several steps).
    train_global_batch_size: int = attrs.field(default=32, validator=_pos)
    #: rows per forward/backward pass on one rank (gradient accumulation up to the global batch).
    train_micro_batch_size: int = attrs.field(default=4, validator=_pos)
    #: rows per forward pass when only logprobs are needed.
    logprob_batch_size: int = attrs.field(default=16, validator=_pos)
    #: longest prompt + response in tokens; longer input is an error.
    max_total_sequence_length: int = attrs.field(default=512, validator=_pos)
    #: dtype of the rollout engine (the trainer's master weights stay float32).
    precision: Literal["float32", "bfloat16"] = "float32"
    #: gradient clipping by global norm; null for none.
    max_grad_norm: float | None = 1.0
    #: run code shipped with a model folder (off unless you trust it).
    trust_remote_code: bool = False
    optimizer: OptimizerConfig = attrs.Factory(OptimizerConfig)
    scheduler: SchedulerConfig = attrs.Factory(SchedulerConfig)
    generation: GenerationConfig = attrs.Factory(GenerationConfig)
    lora: LoraConfig = attrs.Factory(LoraConfig)

    def __attrs_post_init__(self) -> None:
        if self.train_global_batch_size % (self.train_micro_batch_size * self.num_workers):
            raise ValueError(
                f"policy.train_global_batch_size ({self.train_global_batch_size}) must be a multiple of "
                f"policy.train_micro_batch_size x policy.num_workers ({self.train_micro_batch_size} x "
                f"{self.num_workers}); change one of them"
            )


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """Ray. ``address`` (or ``RAY_ADDRESS``) joins an existing cluster; unset, a local one is started."""

    #: a Ray cluster to join (``HOST:PORT`` or ``auto``); unset: ``RAY_ADDRESS``, else a local Ray is started.
    address: str | None = None
    #: nodes the run expects; joining a cluster with fewer live nodes is an error.
    num_nodes: int = attrs.field(default=1, validator=_pos)
    #: logical CPUs per node for a local Ray (unset: the machine's cores, at least 8, so that a trainer group and
    #: an engine fit on a laptop: they take turns, generation then training).
    cpus_per_node: int | None = None
    #: GPUs per node; also makes workers ask Ray for a GPU when the driver itself sees none.
    gpus_per_node: int = attrs.field(default=0, validator=_nonneg)
    #: ``pack`` worker groups onto as few nodes as possible, or ``spread`` them over the nodes.
    placement: Literal["pack", "spread"] = "pack"
    #: ``auto``: CUDA when the driver sees a GPU (or ``gpus_per_node`` > 0), else CPU; ``cpu`` keeps a GPU machine's
    #: workers on CPU (gloo), for debugging or CPU-only tests.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: file holding the cluster's Ray auth token (Ray >= 2.52 token authentication); also read from
    #: ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``. When a token is found, ``RAY_AUTH_MODE=token`` is set.
    auth_token_file: str | None = None


@attrs.frozen(kw_only=True)
class DataConfig:
    """Prompt data: files (JSONL, JSON, Parquet, CSV, Arrow), folders (of such files, or saved by ``datasets``'
    ``save_to_disk``), datasets in the local Hugging Face cache by name, or a generated task (the core's or a plugin's). A path in a
    config file is relative to that file; on the command line, to the current folder."""

    #: training rows: a file, a folder, or a dataset name in the local Hugging Face cache (offline).
    train_path: str | None = None
    #: held-out rows, likewise (may be the same source as ``train_path`` with another split).
    val_path: str | None = None
    #: the split to read when the source has several; unset: ``train``, or the only one.
    train_split: str | None = None
    #: the same for ``val_path`` (unset: ``train``, or the only one).
    val_split: str | None = None
    #: fields filled from (nested) keys of each row, e.g. ``{answer: reward_model.ground_truth}`` for verl's rows.
    columns: dict[str, str] = attrs.Factory(dict)
    #: a system message put before chat-message prompts that have none.
    system_prompt: str | None = None
    #: render prompts with the tokenizer's chat template: ``auto`` those that are chat messages (a list of
    #: ``{role, content}``), ``always`` text prompts too (as one user message), ``never`` none (messages are refused).
    chat_template: Literal["auto", "always", "never"] = "auto"
    #: a generated task, used when no path is given: ``NAME``, or ``NAME:VARIANT`` for a plugin's task with variants
    #: (``reasoning_gym:basic_arithmetic`` with rl-env-reasoning-gym; ``rl-core plugins`` lists the tasks). The
    #: core's: ``parity`` ("Even or odd? 4 8 1 7" -> " odd"), ``parity_format`` (the same with coin-flip answers: a
    #: format-only SFT warm-up), ``addition`` (single digits), ``calculator`` (two-digit sums, for the calculator
    #: environment), ``calculator_format`` (its SFT warm-up: transcripts that use the calculator 40% of the time and
    #: guess otherwise) or ``guess_number``.
    task: str | None = None
    #: the task's own options (a plugin's task: its generator's settings; the core's tasks take none).
    task_options: dict[str, Any] = attrs.Factory(dict)
    #: rows the task generates for training.
    num_train: int = attrs.field(default=2048, validator=_pos)
    #: rows the task generates for validation (fewer when some repeat a training prompt).
    num_val: int = attrs.field(default=64, validator=_pos)
    #: the field holding the prompt; the others are metadata for the rewards.
    prompt_key: str = "prompt"
    #: seed of the task's generator (validation rows come from another seed).
    seed: int = 0


@attrs.frozen(kw_only=True)
class RewardSourceConfig:
    """One reward source: its registered ``name``, a ``weight`` in the total reward, and its own options."""

    name: str
    weight: float = 1.0
    #: the source's own options (its class), from the entry's other keys.
    options: Any = attrs.field(default=None, metadata={LOADER_FILLED: True})


@attrs.frozen(kw_only=True)
class RewardConfig:
    #: the reward sources (``{name, weight, ...options}`` each); a sample's reward is their weighted sum.
    sources: tuple[RewardSourceConfig, ...] = ()


@attrs.frozen(kw_only=True)
class EnvironmentConfig:
    """Multi-turn episodes in an environment (``environment: {name: calculator, ...}``): the model's turn, the
    environment's observation, again, up to ``max_turns``; unset ``name``, single-turn rollouts scored by
    ``reward.sources``. Keys besides these are the environment's own options, validated by its class."""

    MOVED: ClassVar[dict[str, str]] = {
        "save_trajectories_every": "samples of every run, episodes included, are logger.save_samples_every's",
    }

    #: a registered environment (``rl-core plugins`` lists them).
    name: str | None = None
    #: model turns an episode may take; one that reaches it ends.
    max_turns: int = attrs.field(default=4, validator=_pos)
    #: model and environment tokens after the prompt, all turns together; an episode that reaches it ends.
    max_total_tokens: int = attrs.field(default=256, validator=_pos)
    #: tokens one model turn may sample; unset, ``policy.generation.max_new_tokens``.
    max_tokens_per_turn: int | None = attrs.field(default=None, validator=attrs.validators.optional(_pos))
    #: seconds one environment step may take; an episode whose step overruns (or raises) ends with that reason.
    step_timeout_s: float = attrs.field(default=10.0, validator=_pos_float)
    #: ``lockstep``: turn t of every episode in one engine call, then their environment steps; ``streaming``: each
    #: episode on its own, its next turn asked for as soon as its step answers (nothing waits for a slow tool or a
    #: long turn); ``auto``: streaming when the engine batches concurrent calls (vLLM's async engine), else lockstep.
    schedule: Literal["auto", "lockstep", "streaming"] = "auto"
    #: Ray actors that run the environment's steps (for isolation and parallel episodes); 0: in this process.
    num_workers: int = attrs.field(default=0, validator=_nonneg)
    #: the environment's own options (its class), from the section's other keys.
    options: Any = attrs.field(default=None, metadata={LOADER_FILLED: True})


@attrs.frozen(kw_only=True)
class LossConfig:
    """The policy-gradient loss (GRPO, REINFORCE, PPO's policy): its objective, importance ratio, normaliser,
    KL penalty and the corrections for the engine's logprobs. Names follow NeMo RL where it has them."""

    #: PPO's lower clip: the ratio is clipped at ``1 - ratio_clip_min`` (CISPO: its weight's lower bound).
    ratio_clip_min: float = attrs.field(default=0.2, validator=_nonneg_float)
    #: PPO's upper clip: the ratio is clipped at ``1 + ratio_clip_max`` (DAPO's clip-higher sets it above
    #: ``ratio_clip_min``, e.g. 0.28; CISPO: its weight's upper bound).
    ratio_clip_max: float = attrs.field(default=0.2, validator=_nonneg_float)
    #: dual clip for negative advantages (> 1), off when None.
    ratio_clip_c: float | None = None
    #: plain REINFORCE: no ratio, no clipping (the gradient of ``-A * log pi``).
    disable_ppo_ratio: bool = False
    #: ``clipped``: PPO's clipped surrogate; ``cispo`` (MiniMax-M1): each token's ``-A * w * log pi`` with ``w``
    #: its ratio clipped to ``[1 - ratio_clip_min, 1 + ratio_clip_max]`` and no gradient through ``w``, so no
    #: token loses its gradient to clipping.
    policy_objective: Literal["clipped", "cispo"] = "clipped"
    #: ``token``: each token's own ratio (PPO, GRPO); ``sequence`` (GSPO): one ratio per sequence, the geometric
    #: mean of its token ratios ``exp(mean_t (log pi - log pi_old))``, clipped per sequence; ``sequence_token``
    #: (GSPO-token): the sequence's ratio in value, each token's own log-probability gradient.
    importance_ratio: Literal["token", "sequence", "sequence_token"] = "token"
    #: weight of the KL penalty to the reference policy, added to each token's loss (0: off, and no reference
    #: logprobs are computed).
    reference_policy_kl_penalty: float = attrs.field(default=0.0, validator=_nonneg_float)
    #: the per-token KL estimator: ``k1`` (log-ratio), ``k2`` (half its square) or ``k3`` (Schulman's unbiased,
    #: non-negative estimator).
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"
    #: the log-ratio to the reference is clamped to ``[-v, v]`` before the estimator (None: not clamped).
    kl_input_clamp_value: float | None = 20.0
    #: the estimator's value is clamped to ``[-v, v]`` (None: not clamped).
    kl_output_clamp_value: float | None = 10.0
    #: the KL term weighted by the (detached) ratio to the previous policy, for batches trained in several
    #: optimizer steps.
    use_on_policy_kl_approximation: bool = False
    #: weight each token by ``exp(log pi_old - log pi_engine)`` (no gradient): the trainer's previous policy
    #: against the engine's logprobs of the same tokens (the training/inference mismatch, or an off-policy batch).
    use_importance_sampling_correction: bool = False
    #: truncation of the importance weight (TIS); None for no truncation.
    truncated_importance_sampling_ratio: float | None = None
    #: masked importance sampling: tokens (``token``), or whole sequences by the geometric mean of their ratios
    #: (``sequence``), whose trainer-vs-engine ratio ``exp(log pi_old - log pi_engine)`` falls outside
    #: ``[mismatch_mask_low, mismatch_mask_high]`` drop out of the loss (the normaliser still counts them); with both
    #: bounds set the mask is two-sided, as IcePop's. None: no mask. ``train/mismatch_masked_fraction`` says how
    #: much was dropped.
    mismatch_mask: Literal["token", "sequence"] | None = None
    #: the mask's lower bound on the ratio (None: none).
    mismatch_mask_low: float | None = attrs.field(default=None, validator=_optional_pos_float)
    #: the mask's upper bound on the ratio (None: none).
    mismatch_mask_high: float | None = attrs.field(default=2.0, validator=_optional_pos_float)
    #: ``true``: the loss is the mean over every loss token of the batch (DAPO); ``false``: each sequence's mean
    #: over its tokens, then the mean over sequences (GRPO's paper, GSPO).
    token_level_loss: bool = True
    #: Dr. GRPO: the sum over every loss token divided by ``sequences x constant_normalizer`` (use the generation
    #: budget, ``policy.generation.max_new_tokens``), so a sequence's weight does not shrink with its length; the
    #: metrics (ratio, clip fraction, KL) are averaged the same way. None: ``token_level_loss`` decides.
    constant_normalizer: float | None = attrs.field(default=None, validator=_optional_pos_float)

    def __attrs_post_init__(self) -> None:
        if self.ratio_clip_c is not None and self.ratio_clip_c <= 1.0:
            raise ValueError(f"loss_fn.ratio_clip_c must be > 1 (got {self.ratio_clip_c}); set it to null to disable")
        if self.constant_normalizer is not None and not self.token_level_loss:
            raise ValueError(
                "loss_fn.constant_normalizer replaces the per-sequence mean of token_level_loss=false; set one of them"
            )
        if self.policy_objective == "cispo" and self.disable_ppo_ratio:
            raise ValueError("loss_fn.policy_objective=cispo weights each token by its ratio: drop disable_ppo_ratio")
        low, high = self.mismatch_mask_low, self.mismatch_mask_high
        if self.mismatch_mask is not None and low is None and high is None:
            raise ValueError("loss_fn.mismatch_mask needs mismatch_mask_low or mismatch_mask_high (or both)")
        if low is not None and high is not None and low >= high:
            raise ValueError(f"loss_fn.mismatch_mask_low ({low}) must be below mismatch_mask_high ({high})")


@attrs.frozen(kw_only=True)
class CheckpointingConfig:
    #: write checkpoints (false: none, and a killed run starts again).
    enabled: bool = True
    #: a checkpoint every this many steps (and after the last).
    save_period: int = attrs.field(default=10, validator=_pos)
    #: keep the best ``keep_top_k`` checkpoints by ``metric_name`` (the latest one is always kept).
    keep_top_k: int | None = 3
    #: the metric that ranks checkpoints for ``keep_top_k`` (None, or a checkpoint without it: by step).
    metric_name: str | None = "val/reward"
    #: whether a higher ``metric_name`` is a better checkpoint.
    higher_is_better: bool = True
    #: write the final policy as a Hugging Face folder to ``RUN_DIR/final`` when the run ends (atomically).
    export_final_hf: bool = True
    #: record each file's sha256 in the checkpoint's manifest (sizes are always recorded), so that a corrupted
    #: checkpoint is skipped on resume rather than loaded.
    checksums: bool = True


@attrs.frozen(kw_only=True)
class LoggerConfig:
    """JSONL metrics are always written; the others when enabled."""

    #: write TensorBoard event files to ``RUN_DIR/tensorboard`` (needs ``tensorboard``).
    tensorboard_enabled: bool = False
    #: log to Weights & Biases (needs ``wandb``; offline unless ``wandb_mode`` says otherwise).
    wandb_enabled: bool = False
    #: log to MLflow (needs ``mlflow``; a SQLite store in the run folder unless ``mlflow_tracking_uri``).
    mlflow_enabled: bool = False
    #: the Weights & Biases project.
    wandb_project: str = "rl-core"
    #: unset: ``WANDB_MODE`` if set, else ``offline`` (works without a network; ``wandb sync`` uploads later).
    wandb_mode: Literal["online", "offline", "disabled"] | None = None
    #: MLflow tracking URI; unset: ``MLFLOW_TRACKING_URI`` if set, else a SQLite store in the run folder.
    mlflow_tracking_uri: str | None = None
    #: a live progress display (rich) on a terminal; ``false`` prints one plain line per step instead.
    progress: bool = True
    #: every this many steps, at step 1 and at every validation, a few of the rollouts (prompt, response or episode
    #: turn by turn, reward) to RUN_DIR/samples.jsonl and to the loggers that take samples (0: never).
    save_samples_every: int = attrs.field(default=10, validator=_nonneg)
    #: of each prompt, at most this many rollouts per save.
    samples_per_prompt: int = attrs.field(default=2, validator=_pos)
    #: at most this many rollouts per save in all.
    max_samples: int = attrs.field(default=16, validator=_pos)


@attrs.frozen(kw_only=True)
class HealthConfig:
    """Checks in every run that catch silent wrongness: the engine's logprobs against the trainer's on the sampled
    tokens, and the weights each engine process received against the trainer's after a refit."""

    #: mean |engine logprob - trainer logprob| over sampled tokens above which a step warns (fp32 engines agree
    #: to ~1e-6, bf16 ones to ~1e-2).
    logprob_mismatch_warn: float = attrs.field(default=0.1, validator=_nonneg_float)
    #: above which the run stops with a message naming the engine (null: never stop).
    logprob_mismatch_stop: float | None = 1.0
    #: when a step does not compute the trainer's logprobs of the engine's samples anyway (several updates per
    #: batch without the PPO ratio), compute them for the mismatch every this many steps (0: only when computed).
    logprob_mismatch_every: int = attrs.field(default=5, validator=_nonneg)
    #: verify the weights every engine process received (per-tensor checksums) every this many refits, the first
    #: included (1: every refit, which ``--debug`` sets; 0: never).
    verify_refit_every: int = attrs.field(default=10, validator=_nonneg)
    #: what a failed weight sync does: ``stop`` the run, or ``warn``.
    on_weight_sync_failure: Literal["stop", "warn"] = "stop"
    #: step 1's rollouts, judged before the first update (they cost nothing extra): one line with their rewards and
    #: truncation, and when they carry no learning signal at all (every reward alike, or no group with variance),
    #: ``warn`` with the fix, ``stop`` the run with it, or ``off``. Not ``stop`` by default: a sparse reward may miss
    #: every one of a first batch's samples and still fire later (the step-3 warnings then judge more steps).
    preflight: Literal["warn", "stop", "off"] = "warn"


@attrs.frozen(kw_only=True)
class Config:
    """The whole, validated configuration of a run."""

    #: ``grpo``, ``reinforce``, ``sft``, ``dpo`` (or an algorithm a plugin registers).
    algorithm: str = "grpo"
    #: seeds torch, sampling and data order; the same seed reproduces a run.
    seed: int = 42
    #: the run folder: resolved config, metrics, checkpoints. A run in an existing folder resumes.
    run_dir: str = "runs/default"
    #: a recipe (path relative to this file, or ``builtin:NAME``) run first in ``RUN_DIR/warmup``; its final
    #: policy becomes this run's ``policy.model_name`` (for example a short SFT warm-up before GRPO). It runs as
    #: written, given only this run's ``policy.model_name`` and ``seed``: other overrides (``policy.backend``, ...)
    #: do not reach it; to change it, copy the recipe and name the copy here.
    warmup_recipe: str | None = None
    #: reuse the warm-up model this machine built before from the same recipe, base model, seed, libraries and
    #: code (kept under ``RL_CORE_CACHE/warmups``, default ``~/.cache/rl_core``); ``false`` trains it again.
    warmup_cache: bool = True
    policy: PolicyConfig
    cluster: ClusterConfig = attrs.Factory(ClusterConfig)
    data: DataConfig = attrs.Factory(DataConfig)
    reward: RewardConfig = attrs.Factory(RewardConfig)
    environment: EnvironmentConfig = attrs.Factory(EnvironmentConfig)
    loss_fn: LossConfig = attrs.Factory(LossConfig)
    checkpointing: CheckpointingConfig = attrs.Factory(CheckpointingConfig)
    logger: LoggerConfig = attrs.Factory(LoggerConfig)
    health: HealthConfig = attrs.Factory(HealthConfig)
    #: sections contributed by registered components, by dotted config key.
    sections: Mapping[str, Any] = attrs.Factory(dict)

    def section(self, key: str) -> Any:
        try:
            return self.sections[key]
        except KeyError:
            raise ConfigError(
                f"config section {key!r} is not known; is the plugin that provides it installed?"
            ) from None


@attrs.frozen(kw_only=True)
class RolloutLoopConfig:
    """What GRPO and REINFORCE share: one vocabulary for the same knobs. NeMo-Aligner's REINFORCE names are
    accepted as aliases (``num_rollout_samples``, ``max_steps``, ``val_check_interval``)."""

    ALIASES: ClassVar[dict[str, str]] = {
        "num_rollout_samples": "num_generations_per_prompt",
        "max_steps": "max_num_steps",
        "val_check_interval": "val_period",
    }

    #: prompts drawn per step.
    num_prompts_per_step: int = attrs.field(default=8, validator=_pos)
    #: responses sampled per prompt (the group a baseline is formed over).
    num_generations_per_prompt: int = attrs.field(default=8, validator=attrs.validators.ge(2))
    #: training steps of the run (a step: one batch of prompts, rollouts and updates).
    max_num_steps: int = attrs.field(default=20, validator=_pos)
    #: validate (greedy, held-out prompts) every this many steps, and after the last.
    val_period: int = attrs.field(default=5, validator=_pos)
    #: validate before the first step too (step 0: where training starts from).
    val_at_start: bool = True
    #: held-out prompts per validation (the first of the validation split).
    max_val_samples: int = attrs.field(default=64, validator=_pos)
    #: rollouts per reward request (NeMo-Aligner's name): each reward source scores the step's rollouts in
    #: requests of this many, sent concurrently; unset, one request for all. A reward model that splits a request
    #: into ``inference_micro_batch_size`` chunks over ``replicas`` needs ``inference_micro_batch_size x replicas
    #: <= rollout_micro_batch_size`` (checked when the run starts).
    rollout_micro_batch_size: int | None = attrs.field(default=None, validator=attrs.validators.optional(_pos))

    def check_batch(self, policy: PolicyConfig, section: str) -> None:
        """A step's rollouts (prompts x generations) must split into whole optimizer steps of
        ``policy.train_global_batch_size`` rows, or some rollouts would train in a smaller, differently weighted
        update."""
        rows, size = self.num_prompts_per_step * self.num_generations_per_prompt, policy.train_global_batch_size
        if rows % size:
            fits = [d for d in range(1, rows + 1) if rows % d == 0 and d % policy.train_micro_batch_size == 0]
            hint = f"e.g. policy.train_global_batch_size={max(d for d in fits if d <= size)}" if fits else ""
            raise ConfigError(
                f"{section}.num_prompts_per_step x {section}.num_generations_per_prompt ({self.num_prompts_per_step} x "
                f"{self.num_generations_per_prompt} = {rows} rollouts a step) is not a multiple of "
                f"policy.train_global_batch_size ({size}); change one of them{', ' + hint if hint else ''}"
            )


# the config as plain data (for YAML, loggers): attrs records to dicts, nothing validated
_plain_converter = cattrs.Converter()


def to_dict(config: Config) -> dict[str, Any]:
    """The resolved config as plain data, plugin sections put back at their dotted keys."""
    out = _plain_converter.unstructure(
        attrs.evolve(config, sections={}, reward=RewardConfig(), environment=EnvironmentConfig())
    )
    out.pop("sections", None)
    env = config.environment
    out["environment"] = {
        **{k: v for k, v in _plain_converter.unstructure(attrs.evolve(env, options=None)).items() if k != "options"},
        **(_plain_converter.unstructure(env.options) if env.options is not None else {}),
    }
    out["reward"] = {
        "sources": [
            {
                "name": s.name,
                "weight": s.weight,
                **(_plain_converter.unstructure(s.options) if s.options is not None else {}),
            }
            for s in config.reward.sources
        ]
    }
    for key, value in config.sections.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = _plain_converter.unstructure(value)
    return _plain(out)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)
