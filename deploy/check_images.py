"""Refuse every image reference under deploy/ that a registry could change under us: pin by digest.

A tag (`1.13.27`, `15.10`) can be re-pushed, and a node that pulls it again runs other code than the one reviewed.
So every third-party image (the Dagster webserver and daemon, the chart's helper images, the CUDA base image, the CI
job images, oauth2-proxy) must be `name:tag@sha256:<64 hex>`; our own training image is tagged with the commit SHA by
CI (`${CI_COMMIT_SHA}`), which only CI pushes. Run by CI's check-images job before anything is deployed:

    python deploy/check_images.py [deploy-dir]

prints one line per refused reference (`file: where: reference: why`) and exits 1, or exits 0 when all are pinned.
To pin an image, resolve its tag once with registry access and write the digest next to the tag, e.g.
`crane digest docker.io/library/busybox:1.37.0` or `docker buildx imagetools inspect <ref>` (the index digest, so
every platform resolves).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

OWN_IMAGE = "rg.fr-par.scw.cloud/foxhunt-ci/training"
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_COMMIT_TAGGED = re.compile(r"^(rg\.fr-par\.scw\.cloud/foxhunt-ci/training|\$\{?TRAINING_IMAGE\}?):\$\{?CI_COMMIT_SHA\}?$")


def _chart_image(image: dict) -> str:
    """The reference the Dagster chart renders from an image block: `repository@digest` when a digest is given
    (dagster images), otherwise `[registry/]repository:tag` (tag may carry `@sha256:...` for the helper images)."""
    if image.get("digest"):
        return f"{image['repository']}@{image['digest']}"
    name = f"{image['registry']}/{image['repository']}" if image.get("registry") else image["repository"]
    return f"{name}:{image.get('tag', '')}"


def _walk(node, where: str):
    """(where, reference) for every image in a YAML document: `image:` values (strings, chart blocks, GitLab's
    `{name: ...}`), GitLab `services:`, and `*_IMAGE` environment values."""
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{where}.{key}" if where else str(key)
            if key == "image" and isinstance(value, str):
                yield here, value
            elif key == "image" and isinstance(value, dict) and "repository" in value:
                yield here, _chart_image(value)
            elif key == "image" and isinstance(value, dict) and "name" in value:
                yield here, value["name"]
            elif key == "services" and isinstance(value, list):
                for i, service in enumerate(value):
                    yield f"{here}[{i}]", service["name"] if isinstance(service, dict) else service
            else:
                yield from _walk(value, here)
        if str(node.get("name", "")).endswith("_IMAGE") and isinstance(node.get("value"), str):
            yield f"{where}.{node['name']}", node["value"]
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{where}[{i}]")


def references(deploy: Path) -> list[tuple[str, str]]:
    """(file: where, reference) for every image reference under `deploy`: Dockerfile FROM lines and YAML files."""
    out = []
    for path in sorted(p for p in Path(deploy).rglob("*") if p.is_file()):
        name = path.relative_to(deploy.parent)
        if path.name == "Dockerfile" or path.suffix == ".Dockerfile":
            for number, line in enumerate(path.read_text().splitlines(), 1):
                words = [w for w in line.split() if not w.startswith("--")]
                if words and words[0].upper() == "FROM":
                    out.append((f"{name}:{number}", words[1]))
        elif path.suffix in (".yaml", ".yml"):
            for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
                out += [(f"{name}: {where or i}", ref) for where, ref in _walk(doc, "")]
    return out


def problem(reference: str) -> str | None:
    """Why a reference is refused (None: it is pinned)."""
    if _COMMIT_TAGGED.match(reference):
        return None  # our image, tagged with the commit by CI
    if _DIGEST.search(reference):
        return None
    if "@sha256:" in reference:
        return "not a sha256 digest (a placeholder: resolve the tag and write its digest)"
    tag = reference.rpartition("/")[2].partition(":")[2]
    return (
        f"the tag {tag!r} can be re-pushed: pin it by digest (name:tag@sha256:...)"
        if tag
        else "no tag and no digest (the registry's newest): pin it by digest"
    )


def refused(deploy: Path) -> list[str]:
    return [f"{where}: {ref}: {why}" for where, ref in references(deploy) if (why := problem(ref))]


def main(argv: list[str]) -> int:
    deploy = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent)
    lines = refused(deploy)
    for line in lines:
        print(line, file=sys.stderr)
    if lines:
        print(f"{len(lines)} image reference(s) under {deploy} are not pinned by digest", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
