"""Confidence as a calibrated probability: a logistic model of the ranking's margins.

``confidence = 1 / (1 + exp(-(bias + Σ coefficient·feature)))``, the features being those of
:func:`.ranking._features` (how far the chosen set stands above the rest, how much of the task
it explains, how much of the task the catalog knows). The coefficients are fitted by
``make eval-discovery`` on the *tuning* half of the evaluation set to the event "the
recommended set is exactly the expected one", and written to ``calibration.json`` beside this
module; the held-out half reports how well calibrated they are (docs/DISCOVERY.md).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Calibration:
    bias: float
    coefficients: tuple[float, ...]

    def confidence(self, features: tuple[float, ...]) -> float:
        z = self.bias + sum(c * f for c, f in zip(self.coefficients, features, strict=False))
        z = max(-30.0, min(30.0, z))
        return round(1.0 / (1.0 + math.exp(-z)), 3)


# Until a fitted file exists: a neutral model that only rewards a clear margin.
UNFITTED = Calibration(bias=-4.0, coefficients=(0.5, 4.0, 0.0, 1.0, 0.0, 0.0))


@functools.cache
def default_calibration() -> Calibration:
    try:
        data = json.loads(resources.files(__package__).joinpath("calibration.json").read_text())
        return Calibration(float(data["bias"]), tuple(float(c) for c in data["coefficients"]))
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return UNFITTED
