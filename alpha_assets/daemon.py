"""The local daemon of `alpha run`: the one of a running `alpha ui` (or `dg dev`) when it has a live heartbeat
(`daemon_alive`), else a `dagster-daemon run` that `alpha run` starts for as long as it follows its backfill
(`Daemon`), and that dies with it (`_die_with_parent`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg

from alpha_assets.dagster_private import daemon_command, daemon_health
from alpha_core.processes import stop_group


def project_root() -> Path:
    return Path(__file__).resolve().parents[1]


def daemon_alive(instance: dg.DagsterInstance, tolerance_s: float = 15.0) -> bool:
    """A daemon that runs backfills (and dequeues runs) has posted a heartbeat within its interval + tolerance."""
    needed = [t for t in ("BACKFILL", "QUEUED_RUN_COORDINATOR") if t in instance.get_required_daemon_types()]
    return all(daemon_health(instance, needed, tolerance_s).values())


class Daemon:
    """`dagster-daemon run` for as long as `alpha run` needs one, unless a live daemon (e.g. `dg dev`'s) exists."""

    def __init__(self, instance: dg.DagsterInstance, env: dict[str, str]) -> None:
        self.instance, self.env, self.proc, self.log = instance, env, None, None

    def ensure(self) -> str | None:
        """Start a daemon if none is alive; returns why following cannot go on, or None."""
        if self.proc is not None:
            if self.proc.poll() is not None:
                return f"dagster-daemon exited with status {self.proc.returncode}; its log: {self.log}"
            return None
        if not daemon_alive(self.instance):
            self.start()
        return None

    def start(self) -> None:
        folder = Path(self.instance.root_directory) / "alpha-run"  # not logs/: Dagster's telemetry moves that
        folder.mkdir(parents=True, exist_ok=True)
        workspace = folder / f"workspace-{os.getpid()}.yaml"  # the location name `dg dev` uses, from any directory
        workspace.write_text(
            json.dumps(
                {
                    "load_from": [
                        {
                            "python_module": {
                                "module_name": "alpha_assets.definitions",
                                "attribute": "defs",
                                "location_name": "alpha",
                                "working_directory": str(project_root()),
                            }
                        }
                    ]
                }
            )
        )
        self.log = folder / f"daemon-{os.getpid()}.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                daemon_command(workspace),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        print(f"started dagster-daemon (pid {self.proc.pid}) for this run; log {self.log}", flush=True)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        stop_group(self.proc)  # its code server and any run worker are in its session
        self.instance.wipe_daemon_heartbeats()  # so the next `alpha run` does not count on this daemon


def _die_with_parent() -> None:
    """In the daemon's process, before exec: Linux sends it SIGTERM if `alpha run` is killed outright."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
