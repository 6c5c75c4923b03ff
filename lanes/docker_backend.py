"""Run a lane's pytest inside the lane's Docker image (`python -m selgate.lanes run <lane>
--docker`), through docker-py, imported only here so that plain runs never need it.

The lane YAML's `image` says how to get the image:
  dockerfile   docker/<kind>.Dockerfile, built from the checkout on every run so the image
               runs the current sources (unchanged layers come from the engine's cache);
               without it the tag must already exist on the engine, or be pullable
  base_image   the Dockerfile's BASE_IMAGE build argument
  build_args   further build arguments, e.g. {PIP_NO_INDEX: "1"} for offline wheels in .whl/
  tag          default `selgate:<lane>`
SELGATE_DOCKER_BUILD_ARGS="KEY=VALUE ..." overrides both (e.g. a local BASE_IMAGE where no
registry is reachable).
GPU lanes get every GPU (`--gpus all`), or only those CUDA_VISIBLE_DEVICES names, which the
container then sees renumbered from 0. The lane's reports folder, Triton cache and CUDA
extension cache are bind mounts, so the JUnit file lands where a local run puts it; files are written as the calling
user (root included: the images run as an unprivileged user otherwise), and pytest writes no
cache into the image's read-only tree. Exit status: the container's (pytest's); ENGINE_ERROR when there is no engine or the
image cannot be had, after one line that says why.
"""

from __future__ import annotations

import codecs
import os
import sys
import time
from pathlib import Path

from selgate import env_vars
from .config import LANE_DIR

ROOT = LANE_DIR.parent
WORKDIR = "/opt/selgate"  # where docker/*.Dockerfile put the sources
CACHE_MOUNT = "/cache/triton"  # the images' TRITON_CACHE_DIR
EXTENSION_CACHE_MOUNT = "/cache/cuda"  # SELGATE_CUDA_CACHE inside: the CUDA extension's builds
ENGINE_ERROR = 125  # what `docker run` itself exits with when the engine fails it


class EngineError(RuntimeError):
    """No usable engine, or no image: the one line to print."""


def image_spec(lane_cfg: dict, environ=os.environ) -> tuple[str, str | None, dict]:
    """(tag, dockerfile or None, build args) from the lane's `image` entry (a mapping, or
    a bare tag) and SELGATE_DOCKER_BUILD_ARGS."""
    image = lane_cfg.get("image") or {}
    if isinstance(image, str):
        return image, None, {}
    args = {str(k): str(v) for k, v in (image.get("build_args") or {}).items()}
    if image.get("base_image"):
        args.setdefault("BASE_IMAGE", str(image["base_image"]))
    for item in env_vars.get("SELGATE_DOCKER_BUILD_ARGS", environ=environ).split():
        key, sep, value = item.partition("=")
        if not (key and sep):
            raise EngineError(f"SELGATE_DOCKER_BUILD_ARGS: expected space-separated KEY=VALUE items, got {item!r}")
        args[key] = value
    return image.get("tag") or f"selgate:{lane_cfg['name']}", image.get("dockerfile"), args


def device_requests(lane_cfg: dict, environ=os.environ) -> list:
    """`--gpus all` for GPU lanes, or the GPUs CUDA_VISIBLE_DEVICES names (ids or UUIDs)."""
    if lane_cfg.get("device") != "cuda":
        return []
    from docker.types import DeviceRequest

    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    ids = [d.strip() for d in visible.split(",") if d.strip()]
    if not ids:
        raise EngineError(f"lane {lane_cfg['name']} needs a GPU, but CUDA_VISIBLE_DEVICES={visible!r} names none")
    return [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]


def container_env(env: dict) -> dict:
    """The lane's variables, the cache mount and the checkout's commit (the image has no
    .git); not CUDA_VISIBLE_DEVICES, whose host numbering means nothing inside."""
    from selgate.environment import commit

    out = {k: str(v) for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
    out["TRITON_CACHE_DIR"] = CACHE_MOUNT
    out["SELGATE_CUDA_CACHE"] = EXTENSION_CACHE_MOUNT
    out.setdefault("SELGATE_COMMIT", commit())
    return out


def volumes(reports_dir, cache_dir, extension_cache_dir=None) -> dict:
    """reports/out/<lane> of the checkout onto the image's, the Triton cache and the CUDA
    extension's builds (both persist between runs on the host)."""
    reports_dir, cache_dir = Path(reports_dir).resolve(), Path(cache_dir).resolve()
    out = {
        str(reports_dir): {"bind": f"{WORKDIR}/reports/out/{reports_dir.name}", "mode": "rw"},
        str(cache_dir): {"bind": CACHE_MOUNT, "mode": "rw"},
    }
    if extension_cache_dir is not None:
        out[str(Path(extension_cache_dir).resolve())] = {"bind": EXTENSION_CACHE_MOUNT, "mode": "rw"}
    return out


def connect():
    """A docker-py client whose engine answers, else EngineError naming where it looked."""
    where = os.environ.get("DOCKER_HOST") or "the default socket unix:///var/run/docker.sock"
    try:
        import docker
    except ImportError:
        raise EngineError("docker-py is not installed (pip install 'docker>=7'); it is needed for --docker only") from None
    try:
        client = docker.from_env()
        client.ping()
    except Exception as e:  # docker-py raises DockerException, requests' and OS errors here
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise EngineError(
            f"no Docker engine reachable at {where} ({reason}); start one (as root: "
            "bash .ci/docker_engine.sh) or run the lane without --docker"
        ) from None
    return client


def build_image(client, tag: str, dockerfile: str, build_args: dict, out) -> None:
    """Build `tag` from the checkout, streaming the engine's log; EngineError on failure."""
    print(
        f"[docker] building {tag} from {dockerfile} "
        f"({', '.join(f'{k}={v}' for k, v in build_args.items()) or 'default build args'})",
        file=out,
        flush=True,
    )
    start = time.monotonic()
    for chunk in client.api.build(
        path=str(ROOT),
        dockerfile=dockerfile,
        tag=tag,
        buildargs=build_args,
        network_mode="host",
        rm=True,
        forcerm=True,
        decode=True,
    ):
        if "error" in chunk:
            raise EngineError(f"docker build of {tag} from {dockerfile} failed: {chunk['error'].strip()}")
        if chunk.get("stream"):
            out.write(chunk["stream"])
            out.flush()
    print(f"[docker] built {tag} in {time.monotonic() - start:.0f} s", file=out, flush=True)


def ensure_image(client, tag: str) -> None:
    """The tag exists on the engine, or is pulled; EngineError when neither."""
    import docker

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        try:
            client.images.pull(tag)
        except docker.errors.APIError as e:
            raise EngineError(
                f"image {tag} is neither on the engine nor pullable ({e.explanation}); "
                "give the lane an image.dockerfile to build it"
            ) from None


def _stream(container, out) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    for chunk in container.logs(stream=True, follow=True):
        out.write(decoder.decode(chunk))
        out.flush()


def run_container(client, tag: str, command: list, *, env: dict, mounts: dict, devices: list, out) -> int:
    """Run to completion, streaming output, as the calling user (the images' own user cannot
    write the bind-mounted reports folder of a checkout it does not own). An interrupt reaches
    pytest inside as SIGINT, and the run is followed until pytest has written the results it has;
    the container is removed whatever happens."""
    container = client.containers.run(
        tag,
        command,
        detach=True,
        environment=env,
        volumes=mounts,
        device_requests=devices or None,
        working_dir=WORKDIR,
        user=f"{os.getuid()}:{os.getgid()}",
    )
    start = time.monotonic()
    try:
        try:
            _stream(container, out)
        except KeyboardInterrupt:
            print(f"[docker] interrupted: SIGINT to pytest in {tag}, waiting for its results", file=out, flush=True)
            container.kill(signal="SIGINT")
            _stream(container, out)
        status = int(container.wait()["StatusCode"])
    finally:
        container.remove(force=True)
    print(f"[docker] {tag} exited {status} after {time.monotonic() - start:.0f} s", file=out, flush=True)
    return status


def run_lane_in_docker(
    lane_cfg: dict, *, pytest_args: list[str], env: dict, reports_dir, cache_dir, extension_cache_dir=None, client=None, out=None
) -> int:
    """Run `python -m pytest *pytest_args` for the lane inside its image; the container's
    exit status, or ENGINE_ERROR after one line on stderr."""
    out = out or sys.stdout
    try:
        client = client or connect()
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return ENGINE_ERROR
    import docker

    try:
        devices = device_requests(lane_cfg)
        tag, dockerfile, build_args = image_spec(lane_cfg)
        if dockerfile:
            build_image(client, tag, dockerfile, build_args, out)
        else:
            ensure_image(client, tag)
        Path(reports_dir).mkdir(parents=True, exist_ok=True)
        for cache in (cache_dir, extension_cache_dir):
            if cache is not None:
                Path(cache).mkdir(parents=True, exist_ok=True)
        command = ["python", "-m", "pytest", "-p", "no:cacheprovider", *pytest_args]  # the image's tree is read-only
        print(f"[docker] running lane {lane_cfg['name']} in {tag}: {' '.join(command)}", file=out, flush=True)
        return run_container(
            client,
            tag,
            command,
            env=container_env(env),
            mounts=volumes(reports_dir, cache_dir, extension_cache_dir),
            devices=devices,
            out=out,
        )
    except (EngineError, docker.errors.DockerException) as e:
        # DockerException: e.g. a GPU lane on an engine without the NVIDIA container toolkit
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        return ENGINE_ERROR
