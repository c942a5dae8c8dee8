"""The options several commands take mean the same on each
(trainyard/commands/options.py): ``--region`` and ``--backend`` on ``run``,
``env build`` and ``offers``; and ``env build`` submits through the same
sequence as ``run``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.cli.fakes import WS, FakeRest, invoke, make_run, use

ENV_WORKFLOWS = """\
workflows:
  - name: envmodel
    provider: bash
    environment:
      python: "3.11"
      requirements: requirements.txt
    commands: [python train.py]
  - name: broken
    provider: bash
"""

NO_OFFERS = {"offers": [], "shortfall": "", "accounts": 1}


@pytest.fixture
def envmodel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repo (not git) with a workflow that has an environment, and a broken one, as the cwd."""
    root = tmp_path / "envmodel"
    (root / ".trainyard").mkdir(parents=True)
    (root / ".trainyard" / "workflows.yaml").write_text(ENV_WORKFLOWS)
    (root / "requirements.txt").write_text("tinypkg==1.0\n")
    (root / "train.py").write_text("print('train')\n")
    monkeypatch.chdir(root)
    return root


def test_offers_takes_region_and_backend_repeated_or_comma_separated(monkeypatch: pytest.MonkeyPatch):
    rest = FakeRest({("GET", f"{WS}/offers/"): httpx.Response(200, json=NO_OFFERS)})
    use(monkeypatch, "http://fake", rest)
    code, out, err = invoke(
        "offers", "--region", "us-east-1", "--region", "eu-west-1,us-east-1", "--backend", "aws", "--backend", "local"
    )
    assert (code, out, err) == (0, "", "No offer fits (from 1 backend(s))\n")
    [request] = rest.requests
    assert (request.url.params["region"], request.url.params["backend"]) == ("us-east-1,eu-west-1", "aws,local")


@pytest.mark.parametrize("command", [["offers"], ["env", "build", "envmodel"], ["run", "envmodel"]])
def test_an_unknown_backend_is_refused_alike_before_anything_is_sent(
    command: list[str], envmodel: Path, monkeypatch: pytest.MonkeyPatch
):
    rest = FakeRest({})
    use(monkeypatch, "http://fake", rest)
    code, _, err = invoke(*command, "--backend", "aws,asw")
    assert code == 2
    assert (
        "Invalid value for --backend: unknown backend 'asw'; known backends: aws, kubernetes, local, fake, self-hosted"
        in err
    )
    assert rest.requests == []


def test_env_build_submits_as_run_does_with_the_same_placement_options(envmodel: Path, monkeypatch: pytest.MonkeyPatch):
    offer = {"offers": 2, "backend": "fake", "instance_type": "fake-small", "region": "r1", "spot": False}
    created = {**make_run("pending"), "plan": [{"job": "envmodel", "offer": {**offer, "price_per_hour": 0.01}}]}
    rest = FakeRest(
        {
            ("POST", f"{WS}/blobs/"): httpx.Response(201, json={"id": "blob-1", "size": 10, "sha256": "x"}),
            ("POST", f"{WS}/runs/"): httpx.Response(201, json=created),
        }
    )
    use(monkeypatch, "http://fake", rest)
    code, out, err = invoke(
        "env", "build", "envmodel", "-d", "--region", "r1,r2", "--region", "r1", "--backend", "fake"
    )
    assert (code, out) == (0, "brave-otter-1\n")
    assert err.startswith("warning: workflow 'broken' cannot be run:\n")  # as `run` warns
    assert err.endswith(
        "Run brave-otter-1 builds the environment of envmodel\n"
        "View: http://fake/w/ws1/runs/brave-otter-1\n"
        "JOB       BACKEND  REGION  INSTANCE    GPU  SPOT  PRICE      MAX COST  OFFERS\n"
        "envmodel  fake     r1      fake-small  -    no    $0.0100/h  -         2\n"
    )
    body = json.loads(rest.requests[1].content)
    assert (body["workflow"], body["environment_build"]) == ("envmodel", True)
    assert body["placement"] == {"backends": ["fake"], "regions": ["r1", "r2"]}
    assert list(body["environment_files"]) == ["requirements.txt"]
