"""Assembles the `reloadsafe` package from its Python sources and the compiled
extension: an importable folder (for PYTHONPATH) and a wheel (for pip).

Run by the Bazel rule in python/defs.bzl; only the standard library is used.

  build_wheel.py --pyproject pyproject.toml --version V --extension _C.so
      --ext-suffix .cpython-311-x86_64-linux-gnu.so --strip python/
      --site OUT_DIR --wheel OUT.whl --tag cp311-cp311-linux_x86_64 SOURCES...
"""
import argparse
import base64
import hashlib
import os
import shutil
import sys
import zipfile

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = None


def read_project(path):
    with open(path, "rb") as f:
        data = f.read()
    if tomllib is None:
        sys.exit("build_wheel.py needs Python 3.11 or newer (tomllib) to read pyproject.toml")
    return tomllib.loads(data.decode())["project"]


def metadata(project):
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '')}",
    ]
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    return "\n".join(lines) + "\n"


def entry_points(project):
    out = []
    for group, entries in project.get("entry-points", {}).items():
        out.append(f"[{group}]")
        out += [f"{name} = {target}" for name, target in entries.items()]
        out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pyproject", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--extension", required=True)
    ap.add_argument("--ext-suffix", required=True)
    ap.add_argument("--strip", required=True)
    ap.add_argument("--site", required=True)
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("sources", nargs="*")
    args = ap.parse_args()

    project = read_project(args.pyproject)
    if project["version"] != args.version:
        sys.exit(f"pyproject.toml says version {project['version']}, python/defs.bzl says "
                 f"{args.version}: make them equal")
    name, version = project["name"], project["version"]
    dist_info = f"{name}-{version}.dist-info"

    files = {}  # path inside the package folder -> source path
    for src in args.sources:
        rel = src.split(args.strip, 1)[1] if args.strip in src else src
        files[rel] = src
    files[f"reloadsafe/_C{args.ext_suffix}"] = args.extension

    shutil.rmtree(args.site, ignore_errors=True)
    for rel, src in files.items():
        dest = os.path.join(args.site, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(src, dest)
    generated = {
        f"{dist_info}/METADATA": metadata(project),
        f"{dist_info}/entry_points.txt": entry_points(project),
        f"{dist_info}/top_level.txt": "reloadsafe\n",
        f"{dist_info}/WHEEL": ("Wheel-Version: 1.0\nGenerator: reloadsafe build_wheel.py\n"
                               f"Root-Is-Purelib: false\nTag: {args.tag}\n"),
    }
    for rel, text in generated.items():
        dest = os.path.join(args.site, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "w") as f:
            f.write(text)

    # The wheel: every file of the folder, then RECORD with each file's hash.
    record = []
    with zipfile.ZipFile(args.wheel, "w", zipfile.ZIP_DEFLATED) as whl:
        for rel in sorted(files) + sorted(generated):
            with open(os.path.join(args.site, rel), "rb") as f:
                data = f.read()
            info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if rel.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{rel},sha256={digest},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        whl.writestr(info, "\n".join(record) + "\n")


if __name__ == "__main__":
    main()
