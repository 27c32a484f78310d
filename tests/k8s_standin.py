"""A stand-in for the Kubernetes API on 127.0.0.1: the batch/v1 Job and core/v1 Pod calls dagster-k8s makes.

Every created Job is checked the way the API server would (schema with kubernetes-validate, then volume and mount
names) and runs its container command as a local process with the pod's environment. Volumes map to local folders
(PersistentVolumeClaims and ConfigMaps by name, a fresh folder per emptyDir); an environment value under a mount path
is rewritten to the local folder, and a file mounted with subPath appears under a per-pod root. The Job succeeds or
fails with the exit code, as a Job with backoff_limit 0 does, and a process that changed a read-only mount fails it.
Given `nodes`, a pod is first scheduled as the scheduler would place it (node selector, taints and tolerations,
requests within a node's allocatable); a pod no node takes fails, where a cluster would leave it Pending.
Requests it does not implement are answered 404 and kept in `unhandled`, so a test sees what it would miss.
Given `rules` (a Role's rules: the permissions of the one identity in its kubeconfig), it authorizes every request
as the API server's RBAC would: a request no rule allows is answered 403 and kept in `forbidden`; what was allowed is
kept in `authorized` as (verb, "group/resource"), so a test can hold a Role to what the client really calls.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import yaml

K8S_VERSION = "1.30.0"  # the schema tests/test_k8s.py validates the manifests against
_JOBS = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?(/status)?$")
_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?(/log)?$")
_RESOURCE = re.compile(r"^/(?:api/v1|apis/([^/]+)/[^/]+)/namespaces/[^/]+/([^/]+)(?:/([^/]+))?(?:/([^/]+))?$")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Node:
    """A node as the scheduler sees it: labels, NoSchedule taints (key, value or None) and allocatable resources."""

    name: str
    labels: dict[str, str]
    allocatable: dict[str, str]
    taints: tuple[tuple[str, str | None], ...] = ()

    def refuses(self, spec: dict, container: dict) -> str | None:
        """Why this node cannot take the pod (None: it can)."""
        wrong = {k: v for k, v in (spec.get("nodeSelector") or {}).items() if self.labels.get(k) != v}
        if wrong:
            return f"node selector {wrong} does not match"
        for key, value in self.taints:
            if not any(
                t.get("key") == key
                and t.get("effect") in (None, "NoSchedule")
                and (t.get("operator") == "Exists" or t.get("value") == value)
                for t in spec.get("tolerations") or []
            ):
                return f"untolerated taint {key}"
        requests = (container.get("resources") or {}).get("requests") or {}
        over = [r for r, q in requests.items() if _quantity(q) > _quantity(self.allocatable.get(r, "0"))]
        return f"insufficient {', '.join(over)}" if over else None


def _quantity(text: str) -> float:
    """A Kubernetes quantity (`15`, `500m`, `24Gi`) as a number."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    unit = next((u for u in units if str(text).endswith(u)), None)
    return float(str(text)[: -len(unit)]) * units[unit] if unit else float(text)


class Pod:
    """One Job's single pod: the local process, its log and its exit."""

    def __init__(self, job: dict, root: Path) -> None:
        self.job = job
        self.name = f"{job['metadata']['name']}-{uuid.uuid4().hex[:5]}"
        self.root = root
        self.log = root / "container.log"
        self.process: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.problem: str | None = None  # why the pod failed outside its command (a bad mount, a read-only write)
        self.node: str | None = None  # where the scheduler placed it
        self.started = self.finished = None

    @property
    def phase(self) -> str:
        if self.exit_code is None and self.problem is None:
            return "Running" if self.process else "Pending"
        return "Succeeded" if self.exit_code == 0 and self.problem is None else "Failed"


class KubeStandIn:
    """The API server, the scheduler and the kubelet of a one-node cluster whose node is this machine.

    `claims` and `config_maps` map names to local folders, `secrets` names to {key: value} (a secret not given
    resolves to a placeholder: the pipeline never reads one). `image_env` and `workdir` are what the image itself
    brings: the environment and working directory every container starts with.
    """

    def __init__(
        self,
        scratch: Path,
        claims: dict[str, Path],
        config_maps: dict[str, Path],
        image_env: dict[str, str],
        workdir: Path,
        secrets: dict[str, dict[str, str]] | None = None,
        nodes: list[Node] | None = None,
        rules: list[dict] | None = None,
        isolate: bool = False,
    ) -> None:
        self.scratch, self.claims, self.config_maps = Path(scratch), claims, config_maps
        self.nodes, self.rules = nodes, rules
        self.isolate = isolate  # each pod in its own UTS and PID namespace, its hostname the pod's name (needs unshare)
        self.forbidden: list[tuple[str, str]] = []  # (method, path) that RBAC refused
        self.authorized: set[tuple[str, str]] = set()  # (verb, "group/resource") that RBAC allowed
        self.secrets, self.image_env, self.workdir = secrets or {}, image_env, workdir
        self.requests: list[tuple[str, str]] = []
        self.unhandled: list[tuple[str, str]] = []
        self.rejected: list[tuple[str, str]] = []  # (job name, why) for Jobs the API server would refuse
        self.jobs: dict[tuple[str, str], dict] = {}  # (namespace, name) -> the Job as created
        self.pods: dict[tuple[str, str], Pod] = {}  # (namespace, job name) -> its pod
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.kubeconfig = self.scratch / "kubeconfig.yaml"

    def __enter__(self) -> KubeStandIn:
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "standin",
                    "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                    "users": [{"name": "standin", "user": {"token": "standin"}}],
                    "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
                }
            )
        )
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        for pod in list(self.pods.values()):
            self._kill(pod)

    # -- what a container sees -------------------------------------------------------------------------------------

    def local_env(self, env: list[dict], env_from: list[dict], mounts: dict[str, Path]) -> dict[str, str]:
        """The container's environment on this machine: image env, envFrom, env, with mount paths made local."""
        out = dict(self.image_env)
        for source in env_from:
            if "configMapRef" in source:
                folder = self.config_maps.get(source["configMapRef"]["name"])
                items = {} if folder is None else {p.name: p.read_text() for p in folder.iterdir() if p.is_file()}
            else:
                items = self.secrets.get(source["secretRef"]["name"], {})
            out.update({source.get("prefix", "") + k: v for k, v in items.items()})
        for var in env:
            out[var["name"]] = var["value"] if "value" in var else self._value_from(var["name"], var.get("valueFrom", {}))
        return {k: self._local_path(v, mounts) for k, v in out.items()}

    def _value_from(self, name: str, source: dict) -> str:
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self.secrets.get(ref["name"], {}).get(ref["key"], f"standin-secret-{ref['name']}-{ref['key']}")
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return (self.config_maps[ref["name"]] / ref["key"]).read_text()
        raise ValueError(f"env {name}: valueFrom {sorted(source)} is not supported by the stand-in")

    def _local_path(self, value: str, mounts: dict[str, Path]) -> str:
        """A path under a mount made local. The image's own files (this checkout stands in for them) are never
        under a mount, also when the checkout lives below a mounted path such as /tmp."""
        image = str(self.workdir)
        if value == image or value.startswith(image.rstrip("/") + "/"):
            return value
        for mount_path in sorted(mounts, key=len, reverse=True):
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                return str(mounts[mount_path]) + value[len(mount_path.rstrip("/")) :]
        return value

    def _mounts(self, pod: Pod, spec: dict, container: dict) -> dict[str, Path]:
        """mountPath -> local path; a subPath file also shows up under the pod's root, with its folder mapped there."""
        volumes = {}
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                volumes[volume["name"]] = Path(self.claims[volume["persistentVolumeClaim"]["claimName"]])
            elif "configMap" in volume:
                volumes[volume["name"]] = Path(self.config_maps[volume["configMap"]["name"]])
            elif "emptyDir" in volume:
                volumes[volume["name"]] = pod.root / "volumes" / volume["name"]
                volumes[volume["name"]].mkdir(parents=True)
            else:
                raise ValueError(f"volume {volume['name']}: only PVCs, ConfigMaps and emptyDirs are supported")
        mounts = {}
        for mount in container.get("volumeMounts", []):
            local = volumes[mount["name"]] / mount.get("subPath", "")
            if "subPath" in mount:
                in_root = pod.root / "rootfs" / mount["mountPath"].lstrip("/")
                in_root.parent.mkdir(parents=True, exist_ok=True)
                in_root.symlink_to(local)
                mounts.setdefault(str(Path(mount["mountPath"]).parent), in_root.parent)
            mounts[mount["mountPath"]] = local
        return mounts

    # -- the kubelet ---------------------------------------------------------------------------------------------

    def _start(self, pod: Pod) -> None:
        spec = pod.job["spec"]["template"]["spec"]
        (container,) = spec["containers"]  # dagster-k8s step and run pods have one container
        if self.nodes is not None:
            refusals = {node.name: node.refuses(spec, container) for node in self.nodes}
            pod.node = next((name for name, why in refusals.items() if why is None), None)
            if pod.node is None:
                pod.problem = f"pod {pod.name} is unschedulable: {refusals}"
                return
        try:
            mounts = self._mounts(pod, spec, container)
            env = self.local_env(container.get("env", []), container.get("envFrom", []), mounts)
            argv = [*container.get("command", []), *container.get("args", [])]
            argv[0] = shutil.which(argv[0], path=env.get("PATH")) or argv[0]
            if self.isolate:  # as on a node: another host name, PIDs of its own
                argv = [
                    "unshare",
                    "--uts",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "sh",
                    "-c",
                    'hostname "$0" && exec "$@"',
                    pod.name,
                    *argv,
                ]
            cwd = self._local_path(container.get("workingDir", str(self.workdir)), mounts)
        except (KeyError, ValueError, OSError) as exc:
            pod.problem = f"pod {pod.name} cannot start: {type(exc).__name__}: {exc}"
            return
        read_only = {m["mountPath"] for m in container.get("volumeMounts", []) if m.get("readOnly")}
        before = {p: _snapshot(mounts[p]) for p in read_only}
        with pod.log.open("wb") as log:
            pod.started = _now()
            pod.process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        code = pod.process.wait()
        changed = sorted(p for p in read_only if _snapshot(mounts[p]) != before[p])
        if changed:
            pod.problem = f"pod {pod.name} wrote to read-only mounts {changed}"
        pod.finished, pod.exit_code = _now(), code

    def lose(self, pod: Pod) -> None:
        """The node of `pod` is lost: its process dies at once, mid-step, and the pod fails."""
        self._kill(pod)

    @staticmethod
    def _kill(pod: Pod) -> None:
        if pod.process and pod.process.poll() is None:
            os.killpg(pod.process.pid, signal.SIGKILL)
            pod.process.wait()

    # -- the API server ------------------------------------------------------------------------------------------

    def _create_job(self, namespace: str, body: dict) -> tuple[int, dict]:
        name = body["metadata"]["name"]
        problem = _admission_problem(body)
        if problem:
            self.rejected.append((name, problem))
            return 422, _status(422, "Invalid", f"Job.batch {name!r} is invalid: {problem}")
        with self._lock:
            if (namespace, name) in self.jobs:
                return 409, _status(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
            body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
            self.jobs[(namespace, name)] = body
            pod = self.pods[(namespace, name)] = Pod(body, self.scratch / "pods" / name)
        pod.root.mkdir(parents=True)
        threading.Thread(target=self._start, args=(pod,), daemon=True).start()
        return 201, body

    def _job(self, namespace: str, name: str) -> dict:
        job, pod = self.jobs[(namespace, name)], self.pods[(namespace, name)]
        status: dict = {"startTime": job["metadata"]["creationTimestamp"]}
        if pod.phase in ("Pending", "Running"):
            status["active"] = 1
        else:
            ok = pod.phase == "Succeeded"
            status.update(
                {
                    "succeeded" if ok else "failed": 1,
                    "conditions": [
                        {
                            "type": "Complete" if ok else "Failed",
                            "status": "True",
                            "lastTransitionTime": pod.finished or _now(),
                            "reason": None if ok else "BackoffLimitExceeded",
                            "message": pod.problem,
                        }
                    ],
                }
            )
            if ok:
                status["completionTime"] = pod.finished
        return {**job, "status": status}

    def _pod(self, namespace: str, job_name: str) -> dict:
        job, pod = self.jobs[(namespace, job_name)], self.pods[(namespace, job_name)]
        template = job["spec"]["template"]
        labels = {
            **template["metadata"].get("labels", {}),
            "job-name": job_name,
            "batch.kubernetes.io/job-name": job_name,
            "controller-uid": job["metadata"]["uid"],
        }
        (container,) = template["spec"]["containers"]
        if pod.phase in ("Pending", "Running"):
            state = {"running": {"startedAt": pod.started}} if pod.process else {"waiting": {"reason": "ContainerCreating"}}
        else:
            state = {
                "terminated": {
                    "exitCode": 1 if pod.exit_code is None else pod.exit_code,
                    "startedAt": pod.started,
                    "finishedAt": pod.finished,
                    "reason": "Completed" if pod.phase == "Succeeded" else "Error",
                    "message": pod.problem,
                }
            }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": namespace,
                "labels": labels,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, pod.name)),
                "creationTimestamp": job["metadata"]["creationTimestamp"],
            },
            "spec": template["spec"],
            "status": {
                "phase": pod.phase,
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container["image"],
                        "imageID": "",
                        "ready": pod.phase == "Running",
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            },
        }

    def _authorize(self, method: str, path: str, query: dict) -> tuple[int, dict] | None:
        """None when RBAC allows the request (or no rules were given), else the API server's 403."""
        if self.rules is None:
            return None
        verb, group, resource = rbac_attributes(method, path, query)
        if any(
            verb in rule.get("verbs", []) and group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
            for rule in self.rules
        ):
            self.authorized.add((verb, f"{group}/{resource}" if group else resource))
            return None
        self.forbidden.append((method, path))
        return 403, _status(403, "Forbidden", f"cannot {verb} {group}/{resource}: no rule of the Role allows it")

    def _pod_job(self, namespace: str, pod_name: str) -> str | None:
        return next((job for (ns, job), pod in self.pods.items() if ns == namespace and pod.name == pod_name), None)

    def _route(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict | str] | None:
        if m := _JOBS.match(path):
            namespace, name, _status_only = m.groups()
            if method == "POST" and name is None:
                return self._create_job(namespace, body or {})
            if name is None and method == "GET":
                items = [self._job(ns, n) for ns, n in self.jobs if ns == namespace]
                return 200, {"apiVersion": "batch/v1", "kind": "JobList", "metadata": {}, "items": _select(items, query)}
            if (namespace, name) not in self.jobs:
                return 404, _status(404, "NotFound", f'jobs.batch "{name}" not found')
            if method == "GET":
                return 200, self._job(namespace, name)
            if method == "DELETE":
                self._kill(self.pods[(namespace, name)])
                return 200, _status(200, "Success", f"deleted {name}")
        if m := _PODS.match(path):
            namespace, pod_name, log = m.groups()
            if pod_name is None and method == "GET":
                items = [self._pod(ns, job) for ns, job in self.pods if ns == namespace]
                return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": _select(items, query)}
            job = self._pod_job(namespace, pod_name or "")
            if job is None:
                return 404, _status(404, "NotFound", f'pods "{pod_name}" not found')
            if method == "GET" and log:
                return 200, self.pods[(namespace, job)].log.read_text(errors="replace")
            if method == "GET":
                return 200, self._pod(namespace, job)
        return None

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                standin.requests.append((self.command, url.path))
                query = parse_qs(url.query)
                try:
                    answer = standin._authorize(self.command, url.path, query) or standin._route(
                        self.command, url.path, query, json.loads(raw) if raw else None
                    )
                except Exception as exc:  # a stand-in bug must show as a failed request, not a hung client
                    answer = 500, _status(500, "InternalError", f"{type(exc).__name__}: {exc}")
                if answer is None:
                    standin.unhandled.append((self.command, self.path))
                    answer = 404, _status(404, "NotFound", f"the stand-in does not implement {self.command} {url.path}")
                code, payload = answer
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

            def log_message(self, *args) -> None:
                pass

        return Handler


def _admission_problem(job: dict) -> str | None:
    """What the API server would refuse: the schema, then names that must be unique or must exist."""
    try:
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"schema: {exc.message} at {'.'.join(str(p) for p in exc.path)}"
    spec = job["spec"]["template"]["spec"]
    volumes = [v["name"] for v in spec.get("volumes", [])]
    if len(set(volumes)) != len(volumes):
        return f"spec.template.spec.volumes: duplicate names in {volumes}"
    for container in spec["containers"]:
        mounts = container.get("volumeMounts", [])
        paths = [m["mountPath"] for m in mounts]
        if len(set(paths)) != len(paths):
            return f"containers[{container['name']}].volumeMounts: duplicate mountPath in {paths}"
        missing = sorted({m["name"] for m in mounts} - set(volumes))
        if missing:
            return f"containers[{container['name']}].volumeMounts: volumes {missing} not found"
    return None


def rbac_attributes(method: str, path: str, query: dict) -> tuple[str, str, str]:
    """The RBAC verb, API group and resource of a request: ("get", "batch", "jobs/status"), ("list", "", "pods")."""
    m = _RESOURCE.match(path)
    if not m:
        return method.lower(), "", path
    group, resource, name, sub = m.groups()
    if name is None:
        watch = query.get("watch", ["false"])[0] in ("true", "1")
        verb = {"GET": "watch" if watch else "list", "POST": "create", "DELETE": "deletecollection"}[method]
    else:
        verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "POST": "create"}[method]
    return verb, group or "", f"{resource}/{sub}" if sub else resource


def _select(items: list[dict], query: dict) -> list[dict]:
    """labelSelector with `key=value` terms, the form dagster-k8s uses."""
    terms = [t.split("=", 1) for s in query.get("labelSelector", []) for t in s.split(",") if t]
    return [i for i in items if all(i["metadata"].get("labels", {}).get(k) == v for k, v in terms)]


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Success" if code < 300 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in Path(folder).rglob("*") if p.is_file()}
