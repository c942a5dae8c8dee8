"""deploy/kubernetes/: the control plane's manifests are valid Kubernetes
objects (kubernetes-validate: the API's own OpenAPI schemas, strict, so a
misspelt field fails), they describe the topology docs/DEPLOY.md promises
(web ×2 with the health probes, worker ×2, exactly one beat, migrate once),
and their ConfigMap is a production configuration the server starts with.
``backend-rbac.yaml`` (what the kubernetes backend may do in a user's
cluster; not part of the control plane) is valid too and grants exactly what
the backend's connection check asks for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography.fernet import Fernet

from tests.support.stack import REPO_ROOT

MANIFESTS = REPO_ROOT / "deploy" / "kubernetes"
# Applied by a user in the cluster where training pods run, not with the control plane.
BACKEND_RBAC = "backend-rbac.yaml"
# The oldest Kubernetes release still supported upstream when these were written, and the newest.
VERSIONS = ("1.33.0", "1.37.0")


def documents(*, control_plane: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """The objects of the control plane's files (and of the backend's RBAC file unless ``control_plane``)."""
    return [
        (path.name, doc)
        for path in sorted(MANIFESTS.glob("*.yaml"))
        if path.name != "kustomization.yaml" and not (control_plane and path.name == BACKEND_RBAC)
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == kind}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_strictly_against_the_kubernetes_schemas(version: str) -> None:
    problems = []
    for name, doc in documents(control_plane=False):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{name}: {doc['kind']} {doc['metadata']['name']}: {e.message} at {list(e.path)}")
    assert not problems, "\n".join(problems)


def test_the_kustomization_names_every_file_and_the_image() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())

    files = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml", BACKEND_RBAC}
    assert set(kustomization["resources"]) == files
    images = {c["image"] for _, d in documents() if d["kind"] in ("Deployment", "Job") for c in pod(d)["containers"]}
    assert images == {"trainyard"} == {i["name"] for i in kustomization["images"]}


def pod(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]


def test_web_worker_and_beat_are_the_processes_the_deploy_guide_names() -> None:
    deployments = objects("Deployment")
    web, worker, beat = deployments["trainyard-web"], deployments["trainyard-worker"], deployments["trainyard-beat"]

    assert (web["spec"]["replicas"], worker["spec"]["replicas"], beat["spec"]["replicas"]) == (2, 2, 1)
    # Never two beats at once, not even during an update.
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert container(web)["command"][:2] == ["uvicorn", "backend.config.asgi:application"]
    assert container(worker)["command"][:4] == ["celery", "-A", "backend.config", "worker"]
    assert container(beat)["command"][:4] == ["celery", "-A", "backend.config", "beat"]
    assert pod(objects("Job")["trainyard-migrate"])["containers"][0]["command"] == [
        "python", "manage.py", "migrate", "--noinput",
    ]  # fmt: skip
    probes = container(web)
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for deployment in deployments.values():
        assert pod(deployment)["securityContext"]["runAsNonRoot"] is True
        assert container(deployment)["envFrom"] == [
            {"configMapRef": {"name": "trainyard"}},
            {"secretRef": {"name": "trainyard"}},
        ]


def test_web_and_workers_share_the_local_storage_volume() -> None:
    (claim,) = objects("PersistentVolumeClaim").values()
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    config = objects("ConfigMap")["trainyard"]["data"]
    for name in ("trainyard-web", "trainyard-worker"):
        deployment = objects("Deployment")[name]
        (volume,) = pod(deployment)["volumes"]
        assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        (mount,) = container(deployment)["volumeMounts"]
        assert config["TRAINYARD_STORAGE_DIR"].startswith(mount["mountPath"] + "/")


def test_the_ingress_sends_the_dashboard_and_the_apps_hosts_to_the_web_service() -> None:
    (ingress,) = objects("Ingress").values()
    config = objects("ConfigMap")["trainyard"]["data"]
    service = objects("Service")["trainyard-web"]

    dashboard = config["TRAINYARD_PUBLIC_URL"].removeprefix("https://")
    apps = config["TRAINYARD_APPS_URL"].removeprefix("https://").replace("{app}", "*")
    assert [r["host"] for r in ingress["spec"]["rules"]] == [dashboard, apps]
    assert {h for t in ingress["spec"]["tls"] for h in t["hosts"]} == {dashboard, apps}
    for rule in ingress["spec"]["rules"]:
        (route,) = rule["http"]["paths"]
        assert route["backend"]["service"]["name"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == objects("Deployment")["trainyard-web"]["spec"]["selector"]["matchLabels"]


def test_no_secret_value_is_in_the_manifests() -> None:
    assert not objects("Secret")
    config = objects("ConfigMap")["trainyard"]["data"]
    assert not {"DJANGO_SECRET_KEY", "TRAINYARD_SECRET_KEYS", "DATABASE_URL", "REDIS_URL"} & set(config)


def test_the_configmap_with_the_secrets_is_a_production_configuration_that_passes_check_deploy(
    tmp_path: Path,
) -> None:
    """The same keys the guide puts in the Secret, with stand-in values."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TRAINYARD_"))}
    env |= objects("ConfigMap")["trainyard"]["data"]
    env |= {
        "DJANGO_SECRET_KEY": "x7!kq" + "Zp3v9Lr2Tn8Wc4Hy6Jb1Md5Fg0Sa" * 2,
        "TRAINYARD_SECRET_KEYS": Fernet.generate_key().decode(),
        "TRAINYARD_STORAGE_DIR": str(tmp_path / "storage"),
        "DJANGO_SETTINGS_MODULE": "backend.config.settings",
    }
    checked = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_backend_rbac_grants_what_the_connection_check_asks_for_and_nothing_more() -> None:
    from backend.clouds.backends.kubernetes.checks import PERMISSIONS

    rbac = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((MANIFESTS / BACKEND_RBAC).read_text())}
    role, cluster_role = rbac[("Role", "trainyard-backend")], rbac[("ClusterRole", "trainyard-backend-nodes")]

    def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str]]:
        assert all(rule["apiGroups"] == [""] for rule in rules)
        return {(verb, resource) for rule in rules for resource in rule["resources"] for verb in rule["verbs"]}

    asked = {(v, f"{r}/{sub}" if sub else r, namespaced) for v, r, sub, namespaced in PERMISSIONS}
    assert granted(role["rules"]) == {(v, r) for v, r, namespaced in asked if namespaced}
    assert granted(cluster_role["rules"]) == {(v, r) for v, r, namespaced in asked if not namespaced}
    account = rbac[("ServiceAccount", "trainyard")]
    for binding, role_name in (("RoleBinding", "trainyard-backend"), ("ClusterRoleBinding", "trainyard-backend-nodes")):
        bound = rbac[(binding, role_name)]
        assert bound["roleRef"]["name"] == role_name
        assert bound["subjects"] == [
            {"kind": "ServiceAccount", "name": "trainyard", "namespace": account["metadata"]["namespace"]}
        ]
    assert BACKEND_RBAC not in yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
