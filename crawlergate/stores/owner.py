"""Whose cache folder this is: one site's pages per folder, never two apps' in one.

A gate with no ``l2.cache_dir`` gets a folder of its own under the user's cache directory, named
after the site it protects (its public URL, else its origin) or, for middleware that has neither,
after the application it wraps. A marker file in the folder records whose it is; a gate of another
site (another public URL or origin) that is given the same folder refuses to start instead of serving
that site's pages.

    owner = FolderOwner(origin="http://127.0.0.1:8000")
    claim_folder(Path("/var/cache/crawlergate"), owner)  # ConfigError when another site's
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import sys
from dataclasses import asdict, astuple, dataclass
from pathlib import Path

from crawlergate.errors import ConfigError

# In the cache folder: whose pages it holds.
MARKER_FILE = "crawlergate-site.json"
# Under the per-user cache root: one folder per site or app, beside the folder older versions shared.
SITES_FOLDER = "sites"
_UNSAFE_NAME = re.compile(r"[^a-z0-9.]+")
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FolderOwner:
    """A gate's identity as far as its cache folder is concerned: the site's public URL, its origin (a
    proxy's), or the application a middleware wraps (when the site has no URL in the settings)."""

    public_url: str = ""
    origin: str = ""
    app: str = ""

    @property
    def known(self) -> bool:
        return bool(self.public_url or self.origin or self.app)

    def same_site(self, other: FolderOwner) -> bool:
        """Compared by the first URL both have: a public URL, then an origin (which may move behind an unchanged
        public URL). A public URL on one side and only an origin on the other cannot be compared: not the same
        site. An application's name never makes a folder another site's: it changes when the project moves."""
        for mine, theirs in ((self.public_url, other.public_url), (self.origin, other.origin)):
            if mine and theirs:
                return _normal(mine) == _normal(theirs)
        mine_url, their_url = self.public_url or self.origin, other.public_url or other.origin
        return not (mine_url and their_url)

    def describe(self) -> str:
        return self.public_url or self.origin or f"the application {self.app}"

    @property
    def identity(self) -> str:
        """What names the default folder: the public URL, else the origin, else the application."""
        return _normal(self.public_url or self.origin) or self.app


def site_folder(root: Path, owner: FolderOwner) -> Path:
    """The default cache folder of ``owner`` under ``root``: readable (host and port, or project folder and
    application), and distinct per identity."""
    identity = owner.identity or "default"
    if "://" in identity:
        readable = identity.split("://", 1)[1]
    else:  # "KIND at FILE,FILE" or "KIND in FOLDER": the project's folder, the file and the kind
        kind, _, place = identity.partition(" at ") if " at " in identity else identity.partition(" in ")
        where = Path(place.split(",")[0])
        project = f"{where.parent.name}-{where.stem}" if " at " in identity else where.name
        readable = f"{project}-{kind.split(':')[0].rsplit('.', 1)[-1]}"
    readable = _UNSAFE_NAME.sub("-", readable.lower()).strip("-.")[:40].strip("-.") or "site"
    digest = hashlib.blake2b(identity.encode(), digest_size=5).hexdigest()
    return root / SITES_FOLDER / f"{readable}-{digest}"


def claim_folder(folder: Path, owner: FolderOwner) -> None:
    """Record ``owner`` as the folder's, or raise ConfigError (one sentence) when it holds another site's pages.

    A folder without a marker (a new one, or one from before markers) becomes ``owner``'s. The marker is
    rewritten when the owner is the same site seen with more names (an origin that moved, a public URL added,
    the application behind a proxy's origin).
    """
    if not owner.known:
        return
    blocking = next((path for path in (folder, *folder.parents) if path.exists() and not path.is_dir()), None)
    if blocking == folder:
        raise ConfigError(f"The cache folder {folder} is a file, not a folder: give l2.cache_dir a folder.")
    if blocking is not None:
        raise ConfigError(f"The cache folder {folder} cannot be made: {blocking} is a file. Give another folder.")
    marker = folder / MARKER_FILE
    recorded = read_owner(marker)
    if recorded is not None and not owner.same_site(recorded):
        if recorded.public_url and not owner.public_url:  # the setting forgotten, most likely
            advice = f"give it the public URL {recorded.public_url!r} (server.public_url, or a site's public_url)"
        else:  # its pages hold links to the old address until they are filled again
            advice = f"delete {marker} to make the folder this gate's, or the folder to begin empty"
        raise ConfigError(
            f"The cache folder {folder} holds the pages of {recorded.describe()}, and this gate is for "
            f"{owner.describe()}: give this gate a folder of its own (l2.cache_dir, --cache-dir), or, if it "
            f"is the same site at a new address, {advice}."
        )
    if recorded is not None:
        owner = FolderOwner(*(_kept(new, old) for new, old in zip(astuple(owner), astuple(recorded), strict=True)))
        if recorded == owner:
            return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"Cache directory {folder} is not usable: {exc.strerror or exc}.") from exc
    try:
        temporary = folder / f".{MARKER_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        temporary.write_text(json.dumps(asdict(owner), indent=1) + "\n")
        if recorded is None:
            # Two gates starting at once on a new folder: the first marker wins, the other gate reads it.
            try:
                os.link(temporary, marker)
            except FileExistsError:
                os.unlink(temporary)
                claim_folder(folder, owner)
                return
            os.unlink(temporary)
        else:
            os.replace(temporary, marker)
    except OSError as exc:
        raise ConfigError(f"Cannot write {marker}: {exc.strerror or exc}.") from exc


def read_owner(marker: Path) -> FolderOwner | None:
    """The owner a marker records; None when there is none. An unreadable marker is an error, not a new folder."""
    try:
        recorded = json.loads(marker.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"The cache folder's marker {marker} cannot be read ({exc}); delete it.") from exc
    if not isinstance(recorded, dict):
        raise ConfigError(f"The cache folder's marker {marker} is not a JSON object; delete it.")
    fields = {name: str(recorded.get(name) or "") for name in ("public_url", "origin", "app")}
    return FolderOwner(**fields)


def app_identity(app: object) -> str:
    """An application's name that stays the same however it is launched (uvicorn, gunicorn, ``python app.py``)
    and differs between two projects: what it is, and the file that defines it (Flask's import name, Django's
    settings module, the module of a Starlette or FastAPI app's routes; the folder it runs from when none)."""
    for layer in _layers(app):
        import_name = getattr(layer, "import_name", None)
        if isinstance(import_name, str) and import_name:
            return f"{_kind(layer)}:{import_name}{_place(_module_file(import_name))}"
        settings_module = os.environ.get("DJANGO_SETTINGS_MODULE", "")
        if type(layer).__module__.startswith("django.") and settings_module:
            return f"django:{settings_module}{_place(_module_file(settings_module))}"
        modules = {
            module
            for route in getattr(layer, "routes", None) or ()
            if isinstance(module := getattr(getattr(route, "endpoint", None), "__module__", None), str)
        }
        files = sorted({_module_file(module) for module in modules} - {""})
        if files:
            return f"{_kind(layer)} at {','.join(files[:8])}"
    code = getattr(app, "__code__", None)
    return _kind(app) + _place(os.path.abspath(code.co_filename) if code is not None else "")


def _place(file: str) -> str:
    """`` at FILE``; `` in FOLDER`` (the folder the process runs from) when the file is not known."""
    if file:
        return f" at {file}"
    with contextlib.suppress(OSError):
        return f" in {os.getcwd()}"
    return ""


def _layers(app: object) -> list[object]:
    """The app and what it wraps: Flask's bound ``wsgi_app``, Starlette's middleware stack (``add_middleware``
    hands the gate the stack's inner layers, whose innermost is the router)."""
    layers: list[object] = []
    layer: object = app
    while layer is not None and len(layers) < 16 and not any(layer is seen for seen in layers):
        layers.append(layer)
        layer = getattr(layer, "__self__", None) or getattr(layer, "app", None)
    return layers


def _module_file(name: str) -> str:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    return os.path.abspath(path) if isinstance(path, str) else ""


def _kind(app: object) -> str:
    named = app if callable(app) and hasattr(app, "__qualname__") else type(app)
    return f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', '?')}"


def _kept(new: str, old: str) -> str:
    """A marker's field: the new value, unless it is empty or only spelled differently."""
    return old if not new or _normal(new) == _normal(old) else new


def _normal(url: str) -> str:
    return url.strip().rstrip("/").lower()


@functools.cache
def warn_of_shared_folder(root: Path, catalogue_name: str) -> None:
    """Say once that the folder every gate shared before per-site folders is no longer used: it may hold the
    pages of several apps mixed, so no site takes it over (it is neither read nor moved)."""
    if (root / catalogue_name).exists() and not (root / MARKER_FILE).exists():
        logger.warning(
            "%s holds pages from an earlier crawlergate, which every gate with default settings shared; it is no "
            "longer used (each site has its folder under %s now). Its pages may be several apps' pages mixed: "
            "delete everything in it but %s/.",
            root,
            root / SITES_FOLDER,
            SITES_FOLDER,
        )
