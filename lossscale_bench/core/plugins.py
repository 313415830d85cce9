"""The plug-in registry: every model, scaling method, precision and data set a study may name, each
described once (torch-free, standard library only).

A plug-in is a :class:`Plugin`: its kind and name, what builds it (an import path
``package.module:attribute``, never an import), its options (:class:`Option`: type, default, allowed
values, a one-line doc), its display name, its version (bumped when its code changes what a trial
trains to: the trial ids of that name alone change), where it comes from (built in, an entry point of
an installed distribution, an import path a study names) and, outside the package, a digest of its
source (in the trial id, so an edited plug-in never reuses old results). ``description`` carries the
kind's own torch-free description (a method's entry class, a precision's table row, a data set's
schema model).

The built-ins register themselves where they are described (``register`` next to the description,
like timm's ``@register_model``): the study layer's model entries (``study/models/``), method entries
(``study/methods/``), precision table (``study/precisions.py``) and data sets (``study/datasets.py``).
Distributions add plug-ins through the entry-point groups :data:`ENTRY_POINT_GROUPS`, found with
``importlib.metadata`` and loaded only when a study names them. ``lossscale_bench.study.plugins``
is the view that has every built-in registered (:func:`names`, :func:`entry` here see only what
has registered so far).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "BUILT_IN",
    "DESCRIBERS",
    "ENTRY_POINT_GROUPS",
    "IMPORT_PATH",
    "KINDS",
    "OFFERED_PARAMS",
    "Option",
    "Plugin",
    "PluginError",
    "entries",
    "entry",
    "entry_point_names",
    "file_digest",
    "is_import_path",
    "load_entry_point",
    "module_file",
    "load_descriptions",
    "names",
    "register",
]

#: the kinds of plug-in, in the order ``lsbench plugins`` lists them
KINDS = ("model", "method", "precision", "dataset")
#: kind -> the entry-point group an installed distribution declares its plug-ins in
ENTRY_POINT_GROUPS = {k: f"lossscale_bench.{k}s" for k in KINDS}
#: the origin of a plug-in described in the package
BUILT_IN = "built in"


class PluginError(ValueError):
    """A plug-in that cannot be found, loaded or used; the message is one line for the user."""


#: ``package.module:callable``
IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*\Z")
#: what the trial gives a builder named by import path where its signature takes it (never a study's option)
OFFERED_PARAMS = {"model": (), "dataset": ("image_size", "max_val_images")}


def is_import_path(text) -> bool:
    """Whether ``text`` is written as an import path ``package.module:callable``."""
    return isinstance(text, str) and IMPORT_PATH.match(text) is not None


@dataclass(frozen=True)
class Option:
    """One option of a plug-in: a model option, a method's key, a data set's key."""

    name: str
    #: the type in words (``int``, ``float``, ``bool``, ``str``, ``path``, ...)
    type: str = "any"
    #: the value when not given (None: the plug-in's own choice)
    default: Any = None
    #: the values allowed, or None for any value of the type
    allowed: tuple | None = None
    #: what it does, in one line
    doc: str = ""


@dataclass(frozen=True)
class Plugin:
    """One registered plug-in (see the module doc)."""

    kind: str
    name: str
    #: ``package.module:attribute`` of what builds it (imported only when a trial needs it)
    target: str
    options: tuple[Option, ...] = ()
    #: the report's name for it (None: the name)
    display: str | None = None
    #: bumped when its code changes what a trial trains to (None: never bumped)
    version: int | None = None
    #: :data:`BUILT_IN`, ``entry point <group> of <distribution> <version>`` or ``import path <file>``
    origin: str = BUILT_IN
    #: sha256 of its source (outside the package only: built-ins are covered by their version)
    digest: str | None = None
    #: the kind's own description (a method entry class, a precision spec, a data set schema)
    description: Any = field(default=None, compare=False, repr=False)
    #: the one-line doc of the plug-in, for listings
    doc: str = ""
    #: the options a study must give (a callable's parameters without a default)
    required: tuple[str, ...] = ()

    @property
    def display_name(self) -> str:
        return self.display or self.name

    @property
    def built_in(self) -> bool:
        return self.origin == BUILT_IN

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)

    def identity(self) -> dict:
        """What this plug-in adds to a trial id: its version where it has one and, outside the
        package, its origin and digest (a built-in adds nothing else, so built-in ids stay)."""
        out: dict = {} if self.version is None else {"version": self.version}
        if not self.built_in:
            out.update(origin=self.origin, digest=self.digest)
        return out


_REGISTERED: dict[str, dict[str, Plugin]] = {k: {} for k in KINDS}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise PluginError(f"unknown plug-in kind {kind!r}; allowed: {', '.join(KINDS)}")


def register(kind: str, name: str, target: str, **fields) -> Plugin:
    """Describe a plug-in once: ``register("model", "ssd_tiny", "lossscale_bench.models.ssd:ssd_tiny",
    options=(...), display="SSD-tiny", version=2)``. A second description of the same name is an error
    (one name, one plug-in), unless it is identical (a module imported twice)."""
    _check_kind(kind)
    if ":" not in target:
        raise PluginError(f"{kind} {name!r}: target {target!r} is not an import path package.module:attribute")
    plugin = Plugin(kind=kind, name=name, target=target, **fields)
    old = _REGISTERED[kind].get(name)
    if old is not None and replace(old, description=None) != replace(plugin, description=None):
        raise PluginError(f"{kind} {name!r} is registered twice ({old.origin}; {plugin.origin})")
    _REGISTERED[kind][name] = plugin
    return plugin


def names(kind: str, *, entry_points: bool = True) -> tuple[str, ...]:
    """Every registered name of ``kind``, in registration order, then the entry points' names
    (``entry_points=False``: the package's own only, as the reference pages list them)."""
    _check_kind(kind)
    own = tuple(_REGISTERED[kind])
    if not entry_points:
        return tuple(n for n in own if _REGISTERED[kind][n].built_in)
    return own + tuple(n for n in entry_point_names(kind) if n not in _REGISTERED[kind])


def entries(kind: str) -> tuple[Plugin, ...]:
    """Every plug-in of ``kind``, entry points loaded."""
    return tuple(entry(kind, n) for n in names(kind))


def entry(kind: str, name: str) -> Plugin:
    """The plug-in ``name`` of ``kind``: registered, or an entry point loaded now."""
    _check_kind(kind)
    found = _REGISTERED[kind].get(name)
    if found is not None:
        return found
    if name in entry_point_names(kind):
        return load_entry_point(kind, name)
    raise PluginError(f"unknown {kind} {name!r}; allowed: {', '.join(names(kind))}")


def load_descriptions(kind: str, wanted, loaded: dict) -> dict:
    """``loaded``, with the description of every name of ``wanted`` it lacks added (name -> what the
    plug-in describes itself with: a method entry, a precision spec, a data set's schema). Entry points
    load here, late, so that a plug-in's module may import the study layer; one that fails (its module
    still being imported, or broken) is left out now, tried again on the next call, and named by
    ``lsbench plugins``."""
    for name in wanted:
        if name not in loaded:
            try:
                loaded[name] = entry(kind, name).description
            except PluginError:
                continue
    return loaded


# ------------------------------------------------------------------------------------ entry points
_FOUND: dict[str, dict] = {}


def _entry_points(kind: str) -> dict:
    """name -> entry point of ``kind``'s group, read once per process (a scan of every installed
    distribution's metadata: a distribution installed later is seen by the next process)."""
    if kind not in _FOUND:
        from importlib.metadata import entry_points

        _FOUND[kind] = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUPS[kind])}
    return _FOUND[kind]


def entry_point_names(kind: str) -> tuple[str, ...]:
    """The names installed distributions declare in ``kind``'s group (nothing is imported)."""
    return tuple(sorted(_entry_points(kind)))


def _distribution_digest(dist, target_file: str | None) -> str:
    """sha256 of a distribution's name, version, its files' RECORD hashes (or bytes where RECORD has
    none) and the target module's bytes (an editable install's RECORD does not cover its source)."""
    from pathlib import Path

    h = hashlib.sha256(f"{dist.metadata['Name']}\n{dist.version}\n".encode())
    for f in sorted(dist.files or (), key=str):
        if f.hash is not None:
            h.update(f"{f}:{f.hash.mode}={f.hash.value}\n".encode())
    if target_file and Path(target_file).is_file():
        h.update(Path(target_file).read_bytes())
    return h.hexdigest()[:16]


def load_entry_point(kind: str, name: str) -> Plugin:
    """Load the entry point ``name`` of ``kind``'s group and register what it describes.

    The entry point names the plug-in's description: for a model, its builder callable (taken as
    an import path: not imported here); for a method, a precision or a data set, the torch-free
    description the package's own would register (a ``MethodEntry`` subclass, a ``PrecisionSpec``,
    a data set schema model), which ``lossscale_bench.study.plugins`` turns into a :class:`Plugin`
    through the describer registered for the kind.
    """
    ep = _entry_points(kind).get(name)
    if ep is None:
        raise PluginError(f"unknown {kind} {name!r}; allowed: {', '.join(names(kind))}")
    dist = ep.dist
    where = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an unnamed distribution"
    origin = f"entry point {ENTRY_POINT_GROUPS[kind]} of {where}"
    describe = DESCRIBERS.get(kind)
    if describe is None:
        raise PluginError(f"{kind} {name!r} ({origin}): plug-ins of this kind are not loadable here")
    plugin = describe(name, ep.value, origin)
    target_file = module_file(ep.value.split(":")[0])
    digest = _distribution_digest(dist, target_file) if dist is not None else file_digest(target_file)
    plugin = replace(plugin, origin=origin, digest=digest)
    _REGISTERED[kind][name] = plugin
    return plugin


#: kind -> ``describe(name, target, origin) -> Plugin`` for a plug-in from outside the package (set by
#: the study layer, which knows each kind's description)
DESCRIBERS: dict[str, Any] = {}


# ------------------------------------------------------------------------------------ source files
def module_file(module: str) -> str | None:
    """The file of ``module`` without running it (its parent packages are imported), or None."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def file_digest(path: str | None) -> str:
    """sha256 (16 hex digits) of a file's bytes; ``missing`` where there is none."""
    from pathlib import Path

    if not path or not Path(path).is_file():
        return "missing"
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
