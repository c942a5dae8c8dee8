"""Fits y = a*x + b by gradient descent on every ./data/*.csv (the input
from S3, read-only); writes ./model/weights.json.

Resumable: ./model/state.json is written after every epoch, and a restarted
job continues from it.
"""

import csv
import json
import os
import pathlib

epochs = int(os.environ.get("EPOCHS", "40"))
files = sorted(pathlib.Path("data").rglob("*.csv"))
points = [(float(r["x"]), float(r["y"])) for f in files for r in csv.DictReader(f.open())]
print(f"{len(points)} points from {len(files)} files")
model = pathlib.Path("model")
model.mkdir(exist_ok=True)
state_file = model / "state.json"
state = json.loads(state_file.read_text()) if state_file.exists() else {"epoch": 0, "a": 0.0, "b": 0.0}
if state["epoch"]:
    print(f"resuming at epoch {state['epoch']}")

while state["epoch"] < epochs:
    ga = sum(2 * (state["a"] * x + state["b"] - y) * x for x, y in points) / len(points)
    gb = sum(2 * (state["a"] * x + state["b"] - y) for x, y in points) / len(points)
    state["a"] -= 0.05 * ga
    state["b"] -= 0.05 * gb
    state["epoch"] += 1
    loss = sum((state["a"] * x + state["b"] - y) ** 2 for x, y in points) / len(points)
    print(f"epoch {state['epoch']:3d}/{epochs}  loss {loss:.5f}", flush=True)
    state_file.write_text(json.dumps(state))

(model / "weights.json").write_text(json.dumps({"a": state["a"], "b": state["b"]}, indent=2))
print(f"done: a={state['a']:.3f} b={state['b']:.3f}")
