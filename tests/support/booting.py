"""A fake backend whose machines boot from an image (``boots_from_image``):
it keeps the user data each launch was given, so tests can read and run it."""

from __future__ import annotations

from pathlib import Path

from backend.clouds.backends.base import Handle, LaunchSpec, Offer
from backend.clouds.backends.fake.compute import FakeCompute

KIND = "booting"
IMPORT = "tests.support.booting:BootingCompute"


class BootingCompute(FakeCompute):
    kind = KIND
    boots_from_image = True

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        handle = super().launch(offer, spec)
        path = Path(str(self.account.config["state_dir"])) / f"user-data-{spec.idempotency_key}.sh"
        path.write_text(spec.user_data)
        return handle


def user_data_of(state_dir: Path, key: str) -> str:
    return (state_dir / f"user-data-{key}.sh").read_text()
