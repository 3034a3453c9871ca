"""The one-step Jacobi infiller of docs/writing_an_infiller.md works, and the page shows it verbatim."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

import refusion
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError
from refusion.testing import check_part

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "jacobi_infiller.py"


@pytest.fixture(scope="module")
def jacobi():
    spec = importlib.util.spec_from_file_location("jacobi_infiller", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_walkthrough_shows_the_example_file_verbatim():
    page = (ROOT / "docs" / "writing_an_infiller.md").read_text()
    assert EXAMPLE.read_text() in page
    for words in ("row `i`", "predicts", "EOS", "`chain`", "refusion.validators", "InfillContext", "Plan"):
        assert words in page


def test_the_example_passes_the_conformance_checks(jacobi):
    check_part(jacobi.OneStepJacobi(), trials=2)
    check_part(jacobi.OneStepJacobi(keep_above=0.5), trials=2)


def test_the_example_answers_the_shipped_models_task(jacobi):
    model = refusion.load_model()
    decoder = Decoder.from_names(infiller=jacobi.OneStepJacobi(), slot_size=4, serial_num_blocks=1)
    ids = model.tokenizer("rev hello=", add_special_tokens=False)["input_ids"]
    assert decoder.decode(model, ids, 32, tokenizer=model.tokenizer).text == "olleh"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.1, "high"])
def test_the_examples_parameter_is_validated(jacobi, bad):
    with pytest.raises(ConfigError, match="`keep_above` must be a number in \\[0, 1\\]"):
        jacobi.OneStepJacobi(keep_above=bad)
