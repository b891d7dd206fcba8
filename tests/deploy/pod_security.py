"""The Pod Security Standards' checks, as the Kubernetes documentation states them.

``violations(pod_spec, level)`` lists what keeps a pod spec from the ``baseline`` or the
``restricted`` level (kubernetes/website ``content/en/docs/concepts/security/
pod-security-standards.md``: every control of the two levels that a pod spec can carry,
annotations aside). No cluster runs here, so the admission plugin itself cannot judge the
manifests; this is its rule list, applied to the rendered pods.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: Capabilities ``baseline`` allows a container to add.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})  # fmt: skip
#: Volume types ``restricted`` allows.
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
     "projected", "secret"}
)  # fmt: skip


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(kind) or []


def _baseline(pod: dict[str, Any]) -> Iterator[str]:
    context = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            yield f"{field}: true"
    contexts = [("pod", context)] + [
        (c["name"], c.get("securityContext") or {}) for c in _containers(pod)
    ]
    for name, ctx in contexts:
        if (ctx.get("windowsOptions") or {}).get("hostProcess"):
            yield f"{name}: hostProcess"
        if ctx.get("privileged"):
            yield f"{name}: privileged"
        added = set((ctx.get("capabilities") or {}).get("add") or ())
        if added - BASELINE_CAPABILITIES:
            yield f"{name}: adds {sorted(added - BASELINE_CAPABILITIES)}"
        if (ctx.get("appArmorProfile") or {}).get("type") not in (
            None,
            "RuntimeDefault",
            "Localhost",
        ):
            yield f"{name}: appArmorProfile"
        selinux = ctx.get("seLinuxOptions") or {}
        if (
            selinux.get("type", "") not in SELINUX_TYPES
            or selinux.get("user")
            or selinux.get("role")
        ):
            yield f"{name}: seLinuxOptions"
        if ctx.get("procMount") not in (None, "Default"):
            yield f"{name}: procMount"
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield f"{name}: seccomp Unconfined"
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            yield f"volume {volume['name']}: hostPath"
    for container in _containers(pod):
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                yield f"{container['name']}: hostPort"
    for sysctl in context.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            yield f"sysctl {sysctl['name']}"


def _restricted(pod: dict[str, Any]) -> Iterator[str]:
    context = pod.get("securityContext") or {}
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            yield f"volume {volume['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}"
    pod_seccomp = (context.get("seccompProfile") or {}).get("type")
    if context.get("runAsUser") == 0:
        yield "pod: runAsUser 0"
    for container in _containers(pod):
        name, ctx = container["name"], container.get("securityContext") or {}
        if ctx.get("allowPrivilegeEscalation") is not False:
            yield f"{name}: allowPrivilegeEscalation not false"
        non_root = ctx.get("runAsNonRoot", context.get("runAsNonRoot"))
        if non_root is not True:
            yield f"{name}: runAsNonRoot not true"
        if ctx.get("runAsUser") == 0:
            yield f"{name}: runAsUser 0"
        if (ctx.get("seccompProfile") or {}).get("type", pod_seccomp) not in (
            "RuntimeDefault",
            "Localhost",
        ):
            yield f"{name}: seccomp not RuntimeDefault or Localhost"
        capabilities = ctx.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or ()):
            yield f"{name}: does not drop ALL"
        if set(capabilities.get("add") or ()) - {"NET_BIND_SERVICE"}:
            yield f"{name}: adds more than NET_BIND_SERVICE"


def violations(pod: dict[str, Any], level: str) -> list[str]:
    """What keeps ``pod`` (a pod spec) from ``level``: "baseline" or "restricted"."""
    found = list(_baseline(pod))
    if level == "restricted":
        found += _restricted(pod)
    return found
