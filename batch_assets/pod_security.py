"""The Kubernetes Pod Security Standards `restricted` profile (policy version v1.35), as the PodSecurity admission
controller checks a pod spec: many clusters enforce it on namespaces (`pod-security.kubernetes.io/enforce:
restricted`), and there a pod that breaks one rule is refused at creation: a run or step Job's pod never appears.

Written out here because nothing on PyPI implements the admission checks; the rules follow
https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline + restricted), one function each.
Takes a pod spec in the API's JSON form (camelCase, as rendered manifests and `ApiClient.sanitize_for_serialization`
give it).
"""

from __future__ import annotations

from typing import Any

# restricted: "Volume Types"
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                   "secret"}
# baseline: "Capabilities" may add only these; restricted: only NET_BIND_SERVICE, after dropping ALL
RESTRICTED_ADDABLE = {"NET_BIND_SERVICE"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for key, kind in (("initContainers", "init container"), ("containers", "container"),
                      ("ephemeralContainers", "ephemeral container")):
        found += [(f"{kind} {c.get('name', '?')}", c) for c in spec.get(key) or []]
    return found


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """Every rule of the `restricted` profile the pod spec breaks, one line each (empty: admitted)."""
    pod_sc = spec.get("securityContext") or {}
    problems: list[str] = []
    # -- baseline
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            problems.append(f"{key} must be unset or false")
    for volume in spec.get("volumes") or []:
        kinds = [k for k in volume if k != "name"]
        if "hostPath" in kinds:
            problems.append(f"volume {volume.get('name')} is a hostPath")
        elif not set(kinds) <= ALLOWED_VOLUMES:
            problems.append(f"volume {volume.get('name')} has type {kinds}: restricted allows "
                            f"{sorted(ALLOWED_VOLUMES)}")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"sysctl {sysctl.get('name')} is not a safe sysctl")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    pod_non_root = pod_sc.get("runAsNonRoot")
    if pod_sc.get("runAsUser") == 0:
        problems.append("securityContext.runAsUser must not be 0")
    if pod_seccomp == "Unconfined":
        problems.append("securityContext.seccompProfile.type must not be Unconfined")
    for where, container in _containers(spec):
        sc = container.get("securityContext") or {}
        if sc.get("privileged"):
            problems.append(f"{where}: securityContext.privileged must be false")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where}: hostPort {port['hostPort']} is not allowed")
        if sc.get("procMount") not in (None, "Default"):
            problems.append(f"{where}: securityContext.procMount must be Default")
        # -- restricted
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: securityContext.allowPrivilegeEscalation must be false")
        non_root = sc.get("runAsNonRoot", pod_non_root)
        if non_root is not True:
            problems.append(f"{where}: runAsNonRoot must be true (in the container's or the pod's securityContext)")
        if sc.get("runAsUser") == 0:
            problems.append(f"{where}: securityContext.runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost (container or pod)")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}: securityContext.capabilities.drop must include ALL")
        added = set(capabilities.get("add") or []) - RESTRICTED_ADDABLE
        if added:
            problems.append(f"{where}: securityContext.capabilities.add may only hold NET_BIND_SERVICE, "
                            f"not {sorted(added)}")
    return problems
