#!/usr/bin/env python3
"""Checks the sidecar image hack/build-images.sh wrote (docs/supply-chain.md):

  - it holds the sidecar, /usr/local/bin/csi-provisioner, and nothing of the reference driver:
    no file of that name, no other program in /usr/local/bin, no code of the crate
    csi-reference-driver in the binary (its source paths, which panic locations keep);
  - it holds the SBOM, /usr/local/share/sbom/csi-provisioner.cdx.json, the same bytes as the one
    next to the archives;
  - the SBOM describes this binary: CycloneDX, the sidecar at the workspace's version, every
    component at a name and version Cargo.lock has, none of the crates that only the tests or
    the reference driver use, and every crate whose source path the binary holds listed as
    linked (scope "required") at that version.

Usage: hack/check-sidecar-image.py IMAGES_DIR   (the directory hack/build-images.sh printed)
Prints one line per check; exits 1 when one fails.
"""

import json
import re
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BINARY = "usr/local/bin/csi-provisioner"
SBOM = "usr/local/share/sbom/csi-provisioner.cdx.json"
# Crates of the workspace that the sidecar must not contain.
NOT_IN_SIDECAR = ("csi-reference-driver", "csi-testbed", "csi-test-support")
# Crates the sidecar cannot be built without: the SBOM must list them at Cargo.lock's version.
KEY_CRATES = ("kube-client", "k8s-openapi", "tokio", "tonic", "rustls", "csi-spec", "csi-provision")
# A crate's sources as cargo unpacks them: $CARGO_HOME/registry/src/<registry>-<hash>/<name>-<version>/...
CRATE_PATH = re.compile(rb"registry/src/[^/]+-[0-9a-f]{16}/([A-Za-z0-9_-]+?)-(\d+\.\d+\.\d+[A-Za-z0-9.+-]*)/")


def image_files(archive):
    """{path: bytes} of the regular files of a docker-archive's layers (the later layer wins)."""
    files = {}
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=outer.extractfile(layer)) as inner:
                for member in inner.getmembers():
                    name = member.name.lstrip("./")
                    if member.isfile():
                        files[name] = inner.extractfile(member).read()
                    else:
                        files.pop(name, None)
    return files


def lock_packages():
    """{name: {version}} of Cargo.lock."""
    packages = {}
    for block in (REPO / "Cargo.lock").read_text().split("[[package]]")[1:]:
        fields = dict(re.findall(r'^(\w+) = "([^"]*)"$', block, re.M))
        packages.setdefault(fields["name"], set()).add(fields["version"])
    return packages


def workspace_version():
    text = (REPO / "Cargo.toml").read_text()
    return re.search(r'^\[workspace\.package\][^\[]*?^version = "([^"]+)"', text, re.M | re.S)[1]


def main(argv):
    if len(argv) != 2:
        print("usage: hack/check-sidecar-image.py IMAGES_DIR", file=sys.stderr)
        return 2
    images = Path(argv[1])
    failures = []

    def check(ok, what, detail=""):
        print(f"sidecar image: {'ok' if ok else 'FAILED'}: {what}{': ' + detail if detail and not ok else ''}")
        if not ok:
            failures.append(what)

    files = image_files(images / "sidecar.tar")
    binary = files.get(BINARY, b"")
    check(binary.startswith(b"\x7fELF"), f"/{BINARY} is there")
    programs = sorted(p for p in files if p.startswith("usr/local/bin/"))
    check(programs == [BINARY], "no other program in /usr/local/bin", ", ".join(programs))
    driver_files = sorted(p for p in files if "reference-driver" in p or "reference_driver" in p)
    check(not driver_files, "no file of the reference driver", ", ".join(driver_files))
    check(b"reference-driver/src/" not in binary and b"csi_reference_driver" not in binary,
          "no code of the crate csi-reference-driver in the binary")

    sbom_bytes = files.get(SBOM)
    check(sbom_bytes is not None, f"/{SBOM} is there")
    if sbom_bytes is None:
        return 1
    beside = images / "csi-provisioner.cdx.json"
    check(beside.is_file() and beside.read_bytes() == sbom_bytes,
          f"{beside.name} next to the archives is the image's SBOM")

    sbom = json.loads(sbom_bytes)
    meta = sbom.get("metadata", {}).get("component", {})
    check(sbom.get("bomFormat") == "CycloneDX" and sbom.get("specVersion") == "1.5"
          and meta.get("name") == "csi-provisioner" and meta.get("version") == workspace_version(),
          "the SBOM is CycloneDX 1.5 of csi-provisioner at the workspace's version",
          f"{sbom.get('bomFormat')} {sbom.get('specVersion')} {meta.get('name')} {meta.get('version')}")
    components = sbom.get("components", [])
    lock = lock_packages()
    not_locked = sorted(f"{c['name']}@{c['version']}" for c in components
                        if c["version"] not in lock.get(c["name"], ()))
    check(components and not not_locked, f"its {len(components)} components are in Cargo.lock",
          ", ".join(not_locked) or "none")
    listed = {c["name"]: c for c in components}
    unwanted = sorted(n for n in NOT_IN_SIDECAR if n in listed)
    check(not unwanted, "it lists none of " + ", ".join(NOT_IN_SIDECAR), ", ".join(unwanted))
    key_missing = sorted(n for n in KEY_CRATES
                         if n not in listed or listed[n]["scope"] != "required"
                         or listed[n]["version"] not in lock.get(n, ()))
    check(not key_missing, "it lists " + ", ".join(KEY_CRATES) + " as linked, at Cargo.lock's versions",
          ", ".join(key_missing))
    required = {(c["name"], c["version"]) for c in components if c["scope"] == "required"}
    in_binary = {(m[1].decode(), m[2].decode()) for m in CRATE_PATH.finditer(binary)}
    unlisted = sorted(f"{n}@{v}" for n, v in in_binary - required)
    check(in_binary and not unlisted,
          f"the {len(in_binary)} crates whose sources the binary names are listed as linked",
          ", ".join(unlisted) or "the binary names none")
    required_count = len(required)
    print(f"sidecar image: SBOM: {required_count} crates linked, "
          f"{len(components) - required_count} at build time only")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
