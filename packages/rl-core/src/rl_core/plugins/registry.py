"""The plugin registry: discovery through entry points, typed records keyed by name, selection by priority.

Plugins are modules named by entry points in the ``rl_core`` group. The core's own parts (``rl_core.plugins.builtin``)
are one of them: rl-core declares the entry point ``core = "rl_core.plugins.builtin"`` and it is loaded like any other
(always, and first). A plugin that fails to import is reported and skipped; it becomes an error only when the
config selects something it would have provided. ``RL_CORE_DISABLE_PLUGINS=a,b`` blocks plugins by entry-point
name (the core cannot be blocked).
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Iterable, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import attrs
import pluggy
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rl_core.base.errors import PluginError, closest
from rl_core.plugins import hookspecs
from rl_core.plugins.specs import KINDS, CliCommandSpec, ComponentSpec, TaskSpec

if TYPE_CHECKING:
    from rl_core.training.context import HookRelay

log = logging.getLogger(__name__)

#: a kind of record, by its class (typed lookups) or by its name (``"training_backend"``, ...).
S = TypeVar("S", bound=ComponentSpec | CliCommandSpec)

ENTRY_POINT_GROUP = "rl_core"
DISABLE_ENV = "RL_CORE_DISABLE_PLUGINS"
BUILTIN = "core"

#: First-party components and the plugin (entry-point name) and pip requirement that provide them. Used only to
#: word errors when a component is missing; the core never imports these packages.
FIRST_PARTY: dict[str, tuple[str, str]] = {
    "dtensor": ("dtensor", "rl-backend-dtensor"),
    "megatron": ("megatron", "rl-backend-megatron"),
    "vllm": ("vllm", "rl-rollout-vllm[cpu]' (or 'rl-rollout-vllm[cuda]' on a GPU machine)"),
    "remote": ("reward_server", "rl-reward-server"),
    "math_verify": ("reward_server", "rl-reward-server"),
    "reward_model": ("reward_server", "rl-reward-server"),
    "reasoning_gym": ("reasoning_gym", "rl-env-reasoning-gym"),
}
_FIRST_PARTY_KIND: dict[str, tuple[str, ...]] = {
    "training_backend": ("dtensor",),
    "rollout_engine": ("vllm",),
    "reward_source": ("remote",),
}


@attrs.frozen(kw_only=True)
class PluginInfo:
    """One discovered plugin and what became of it."""

    name: str
    distribution: str
    version: str
    #: "conflict": it clashes with a plugin loaded before it (only ``rl-core plugins`` gets this far; a run stops)
    status: Literal["loaded", "failed", "disabled", "conflict"]
    error: str | None = None
    #: what to do about ``error``.
    advice: str = ""
    hooks: tuple[str, ...] = ()
    #: the module holding its hooks (its top-level package's loggers show on the run's terminal).
    module: str = ""
    #: a loaded plugin built for another rl-core than the one installed (its declared range), else "".
    warning: str = ""


@attrs.frozen(kw_only=True)
class Registered:
    """A record and the plugin that registered it."""

    spec: ComponentSpec | CliCommandSpec
    plugin: str


def import_advice(exc: BaseException, module: str, distribution: str) -> str:
    """What to do about a plugin module that failed to import: a dependency it imports is missing (install that), its
    own module is missing (the installation is broken: reinstall it), or its code raised (report it to its authors)."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        own = module.split(".")[0]
        if exc.name == own or module.startswith(exc.name + ".") or exc.name.startswith(own + "."):
            return f"Its own module is missing: reinstall it: pip install --force-reinstall {distribution}"
        return (
            f"It needs {exc.name!r}, which is not installed: install the package that provides it (often pip install "
            f"{exc.name.split('.')[0]}), or {distribution} with the extra that brings it"
        )
    return f"Its code failed while importing: update {distribution}, or report the error to its authors"


def disabled_from_env() -> frozenset[str]:
    raw = os.environ.get(DISABLE_ENV, "")
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


def core_range_warning(dist: metadata.Distribution | None) -> str:
    """ "" when ``dist`` declares no rl-core range or the installed rl-core is in it; else what is wrong and the fix."""
    installed = metadata.version("rl-core")
    for line in (dist.requires or []) if dist is not None else []:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) != "rl-core" or requirement.marker is not None:
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            name = dist.metadata["Name"] if dist is not None else "?"
            return (
                f"{name} is built for rl-core {requirement.specifier} but rl-core {installed} is installed: "
                f"install a {name} made for it (pip install -U {name}) or an rl-core in its range"
            )
    return ""


def _dist_of(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = ep.dist
    if dist is None:
        return "?", "?"
    return dist.metadata["Name"], dist.version


class Registry:
    """All components registered by the core and the loaded plugins."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self._components: dict[str, dict[str, Registered]] = {kind: {} for kind in KINDS}
        #: record a clash between plugins (status "conflict") instead of raising it: ``rl-core plugins``
        self.lenient = False

    # -- building -------------------------------------------------------------------------------------------------

    @classmethod
    def discover(
        cls,
        *,
        entry_points: bool = True,
        disabled: Iterable[str] | None = None,
        extra: Sequence[tuple[str, object]] = (),
        lenient: bool = False,
    ) -> Registry:
        """Build the registry: the core's own entry point, then (with ``entry_points``) every other plugin of the
        ``rl_core`` group not disabled, then ``extra`` (``(name, module_or_object)`` pairs, for tests). Two plugins
        of one name, or two components of one kind and name, are an error; with ``lenient`` the later one is
        listed as a conflict instead (what ``rl-core plugins`` shows)."""
        reg = cls()
        reg.lenient = lenient
        blocked = disabled_from_env() if disabled is None else frozenset(disabled)
        found = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
        core = [ep for ep in found if ep.name == BUILTIN]
        if not core:
            raise PluginError(
                f"rl-core's own entry point ({ENTRY_POINT_GROUP}: {BUILTIN}) is missing: the package metadata is "
                "stale or broken; reinstall it: pip install --force-reinstall rl-core"
            )
        reg._add(BUILTIN, core[0].load(), *_dist_of(core[0]))
        for ep in found if entry_points else []:
            if ep.name == BUILTIN:
                continue
            dist, version = _dist_of(ep)
            if ep.name in blocked:
                reg.plugins[ep.name] = PluginInfo(name=ep.name, distribution=dist, version=version, status="disabled")
                continue
            try:
                module = ep.load()
            except Exception as exc:  # a broken plugin must not break the others
                advice = import_advice(exc, ep.module, dist)
                log.warning(
                    "plugin %r (%s %s) failed to import and is skipped: %r. %s", ep.name, dist, version, exc, advice
                )
                reg.plugins[ep.name] = PluginInfo(
                    name=ep.name, distribution=dist, version=version, status="failed", error=repr(exc), advice=advice
                )
                continue
            reg._add(ep.name, module, dist, version)
            warning = core_range_warning(ep.dist)
            if warning and reg.plugins[ep.name].status == "loaded":
                log.warning("plugin %r: %s", ep.name, warning)
                reg.plugins[ep.name] = attrs.evolve(reg.plugins[ep.name], warning=warning)
        for name, module in extra:
            reg._add(name, module, name, "0")
        return reg

    def _add(self, name: str, module: object, dist: str, version: str) -> None:
        if name in self.plugins and self.plugins[name].status == "loaded":
            other = self.plugins[name]
            self._conflict(
                f"{name} ({dist})",
                PluginInfo(name=name, distribution=dist, version=version, status="conflict"),
                f"two plugins are named {name!r}: from {other.distribution} {other.version} and from {dist} {version}. "
                f"Keep one: pip uninstall {dist} (or {other.distribution}); rl-core plugins lists what is installed",
            )
            return
        self.pm.register(module, name=name)
        collected: dict[str, list[Any]] = {}
        try:
            for kind, record_cls in KINDS.items():
                hook = record_cls.hook
                impls = [i for i in getattr(self.pm.hook, hook).get_hookimpls() if i.plugin_name == name]
                records: list[Any] = []
                for impl in impls:
                    for record in impl.function() or []:
                        if not isinstance(record, record_cls):
                            raise TypeError(f"{hook} returned {type(record).__name__}, expected {record_cls.__name__}")
                        records.append(record)
                collected[kind] = records
        except Exception as exc:
            self.pm.unregister(name=name)
            log.warning("plugin %r (%s %s) failed to register and is skipped: %r", name, dist, version, exc)
            self.plugins[name] = PluginInfo(
                name=name,
                distribution=dist,
                version=version,
                status="failed",
                error=repr(exc),
                advice=f"Its hooks failed while registering: update {dist}, or report the error to its authors",
            )
            return
        for kind, records in collected.items():
            for record in records:
                existing = self._components[kind].get(record.name)
                if existing is not None:
                    first = self.plugins.get(existing.plugin)
                    first_dist = f"{first.distribution} {first.version}" if first else existing.plugin
                    self.pm.unregister(name=name)
                    self._conflict(
                        name,
                        PluginInfo(name=name, distribution=dist, version=version, status="conflict"),
                        f"{KINDS[kind].words} {record.name!r} is registered twice: by {first_dist} "
                        f"(plugin {existing.plugin!r}) and by {dist} {version} (plugin {name!r}); "
                        f"uninstall one, or block one with {DISABLE_ENV}={name}",
                    )
                    return
        for kind, records in collected.items():
            for record in records:
                self._components[kind][record.name] = Registered(spec=record, plugin=name)
        hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(module) or []))
        where = module.__name__ if isinstance(module, types.ModuleType) else type(module).__module__
        self.plugins[name] = PluginInfo(
            name=name, distribution=dist, version=version, status="loaded", hooks=hooks, module=where
        )

    def _conflict(self, key: str, info: PluginInfo, message: str) -> None:
        """A plugin that clashes with one loaded before it: an error, or (``lenient``) listed and left out."""
        if not self.lenient:
            raise PluginError(message)
        self.plugins[key] = attrs.evolve(info, error=message)

    # -- lookup ---------------------------------------------------------------------------------------------------

    @overload
    def specs(self, kind: type[S]) -> dict[str, S]: ...
    @overload
    def specs(self, kind: str) -> dict[str, Any]: ...
    def specs(self, kind: type[Any] | str) -> dict[str, Any]:
        """Records of one kind (its record class, or its name), by name."""
        return {name: reg.spec for name, reg in self._components[kind_name(kind)].items()}

    def owner(self, kind: type[Any] | str, name: str) -> PluginInfo:
        return self.plugins[self._components[kind_name(kind)][name].plugin]

    @overload
    def get(self, kind: type[S], name: str) -> S: ...
    @overload
    def get(self, kind: str, name: str) -> Any: ...
    def get(self, kind: type[Any] | str, name: str) -> Any:
        """The record ``name`` of ``kind``, or a PluginError saying why it is not there and what to install."""
        found = self._components[kind_name(kind)].get(name)
        if found is None:
            raise PluginError(self.why_missing(kind, name))
        return found.spec

    def task(self, name: str) -> TaskSpec:
        """The task ``name`` (what ``data.task`` names before any ``:VARIANT``), or a PluginError saying what to
        install."""
        return self.get(TaskSpec, name)

    def why_missing(self, kind: type[Any] | str, name: str) -> str:
        """Why no ``kind`` is registered as ``name``, and what to do. A first-party component names the plugin
        that provides it; otherwise a plugin of the same name that failed or is disabled is offered as the likely
        cause (an entry point does not say what a plugin would have registered)."""
        kind = kind_name(kind)
        words = KINDS[kind].words
        known = name in FIRST_PARTY
        plugin, package = FIRST_PARTY.get(name, (name, ""))
        info = self.plugins.get(plugin)
        available = ", ".join(sorted(self._components[kind])) or "none"
        provided = (
            f"is provided by plugin {plugin!r}"
            if known
            else f"is not registered; plugin {plugin!r}, which may provide it,"
        )
        if info is not None and info.status == "disabled":
            return (
                f"{words} {name!r} {provided} ({info.distribution}) is disabled by "
                f"{DISABLE_ENV}={os.environ.get(DISABLE_ENV, plugin)}; remove {plugin!r} from it, or select another "
                f"{words} (available: {available})"
            )
        if info is not None and info.status == "failed":
            return (
                f"{words} {name!r} {provided} ({info.distribution} {info.version}) failed to import: {info.error}. "
                f"{info.advice}"
            )
        hint = f" Install it: pip install '{package}'." if package else ""
        failed = sorted(p.name for p in self.plugins.values() if p.status == "failed")
        also = f" Plugins that failed to import: {', '.join(failed)} (rl-core plugins shows why)." if failed else ""
        close = closest(name, self._components[kind])
        meant = f" Did you mean {close!r}?" if close else ""
        return f"no {words} named {name!r} is installed (available: {available}).{meant}{hint}{also}"

    def section_classes(self) -> dict[str, type]:
        """Config sections contributed by registered components: ``config_key -> config_class``."""
        out: dict[str, type] = {}
        for kind, cls in KINDS.items():
            for reg in self._components[kind].values():
                spec = reg.spec
                if cls.owns_section and isinstance(spec, ComponentSpec) and spec.config_key and spec.config_class:
                    out[spec.config_key] = spec.config_class
        return out

    def unavailable(self) -> str:
        """The plugins that are installed but not loaded (disabled, or failed to import), as a sentence for an error
        (empty when there are none)."""
        disabled = [f"plugin {p.name!r} ({p.distribution})" for p in self.plugins.values() if p.status == "disabled"]
        failed = [
            f"plugin {p.name!r} ({p.distribution}: {p.error})" for p in self.plugins.values() if p.status == "failed"
        ]
        out = ""
        if disabled:
            out += f"; disabled by {DISABLE_ENV}={os.environ.get(DISABLE_ENV, '')}: {', '.join(disabled)}"
        if failed:
            out += f"; failed to import: {', '.join(failed)} (rl-core plugins shows why)"
        return out or "; install the plugin that provides it, or remove the section"

    def install_hint(self, kind: type[Any] | str) -> str:
        """How to install the first-party component of ``kind``, if there is one (``: pip install 'PKG'``)."""
        kind = kind_name(kind)
        packages = sorted({pkg for comp, (_p, pkg) in FIRST_PARTY.items() if comp in _FIRST_PARTY_KIND.get(kind, ())})
        return f": pip install '{packages[0]}'" if packages else ""

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def packages(self) -> frozenset[str]:
        """The top-level packages of the loaded plugins (``rl_core`` included)."""
        return frozenset(p.module.split(".")[0] for p in self.plugins.values() if p.status == "loaded" and p.module)

    @property
    def hook(self) -> HookRelay:
        """The lifecycle hooks, typed (``rl_core.plugins.hookspecs.HookRelay``)."""
        hooks: HookRelay = self.pm.hook
        return hooks


def kind_name(kind: type[Any] | str) -> str:
    """The registry's name of a kind given as its record class or its name; an unknown one is an error."""
    name = kind if isinstance(kind, str) else getattr(kind, "kind", "")
    if name not in KINDS:
        raise PluginError(f"unknown kind of component {kind!r}; the kinds are {', '.join(KINDS)}")
    return name
