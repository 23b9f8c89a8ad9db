"""Where a service's error shows on a dashboard form (common/form_errors.py), the one rule of every form."""

from common.domain_errors import InvalidInput
from common.form_errors import error_placements

INPUTS = {"config.rl_steps": "rl_steps", "config.model": "model", "config.stop_strings": "stop_strings",
          "settings": "settings", "name": "name"}


def test_a_message_shows_plain_at_the_input_of_exactly_its_path():
    error = InvalidInput("bad", fields={"config.rl_steps": ["Too many."], "name": ["Taken."]})

    assert error_placements(error, inputs=INPUTS) == [("rl_steps", "Too many."), ("name", "Taken.")]


def test_a_path_inside_an_inputs_value_shows_there_naming_the_path():
    error = InvalidInput("bad", fields={"settings.url": ["Refused."], "config.stop_strings.0": ["Empty."],
                                        "config.model": ["num_heads must divide d_model."]})

    assert error_placements(error, inputs=INPUTS) == [
        ("settings", "settings.url: Refused."), ("stop_strings", "config.stop_strings.0: Empty."),
        ("model", "num_heads must divide d_model.")]


def test_what_no_input_shows_goes_above_the_form():
    error = InvalidInput("bad", fields={"config.lora.rank": ["Too big."], "non_field_errors": ["Whole."]})

    assert error_placements(error, inputs=INPUTS) == [(None, "config.lora.rank: Too big."), (None, "Whole.")]
    assert error_placements(InvalidInput("Nothing fits."), inputs=INPUTS) == [(None, "Nothing fits.")]


def test_several_errors_show_at_once_each_at_the_deepest_input_that_holds_its_path():
    # The new-run form's inputs: a leaf, a row's cell, a list, and a section's rule.
    inputs = {"config.rl_steps": "rl_steps", "config.sft.datasets": "sft.datasets",
              "config.sft.datasets.1.weight": "sft.datasets.1.weight", "config.evaluation.pass_k": "evaluation.pass_k",
              "config.sft": "sft"}
    error = InvalidInput("bad", fields={
        "config.rl_steps": ["Too many."], "config.sft.datasets.1.weight": ["Must be > 0."],
        "config.sft.datasets.0": ["Unknown key."], "config.evaluation.pass_k.1": ["Too large."],
        "config.sft": ["Listed twice."]})

    assert error_placements(error, inputs=inputs) == [
        ("rl_steps", "Too many."), ("sft.datasets.1.weight", "Must be > 0."),
        ("sft.datasets", "config.sft.datasets.0: Unknown key."),
        ("evaluation.pass_k", "config.evaluation.pass_k.1: Too large."), ("sft", "Listed twice.")]
