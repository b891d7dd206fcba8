"""deploy/k8s and deploy/grafana, offline: no cluster is needed or used.

What is checked, and how:

- every overlay renders with ``kubectl kustomize`` (the real binary; skipped, saying so,
  where it is missing);
- every core manifest (Job, PersistentVolumeClaim) validates in strict mode (unknown
  fields are errors) against the Kubernetes schema that ``kubernetes-validate`` ships for
  a pinned version: 1.31 for the base (native sidecars 1.29+, podFailurePolicy GA 1.31),
  1.34 for the in-place restart overlay (container restart rules), which 1.33 rejects;
- custom resources (PodMonitor, PrometheusRule, PyTorchJob, JobSet) validate against the
  openAPIV3Schema of their upstream CRDs, vendored in ``tests/deploy/crds/`` with the
  repository, commit and path they came from; unknown fields are errors there too (what
  ``kubectl apply``'s default strict field validation does); the Job inside a JobSet is
  also checked against the Kubernetes Job schema;
- yamllint is clean (``deploy/k8s/.yamllint.yaml``);
- what a schema cannot check: the sidecar is an init container with restartPolicy Always,
  the process namespace is shared, the paths the sidecar's args name lie on volumes the
  trainer mounts at the same place, the probes' port is the ``--http`` port, every
  exit-code rule names the trainer, the verdict codes map as the README says;
- every query of the Grafana dashboard and the PrometheusRule names a series that a real
  sentinel ``/metrics`` exports (a Metrics object served by the real HealthServer);
- a simulated pod: the rendered Job's trainer command line and sidecar args, run as two
  processes with the volumes mapped to temp dirs, roll back a NaN, exit 91, and resume
  from the clean checkpoint when run again.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sentinel.config import load_settings
from sentinel.service.http import HealthServer
from sentinel.service.metrics import GRAD_NORM, LOSS, TOKENS_PER_SEC, Metrics
from tests.deploy import pod_security
from tests.deploy.standin import TRAIN_PY
from tests.helpers.env import clean_env

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DASHBOARD = ROOT / "deploy" / "grafana" / "sentinel-dashboard.json"
CRDS = Path(__file__).resolve().parent / "crds"

#: The version the base and most overlays are validated against, and the one the
#: in-place restart overlay needs (restartPolicyRules: alpha in 1.34, beta in 1.35).
K8S_VERSION = "1.31.0"
IN_PLACE_VERSION = "1.34.0"
OVERLAYS = {
    "overlays/sidecar": K8S_VERSION,
    "overlays/in-place-restart": IN_PLACE_VERSION,
    "overlays/wrapper": K8S_VERSION,
    "overlays/stacks": K8S_VERSION,
    "examples": K8S_VERSION,
}
CORE_KINDS = {"Job", "PersistentVolumeClaim"}
CRD_FILES = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-monitoring.coreos.com-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring.coreos.com-v1.json",
    ("kubeflow.org/v1", "PyTorchJob"): "pytorchjob-kubeflow.org-v1.json",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset-jobset.x-k8s.io-v1alpha2.json",
}
VERDICTS = {"give_up": 90, "rolled_back": 91, "node_fault": 92}
#: Series the rules read that sentinel does not export: Prometheus' own and
#: kube-state-metrics'.
FOREIGN_SERIES = {"up", "kube_pod_container_status_running"}


# -- rendering -----------------------------------------------------------------------------


@cache
def _render(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed here: the kustomizations were not rendered")
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / overlay)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def _one(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    [doc] = [doc for doc in docs if doc["kind"] == kind]
    return doc


def _pod_specs() -> dict[str, tuple[dict[str, Any], dict[str, Any] | None]]:
    """Every pod template that carries a watched trainer, with the Job spec around it."""
    specs: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
    for overlay in ("overlays/sidecar", "overlays/in-place-restart"):
        job = _one(_render(overlay), "Job")["spec"]
        specs[overlay] = (job["template"]["spec"], job)
    examples = _render("examples")
    child = _one(examples, "JobSet")["spec"]["replicatedJobs"][0]["template"]["spec"]
    specs["examples/jobset"] = (child["template"]["spec"], child)
    master = _one(examples, "PyTorchJob")["spec"]["pytorchReplicaSpecs"]["Master"]
    specs["examples/pytorchjob"] = (master["template"]["spec"], None)
    return specs


def _trainer(pod: dict[str, Any]) -> dict[str, Any]:
    [trainer] = pod["containers"]
    return dict(trainer)


def _sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    [sidecar] = [c for c in pod.get("initContainers", []) if c["name"] == "sentinel"]
    return dict(sidecar)


def _options(args: list[str]) -> dict[str, str]:
    """``--name=value`` arguments (the manifests' style) as a dict."""
    return dict(arg[2:].split("=", 1) for arg in args if arg.startswith("--") and "=" in arg)


def _script(container: dict[str, Any]) -> str:
    assert container["command"] == ["bash", "-c"]
    [script] = container["args"]
    return str(script)


def _mount_of(container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume mount ``path`` lies on (the longest mount path that holds it)."""
    holding = [
        m for m in container.get("volumeMounts", [])
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]  # fmt: skip
    assert holding, f"{container['name']} mounts nothing at {path}"
    return dict(max(holding, key=lambda m: len(m["mountPath"])))


def _run_as(pod: dict[str, Any], container: dict[str, Any]) -> int | None:
    own = container.get("securityContext", {}).get("runAsUser")
    user = own if own is not None else pod.get("securityContext", {}).get("runAsUser")
    return None if user is None else int(user)


# -- rendering and schemas ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_kustomize_renders_every_overlay(overlay: str) -> None:
    kinds = sorted(doc["kind"] for doc in _render(overlay))
    expected = {
        "overlays/sidecar": ["Job", "PersistentVolumeClaim", "PodMonitor", "PrometheusRule"],
        "overlays/in-place-restart": ["Job", "PersistentVolumeClaim", "PodMonitor",
                                      "PrometheusRule"],
        "overlays/wrapper": ["Job", "PersistentVolumeClaim", "PodMonitor", "PrometheusRule"],
        "overlays/stacks": ["Job", "PersistentVolumeClaim", "PodMonitor", "PrometheusRule"],
        "examples": ["JobSet", "PyTorchJob"],
    }  # fmt: skip
    assert kinds == expected[overlay]


@pytest.mark.slow
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_core_manifests_validate_against_the_pinned_kubernetes_schema(overlay: str) -> None:
    checked = 0
    for doc in _render(overlay):
        if doc["kind"] in CORE_KINDS:
            kubernetes_validate.validate(doc, OVERLAYS[overlay], strict=True)
            checked += 1
    if overlay == "examples":  # the Job a JobSet makes of each replicated job
        for replicated in _one(_render(overlay), "JobSet")["spec"]["replicatedJobs"]:
            job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "child"}}
            kubernetes_validate.validate(
                {**job, **replicated["template"]}, K8S_VERSION, strict=True
            )
            checked += 1
    assert checked >= 1


def test_in_place_restart_needs_kubernetes_1_34() -> None:
    """The version marked in the overlay is real: 1.33's schema has no restart rules."""
    job = _one(_render("overlays/in-place-restart"), "Job")
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicyRules"):
        kubernetes_validate.validate(job, "1.33.0", strict=True)


def test_a_typo_fails_kubernetes_validation() -> None:
    job = copy.deepcopy(_one(_render("overlays/sidecar"), "Job"))
    job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["container"] = "trainer"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def _strict(schema: Any) -> Any:
    """The schema with unknown fields made errors where the CRD does not keep them."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    vendored = json.loads((CRDS / CRD_FILES[api_version, kind]).read_text())
    assert vendored["source"]["commit"], "each vendored schema names the commit it came from"
    schema = _strict(vendored["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_custom_resources_validate_against_their_vendored_crds(overlay: str) -> None:
    custom = [doc for doc in _render(overlay) if doc["kind"] not in CORE_KINDS]
    assert custom
    for doc in custom:
        errors = list(_crd_validator(doc["apiVersion"], doc["kind"]).iter_errors(doc))
        assert not errors, [f"{doc['kind']}: {e.json_path}: {e.message}" for e in errors]


def test_an_unknown_field_fails_crd_validation() -> None:
    rule = copy.deepcopy(_one(_render("overlays/sidecar"), "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["expression"] = "up == 0"
    validator = _crd_validator(rule["apiVersion"], rule["kind"])
    assert any("expression" in e.message for e in validator.iter_errors(rule))


@pytest.mark.slow
def test_yamllint_is_clean() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "yamllint", "-s", "-c", str(K8S / ".yamllint.yaml"), str(K8S)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


# -- what a schema cannot say ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["overlays/sidecar", "overlays/in-place-restart",
                                   "examples/jobset", "examples/pytorchjob"])  # fmt: skip
def test_the_sidecar_watches_the_trainer_it_shares_a_pod_with(where: str) -> None:
    pod, _job = _pod_specs()[where]
    sidecar, trainer = _sidecar(pod), _trainer(pod)
    assert pod["shareProcessNamespace"] is True
    assert sidecar["restartPolicy"] == "Always", "a native sidecar"
    # The trainer's lines reach the log at once, not in 8 KiB blocks.
    assert {"name": "PYTHONUNBUFFERED", "value": "1"} in trainer.get("env", [])
    assert "sentinel" not in [c["name"] for c in pod["containers"]]
    assert sidecar["args"][0] == "watch"
    options = _options(sidecar["args"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    script = _script(trainer)
    # Pidfile and log on an emptyDir, checkpoints and state on the claim, each mounted
    # by the trainer at the very path the sidecar's args name.
    for option, kind in (("pidfile", "emptyDir"), ("log", "emptyDir"),
                         ("checkpoints", "persistentVolumeClaim"),
                         ("state-dir", "persistentVolumeClaim")):  # fmt: skip
        path = options[option].replace("$(POD_NAME)", "$POD_NAME")
        mine, theirs = _mount_of(sidecar, path), _mount_of(trainer, path)
        assert (mine["name"], mine["mountPath"]) == (theirs["name"], theirs["mountPath"])
        assert kind in volumes[mine["name"]], (option, volumes[mine["name"]])
        assert not theirs.get("readOnly"), f"the trainer writes {option}"
        if option != "state-dir":
            assert path in script, f"the trainer's command does not use {path}"
    assert not _mount_of(sidecar, options["checkpoints"]).get("readOnly"), "rollback moves files"
    state_dir = options["state-dir"].replace("$(POD_NAME)", "$POD_NAME")
    assert re.search(
        r"sentinel verdict --state-dir \"?" + re.escape(state_dir) + r"\"? --wait --timeout 120"
        r" --job-status \"\$status\"",
        script,
    ), "the trainer exits with the verdict of the sentinel beside it"
    assert script.index("job.pid") < script.index("sentinel verdict")


@pytest.mark.parametrize("where", ["overlays/sidecar", "examples/jobset", "examples/pytorchjob"])
def test_probes_and_ports_are_the_http_address(where: str) -> None:
    pod, _job = _pod_specs()[where]
    sidecar = _sidecar(pod)
    host, port = _options(sidecar["args"])["http"].rsplit(":", 1)
    assert host == "$(POD_IP)", "the kubelet probes the pod's address, not loopback"
    [pod_ip] = [e for e in sidecar["env"] if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/readyz", "port": int(port)}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/livez", "port": int(port)}
    assert [p["containerPort"] for p in sidecar["ports"]] == [int(port)]
    assert sidecar["envFrom"] == [{"secretRef": {"name": "sentinel-notify", "optional": True}}]


@pytest.mark.parametrize("where", ["overlays/sidecar", "overlays/in-place-restart",
                                   "examples/jobset", "examples/pytorchjob"])  # fmt: skip
def test_sidecar_runs_as_the_trainer_with_no_capability(where: str) -> None:
    pod, _job = _pod_specs()[where]
    sidecar, trainer = _sidecar(pod), _trainer(pod)
    assert _run_as(pod, sidecar) == _run_as(pod, trainer) is not None
    context = sidecar["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def _pods(doc: Any) -> list[dict[str, Any]]:
    """Every pod spec anywhere in ``doc`` (a Job's, a JobSet's child Job's, a PyTorchJob's)."""
    found: list[dict[str, Any]] = []
    if isinstance(doc, list):
        for item in doc:
            found += _pods(item)
    elif isinstance(doc, dict):
        if isinstance(doc.get("containers"), list):
            found.append(doc)
        for value in doc.values():
            found += _pods(value)
    return found


@pytest.mark.parametrize(
    ("overlay", "level"),
    [
        ("overlays/sidecar", "restricted"),
        ("overlays/in-place-restart", "restricted"),
        ("overlays/wrapper", "restricted"),
        ("examples", "restricted"),
        ("overlays/stacks", "privileged"),
    ],
)
def test_every_pod_passes_pod_security_restricted_but_the_stacks_overlay(
    overlay: str, level: str
) -> None:
    """The recipe and its variants pass Pod Security ``restricted`` (so ``baseline``); the
    opt-in stacks overlay adds SYS_PTRACE, which ``baseline`` refuses, and says so."""
    pods = _pods(list(_render(overlay)))
    assert pods
    for pod in pods:
        if level == "restricted":
            assert pod_security.violations(pod, "restricted") == []
        else:
            assert pod_security.violations(pod, "baseline") == ["sentinel: adds ['SYS_PTRACE']"]
    text = (K8S / overlay / "kustomization.yaml").read_text()
    assert (level == "privileged") == ("privileged" in text), "the overlay names its level"


@pytest.mark.parametrize(
    ("change", "found"),
    [
        (lambda pod: pod.update(hostPID=True), "hostPID: true"),
        (lambda pod: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
         "volume h: hostPath"),
        (lambda pod: pod["initContainers"][0]["securityContext"].update(privileged=True),
         "sentinel: privileged"),
    ],
    ids=["host-pid", "host-path", "privileged"],
)  # fmt: skip
def test_the_pod_security_check_can_fail(change: Any, found: str) -> None:
    pod = copy.deepcopy(_one(_render("overlays/sidecar"), "Job")["spec"]["template"]["spec"])
    change(pod)
    assert found in pod_security.violations(pod, "baseline")


@pytest.mark.parametrize("where", ["overlays/sidecar", "overlays/in-place-restart",
                                   "examples/jobset", "examples/pytorchjob"])  # fmt: skip
def test_the_sidecar_asks_the_runtime_for_the_gpus_and_requests_none(where: str) -> None:
    """The NVIDIA runtime hands a container that requests no GPU the devices its
    NVIDIA_VISIBLE_DEVICES names, with NVML; a nvidia.com/gpu request would allocate others."""
    pod, _job = _pod_specs()[where]
    sidecar = _sidecar(pod)
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    resources = sidecar.get("resources", {})
    for kind in ("requests", "limits"):
        assert not any("gpu" in name for name in resources.get(kind, {})), resources


@pytest.mark.parametrize("where", ["overlays/sidecar", "overlays/in-place-restart",
                                   "examples/jobset", "examples/pytorchjob"])  # fmt: skip
def test_the_checkpoint_volume_is_not_chowned_at_each_start_and_the_grace_fits_a_save(
    where: str,
) -> None:
    pod, _job = _pod_specs()[where]
    context = pod["securityContext"]
    assert context["fsGroupChangePolicy"] == "OnRootMismatch"
    drain = float(_options(_sidecar(pod)["args"])["drain-timeout"])
    # Minutes for the trainer's final save, then the sidecar's drain.
    assert pod["terminationGracePeriodSeconds"] >= 240 + drain


def _watching_sentinels(doc: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) for every ``sentinel watch`` container anywhere in ``doc``."""
    return [
        (pod, container)
        for pod in _pods(doc)
        for container in pod.get("initContainers", []) + pod["containers"]
        if container.get("args", [None])[0] == "watch"
    ]


def _ptrace_gaps(docs: tuple[dict[str, Any], ...]) -> list[str]:
    """Watching sentinels that could not take the job's stacks: py-spy attaches with ptrace,
    which needs the job's processes in sight (a shared process namespace) and, past Yama's
    ptrace_scope 1 (the sidecar is not the job's ancestor), CAP_SYS_PTRACE, which a
    securityContext that drops ALL must add back."""
    gaps = []
    for pod, container in _watching_sentinels(list(docs)):
        capabilities = container.get("securityContext", {}).get("capabilities", {})
        if pod.get("shareProcessNamespace") is not True:
            gaps.append(f"{container['name']}: the pod does not share its process namespace")
        if "ALL" in capabilities.get("drop", []) and "SYS_PTRACE" not in capabilities.get(
            "add", []
        ):
            gaps.append(f"{container['name']}: drops ALL and does not add SYS_PTRACE back")
    return gaps


def test_the_stacks_overlay_lets_the_watching_sentinel_ptrace_the_job() -> None:
    docs = _render("overlays/stacks")
    sentinels = _watching_sentinels(list(docs))
    assert len(sentinels) == 1
    [(_pod, container)] = sentinels
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert _ptrace_gaps(docs) == []
    # Everything else is the sidecar recipe's.
    stacked = copy.deepcopy(_one(docs, "Job"))
    del stacked["spec"]["template"]["spec"]["initContainers"][0]["securityContext"]["capabilities"][
        "add"
    ]
    assert stacked == _one(_render("overlays/sidecar"), "Job")


def test_the_ptrace_check_can_fail() -> None:
    """The default recipe's sidecar, which drops every capability, is reported; so is a pod
    that does not share its process namespace."""
    job = copy.deepcopy(_one(_render("overlays/sidecar"), "Job"))
    pod = job["spec"]["template"]["spec"]
    pod["shareProcessNamespace"] = False
    assert _ptrace_gaps((job,)) == [
        "sentinel: the pod does not share its process namespace",
        "sentinel: drops ALL and does not add SYS_PTRACE back",
    ]


@pytest.mark.parametrize(
    "where", ["overlays/sidecar", "overlays/in-place-restart", "examples/jobset"]
)
def test_pod_failure_policy_maps_the_verdicts_of_the_trainer(where: str) -> None:
    pod, job = _pod_specs()[where]
    assert job is not None
    assert pod["restartPolicy"] == "Never"
    trainer = _trainer(pod)["name"]
    actions: dict[int, str] = {}
    for rule in job["podFailurePolicy"]["rules"]:
        codes = rule.get("onExitCodes")
        if codes is None:
            assert rule == {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            }
            continue
        assert codes["containerName"] == trainer, "else the sidecar's own exit matches too"
        assert codes["operator"] == "In" and codes["values"] == sorted(set(codes["values"]))
        for code in codes["values"]:
            actions.setdefault(code, rule["action"])  # the first matching rule wins
    assert actions == {90: "FailJob", 91: "Count", 92: "Count", 94: "FailJob"}


def test_in_place_restart_restarts_the_trainer_on_91_only() -> None:
    pod, _job = _pod_specs()["overlays/in-place-restart"]
    trainer = _trainer(pod)
    assert trainer["restartPolicy"] == "Never"
    assert trainer["restartPolicyRules"] == [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [VERDICTS["rolled_back"]]}}
    ]
    assert "restartPolicyRules" not in _sidecar(pod)


def test_jobset_fails_on_give_up_and_restarts_everything_otherwise() -> None:
    jobset = _one(_render("examples"), "JobSet")["spec"]
    rules = {r["action"]: r["onJobFailureReasons"] for r in jobset["failurePolicy"]["rules"]}
    # 90 -> FailJob (reason PodFailurePolicy); 91, 92 -> Count past backoffLimit 0.
    assert rules == {"FailJobSet": ["PodFailurePolicy"], "RestartJobSet": ["BackoffLimitExceeded"]}
    assert jobset["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] == 0


def test_pytorchjob_maps_verdicts_to_the_exit_code_policy() -> None:
    """Under restartPolicy ExitCode, 138 is retried and 90 is permanent: run the mapping."""
    master = _one(_render("examples"), "PyTorchJob")["spec"]["pytorchReplicaSpecs"]["Master"]
    assert master["restartPolicy"] == "ExitCode"
    script = _script(_trainer(master["template"]["spec"]))
    mapping = script[script.index("code=$?") :]
    for verdict, exit_code in ((90, 90), (91, 138), (92, 138), (94, 94), (0, 0), (1, 1)):
        done = subprocess.run(["bash", "-c", f"(exit {verdict}); {mapping}"], timeout=10)
        assert done.returncode == exit_code, verdict


def test_wrapper_variant_runs_sentinel_as_the_entrypoint() -> None:
    pod = _one(_render("overlays/wrapper"), "Job")["spec"]["template"]["spec"]
    assert "initContainers" not in pod and pod["shareProcessNamespace"] is False
    trainer = _trainer(pod)
    assert trainer["command"] == ["sentinel"] and trainer["args"][0] == "run"
    dash = trainer["args"].index("--")
    options = _options(trainer["args"][:dash])
    assert trainer["args"][dash + 1 :][:3] == ["python", "-u", "train.py"]
    port = int(options["http"].rsplit(":", 1)[1])
    assert trainer["startupProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    for option in ("checkpoints", "state-dir"):
        assert _mount_of(trainer, options[option])["name"] == "data"
    assert options["checkpoints"] in trainer["args"][dash:], "the job saves where sentinel looks"


def test_pod_monitor_scrapes_the_sidecars_port() -> None:
    docs = _render("overlays/sidecar")
    monitor = _one(docs, "PodMonitor")["spec"]
    template = _one(docs, "Job")["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for c in template["spec"]["initContainers"] for p in c["ports"]}
    assert [e["port"] for e in monitor["podMetricsEndpoints"]] == ["sentinel-http"]
    assert "sentinel-http" in ports
    for where in ("examples/jobset", "examples/pytorchjob"):
        pod, _job = _pod_specs()[where]
        assert "sentinel-http" in {p["name"] for p in _sidecar(pod)["ports"]}


# -- the series the dashboard and the alerts read --------------------------------------------


def _exported_series() -> set[str]:
    """The sample names a real /metrics serves once every kind of series has a value."""
    metrics = Metrics(job_name="train", host="pod", mode="watch")
    metrics.job_info("train", "pod", "watch")
    metrics.attempt_started(2)
    metrics.restarted()
    metrics.lines_read(10, garbled=1)
    for name in (LOSS, GRAD_NORM, TOKENS_PER_SEC):
        metrics.sample(name, 1.0, step=5)
    metrics.sample(LOSS, float("nan"), step=6)
    metrics.loop_turned()
    metrics.incident_opened("nan_inf", "critical")
    metrics.incidents_active({"nan_inf": 1})
    metrics.action("rollback", ok=False)
    metrics.notified("slack", ok=False)
    metrics.outbox_depth(1)
    metrics.spend(3.5)
    server = HealthServer(metrics, "127.0.0.1:0", live_within_s=10.0, poll_interval_s=0.01)
    server.start()
    try:
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as response:
            body = response.read().decode()
    finally:
        server.stop()
    return {s.name for family in text_string_to_metric_families(body) for s in family.samples}


def _series_in(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_strings)
    words = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", without_ranges))
    words -= {"by", "on", "unless", "and", "or", "without", "ignoring", "group_left", "bool"}
    words -= {"sum", "min", "max", "avg", "count", "group", "topk", "bottomk", "quantile"}
    labels = set(re.findall(r"\b([a-zA-Z_]\w*)\s*=~?", without_ranges))
    labels |= {w for group in re.findall(r"(?:by|on)\s*\(([^)]*)\)", without_ranges)
               for w in re.findall(r"\w+", group)}  # fmt: skip
    return {w for w in words - labels if not w.startswith("__") and not w.isdigit()}


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.*), \w+\)", variable["query"]["query"])
            assert inner, variable
            queries.append(inner.group(1))
    return queries


def test_every_dashboard_and_alert_query_names_an_exported_series() -> None:
    exported = _exported_series()
    rules = _one(_render("overlays/sidecar"), "PrometheusRule")["spec"]["groups"][0]["rules"]
    queries = {"dashboard": _dashboard_queries(), "rules": [r["expr"] for r in rules]}
    named: set[str] = set()
    for where, exprs in queries.items():
        for expr in exprs:
            series = _series_in(expr)
            assert series, (where, expr)
            unknown = series - exported - (FOREIGN_SERIES if where == "rules" else set())
            assert not unknown, (where, expr, sorted(exported))
            named |= series
    # What the dashboard is for: step, loss, grad-norm, tokens/s, incidents, attempts, spend.
    wanted = {"sentinel_training_step", "sentinel_loss", "sentinel_grad_norm",
              "sentinel_tokens_per_second", "sentinel_incidents_total", "sentinel_job_attempt",
              "sentinel_spend_currency_units"}  # fmt: skip
    assert wanted <= set().union(*map(_series_in, queries["dashboard"]))
    alerts = {r["alert"] for r in rules}
    assert {"SentinelDown", "TrainingStalled", "TrainingNonFinite",
            "SentinelNotificationsFailing"} <= alerts  # fmt: skip


def test_the_series_check_can_fail() -> None:
    assert _series_in('rate(sentinel_lines_total{pod=~"$pod"}[5m])') == {"sentinel_lines_total"}
    assert "sentinel_lines_total" not in _exported_series()


def test_sentinel_down_alerts_only_while_the_trainer_runs() -> None:
    rules = _one(_render("overlays/sidecar"), "PrometheusRule")["spec"]["groups"][0]["rules"]
    [down] = [r["expr"] for r in rules if r["alert"] == "SentinelDown"]
    running, _, scraped = down.partition("unless on (namespace, pod)")
    assert 'kube_pod_container_status_running{container="trainer"}' in running
    assert 'up{job="sentinel"}' in scraped
    monitor = _one(_render("overlays/sidecar"), "PodMonitor")["spec"]
    [endpoint] = monitor["podMetricsEndpoints"]
    assert {"action": "replace", "targetLabel": "job", "replacement": "sentinel"} in endpoint[
        "relabelings"
    ]


# -- the simulated pod ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Pod:
    """The pod's volumes as temp dirs, and the kubelet's substitutions."""

    def __init__(self, pod: dict[str, Any], root: Path, port: int) -> None:
        self.pod, self.port = pod, port
        self.volumes = {v["name"]: root / "volumes" / v["name"] for v in pod["volumes"]}
        for path in self.volumes.values():
            path.mkdir(parents=True)
        self.workdir = root / "workspace"
        self.workdir.mkdir()

    def host_path(self, container: dict[str, Any], text: str) -> str:
        """``text`` with every mount path of ``container`` replaced by its temp dir."""
        mounts = sorted(container["volumeMounts"], key=lambda m: -len(m["mountPath"]))
        where = {m["mountPath"]: str(self.volumes[m["name"]]) for m in mounts}
        alternatives = "|".join(re.escape(m["mountPath"]) for m in mounts)
        pattern = r"(?<![\w./])(" + alternatives + r")(?=/|\b|$)"
        return re.sub(pattern, lambda match: where[match.group(1)], text)  # one pass

    def expand(self, container: dict[str, Any], text: str) -> str:
        """The kubelet's $(VAR) expansion (POD_IP is loopback here), mount paths mapped."""
        text = text.replace("$(POD_IP)", "127.0.0.1").replace(":9464", f":{self.port}")
        return self.host_path(container, text)

    def env(self, container: dict[str, Any]) -> dict[str, str]:
        env = clean_env()
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = self.host_path(container, item["value"])
        env["POD_IP"] = "127.0.0.1"
        return env


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)
    except OSError:
        return 0


@pytest.mark.slow
def test_simulated_pod_rolls_back_exits_91_and_resumes_from_the_clean_checkpoint(
    tmp_path: Path,
) -> None:
    job = _one(_render("overlays/sidecar"), "Job")
    spec = job["spec"]["template"]["spec"]
    sidecar, trainer = _sidecar(spec), _trainer(spec)
    pod = _Pod(spec, tmp_path, _free_port())
    (pod.workdir / "train.py").write_text(TRAIN_PY)
    assert trainer["workingDir"] and "train.py" in _script(trainer)

    # The sidecar: the image's entrypoint is `sentinel` (deploy/Dockerfile), its args as
    # the kubelet hands them over.
    args = [pod.expand(sidecar, arg) for arg in sidecar["args"]]
    watch = subprocess.Popen(
        [sys.executable, "-m", "sentinel", *args], env=pod.env(sidecar), cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # The kubelet starts the trainer once the sidecar's startup probe passes.
        probe = sidecar["startupProbe"]["httpGet"]
        ready = f"http://127.0.0.1:{pod.port}{probe['path']}"
        deadline = time.monotonic() + 30
        while _get(ready) != 200:
            assert watch.poll() is None, watch.communicate()[1]
            assert time.monotonic() < deadline, "the startup probe never passed"
            time.sleep(0.1)

        command = [*trainer["command"], *(pod.expand(trainer, a) for a in trainer["args"])]
        first = subprocess.run(
            command, env=pod.env(trainer), cwd=pod.workdir, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        state = Path(pod.expand(sidecar, _options(sidecar["args"])["state-dir"]))
        # The wrapper took the 91 it handed on (the relaunch follows): set aside, not left
        # for a later attempt's wrapper.
        assert not (state / "verdict.json").exists()
        verdict = json.loads((state / "verdict.consumed.json").read_text())
        ckpt = pod.volumes["data"] / "checkpoints"
        assert first.returncode == VERDICTS["rolled_back"], first.stderr
        assert (verdict["state"], verdict["code"], verdict["rule"]) == ("final", 91, "nan_inf")
        assert verdict["resume_from"] == str(ckpt / "step_20")
        assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_10", "step_20"]
        assert [p.name for p in (ckpt / "quarantine").rglob("step_*")] == ["step_25"]
        assert _get(f"http://127.0.0.1:{pod.port}/livez") == 200

        # As the kubelet would (in place) or the Job's next pod: the same command again.
        second = subprocess.run(
            command, env=pod.env(trainer), cwd=pod.workdir, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert second.returncode == 0, second.stderr
        attempts = [json.loads((pod.workdir / f"attempt-{n}").read_text()) for n in (1, 2)]
        assert [a["start"] for a in attempts] == [0, 20], "attempt 2 resumed from step_20"
        assert (ckpt / "step_40").is_dir()
        log = (pod.volumes["logs"] / "train.log").read_text().splitlines()
        assert '"step": 40' in log[-1], "the trainer's output reached the shared log"
    finally:
        watch.send_signal(signal.SIGTERM)
        _out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert "attempt 2" in err


# -- the README's recipe -----------------------------------------------------------------------


def _readme_section() -> str:
    from tests.helpers.manual import section

    return section("On Kubernetes")


def test_readme_recipe_names_files_that_exist_and_a_secret_sentinel_loads() -> None:
    section = _readme_section()
    links = re.findall(r"`(deploy/[^`\s]+)`", section)
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).exists(), link
    for overlay in re.findall(r"kubectl apply -k (\S+)", section):
        assert (ROOT / overlay / "kustomization.yaml").exists(), overlay
    [urls] = re.findall(r"--from-literal=SENTINEL_NOTIFY__URLS='([^']+)'", section)
    settings = load_settings(None, environ={"SENTINEL_NOTIFY__URLS": urls})
    assert [u.get_secret_value() for u in settings.notify.urls] == urls.split()
    job = _one(_render("overlays/sidecar"), "Job")
    [sidecar_secret] = _sidecar(job["spec"]["template"]["spec"])["envFrom"]
    assert f"secret generic {sidecar_secret['secretRef']['name']}" in section


@pytest.mark.slow
def test_simulated_wrapper_pod_rolls_back_and_restarts_inside_the_container(
    tmp_path: Path,
) -> None:
    """The wrapper overlay's trainer (`sentinel run -- python -u train.py ...`), run as is."""
    spec = _one(_render("overlays/wrapper"), "Job")["spec"]["template"]["spec"]
    trainer = _trainer(spec)
    pod = _Pod(spec, tmp_path, _free_port())
    (pod.workdir / "train.py").write_text(TRAIN_PY)
    command = [*trainer["command"], *(pod.expand(trainer, a) for a in trainer["args"])]
    assert command[0] == "sentinel", "the image's sentinel, found on PATH"
    done = subprocess.run(
        command, env=pod.env(trainer), cwd=pod.workdir, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    attempts = [json.loads((pod.workdir / f"attempt-{n}").read_text()) for n in (1, 2)]
    assert [a["start"] for a in attempts] == [0, 20], "restarted from the clean step_20"
    ckpt = pod.volumes["data"] / "checkpoints"
    assert [p.name for p in (ckpt / "quarantine").rglob("step_*")] == ["step_25"]
    assert (ckpt / "step_40").is_dir()
