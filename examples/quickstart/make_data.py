"""Makes a small, noisy, deterministic data set for a straight line: y = 2.5x - 0.7."""

import csv
import os
import pathlib
import random

samples = int(os.environ.get("SAMPLES", "500"))
rng = random.Random(42)
out = pathlib.Path("data")
out.mkdir(exist_ok=True)
with open(out / "points.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["x", "y"])
    for _ in range(samples):
        x = rng.uniform(-3, 3)
        writer.writerow([f"{x:.5f}", f"{2.5 * x - 0.7 + rng.gauss(0, 0.3):.5f}"])
print(f"wrote {samples} points to {out / 'points.csv'}")
