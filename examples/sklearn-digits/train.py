"""A RandomForest on the digits set that ships with scikit-learn: prints the
test accuracy and saves the model under ./model (the run's artifact)."""

import pickle
import time
from pathlib import Path

from sklearn.datasets import load_digits
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import train_test_split

started = time.monotonic()
X, y = load_digits(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
model = RandomForestClassifier(n_estimators=200, random_state=0).fit(X_train, y_train)
print(f"accuracy {model.score(X_test, y_test):.3f} in {time.monotonic() - started:.1f} s", flush=True)

out = Path("model")
out.mkdir(exist_ok=True)
(out / "forest.pkl").write_bytes(pickle.dumps(model))
print(f"saved model/forest.pkl ({(out / 'forest.pkl').stat().st_size // 1024} KiB)")
