# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The node artifact: every node-side command of the collection in one zip application.

zerolayer-routectl (and the fence watcher it runs), zerolayer-register-engine, the route
exporter and the store exporter run the collection's own module_utils on nodes that have
nothing but Python's standard library. Instead of copying those files one by one, the
controller builds them into one file, zerolayer-node-VERSION.pyz (Python's zipapp format):

- it holds the modules the commands import, found by reading their imports, and the
  packages of module_utils that hold them (common/ with its __init__.py), so none of the
  controller's that they do not (no drill, notifications, canary steps or CLI); a __main__
  that picks the command by the name it was run under; and a manifest with the version;
- the version is the collection's version and a digest of what the archive holds
  ("0.1.0+3f2a9c0d41b7"), so two nodes with the same version run the same code; the build
  is byte for byte the same for the same sources (fixed times and modes in the zip), so its
  checksum is too;
- the commands are links to it; `COMMAND --version` prints the version and both exporters
  export it (zerolayer_node_artifact_info), so a fleet half upgraded is visible.

Standard library only: the nodes run this module from inside the archive.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import json
import os
import shutil
import sys
import zipfile

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.atomic_files import (
    write_atomic,
    write_text_atomic,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

PACKAGE = "ansible_collections.zerolayer.fleet.plugins.module_utils"
# Command name -> (module in PACKAGE, function). The function reads sys.argv and returns
# the exit status.
COMMANDS = {
    "zerolayer-routectl": ("node.node_cli", "main"),
    "zerolayer-register-engine": ("node.node_cli", "register_hook_main"),
    "zerolayer-route-exporter": ("node.exposition", "exporter_main"),
    "zerolayer-store-exporter": ("telemetry.store_exporter", "exporter_main"),
}
# -sS: only the standard library is needed, and skipping site-packages starts faster (a
# rollback is timed).
INTERPRETER = "/usr/bin/python3 -sS"
MANIFEST = "zerolayer_node_artifact.json"
NAME_PREFIX = "zerolayer-node-"
NAME_SUFFIX = ".pyz"
# The archive's __main__. The commands are links to zerolayer-node.pyz, itself a link to the
# installed version, and Python reads a zip application again by the path it was started
# under at every later import (the node code imports lazily). A process started before an
# upgrade switched the links would then read the new archive with the old one's offsets:
# so the path is resolved to the archive file itself before anything is imported from it,
# and a running process keeps reading the version it started with (the role keeps the
# previous version until the next upgrade).
MAIN = (
    """import os
import sys

started_as = sys.path[0]
sys.path[0] = os.path.realpath(started_as)
sys.path_importer_cache.pop(started_as, None)

from %s.node.node_artifact import main  # noqa: E402

raise SystemExit(main())
"""
    % PACKAGE
)
# Zip entries carry this time and mode, so the same sources give the same bytes.
ENTRY_TIME = (2020, 1, 1, 0, 0, 0)
ENTRY_MODE = 0o644 << 16
# The archive on the host: run by root and by the exporters' own accounts.
EXECUTABLE_MODE = 0o755


def artifact_name(version):
    return "%s%s%s" % (NAME_PREFIX, version, NAME_SUFFIX)


def package_imports(source, source_dir):
    """The modules of PACKAGE (its files in source_dir) a module's source imports, at any
    level (function-local imports too): {"pins", "common.errors", "common", ...}.

    `from PACKAGE.common import errors` imports a module of a package and `from
    PACKAGE.common.errors import FleetError` a name of a module: the folders of source_dir
    tell the two apart."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            inner = _name_in_package(node.module)
            if inner is None:
                continue
            if _is_package(source_dir, inner):
                found.update(_join(inner, alias.name) for alias in node.names)
            else:
                found.add(inner)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                inner = _name_in_package(alias.name)
                if inner:
                    found.add(inner)
    return found


def _name_in_package(module):
    """A module's name in PACKAGE: "common.errors" for PACKAGE.common.errors, "" for
    PACKAGE itself, None for a module outside it."""
    if module == PACKAGE:
        return ""
    if module.startswith(PACKAGE + "."):
        return module[len(PACKAGE) + 1 :]
    return None


def _join(package, name):
    return "%s.%s" % (package, name) if package else name


def _is_package(source_dir, name):
    return not name or os.path.isfile(os.path.join(source_dir, *name.split("."), "__init__.py"))


def module_file(source_dir, name):
    """The file of module `name` of PACKAGE, relative to source_dir: "pins.py",
    "common/errors.py", or a package's __init__.py ("common/__init__.py")."""
    parts = name.split(".")
    if _is_package(source_dir, name):
        return "/".join([*parts, "__init__.py"])
    return "/".join(parts) + ".py"


def _packages_above(name):
    """The packages Python imports before module `name`: "common" for "common.errors"."""
    parts = name.split(".")
    return [".".join(parts[:depth]) for depth in range(1, len(parts))]


def module_closure(source_dir, entries):
    """Sorted names of the modules in source_dir (module_utils) that `entries` need, the
    entries and the packages that hold them included. A module imported but missing is an
    error that names it."""
    seen, todo = set(), list(entries)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = os.path.join(source_dir, module_file(source_dir, name))
        try:
            with open(path, encoding="utf-8") as handle:
                source = handle.read()
        except OSError as exc:
            raise FleetError(
                "node artifact: module %s is imported but %s" % (name, exc.strerror),
                {"module": name},
            ) from None
        seen.add(name)
        todo.extend(package_imports(source, source_dir))
        todo.extend(_packages_above(name))
    return sorted(seen)


def node_modules(source_dir):
    """What the archive holds of module_utils: the commands' modules and this one."""
    entries = {module for module, _function in COMMANDS.values()} | {"node.node_artifact"}
    return module_closure(source_dir, entries)


def collection_version(collection_root):
    """version: from the collection's galaxy.yml (or its MANIFEST.json once built)."""
    manifest = os.path.join(collection_root, "MANIFEST.json")
    if os.path.exists(manifest):
        with open(manifest, encoding="utf-8") as handle:
            return json.load(handle)["collection_info"]["version"]
    with open(os.path.join(collection_root, "galaxy.yml"), encoding="utf-8") as handle:
        for line in handle:
            key, _colon, value = line.partition(":")
            if key.strip() == "version" and not line.startswith((" ", "\t")):
                return value.strip().strip("'\"")
    raise FleetError(
        "node artifact: no version in %s/galaxy.yml" % collection_root, {"field": "version"}
    )


def archive_entries(source_dir, version_base):
    """({name in the zip: bytes}, the manifest included; the manifest as a dict)."""
    modules = node_modules(source_dir)
    entries = {"__main__.py": MAIN.encode()}
    parts = PACKAGE.split(".")
    for depth in range(1, len(parts) + 1):
        entries["/".join(parts[:depth]) + "/__init__.py"] = b""
    for name in modules:
        relative = module_file(source_dir, name)
        with open(os.path.join(source_dir, relative), "rb") as handle:
            entries["/".join(parts) + "/" + relative] = handle.read()
    digest = hashlib.sha256()
    for name in sorted(entries):
        digest.update(name.encode() + b"\0" + hashlib.sha256(entries[name]).digest())
    version = "%s+%s" % (version_base, digest.hexdigest()[:12])
    manifest = {
        "version": version,
        "commands": sorted(COMMANDS),
        "modules": modules,
        "interpreter": INTERPRETER,
    }
    entries[MANIFEST] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    return entries, manifest


def write_archive(entries, path):
    """The zip application at path (written beside it, then renamed into place)."""

    def write(stream):
        stream.write(b"#!" + INTERPRETER.encode() + b"\n")
        with zipfile.ZipFile(stream, "w", zipfile.ZIP_DEFLATED) as archive:
            for name in sorted(entries):
                info = zipfile.ZipInfo(name, ENTRY_TIME)
                info.external_attr = ENTRY_MODE
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, entries[name])

    # An executable every account may run: the exporters run as accounts of their own.
    write_atomic(path, write, mode=EXECUTABLE_MODE)


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def sources_key(source_dir, version_base):
    """A digest of every module in source_dir and the collection's version: what the
    archive is built from, read without parsing anything."""
    digest = hashlib.sha256(version_base.encode() + b"\0")
    for relative in _python_files(source_dir):
        with open(os.path.join(source_dir, relative), "rb") as handle:
            digest.update(relative.encode() + b"\0" + hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()


def _python_files(source_dir):
    """Sorted paths of the .py files in source_dir and its packages, relative to it."""
    found = []
    for directory, folders, names in os.walk(source_dir):
        folders[:] = [folder for folder in folders if folder != "__pycache__"]
        relative = os.path.relpath(directory, source_dir)
        for name in names:
            if name.endswith(".py"):
                found.append(name if relative == "." else "%s/%s" % (relative, name))
    return sorted(found)


def build(collection_root, out_dir):
    """Build (or find, built before from the same sources) the artifact in out_dir.

    Returns {"path", "name", "version", "sha256", "modules"}. The action calls it once for
    every host: reading the imports of the modules is most of a build (about 0.1 s), so what
    a build of the same sources gave is kept beside the archive (sources-KEY.json) and read
    instead."""
    source_dir = os.path.join(collection_root, "plugins", "module_utils")
    version_base = collection_version(collection_root)
    os.makedirs(out_dir, exist_ok=True)
    index = os.path.join(out_dir, "sources-%s.json" % sources_key(source_dir, version_base)[:32])
    try:
        with open(index, encoding="utf-8") as handle:
            built = json.load(handle)
        if sha256_of(built["path"]) == built["sha256"]:
            return built
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not built from these sources yet, or changed since: built again
    entries, manifest = archive_entries(source_dir, version_base)
    path = os.path.join(out_dir, artifact_name(manifest["version"]))
    write_archive(entries, path)
    built = {
        "path": path,
        "name": os.path.basename(path),
        "version": manifest["version"],
        "sha256": sha256_of(path),
        "modules": manifest["modules"],
    }
    write_text_atomic(index, json.dumps(built, sort_keys=True))
    return built


# ------------------------------------------------------------------ on the node


@functools.lru_cache(maxsize=None)
def installed_manifest():
    """The manifest of the archive this module runs from, or None when it runs from a
    checkout or an Ansible module's payload (no node artifact). Read once: a process keeps
    the archive it started with (see MAIN), and the exporters ask on every scrape."""
    loader = globals().get("__loader__")
    archive = getattr(loader, "archive", None)
    if not archive or not archive.endswith(NAME_SUFFIX):
        return None
    try:
        return json.loads(loader.get_data(os.path.join(archive, MANIFEST)))
    except (OSError, ValueError):
        return None


def installed_version():
    """The node artifact's version, or None outside one."""
    manifest = installed_manifest()
    return manifest.get("version") if isinstance(manifest, dict) else None


def usage():
    return "usage: %s COMMAND [ARGS...] | --version\ncommands: %s\n" % (
        os.path.basename(sys.argv[0]),
        ", ".join(sorted(COMMANDS)),
    )


def main(argv=None):
    """Run the command this archive was started as (the link's name), or the one named
    first when it is run as itself."""
    argv = list(sys.argv if argv is None else argv)
    command = os.path.basename(argv[0])
    if command not in COMMANDS:
        if len(argv) > 1 and argv[1] == "--version":
            sys.stdout.write("zerolayer node artifact %s\n" % installed_version())
            return 0
        if len(argv) < 2 or argv[1] not in COMMANDS:
            sys.stderr.write(usage())
            return 2
        command, argv = argv[1], argv[1:]
    if argv[1:2] == ["--version"]:
        sys.stdout.write("%s (zerolayer node artifact) %s\n" % (command, installed_version()))
        return 0
    module, function = COMMANDS[command]
    sys.argv = [command, *argv[1:]]
    return getattr(importlib.import_module("%s.%s" % (PACKAGE, module)), function)()


# ------------------------------------------------------------------ installing it


CURRENT_LINK = NAME_PREFIX.rstrip("-") + NAME_SUFFIX  # zerolayer-node.pyz


def _replace_link(target, path):
    """Point the link at path to target, in one rename (never a moment without it)."""
    directory = os.path.dirname(path)
    temp = os.path.join(directory, ".%s.%d.new" % (os.path.basename(path), os.getpid()))
    if os.path.lexists(temp):
        os.unlink(temp)
    os.symlink(target, temp)
    os.replace(temp, path)


def _link_target(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def installed_versions(dest_dir):
    """Names of the versioned archives in dest_dir."""
    try:
        names = os.listdir(dest_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(NAME_PREFIX) and n.endswith(NAME_SUFFIX))


def install_plan(dest_dir, commands_dir, commands, name, sha256, remove=()):
    """What install() would change: {"copy": bool, "link": bool, "commands": [names to
    link], "stale": [archive names to remove], "remove": [paths to remove], "previous":
    the archive name the current link pointed to (None: none)}."""
    target = os.path.join(dest_dir, name)
    copy = not (os.path.isfile(target) and sha256_of(target) == sha256)
    current = os.path.join(dest_dir, CURRENT_LINK)
    previous = _link_target(current)
    link = previous != name
    relink = [c for c in commands if _link_target(os.path.join(commands_dir, c)) != current]
    versions = installed_versions(dest_dir)
    # The version before this one stays: a process started from it (the fence watcher
    # before its restart) still reads it.
    keep = {name, previous if link else None}
    if not link:
        # Re-run: the previous version is the newest other one still there.
        others = [n for n in versions if n != name]
        others.sort(key=lambda n: os.stat(os.path.join(dest_dir, n)).st_mtime)
        keep.add(others[-1] if others else None)
    stale = [n for n in versions if n not in keep]
    gone = [p for p in remove if os.path.lexists(p)]
    return {
        "copy": copy,
        "link": link,
        "commands": relink,
        "stale": stale,
        "remove": gone,
        "previous": previous,
    }


def install(source, dest_dir, commands_dir, commands, name, sha256, remove=()):
    """Install the archive `name` (its bytes at source; None when it is there already),
    point zerolayer-node.pyz and the commands at it, remove stale versions and the paths in
    remove. Returns the plan it carried out (install_plan)."""
    plan = install_plan(dest_dir, commands_dir, commands, name, sha256, remove)
    target = os.path.join(dest_dir, name)
    if plan["copy"]:
        if source is None or sha256_of(source) != sha256:
            raise FleetError(
                "node artifact %s: the copy that arrived does not have its sha256 %s"
                % (name, sha256),
                {"field": "sha256", "value": sha256},
            )
        with open(source, "rb") as copied:
            write_atomic(target, lambda stream: shutil.copyfileobj(copied, stream), EXECUTABLE_MODE)
    if plan["link"]:
        _replace_link(name, os.path.join(dest_dir, CURRENT_LINK))
    for command in plan["commands"]:
        _replace_link(os.path.join(dest_dir, CURRENT_LINK), os.path.join(commands_dir, command))
    for stale in plan["stale"]:
        os.unlink(os.path.join(dest_dir, stale))
    for path in plan["remove"]:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return plan
