"""A method is one package: the tables, the settings, the app and the library find a new one by itself.

The test writes a toy method (an options table, a signal, a client step, a
rule, a strategy) as three files in a folder of its own, puts the folder on
``fedweigh.methods``' path in a fresh interpreter, and checks that every
table, the run config, the check before training, the run-config app's
strategy and the library offer it, with nothing else edited (the fourth file
a real method touches is ``pyproject.toml``, for its defaults in the app
config: :func:`test_every_package_table_is_in_the_app_config`).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib

import pytest
from conftest import REPO

from fedweigh.methods.catalog import OPTION_TABLES, SIGNALS, STEPS, method_packages
from fedweigh.methods.registry import METHODS, RULES, STRATEGY_CLASSES

pytestmark = pytest.mark.unit

TOY = {
    "protocol.py": """
        from pydantic import Field

        from fedweigh.options import OptionsTable
        from fedweigh.protocol import Signal, StepSpec, finite_non_negative


        class ToyOptions(OptionsTable):
            power: float = Field(1.0, ge=0.0)


        OPTIONS = {"toy": ToyOptions}
        SIGNALS = (Signal("toy-signal", "toy", finite_non_negative, "a toy signal"),)
        STEPS = (StepSpec("toy", ("toy-signal",), "toy", "after training: reports 1"),)
    """,
    "client.py": """
        from fedweigh.client.steps import ClientStep


        class ToyStep(ClientStep):
            name = "toy"

            def after_training(self, context):
                return {"toy-signal": 1.0}


        STEP_CLASSES = (ToyStep,)
        __all__ = ["ToyStep"]
    """,
    "server.py": """
        from fedweigh.methods.declaration import Declaration, Method, RuleSpec
        from fedweigh.rules.base import ComplementShareRule
        from fedweigh.strategies.library import MethodStrategy

        TOY_RULE = RuleSpec("toy", lambda settings: ComplementShareRule("toy-signal"), "toy", "a toy rule")
        TOY = Method("toy", TOY_RULE, meaning="a toy method")


        class Toy(MethodStrategy):
            method = TOY

            def __init__(self, *, power=1.0, **kwargs):
                super().__init__(options={"toy": {"power": power}}, **kwargs)


        DECLARATION = Declaration(methods=(TOY,), rules=(TOY_RULE,), strategies=(Toy,))
    """,
}

CHECKS = """
import sys

import fedweigh.methods

fedweigh.methods.__path__.append(sys.argv[1])

import pytest

from fedweigh.client import ToyStep
from fedweigh.client.registry import STEP_CLASSES
from fedweigh.methods.registry import METHODS, RULES, plan_run
from fedweigh.preflight import parse_settings
from fedweigh.settings import SettingsError, setting_names
from fedweigh.strategies import Toy
from fedweigh.strategies.build import build_strategy

settings = parse_settings({"strategy": "toy", "toy.power": 2.0})
assert settings.toy.power == 2.0 and "toy.power" in setting_names()
plan = plan_run(settings)
assert plan.rule.name == "toy" and plan.comma_list == ["toy"] and METHODS["toy"].meaning == "a toy method"
assert STEP_CLASSES["toy"] is ToyStep and "toy" in RULES
app = build_strategy(settings)
assert app.recipe["client-steps"] == ["toy"] and app.recipe["toy.power"] == 2.0 and app.rule.signals == ("toy-signal",)
assert Toy(power=3.0).recipe["toy.power"] == 3.0 and type(Toy()).__name__ == "Toy"
with pytest.raises(SettingsError, match="toy.power = -1.0"):
    Toy(power=-1.0)
with pytest.raises(SettingsError, match="toy.power = 'x'"):
    parse_settings({"strategy": "toy", "toy.power": "x"})
print("toy method found everywhere")
"""


def test_a_new_method_package_is_found_by_every_table_and_the_library(tmp_path):
    package = tmp_path / "toy"
    package.mkdir()
    for name, source in TOY.items():
        (package / name).write_text(textwrap.dedent(source).lstrip())
    script = tmp_path / "checks.py"
    script.write_text(CHECKS)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "toy method found everywhere" in done.stdout
    assert sorted(path.name for path in package.iterdir() if path.suffix == ".py") == sorted(TOY)  # three files


def test_every_method_package_declares_what_it_names():
    assert set(method_packages()) >= {"fedoui", "ufl", "fednolowe", "flood", "feddle", "fedbuff", "fedasync"}
    assert {"fedoui", "fednolowe", "ufl", "flood", "feddle", "fedbuff", "fedasync", "fedprox"} <= set(STRATEGY_CLASSES)
    for method in METHODS.values():  # a method's rule and steps are in the tables
        assert RULES[method.rule.name] is method.rule and set(method.steps) <= set(STEPS)
    for signal in SIGNALS.values():  # every signal but the training loss comes from a declared step
        assert signal.producer is None or signal.name in STEPS[signal.producer].produces
    for step in STEPS.values():  # a step's options table is declared
        assert step.options is None or step.options in OPTION_TABLES


def test_every_package_table_is_in_the_app_config():
    # Flower passes --run-config keys only when pyproject.toml has them: each table, key and default is there
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    for table, model in OPTION_TABLES.items():
        defaults = {name.replace("_", "-"): field.default for name, field in model.model_fields.items()}
        assert config.get(table) == defaults, table


BAD = {
    "a table named like a run setting": (
        {
            "protocol.py": """
                from fedweigh.options import OptionsTable


                class Clash(OptionsTable):
                    size: int = 1


                OPTIONS = {"model": Clash}
            """
        },
        "option tables ['model'] (fedweigh/methods/bad) are named like run settings",
    ),
    "a strategy named like another package's": (
        {
            "server.py": """
                from fedweigh.methods.declaration import Declaration, Method
                from fedweigh.methods.fedavg.server import SAMPLE_COUNT
                from fedweigh.strategies.library import MethodStrategy


                class UFL(MethodStrategy):
                    method = Method("ufl-again", SAMPLE_COUNT)


                DECLARATION = Declaration(methods=(UFL.method,), strategies=(UFL,))
            """
        },
        "the public name 'UFL' is declared by both fedweigh/methods/bad/server.py and fedweigh/methods/ufl/server.py",
    ),
    "a signal no step produces": (
        {
            "protocol.py": """
                from fedweigh.protocol import Signal, finite

                SIGNALS = (Signal("lonely", "nostep", finite, "a signal of no step"),)
            """
        },
        "signal 'lonely' (fedweigh/methods/bad) names the producer 'nostep', which is no client step producing it",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_packages_that_do_not_fit_are_refused_naming_the_package(tmp_path, case):
    files, message = BAD[case]
    package = tmp_path / "bad"
    package.mkdir()
    for name, source in files.items():
        (package / name).write_text(textwrap.dedent(source).lstrip())
    code = (
        "import sys, fedweigh.methods\nfedweigh.methods.__path__.append(sys.argv[1])\n"
        "import fedweigh.settings, fedweigh.methods.registry\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode != 0 and "DeclarationError" in done.stderr
    assert message in done.stderr, done.stderr[-2000:]
