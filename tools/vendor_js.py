#!/usr/bin/env python3
"""Copy the vendored browser libraries from node_modules/ into static/vendor/.

Usage (from anywhere; paths are resolved relative to the repository root):

    npm install                  # installs the exact versions pinned in package.json
    python tools/vendor_js.py    # copies each library's dist file(s) and LICENSE

Libraries (see VENDORED): socket.io-client (dist/socket.io.min.js) and uPlot
(dist/uPlot.iife.min.js and dist/uPlot.min.css). Each version is read from the
package's own package.json and put in the file names (socket.io-<version>.min.js,
LICENSE-socket.io-client-<version>.txt, uPlot-<version>.min.js, ...), so the
templates must be updated when a pin in package.json changes. Vendored files of
other versions are removed.

    python tools/vendor_js.py --check

only verifies that static/vendor/ holds byte-identical copies (exit status 1 if not).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ROOT / "node_modules"
VENDOR = ROOT / "static" / "vendor"

# npm package -> [(file in the package, vendored name with {v} for the version)]
VENDORED = {
    "socket.io-client": [("dist/socket.io.min.js", "socket.io-{v}.min.js"),
                         ("LICENSE", "LICENSE-socket.io-client-{v}.txt")],
    "uplot": [("dist/uPlot.iife.min.js", "uPlot-{v}.min.js"),
              ("dist/uPlot.min.css", "uPlot-{v}.min.css"),
              ("LICENSE", "LICENSE-uPlot-{v}.txt")],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify only; copy nothing")
    args = parser.parse_args(argv)

    pairs = []
    for package, files in VENDORED.items():
        manifest = MODULES / package / "package.json"
        if not manifest.is_file():
            print(f"{manifest} not found: run `npm install` in {ROOT} first", file=sys.stderr)
            return 2
        version = json.loads(manifest.read_text(encoding="utf-8"))["version"]
        pairs += [(MODULES / package / src, VENDOR / name.format(v=version))
                  for src, name in files]

    if args.check:
        stale = [dst for src, dst in pairs if not dst.is_file() or dst.read_bytes() != src.read_bytes()]
        for dst in stale:
            print(f"out of date: {dst.relative_to(ROOT)}", file=sys.stderr)
        return 1 if stale else 0

    VENDOR.mkdir(parents=True, exist_ok=True)
    keep = {dst.name for _, dst in pairs}
    patterns = [name.format(v="*") for files in VENDORED.values() for _, name in files]
    for old in [p for pattern in patterns for p in VENDOR.glob(pattern)]:
        if old.name not in keep:
            old.unlink()
            print(f"removed {old.relative_to(ROOT)}")
    for src, dst in pairs:
        shutil.copyfile(src, dst)
        print(f"{src.relative_to(ROOT)} -> {dst.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
