"""Build ``dis-spark.jar``, the JVM Spark reader, from ``jvm/src`` (no Maven, no downloads).

    python jvm/build.py [--require] [--out PATH]

``javac --release 17`` compiles the sources against PySpark's own ``jars/`` (every class the
reader uses is there: Spark's DataSource V2 API, Jackson, SnakeYAML, SLF4J), and the classes,
``META-INF/services`` and a ``disd/spark/build.json`` stamp (PySpark version, digest of the
sources) are zipped into ``dis/disd/spark/jars/dis-spark.jar``, inside the ``disd`` package.
The jar's ``META-INF/MANIFEST.MF`` names the Spark and Scala versions it was compiled against
(``Spark-Version``, ``Scala-Version``, ``Scala-Binary-Version``, read off those jars), for
``disd.spark.jvm`` and for anyone who finds the jar alone.
Nothing happens when the stamp already matches: the jar is rebuilt only when the sources or the
installed PySpark's version change.

Used by ``setup.py`` (``build_py``: optional, the jar is built when a JDK and PySpark are there)
and by ``make jar`` / ``make test`` (``--require``: no JDK or no PySpark is an error, exit 2).
Standard library only: it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
SRC = HERE / "src" / "main"
OUT = ROOT / "dis" / "disd" / "spark" / "jars" / "dis-spark.jar"
STAMP_ENTRY = "disd/spark/build.json"
RELEASE = "17"
#: raised when what the jar's manifest holds changes, so jars built before are rebuilt
MANIFEST_VERSION = 2


class BuildError(Exception):
    pass


def sources_digest(src: pathlib.Path = SRC) -> str:
    h = hashlib.sha256()
    for p in sorted(x for x in src.rglob("*") if x.is_file()):
        h.update(p.relative_to(src).as_posix().encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    h.update(f"release {RELEASE}".encode())
    return h.hexdigest()


def _pyspark_at(site: pathlib.Path) -> tuple[pathlib.Path, str] | None:
    jars = site / "pyspark" / "jars"
    version_py = site / "pyspark" / "version.py"
    if not jars.is_dir() or not version_py.is_file():
        return None
    # `__version__: str = "4.x.y"`, read without running the file (nor importing PySpark)
    for node in ast.parse(version_py.read_text(), str(version_py)).body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "__version__" and node.value is not None:
            return jars, str(ast.literal_eval(node.value))
    return jars, "None"


def find_pyspark() -> tuple[pathlib.Path, str] | None:
    """PySpark's jars directory and version: ``$DIS_PYSPARK_HOME`` (a pyspark package directory),
    the pyspark this interpreter imports, or the one in its environment's site-packages (a build
    isolated from it, as pip's, still runs in that environment's interpreter)."""
    home = os.environ.get("DIS_PYSPARK_HOME")
    if home:
        found = _pyspark_at(pathlib.Path(home).parent)
        if found is None:
            raise BuildError(f"DIS_PYSPARK_HOME={home} is not a pyspark package directory (no jars/ or version.py)")
        return found
    for entry in sys.path:
        if entry and (pathlib.Path(entry) / "pyspark" / "jars").is_dir():
            return _pyspark_at(pathlib.Path(entry))
    for key in ("purelib", "platlib"):
        found = _pyspark_at(pathlib.Path(sysconfig.get_paths()[key]))
        if found:
            return found
    return None


def spark_versions(jars: pathlib.Path) -> dict[str, str]:
    """The Spark and Scala versions of a Spark ``jars/`` directory, from its file names
    (``spark-core_2.13-4.1.0.jar``, ``scala-library-2.13.16.jar``); {} for what is not there."""
    out: dict[str, str] = {}
    for p in jars.glob("spark-core_*-*.jar"):
        binary, _, version = p.name[len("spark-core_"):-len(".jar")].partition("-")
        out.update({"Spark-Version": version, "Scala-Binary-Version": binary})
    for p in jars.glob("scala-library-*.jar"):
        out["Scala-Version"] = p.name[len("scala-library-"):-len(".jar")]
    return out


def manifest(jars: pathlib.Path) -> str:
    """The jar's ``META-INF/MANIFEST.MF``: what built it and the Spark and Scala it was compiled
    against (a reader of the jar alone needs nothing else to know which Spark it is for)."""
    versions = spark_versions(jars)
    missing = {"Spark-Version", "Scala-Version", "Scala-Binary-Version"} - set(versions)
    if missing:
        raise BuildError(f"{jars} holds no spark-core_<scala>-<spark>.jar or scala-library-<scala>.jar: "
                         "not a Spark distribution's jars directory")
    lines = ["Manifest-Version: 1.0", "Created-By: dis jvm/build.py", "Implementation-Title: dis-spark",
             f"Build-Jdk-Spec: {RELEASE}", *(f"{k}: {v}" for k, v in sorted(versions.items()))]
    return "\r\n".join(lines) + "\r\n\r\n"


def find_javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (pathlib.Path(home) / "bin" / "javac").is_file():
        return str(pathlib.Path(home) / "bin" / "javac")
    return shutil.which("javac")


def stamp_of(jar: pathlib.Path) -> dict | None:
    try:
        with zipfile.ZipFile(jar) as z:
            return json.loads(z.read(STAMP_ENTRY))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def build(out: pathlib.Path = OUT, require: bool = False, log=print) -> pathlib.Path | None:  # noqa: ANN001
    """The jar, built or already current; None (with a note) when it cannot be built and
    ``require`` is false; BuildError when it is."""
    def missing(why: str) -> None:
        if require:
            raise BuildError(why)
        log(f"dis: not building the JVM Spark reader: {why}; the Spark source will use its Python reader")

    found = find_pyspark()
    if found is None:
        missing("PySpark is not installed in this environment (pip install '.[spark]' or '.[test]')")
        return None
    jars, version = found
    want = {"pyspark": version, "sources": sources_digest(), "release": RELEASE, "manifest": MANIFEST_VERSION}
    have = stamp_of(out)
    if have is not None and {k: have.get(k) for k in want} == want:
        return out
    javac = find_javac()
    if javac is None:
        missing("javac was not found: the JVM Spark reader needs a JDK 17 to build (Debian/Ubuntu: apt-get install "
                "openjdk-17-jdk-headless; or set JAVA_HOME)")
        return None
    sources = sorted(str(p) for p in (SRC / "java").rglob("*.java"))
    with tempfile.TemporaryDirectory(prefix="dis-jar-") as tmp:
        classes = pathlib.Path(tmp) / "classes"
        classes.mkdir()
        cmd = [javac, "--release", RELEASE, "-encoding", "UTF-8", "-nowarn", "-Xlint:-path", "-Xlint:-options",
               "-cp", str(jars / "*"), "-d", str(classes), *sources]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"javac failed (against pyspark {version} at {jars}):\n{r.stdout}{r.stderr}")
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(out.name + ".part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", manifest(jars))
            for base in (classes, SRC / "resources"):
                for p in sorted(x for x in base.rglob("*") if x.is_file()):
                    z.write(p, p.relative_to(base).as_posix())
            z.writestr(STAMP_ENTRY, json.dumps(want, sort_keys=True))
        os.replace(part, out)
    log(f"dis: built {out} (pyspark {version})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--require", action="store_true", help="fail (exit 2) when the jar cannot be built")
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    args = ap.parse_args(argv)
    try:
        build(args.out, args.require)
    except BuildError as e:
        print(f"dis: cannot build the JVM Spark reader: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
