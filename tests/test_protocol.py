"""The message format: written once, read back the same, consistent with the code that fills it."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord

from fedweigh.client.registry import STEP_CLASSES
from fedweigh.methods.catalog import SIGNALS, STEPS, producers
from fedweigh.methods.ufl.protocol import UFLSettings
from fedweigh.protocol import TrainRecipe, table_entries, table_from_config
from fedweigh.settings import Settings, validate


def test_the_recipe_survives_a_config_record():
    recipe = TrainRecipe(local_epochs=3, optimizer="adam", learning_rate=1e-3, proximal_mu=0.1)
    record = ConfigRecord(recipe.to_config())  # what travels
    assert TrainRecipe.from_config(dict(record)) == recipe


def test_a_config_without_the_recipe_names_what_is_missing():
    with pytest.raises(ValueError, match=r"lacks \['optimizer'.*'proximal-mu'"):
        TrainRecipe.from_config({"local-epochs": 1, "batch-size": 8, "learning-rate": 0.1, "momentum": 0.9})


def test_every_recipe_field_is_a_setting_of_the_same_name():
    settings = validate({"local-epochs": 4, "optimizer": "adam", "adam-beta2": 0.99})
    recipe = TrainRecipe.from_settings(settings, proximal_mu=0.0)
    assert (recipe.local_epochs, recipe.optimizer, recipe.adam_beta2) == (4, "adam", 0.99)
    for name in TrainRecipe.__dataclass_fields__:
        assert name in Settings.model_fields or name == "proximal_mu", name


def test_step_options_travel_under_their_run_config_keys():
    options = UFLSettings(mc_passes=4, normalize=True)
    entries = table_entries("ufl", options)
    assert entries["ufl.mc-passes"] == 4 and entries["ufl.normalize"] is True
    assert table_from_config("ufl", UFLSettings, {**entries, "other.key": 1}) == options
    # and under the same keys as in the run config
    assert validate(entries).ufl == options


def test_signals_steps_and_their_code_agree():
    for step, spec in STEPS.items():
        assert STEP_CLASSES[step].name == step
        for signal in spec.produces:
            assert SIGNALS[signal].producer == step
        if spec.options is not None:
            assert spec.options in Settings.model_fields
    for name, signal in SIGNALS.items():
        assert signal.producer is None or name in STEPS[signal.producer].produces
    assert producers(["oui", "train_loss", "oui"]) == ["oui"]


def test_the_recipe_s_defaults_are_the_settings_defaults():
    assert TrainRecipe() == TrainRecipe.from_settings(validate({}), proximal_mu=0.0)
