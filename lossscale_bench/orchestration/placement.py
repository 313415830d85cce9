"""Where a trial goes: the Ray resources of a trial, its placement text, what the cluster can hold.

Pure resource arithmetic, no Ray import: the study runner uses it to schedule and
the CLI to print ``--dry-run`` tables, the multi-device launcher (``distributed``)
to build its worker group. It sits with them in ``orchestration``, above ``trial``.
"""

from __future__ import annotations

#: CPU share the Tune trial (the Train driver) itself holds; it only polls a queue
DRIVER_CPUS = 0.25
#: Ray resource of one device per backend (None: CPU only)
DEVICE_RESOURCE = {"cpu": None, "cuda": "GPU", "hpu": "HPU", "xla": "TPU"}


def devices_of(resources: dict) -> int:
    return int(resources.get("devices_per_trial", 1) or 1)


def is_distributed(resources: dict) -> bool:
    return devices_of(resources) > 1


def threads_of(resources: dict) -> int:
    """Intra-op threads of a trial's process: its whole CPUs (``cpus_per_trial``), at least one."""
    return max(1, int(float(resources.get("cpus_per_trial", 1))))


def backend_of(resources: dict) -> str:
    """The trial's backend; ``auto`` is refused for several devices (Ray reserves devices by name)."""
    backend = resources.get("backend", "cpu")
    if backend == "auto" and is_distributed(resources):
        raise ValueError(
            "resources.backend auto cannot be used with devices_per_trial > 1: "
            "name the backend (cpu, cuda, hpu, xla) so Ray can reserve its devices"
        )
    return backend


def driver_bundle(resources: dict) -> dict[str, float]:
    """What the Tune trial (the Train driver) holds: a CPU share, no device."""
    return {"CPU": DRIVER_CPUS}


def worker_bundles(resources: dict) -> list[dict[str, float]]:
    """The Train worker group's placement group: one bundle per worker."""
    backend = backend_of(resources)
    n = devices_of(resources)
    cpus = float(resources.get("cpus_per_trial", 1))
    dev = DEVICE_RESOURCE.get(backend)
    if backend == "xla":  # one worker holds every chip; torch_xla starts a process per chip
        return [{"CPU": cpus, "TPU": float(n)}]
    bundle = {"CPU": cpus}
    if dev:
        bundle[dev] = 1.0
    return [dict(bundle) for _ in range(n)]


def _fmt(x: float) -> str:
    return f"{x:g}"


def placement_text(resources: dict) -> str:
    """One-line placement for ``--dry-run``, e.g. ``CPU:0.25 + 8×{CPU:1, GPU:1}``."""
    if not is_distributed(resources):
        backend = resources.get("backend", "cpu")
        dev = DEVICE_RESOURCE.get(backend) or ("auto" if backend == "auto" else None)
        parts = [f"CPU:{_fmt(float(resources.get('cpus_per_trial', 1)))}"]
        if dev:
            parts.append(f"{dev}:{devices_of(resources)}")
        return ", ".join(parts)
    try:
        bundles = worker_bundles(resources)
    except ValueError:  # backend auto: nothing to reserve a device by
        return f"auto:{devices_of(resources)} (not placeable: name the backend)"
    inner = ", ".join(f"{k}:{_fmt(v)}" for k, v in bundles[0].items())
    return f"CPU:{_fmt(DRIVER_CPUS)} + {len(bundles)}×{{{inner}}}"


def infeasible(resources: dict, cluster: dict[str, float]) -> str | None:
    """Why the cluster (``ray.cluster_resources()``) can never hold this trial, or None."""
    need: dict[str, float] = dict(driver_bundle(resources))
    for b in worker_bundles(resources):
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    short = {k: (v, float(cluster.get(k, 0.0))) for k, v in need.items() if float(cluster.get(k, 0.0)) + 1e-9 < v}
    if not short:
        return None
    what = ", ".join(f"{k} {_fmt(v)} (cluster has {_fmt(have)})" for k, (v, have) in short.items())
    return (
        f"a {devices_of(resources)}-device {resources.get('backend')} trial needs {what}; "
        f"add nodes with that resource (docs/guide/cluster.md) or lower resources.devices_per_trial"
    )


def tune_concurrency(trial_resources: list[dict], cluster: dict[str, float]) -> int | None:
    """``max_concurrent_trials`` so that Tune does not start many trials that can only wait for devices.

    Tune schedules a multi-device trial by its driver's CPU share only. For each
    kind of trial (backend × devices_per_trial) this counts how many fit the
    cluster at once, ``floor(cluster[R] / need[R])`` over its resources, capped
    by how many such trials there are, and returns the sum. None when no trial
    is multi-device (Tune's own accounting is exact then). In a mixed study a
    kind may briefly start more than fit while another kind waits in Tune's
    queue; its surplus Train runs then wait for their placement group.
    """
    if not any(is_distributed(r) for r in trial_resources):
        return None
    kinds: dict[tuple, list] = {}
    for r in trial_resources:
        key = (r.get("backend", "cpu"), devices_of(r), float(r.get("cpus_per_trial", 1)))
        kinds.setdefault(key, []).append(r)
    total = 0
    for rs in kinds.values():
        r = rs[0]
        need: dict[str, float] = {}
        for b in worker_bundles(r) if is_distributed(r) else [single_bundle(r)]:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + v
        fit = min((int(float(cluster.get(k, 0.0)) // v) for k, v in need.items() if v > 0), default=len(rs))
        total += max(1, min(fit, len(rs)))
    return total


def single_bundle(resources: dict) -> dict[str, float]:
    """The one Tune bundle of a single-device trial (``CPU`` plus its device)."""
    from ..backends import ray_resources

    return ray_resources(
        resources.get("backend", "cpu"), devices_of(resources), float(resources.get("cpus_per_trial", 1))
    )


# --------------------------------------------------------------------------- can the cluster ever hold it?
# Ray never refuses a request no node can meet: it logs "infeasible" and waits for a node that may
# never come (an autoscaler could add one), so a study asking for a GPU on a CPU cluster hangs in
# silence. The study runner asks these functions first, on the nodes' totals, and stops with one line.

#: a device resource's plain name for messages
_DEVICE_WORDS = {"GPU": "GPU", "HPU": "HPU (Gaudi)", "TPU": "TPU chip"}


def trial_bundles(resources: dict) -> list[dict[str, float]]:
    """Every bundle a trial holds at once, each of which must fit on one node.

    A single-device trial is one Tune bundle (``CPU`` plus its device); a
    multi-device trial is the Tune driver's bundle plus its Train workers'.
    Raises ``ValueError`` for ``backend: auto`` with several devices.
    """
    if is_distributed(resources):
        return [driver_bundle(resources)] + worker_bundles(resources)
    return [single_bundle(resources)]


def _plural(n: float, word: str) -> str:
    return f"{_fmt(n)} {word}" + ("" if n == 1 else "s")


def cluster_text(nodes: list[dict[str, float]], also: tuple[str, ...] = ()) -> str:
    """``the cluster has 2 CPUs, no GPU``: CPUs and every device kind it has, ``no X`` for ``also``
    (the devices the study asked for); per-node maxima when there are several nodes."""
    several = len(nodes) > 1
    parts = [_plural(len(nodes), "node")] if several else []
    for key in ("CPU", *[d for d in _DEVICE_WORDS if d != "CPU"]):
        total = sum(float(n.get(key, 0.0)) for n in nodes)
        if total <= 0:
            if key in also:
                parts.append(f"no {key}")
            continue
        text = _plural(total, key)
        most = max(float(n.get(key, 0.0)) for n in nodes)
        if several and most < total:
            text += f" (at most {_fmt(most)} on one node)"
        parts.append(text)
    return "the cluster has " + (", ".join(parts) if parts else "no resources")


def unplaceable(resources: dict, nodes: list[dict[str, float]]) -> tuple[str, str] | None:
    """``(resources key at fault, why)`` if no arrangement of ``nodes`` can ever run the trial, else None.

    ``nodes``: each alive node's resource totals (``ray.nodes()[i]["Resources"]``).
    Checked: the backend's device exists at all (key ``backend``); each bundle
    fits some node (``devices_per_trial`` or ``cpus_per_trial``, whichever is
    short); a multi-device trial's bundles together fit the cluster's totals.
    These are necessary conditions only, so a trial is never refused that Ray
    could place; the key names the study-file field the user should change.
    """
    backend = resources.get("backend", "cpu")
    dev = DEVICE_RESOURCE.get(backend)
    also = (dev,) if dev else ()
    where = cluster_text(nodes, also)
    try:
        bundles = trial_bundles(resources)
    except ValueError as exc:
        return "backend", str(exc)
    if dev and sum(float(n.get(dev, 0.0)) for n in nodes) <= 0:
        return "backend", f"{backend} trials need a {_DEVICE_WORDS.get(dev, dev)}, but {where}"
    for b in bundles:
        if any(all(float(n.get(k, 0.0)) + 1e-9 >= v for k, v in b.items()) for n in nodes):
            continue
        short = [k for k, v in b.items() if max((float(n.get(k, 0.0)) for n in nodes), default=0.0) + 1e-9 < v]
        need = ", ".join(f"{k}:{_fmt(v)}" for k, v in b.items())
        key = "devices_per_trial" if dev in short else "cpus_per_trial"
        what = "no node has that much" if short else "no node has all of it"
        return key, f"a trial needs {need} on one node, but {what} ({where})"
    if len(bundles) > 1:
        need: dict[str, float] = {}
        for b in bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + v
        for k in sorted(need, key=lambda k: k != dev):  # the device first: it is what a user sized
            v, have = need[k], sum(float(n.get(k, 0.0)) for n in nodes)
            if have + 1e-9 < v:
                key = "devices_per_trial" if k == dev else "cpus_per_trial"
                return key, (
                    f"a {devices_of(resources)}-device trial needs {_plural(v, k)} in all "
                    f"(its {len(bundles) - 1} workers and driver), but {where}"
                )
    return None
