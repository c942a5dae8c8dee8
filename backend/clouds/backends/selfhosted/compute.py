"""``SelfHostedCompute``: machines the user registered, not machines we start.

- ``offers``: none. A registered machine takes jobs through the scheduler's
  idle-instance match (its runner reports its resources in ``Hello``), never
  through an offer.
- ``launch``: ``InvalidConfig``: such a machine is registered, not launched.
  The services never ask (a self-hosted row is written by the registration,
  not by ``instance_request``).
- ``describe``: ``RUNNING`` for every handle. The server cannot look at the
  user's machine from outside, so a silent runner is presumed to be on a
  machine that is still there: it keeps its job for the unreachable grace,
  then its attempt is fenced (never "gone" at once because of a blip).
- ``terminate``: nothing to do: Trainyard never powers off a user's machine.
  Stopping trust in a runner is the server's business (revocation, fencing).
- ``list_managed``: empty: nothing here was launched by this installation,
  so the leak sweep never touches a self-hosted machine.

No config keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

from backend.clouds.backends.base import (
    CloudState,
    Compute,
    Handle,
    LaunchSpec,
    Offer,
    Requirements,
    Timings,
)
from backend.clouds.backends.errors import InvalidConfig


class SelfHostedCompute(Compute):
    kind: ClassVar[str] = "self-hosted"
    reusable_instances: ClassVar[bool] = True
    supports_spot: ClassVar[bool] = False
    # provision_timeout is never read for this kind: a registered machine
    # waits for its runner as long as it takes (the reconciler skips it).
    timings: ClassVar[Timings] = Timings(provision_timeout=0.0)
    # A folder of the machine a volume was created for (`--machine`), made by its runner.
    volume_kind: ClassVar[str] = "directory"

    def offers(self, req: Requirements) -> Iterable[Offer]:
        return ()

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        raise InvalidConfig(
            "self-hosted machines are registered, not launched: run `trainyard-runner register` on the machine",
            code="SelfHostedNotLaunchable",
        )

    def describe(self, handles: Sequence[Handle]) -> Mapping[str, CloudState]:
        return {handle.key: CloudState.RUNNING for handle in handles}

    def terminate(self, handle: Handle) -> None:
        return None

    def list_managed(self) -> Sequence[Handle]:
        return ()
