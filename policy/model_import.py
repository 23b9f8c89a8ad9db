"""A pretrained model, as a GGUF file or a Hugging Face directory, made into a Tandem-ready directory.

``tandem models import SOURCE DEST`` runs :func:`import_model`. DEST gets what
:func:`policy.load_hf_checkpoint` and :func:`policy.load_tokenizer` read:
``model.safetensors`` (float32, dequantized), ``config.json`` with its
``architectures``, ``tokenizer.json`` and ``tokenizer_config.json`` with the
model's chat template. The result is checked by loading it the way a run does.

A GGUF file is dequantized by ``transformers`` (which needs ``torch``, ``gguf``
and ``accelerate``: the ``models`` extra). Only this import uses them, and
imports them when it runs: the trainer and the producers never load torch.
``save_pretrained`` refuses a model loaded from GGUF, so its state dict is
written with safetensors directly (a tied ``lm_head`` as the embedding alone).

A base model's file may hold no chat template (Gemma 3 270M's does not, though
its tokenizer knows ``<start_of_turn>`` and ``<end_of_turn>``): the caller gives
one (``--chat-template FILE``), written as the directory's ``chat_template.jinja``.
Without one, such a model imports, but a run can only use it with
``prompt_format: byte``, which a pretrained vocabulary was never trained on;
the import says so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from policy.hf import (
    CheckpointError,
    architecture_of_model_type,
    load_hf_checkpoint,
    transformer_config_from_hf,
)
from policy.tokenizer import load_tokenizer

# What a Hugging Face directory may carry beside its weights that a run reads.
_DIRECTORY_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
)


class ModelImportError(RuntimeError):
    """The source cannot become a Tandem model; the message says why and what is supported."""


def import_model(
    source: str | Path, destination: str | Path, *, chat_template: str | Path | None = None
) -> Path:
    """Write the model at ``source`` (a ``.gguf`` file or a Hugging Face directory) to ``destination``.

    ``chat_template``: a Jinja file that becomes the model's chat template, in place of any
    its tokenizer has.

    Returns ``destination``. Raises :class:`ModelImportError` for a source that
    is missing, of an architecture Tandem does not build, or quantized in a way
    that cannot be dequantized, and for a template file that is missing or not Jinja.
    """
    source, destination = Path(source), Path(destination)
    if not source.exists():
        raise ModelImportError(f"{source} does not exist")
    template_source = _read_template(Path(chat_template)) if chat_template is not None else None
    if source.is_file() and source.suffix == ".gguf":
        _import_gguf(source, destination)
    elif source.is_dir():
        _import_directory(source, destination)
    else:
        raise ModelImportError(f"{source} is neither a .gguf file nor a Hugging Face directory")
    if template_source is not None:
        _replace_template(destination, template_source)
    _check(destination)
    return destination


def _read_template(path: Path) -> str:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelImportError(f"--chat-template {path}: {exc}") from exc
    try:
        import jinja2
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ModelImportError(f"--chat-template {path}: not a Jinja template: {exc}") from exc
    return text


def _replace_template(destination: Path, template: str) -> None:
    """Make ``template`` the directory's chat template: a template in tokenizer_config.json wins over
    the file, so one there goes."""
    config_path = destination / "tokenizer_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        if config.pop("chat_template", None) is not None:
            config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (destination / "chat_template.json").unlink(missing_ok=True)
    (destination / "chat_template.jinja").write_text(template)


def _supported(config: dict, source: Path) -> None:
    try:
        transformer_config_from_hf(config)
    except CheckpointError as exc:
        raise ModelImportError(f"{source}: {exc}") from exc


def _import_gguf(source: Path, destination: Path) -> None:
    try:
        import safetensors.torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - the models extra is part of the project's set-up
        raise ModelImportError(
            f"importing a GGUF file needs transformers, torch, gguf and accelerate ({exc}): "
            "pip install 'tandem[models]'"
        ) from exc
    directory, name = source.parent, source.name
    try:
        config = AutoConfig.from_pretrained(directory, gguf_file=name)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a bad file
        raise ModelImportError(f"{source} is not a GGUF model transformers can read: {exc}") from exc
    config_dict = config.to_dict()
    # GGUF files name a model_type, not a class.
    config_dict["architectures"] = config_dict.get("architectures") or [
        architecture_of_model_type(config.model_type) or config.model_type]
    _supported(config_dict, source)
    try:
        # transformers dequantizes tensor by tensor, with a progress bar of its own.
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    except (ValueError, NotImplementedError, KeyError) as exc:
        raise ModelImportError(f"cannot dequantize {source}: {exc}") from exc
    destination.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    if config_dict.get("tie_word_embeddings"):
        # The output layer is the embedding; Hugging Face checkpoints keep only the embedding.
        tensors.pop("lm_head.weight", None)
    safetensors.torch.save_file(tensors, str(destination / "model.safetensors"), metadata={"format": "pt"})
    config_dict["torch_dtype"] = str(model.dtype).removeprefix("torch.")  # dequantized: float32
    config_dict.pop("dtype", None)
    (destination / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True))
    tokenizer.save_pretrained(destination)


def _import_directory(source: Path, destination: Path) -> None:
    config_path = source / "config.json"
    if not config_path.is_file():
        raise ModelImportError(f"{source} has no config.json: not a Hugging Face model directory")
    _supported(json.loads(config_path.read_text()), source)
    weights = sorted(source.glob("*.safetensors"))
    if not weights:
        raise ModelImportError(
            f"{source} has no *.safetensors weights (pytorch_model.bin is not read: save it with "
            "safetensors first)"
        )
    if not (source / "tokenizer.json").is_file():
        raise ModelImportError(f"{source} has no tokenizer.json")
    destination.mkdir(parents=True, exist_ok=True)
    if source.resolve() == destination.resolve():
        return
    for path in (*weights, *(source / name for name in (*_DIRECTORY_FILES, "model.safetensors.index.json"))):
        if path.is_file():
            shutil.copy2(path, destination / path.name)


def _check(destination: Path) -> None:
    """Load the result as a run would: its config, its tokenizer, and its tensors' names and shapes."""
    try:
        load_hf_checkpoint(destination)
        load_tokenizer(str(destination))
    except (CheckpointError, ValueError, OSError) as exc:
        raise ModelImportError(f"the imported model in {destination} does not load: {exc}") from exc
