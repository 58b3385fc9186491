#!/usr/bin/env python3
"""The CycloneDX 1.5 SBOM (JSON) of one of the workspace's binaries: every crate compiled to build
it, from cargo's own view of the build (`cargo tree` for the target, with the features of the
`cargo build` hack/build-static.sh runs) and Cargo.lock (the crates' checksums).

Usage: hack/sbom.py PACKAGE BINARY TARGET OUT_FILE
  e.g. hack/sbom.py csi-provisioner-rs csi-provisioner x86_64-unknown-linux-musl out/csi-provisioner.cdx.json

Components:
  scope "required"  the crates linked into the binary (normal dependencies, not proc macros);
  scope "excluded"  the crates only run while building it: build scripts' dependencies, proc
                    macros and what they depend on (CycloneDX's scope for what is not shipped).
Crates from crates.io have a purl (pkg:cargo/NAME@VERSION) and the SHA-256 of their .crate (the
checksum of Cargo.lock); the workspace's own crates have neither, and the property
"cdx:cargo:source" = "workspace".
The output depends only on Cargo.toml/Cargo.lock (no time stamp, no random serial number, no
paths), so the same tree gives the same bytes: hack/build-images.sh hashes it with the binaries.
Run from anywhere; it uses the repository this script is in. Needs cargo (offline: run it after
the build, which downloaded every crate).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# `cargo tree --prefix depth -f '{p}|{l}'`: "<depth><name> v<version>[ (<path>)][ (proc-macro)]|<licence>[ (*)]"
LINE = re.compile(r"^(\d+)(\S+) v(\S+)(?: \(([^)]*)\))?(?: \(proc-macro\))?\|(.*?)(?: \(\*\))?$")


class SbomError(Exception):
    pass


def cargo_tree(target, edges):
    """Nodes {(name, version): (licence, is_workspace)} and edges {node: {child}} of every root
    cargo builds by default (the workspace's default members, as `cargo build --bin ...` does)."""
    cmd = ["cargo", "tree", "--locked", "--offline", "--target", target, "-e", edges,
           "--prefix", "depth", "-f", "{p}|{l}"]
    out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout
    nodes, children, stack = {}, {}, []
    for line in out.splitlines():
        if not line.strip():
            continue
        m = LINE.match(line)
        if not m:
            raise SbomError(f"unexpected line from {' '.join(cmd)}: {line!r}")
        depth, name, version, path, licence = int(m[1]), m[2], m[3], m[4], m[5]
        node = (name, version)
        nodes[node] = (licence, path is not None and path != "proc-macro")
        children.setdefault(node, set())
        del stack[depth:]
        if stack:
            children[stack[-1]].add(node)
        stack.append(node)
    return nodes, children


def reachable(children, root):
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(children.get(node, ()))
    return seen


def lock_checksums():
    """{(name, version): sha256} of Cargo.lock's registry packages."""
    sums = {}
    for block in (REPO / "Cargo.lock").read_text().split("[[package]]")[1:]:
        fields = dict(re.findall(r'^(\w+) = "([^"]*)"$', block, re.M))
        if "checksum" in fields:
            sums[(fields["name"], fields["version"])] = fields["checksum"]
    return sums


def ref(node):
    return f"pkg:cargo/{node[0]}@{node[1]}"


def main(argv):
    if len(argv) != 5:
        raise SbomError("usage: hack/sbom.py PACKAGE BINARY TARGET OUT_FILE")
    package, binary, target, out_file = argv[1:]
    nodes, children = cargo_tree(target, "normal,build")
    linked_nodes, linked_children = cargo_tree(target, "normal,no-proc-macro")
    roots = [n for n in nodes if n[0] == package]
    if len(roots) != 1:
        raise SbomError(f"package {package} is not (once) in the default members' tree: {roots}")
    root = roots[0]
    built = reachable(children, root) - {root}
    linked = reachable(linked_children, root) - {root}
    if not linked <= built:
        raise SbomError(f"linked crates outside the build graph: {sorted(linked - built)}")
    sums = lock_checksums()

    def component(node):
        licence, workspace = nodes[node]
        c = {"type": "library", "bom-ref": ref(node), "name": node[0], "version": node[1],
             "scope": "required" if node in linked else "excluded"}
        if licence:
            c["licenses"] = [{"expression": licence}]
        if workspace:
            c["properties"] = [{"name": "cdx:cargo:source", "value": "workspace"}]
        else:
            if node not in sums:
                raise SbomError(f"{node[0]} {node[1]} has no checksum in Cargo.lock")
            c["purl"] = ref(node)
            c["hashes"] = [{"alg": "SHA-256", "content": sums[node]}]
        return c

    licence, _ = nodes[root]
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "hack/sbom.py",
                                      "description": "cargo tree and Cargo.lock"}]},
            "component": {"type": "application", "bom-ref": ref(root), "name": binary,
                          "version": root[1], "licenses": [{"expression": licence}],
                          "properties": [{"name": "cdx:cargo:package", "value": package},
                                         {"name": "cdx:rust:target", "value": target}]},
        },
        "components": [component(n) for n in sorted(built)],
        "dependencies": [{"ref": ref(n), "dependsOn": sorted(ref(c) for c in children[n])}
                         for n in sorted(built | {root})],
    }
    Path(out_file).write_text(json.dumps(bom, separators=(",", ":")) + "\n")
    print(f"sbom.py: {out_file}: {binary} {root[1]}: {len(linked)} crates linked, "
          f"{len(built) - len(linked)} more at build time only", file=sys.stderr)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except (SbomError, subprocess.CalledProcessError, OSError) as err:
        print(f"sbom.py: {err}", file=sys.stderr)
        sys.exit(1)
