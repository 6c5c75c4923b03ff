"""`python -m selgate.conformance.probe SPEC RESULT [--declare FILE]`: imports an outside
implementation in a process of its own and writes its validated declarations to RESULT (JSON),
so that the process deciding `selgate check`'s verdict never imports or calls the kernel.

Whatever the import does is caught here and written as a reason: an exception, `sys.exit`
with any code, KeyboardInterrupt. What cannot be caught (`os._exit`, a signal, a hang) leaves
RESULT unwritten, and the caller names it from the exit status or its own timeout, which starts
when the probe begins importing the module (`importing_marker`): selgate's own start-up, torch's
import among it, is not charged to the kernel.

RESULT holds `{"ok": true, "declared": {...}}` (the declarations the whole check uses: the
workers describe the implementation from them and call it in executors) or `{"ok": false, "usage": bool, "error": str}`;
`usage` marks the caller's mistakes (a malformed spec, a module or callable that does not
exist, a declaration that does not validate), which `selgate check` reports as exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path


def _missing(error: ModuleNotFoundError, module: str) -> bool:
    """The spec's module (or a package above it) does not exist, as opposed to a module that
    exists and imports something missing."""
    return bool(error.name) and (module == error.name or module.startswith(error.name + "."))


def probe(spec: str, declare: str | None, importing: Path | None = None) -> dict:
    """The result for `spec`; `importing` is touched once selgate's own modules (torch among
    them) are in, so the caller's import timeout measures the kernel's module alone."""
    from . import declarations
    from .registry import load_user_impl

    if importing is not None:
        importing.touch()
    module = spec.partition(":")[0]
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # the check starts this process with PYTHONSAFEPATH
    try:
        if module:
            importlib.import_module(module)
    except BaseException as e:  # noqa: BLE001 - an import may raise anything, SystemExit included
        if isinstance(e, ModuleNotFoundError) and _missing(e, module):
            return {"ok": False, "usage": True, "error": f"impl {spec}: no module named {e.name!r}"}
        what = f"sys.exit({e.code!r})" if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}"
        return {"ok": False, "usage": False, "error": f"importing {module} ended in {what}"}
    try:  # the module is imported: what fails now is the spec or the declarations
        impl = load_user_impl(spec, declare, what="impl")
    except (ValueError, ImportError, AttributeError, TypeError, OSError) as e:
        return {"ok": False, "usage": True, "error": str(e)}
    declared = declarations.to_json(impl.declared)
    if "varlen" in declared:
        declared["varlen"] = declarations.varlen_source(spec, declare)
    return {"ok": True, "declared": declared}


def importing_marker(result: Path) -> Path:
    """The file whose existence says the probe has started importing the kernel's module."""
    return result.with_name(result.name + ".importing")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m selgate.conformance.probe", description=__doc__)
    p.add_argument("spec")
    p.add_argument("result")
    p.add_argument("--declare")
    args = p.parse_args(argv)
    result = probe(args.spec, args.declare, importing_marker(Path(args.result)))
    Path(args.result).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
