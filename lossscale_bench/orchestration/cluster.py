"""Joining the Ray cluster a study runs on, and refusing one that can never run it.

Why this is its own module: ``ray.init`` on a wrong ``--address`` retries for
many minutes without a word, and Ray accepts a trial no node can hold and
waits for it forever. Both are user errors that deserve one line and exit 2
before any MLflow run is opened: :func:`probe_address` and :func:`connect_ray`
say why a cluster cannot be joined (:class:`ClusterUnavailable`),
:func:`check_feasible` which study-file field asks for what no node has
(:class:`Infeasible`). Ray is imported inside the functions that use it.
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any


class ClusterUnavailable(RuntimeError):
    """``--address`` names a Ray cluster this process cannot join; the message says why."""


class Infeasible(ClusterUnavailable):
    """No node of the cluster can ever hold some trial's resources (a user error: exit 2).

    Ray would accept the request and wait, silently, for a node that never
    comes; this is raised instead, naming the study file's field and what the
    cluster has. ``LSBENCH_SKIP_RESOURCE_CHECK=1`` (or ``lsbench run
    --no-resource-check``) skips the check for clusters whose autoscaler adds nodes on demand.
    """


#: seconds to wait for a TCP answer from ``--address`` before ray.init (which would retry for minutes),
#: unless ``LSBENCH_ADDRESS_TIMEOUT_S`` says otherwise (read when probing: :func:`probe_timeout`)
PROBE_TIMEOUT_S = 5.0


def probe_timeout() -> float:
    """``LSBENCH_ADDRESS_TIMEOUT_S`` (a number > 0), else :data:`PROBE_TIMEOUT_S`."""
    from ..core.env_vars import env_number

    return float(env_number("LSBENCH_ADDRESS_TIMEOUT_S", PROBE_TIMEOUT_S))


def _host_port(address: str) -> tuple[str, int] | None:
    """``host:port``, ``ray://host:port``, ``[::1]:6379`` -> (host, port); None when there is no port."""
    rest = address.split("://", 1)[1] if "://" in address else address
    rest = rest.split("/", 1)[0]
    if rest.startswith("["):  # IPv6
        host, _, tail = rest[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host, int(port)


#: the largest TCP port; a larger one would make the probe's connect() fail with an unrelated error
_MAX_PORT = 65535


#: the HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, a Ray Client
#: server) answers with its own SETTINGS frame (frame type 4, the 4th byte of the 9-byte header)
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _speaks_grpc(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        sock.sendall(_H2_HELLO)
        head = b""
        while len(head) < 9:
            chunk = sock.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except OSError:
        return False
    return len(head) == 9 and head[3] == 4


def probe_address(address: str, timeout: float | None = None) -> None:
    """Raise :class:`ClusterUnavailable` unless a Ray cluster can answer on ``address``'s port.

    ``ray.init`` keeps retrying an address for many minutes without a word when
    nobody answers there, or when something other than Ray does (every attempt
    waits ~40 s, 20 attempts). So first one TCP connect with a timeout (a host
    that does not resolve, a closed port, a firewall), then an HTTP/2 hello that
    any gRPC server, Ray's GCS included, answers at once (skipped with TLS,
    ``RAY_USE_TLS``). ``auto`` and addresses without a port are left to Ray, which fails fast on them.
    """
    hp = _host_port(address)
    if hp is None:
        return
    timeout = probe_timeout() if timeout is None else timeout
    host, port = hp
    if port > _MAX_PORT:
        raise ClusterUnavailable(
            f"cannot join the Ray cluster at {address}: port {port} is not a TCP port (0 to {_MAX_PORT})"
        )
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true") or _speaks_grpc(sock, timeout):
                return
        why = (
            f"something answers on {host} port {port}, but not a Ray cluster (no gRPC reply within "
            f"{timeout:g} s; the head's `ray status` prints the address to use)"
        )
    except socket.gaierror:
        why = f"the host name {host!r} does not resolve"
    except TimeoutError:
        why = f"no answer from {host} port {port} within {timeout:g} s (a firewall, or the wrong host)"
    except ConnectionRefusedError:
        why = f"nothing listens on {host} port {port} (is the cluster up? `ray start --head` prints its address)"
    except OSError as exc:
        why = f"{host} port {port} cannot be reached ({exc.strerror or exc})"
    raise ClusterUnavailable(f"cannot join the Ray cluster at {address}: {why}")


def _first_words(text: str, cause: BaseException) -> str:
    """The first line of Ray's error, cut before any traceback it quotes ("Last connection error:
    Traceback (most recent call last): ..." from a GCS that never answered): one line, no traceback."""
    first = text.strip().splitlines()[0] if text.strip() else type(cause).__name__
    for marker in ("Last connection error", "Traceback"):
        if marker in first:
            first = first[: first.index(marker)]
    return first.strip().rstrip(".:;, ")[:300] or type(cause).__name__


def connect_ray(address: str | None, num_cpus: int | None, quiet: bool, env_vars: dict | None = None) -> bool:
    """Join ``address`` (else ``$RAY_ADDRESS``) or start a local Ray; True if this call started it.

    An address is probed first (:func:`probe_address`); a join that fails says why in one line.
    ``env_vars`` (a repeatable study's kernel pins, core/portable.py) must be in every worker before it
    starts. A local Ray inherits them: they are set in this process's environment first, and its
    raylet and workers are its children. A joined cluster's nodes do not inherit it, so there they
    go in the job's ``runtime_env``. Not for the local Ray too: a job ``runtime_env`` makes Ray start
    a dedicated worker for each trial instead of using its pre-started pool; on this loaded 2-core
    machine a study started that way once saw its worker starts pass Ray's 60 s registration
    timeout (raylet errors on the terminal, both trials retried). Inherited, the local Ray starts
    its workers as it does without the switch.
    """
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # our funnel writes each result to MLflow inside Tune's result processing, which Tune times
    # and calls "a performance bottleneck" past 0.5 s; read by ray.tune at import, so set it first
    os.environ.setdefault("TUNE_WARN_THRESHOLD_S", "30")
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": not quiet,
        "configure_logging": True,
        "logging_level": "WARNING",
    }
    if address:
        probe_address(address)
        if env_vars:
            kwargs["runtime_env"] = {"env_vars": dict(env_vars)}
        try:
            ray.init(address=address, **kwargs)
        except ValueError as exc:
            # Ray's own check of the address text ("Invalid address format: foo"), or a ray:// address
            # without the ray[client] extra: a user error, said before any connection is tried
            raise ClusterUnavailable(
                f"cannot join the Ray cluster at {address}: {str(exc).strip()[:300]} "
                "(--address takes host:port, ray://host:port or auto; "
                "see docs/guide/cluster.md)"
            ) from None
        except (ConnectionError, RuntimeError) as exc:
            cause = exc
            while cause.__cause__ is not None:
                cause = cause.__cause__
            text = str(cause)
            if "auth" in text.lower() and "token" in text.lower():
                raise ClusterUnavailable(
                    f"cannot join the Ray cluster at {address}: the cluster's authentication token is missing "
                    "or wrong (a cluster started with token authentication, Ray's default, needs "
                    "RAY_AUTH_MODE=token and its token in ~/.ray/auth_token or RAY_AUTH_TOKEN on this "
                    "machine; see docs/guide/cluster.md)"
                ) from None
            raise ClusterUnavailable(
                f"cannot join the Ray cluster at {address}: {_first_words(text, cause)} "
                "(is a Ray head running there and reachable from here? "
                "see docs/guide/cluster.md)"
            ) from None
    else:
        os.environ.update(env_vars or {})  # inherited by the raylet and every worker (see above)
        # address="local": always a fresh instance of our own, never a cluster some other
        # process left running on this machine (that is what --address is for). Ray 2.60 warns on
        # every such start that token authentication is on; for an instance that lives only as long
        # as this process, on this machine, that is noise between the user and a one-line error.
        import logging

        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kwargs)
    return True


def _resource_field(study, row: int, key: str) -> str:
    """Where the study file sets ``key`` for scaling entry ``row``: its own override or the study's."""
    entry = study.scaling[row] if 0 <= row < len(study.scaling) else None
    own = entry.resources.given() if entry is not None and entry.resources is not None else {}
    return f"scaling[{row}].resources.{key}" if key in own else f"resources.{key}"


def check_feasible(study, trials, nodes: list[dict[str, float]], *, local: bool = False) -> None:
    """Raise :class:`Infeasible` if some trial's resources fit no node of ``nodes`` (or no node has
    its backend's device); every distinct field at fault is named, in one line.

    ``local``: the cluster is the Ray instance ``lsbench run`` started here, whose CPUs are
    logical: too few of them is fixed by ``--num-cpus`` (trials then share the cores), which
    the message says first, before the autoscaler's way out.
    """
    from .placement import trial_bundles, unplaceable

    problems: dict[str, str] = {}
    cpus_short = 0.0
    for cfg in trials:
        found = unplaceable(cfg.resources, nodes)
        if found:
            key, why = found
            problems.setdefault(_resource_field(study, cfg.row, key), why)
            if key != "backend":
                cpus_short = max(cpus_short, sum(b.get("CPU", 0.0) for b in trial_bundles(cfg.resources)))
    if problems:
        src = getattr(study, "source", "") or "study"
        most = max((float(n.get("CPU", 0.0)) for n in nodes), default=0.0)
        # logical CPUs share the real ones: worth saying for a few more, not for a typo's thousand
        sensible = local and cpus_short and cpus_short <= max(4 * most, 4)
        advice = (
            f"--num-cpus {int(math.ceil(cpus_short))} gives this machine's Ray that many logical CPUs "
            "(trials then share its cores); "
            if sensible
            else ""
        )
        raise Infeasible(
            f"{src}: "
            + "; ".join(f"{f}: {why}" for f, why in problems.items())
            + f" ({advice}if an autoscaler adds such nodes on demand: --no-resource-check or "
            "LSBENCH_SKIP_RESOURCE_CHECK=1)"
        )


def cluster_nodes() -> list[dict[str, float]]:
    """Resource totals of each alive node of the connected Ray cluster."""
    import ray

    return [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]


def resource_check_skipped() -> bool:
    """``LSBENCH_SKIP_RESOURCE_CHECK=1``: an autoscaler adds the nodes a study needs on demand."""
    from ..core.env_vars import env_flag

    return env_flag("LSBENCH_SKIP_RESOURCE_CHECK")
