"""Tokenizers and chat templates, on a tiny byte-level BPE built here and a ChatML template."""

from __future__ import annotations

import json

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from policy.byte_layout import Conversation
from policy.chat_template import ChatTemplateError, render_chat
from policy.tokenizer import EOS_ID, ByteTokenizer, HFTokenizer, load_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "calc(2 + 3)"},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "It is 5."},
]


@pytest.fixture(scope="module")
def tokenizer_directory(tmp_path_factory):
    """A byte-level BPE trained on a few strings, saved like a Hugging Face checkpoint."""
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["What is 2 + 3? It is 5.", "calc(2 + 3) returns 5", "You add numbers."] * 10
    bpe.train_from_iterator(corpus, trainer=trainer)
    directory = tmp_path_factory.mktemp("tokenizer")
    bpe.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def tokenizer(tokenizer_directory) -> HFTokenizer:
    return load_tokenizer(str(tokenizer_directory))


def test_hf_tokenizer_round_trips_text_and_reads_its_special_tokens(tokenizer, tokenizer_directory):
    assert isinstance(tokenizer, HFTokenizer)
    text = "What is 2 + 3? Ünïcode too."
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_id == tokenizer.encode("<|im_end|>")[0] == SPECIALS.index("<|im_end|>")
    assert tokenizer.pad_id == SPECIALS.index("<|endoftext|>")
    assert tokenizer.bos_id is None
    saved = tokenizers.Tokenizer.from_file(str(tokenizer_directory / "tokenizer.json"))
    assert tokenizer.vocab_size == saved.get_vocab_size() > max(tokenizer.encode(text))
    # encode adds nothing; decode drops special tokens like ByteTokenizer.decode does.
    assert tokenizer.decode(tokenizer.encode("hi<|im_end|>")) == "hi"


def test_special_tokens_can_be_overridden_and_must_exist(tokenizer_directory):
    overridden = load_tokenizer(str(tokenizer_directory), eos_token="<|endoftext|>", bos_token=1)
    assert (overridden.eos_id, overridden.bos_id) == (0, 1)
    with pytest.raises(ValueError, match="eos_token='<nope>'"):
        HFTokenizer.from_directory(tokenizer_directory, eos_token="<nope>")
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)


def test_special_tokens_fall_back_to_the_special_tokens_map(tokenizer_directory, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((tokenizer_directory / "tokenizer.json").read_bytes())
    added_token = {"content": "<|im_end|>", "special": True}  # the AddedToken form
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": added_token}))
    tokenizer = load_tokenizer(str(tmp_path))
    assert tokenizer.eos_id == tokenizer.pad_id == SPECIALS.index("<|im_end|>")
    assert tokenizer.chat_template is None
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        render_chat(CONVERSATION, tokenizer)
    (tmp_path / "special_tokens_map.json").unlink()
    with pytest.raises(ValueError, match="names no eos_token"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="neither 'byte' nor a directory"):
        load_tokenizer(str(tokenizer_directory / "missing"))


def test_chatml_template_marks_exactly_the_assistant_turns_and_their_end_token(tokenizer):
    rendered = render_chat(CONVERSATION, tokenizer, add_generation_prompt=True)
    text = (
        "<|im_start|>system\nYou add numbers.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\ncalc(2 + 3)<|im_end|>\n"
        "<|im_start|>tool\n5<|im_end|>\n"
        "<|im_start|>assistant\nIt is 5.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # Special tokens split the text, so the piecewise tokenization equals the whole one here.
    assert rendered.token_ids == tokenizer.encode(text)
    assistant_ids = [
        t for t, m in zip(rendered.token_ids, rendered.assistant_mask, strict=True) if m
    ]
    eos = tokenizer.eos_id
    assert assistant_ids == [
        *tokenizer.encode("calc(2 + 3)"),
        eos,
        *tokenizer.encode("It is 5."),
        eos,
    ]
    # Two contiguous runs, each ending on the end-of-turn token.
    runs = "".join(map(str, rendered.assistant_mask)).split("0")
    assert len([run for run in runs if run]) == 2
    for index, flag in enumerate(rendered.assistant_mask):
        if flag and (
            index + 1 == len(rendered.token_ids) or not rendered.assistant_mask[index + 1]
        ):
            assert rendered.token_ids[index] == eos


def test_templates_that_rewrite_earlier_turns_or_lack_the_end_token_are_refused(tokenizer):
    # Keeps only the last assistant message's content, like templates that strip old reasoning.
    rewriting = (
        "{% for message in messages %}{% if message['role'] == 'assistant' and not loop.last %}"
        "{{ '<|im_start|>assistant\\n<|im_end|>\\n' }}{% else %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="prefix-stable"):
        render_chat(CONVERSATION, tokenizer, chat_template=rewriting)
    no_end = (
        "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="end-of-turn token '<\\|im_end\\|>'"):
        render_chat(CONVERSATION, tokenizer, chat_template=no_end)
    with pytest.raises(ChatTemplateError, match="adds nothing for add_generation_prompt"):
        render_chat(CONVERSATION, tokenizer, chat_template=CHATML.split("{% if")[0])
    with pytest.raises(ChatTemplateError, match="role='robot'"):
        render_chat([{"role": "robot", "content": "hi"}], tokenizer)
    with pytest.raises(ChatTemplateError, match="chat template error: no tools"):
        render_chat(CONVERSATION, tokenizer, chat_template="{{ raise_exception('no tools') }}")


def test_byte_template_reproduces_the_trainer_conversation_layout():
    tokenizer = ByteTokenizer()
    conversation = Conversation.start(tokenizer, tool_names=["calc"], prompt="2+3=?\n")
    conversation.add_policy_text("calc(2+3)")
    conversation.add_environment("=5\n")
    conversation.add_policy_text("A:5")

    rendered = render_chat(
        [
            {"role": "user", "content": "2+3=?\n"},
            {"role": "assistant", "content": "calc(2+3)"},
            {"role": "tool", "content": "=5\n"},
            {"role": "assistant", "content": "A:5"},
        ],
        tokenizer,
        tools=[{"type": "function", "function": {"name": "calc"}}],
    )
    assert rendered.token_ids == conversation.token_ids
    assert rendered.assistant_mask == conversation.loss_mask
    assert rendered.token_ids[-1] == EOS_ID


# ChatML with transformers' {% generation %} markers around the model's part of each turn.
CHATML_WITH_GENERATION_MARKERS = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
)


def test_rendering_and_mask_agree_with_transformers_apply_chat_template(
    tokenizer, tokenizer_directory
):
    import transformers
    reference = transformers.PreTrainedTokenizerFast.from_pretrained(str(tokenizer_directory))
    ours = render_chat(CONVERSATION, tokenizer, chat_template=CHATML_WITH_GENERATION_MARKERS)
    theirs = reference.apply_chat_template(
        CONVERSATION,
        chat_template=CHATML_WITH_GENERATION_MARKERS,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    assert ours.token_ids == list(theirs["input_ids"])
    assert ours.assistant_mask == list(theirs["assistant_masks"])
    text = reference.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert render_chat(CONVERSATION, tokenizer, add_generation_prompt=True).token_ids == (
        tokenizer.encode(text)
    )


def test_generation_markers_that_leave_out_the_end_token_are_extended_to_it(tokenizer):
    content_only = CHATML_WITH_GENERATION_MARKERS.replace(
        "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}",
        "{% generation %}{{ message['content'] }}{% endgeneration %}{{ '<|im_end|>' }}",
    )
    assert content_only != CHATML_WITH_GENERATION_MARKERS
    marked = render_chat(CONVERSATION, tokenizer, chat_template=CHATML_WITH_GENERATION_MARKERS)
    assert render_chat(CONVERSATION, tokenizer, chat_template=content_only) == marked
