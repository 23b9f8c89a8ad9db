"""Where a service's error shows on a dashboard form (config/form_errors.py), the one rule of every form."""

from config.form_errors import error_placements
from domain_errors import InvalidInput

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
