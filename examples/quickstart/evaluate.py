"""Scores the tagged model's weights against the true line."""

import json
import pathlib

w = json.loads(pathlib.Path("model/weights.json").read_text())
error = abs(w["a"] - 2.5) + abs(w["b"] + 0.7)
print(f"a={w['a']:.3f} b={w['b']:.3f} error={error:.4f}")
