"""A small CNN on CIFAR-10: on the GPU when there is one, else on the CPU.

- Data: the workflow's input ``cifar-10-binary.tar.gz``, read straight from
  the archive (CIFAR-10's binary form: a label byte and 3,072 pixel bytes
  a record; nothing is unpickled).
- Resumable: after every epoch the whole training state goes to
  ``checkpoint/state.pt``, written to a temporary file and renamed over the
  old one, so a sync never sees half a file. The runner syncs
  ``./checkpoint`` and restores it on the next attempt with
  ``TRAINYARD_RESUMED=1``; the script then goes on from the epoch it reached.
- Metrics: JSON lines appended to ``$TRAINYARD_METRICS_FILE``.
- Output: ``model/cifar-cnn.pt``, the trained weights (the run's artifact).

Settings from the environment: EPOCHS (10), BATCH_SIZE (256), LR (0.1).
"""

from __future__ import annotations

import json
import os
import tarfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ARCHIVE = Path("cifar-10-binary.tar.gz")
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CHECKPOINT = Path("checkpoint") / "state.pt"
MODEL = Path("model") / "cifar-cnn.pt"
EPOCHS = int(os.environ.get("EPOCHS", "10"))
BATCH_SIZE = int(os.environ.get("BATCH_SIZE", "256"))
LR = float(os.environ.get("LR", "0.1"))
RECORD_BYTES = 1 + 3 * 32 * 32
MEAN = (125.3, 123.0, 113.9)  # per channel, on the 0 to 255 scale
STD = (63.0, 62.1, 66.7)

Images = tuple[torch.Tensor, torch.Tensor]  # uint8 N x 3 x 32 x 32, int64 labels


def read_cifar(archive: Path) -> tuple[Images, Images]:
    """The training set (50,000 images) and the test set (10,000)."""
    if not archive.exists():
        raise SystemExit(f"{archive} is missing: the workflow's input downloads it; elsewhere: curl -O {URL}")
    files: dict[str, bytes] = {}
    with tarfile.open(archive) as tar:
        for member in tar:  # in the order of the stream: nothing is decompressed twice
            name = Path(member.name).name
            wanted = member.isfile() and name.startswith(("data_batch_", "test_batch")) and name.endswith(".bin")
            extracted = tar.extractfile(member) if wanted else None
            if extracted is not None:
                files[name] = extracted.read()

    def records(names: list[str]) -> Images:
        data = torch.frombuffer(bytearray(b"".join(files[n] for n in names)), dtype=torch.uint8)
        rows = data.view(-1, RECORD_BYTES)
        return rows[:, 1:].reshape(-1, 3, 32, 32).contiguous(), rows[:, 0].long()

    return records([f"data_batch_{i}.bin" for i in range(1, 6)]), records(["test_batch.bin"])


def block(channels_in: int, channels_out: int, *, pool: bool) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
    ]
    return nn.Sequential(*layers, nn.MaxPool2d(2)) if pool else nn.Sequential(*layers)


class Net(nn.Module):
    """Four 3x3 convolutions (32 to 256 channels, 32 to 4 pixels) and a linear
    head: about 0.4 M parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            block(3, 32, pool=False),
            block(32, 64, pool=True),
            block(64, 128, pool=True),
            block(128, 256, pool=True),
        )
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_max_pool2d(self.features(x), 1).flatten(1))


def augment(x: torch.Tensor) -> torch.Tensor:
    """A random horizontal flip per image and one random 32x32 crop of the
    batch padded by 4 pixels, on the batch's own device."""
    flip = torch.rand(x.size(0), device=x.device) < 0.5
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    i, j = torch.randint(0, 9, (2,)).tolist()
    return F.pad(x, (4, 4, 4, 4), mode="reflect")[:, :, i : i + 32, j : j + 32]


def report(**values: float) -> None:
    """One line of training metrics, as docs/METRICS.md says: a JSON object
    appended to $TRAINYARD_METRICS_FILE (absent outside Trainyard)."""
    path = os.environ.get("TRAINYARD_METRICS_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(values) + "\n")


def save_atomically(state: dict[str, object], path: Path) -> None:
    """Write ``state`` to a temporary file, flush it to disk, then rename it
    over ``path``: a reader (the runner's sync) sees the old file or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    where = torch.cuda.get_device_name(0) if on_gpu else f"the CPU, {torch.get_num_threads()} threads"
    print(f"training on {where}, torch {torch.__version__}", flush=True)

    (train_x, train_y), (test_x, test_y) = read_cifar(ARCHIVE)
    train_x, train_y, test_x, test_y = (t.to(device) for t in (train_x, train_y, test_x, test_y))
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    torch.manual_seed(0)
    model = Net().to(device)
    steps_per_epoch = len(train_x) // BATCH_SIZE
    total_steps = EPOCHS * steps_per_epoch
    warmup = max(1, total_steps // 5)

    def schedule(step: int) -> float:
        """LR's factor: up linearly over the first fifth of the steps, then
        down linearly to 0 at the last (a resume with more EPOCHS stretches it)."""
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    scaler = torch.amp.GradScaler(device.type, enabled=on_gpu)

    first_epoch = 0
    if os.environ.get("TRAINYARD_RESUMED") == "1" and CHECKPOINT.exists():
        state = torch.load(CHECKPOINT, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        first_epoch = state["epoch"]
        print(f"resuming from epoch {first_epoch} (attempt {os.environ.get('TRAINYARD_ATTEMPT', '?')})", flush=True)

    def normalised(images: torch.Tensor) -> torch.Tensor:
        return (images.float() - mean) / std

    @torch.no_grad()
    def test_accuracy() -> float:
        model.eval()
        correct = 0
        for i in range(0, len(test_x), 1000):
            with torch.autocast(device.type, dtype=torch.float16, enabled=on_gpu):
                logits = model(normalised(test_x[i : i + 1000]))
            correct += int((logits.argmax(1) == test_y[i : i + 1000]).sum())
        return correct / len(test_x)

    for epoch in range(first_epoch, EPOCHS):
        began = time.monotonic()
        torch.manual_seed(epoch)  # the same batches after a resume
        model.train()
        order = torch.randperm(len(train_x), device=device)
        running = torch.zeros((), device=device)
        for i in range(steps_per_epoch):
            batch = order[i * BATCH_SIZE : (i + 1) * BATCH_SIZE]
            with torch.autocast(device.type, dtype=torch.float16, enabled=on_gpu):
                loss = F.cross_entropy(model(augment(normalised(train_x[batch]))), train_y[batch], label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            running += loss.detach()
            step = epoch * steps_per_epoch + i + 1
            if step % 50 == 0:
                report(step=step, train_loss=float(running) / (i + 1), lr=scheduler.get_last_lr()[0])
        accuracy = test_accuracy()
        state = {
            "epoch": epoch + 1,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
        }
        save_atomically(state, CHECKPOINT)
        report(step=(epoch + 1) * steps_per_epoch, test_accuracy=accuracy)
        seconds = time.monotonic() - began
        average = float(running) / steps_per_epoch
        line = f"epoch {epoch + 1:3d}/{EPOCHS}  loss {average:.4f}  accuracy {accuracy:.4f}  ({seconds:.1f} s)"
        print(line, flush=True)

    MODEL.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), MODEL)
    print(f"saved {MODEL} (test accuracy {test_accuracy():.4f})", flush=True)


if __name__ == "__main__":
    main()
