"""The import name is `disd`; the folder `dis/` must never shadow the standard-library `dis`."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_py(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_no_package_init_at_dis_root():
    assert not (ROOT / "dis" / "__init__.py").exists()


def test_import_inspect_and_disd_from_repo_root():
    r = run_py("import inspect, dis, disd; assert hasattr(dis, 'dis'), dis.__file__; print(disd.__file__)", ROOT)
    assert r.returncode == 0, r.stderr
    assert "disd" in r.stdout


def test_import_from_installed_copy(tmp_path):
    """Build a wheel, install it into a fresh target dir and import from there."""
    wheel_dir = tmp_path / "wheel"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheel_dir), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    wheels = list(wheel_dir.glob("*.whl"))
    assert wheels
    import zipfile

    with zipfile.ZipFile(wheels[0]) as z:  # the JVM Spark reader's jar travels inside the package
        names = z.namelist()
        has_jar = "disd/spark/jars/dis-spark.jar" in names
    assert has_jar == (ROOT / "dis" / "disd" / "spark" / "jars" / "dis-spark.jar").is_file()
    # and so do the storage engine's C modules, built for this platform (the wheel says so)
    for module in ("storage/newlocation", "storage/batchwrite", "storage/lastbyindex", "binlog/rowencode"):
        assert any(n.startswith(f"disd/{module}.") and n.endswith(".so") for n in names), names
    assert "-py3-none-any" not in wheels[0].name
    target = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheels[0])],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    code = (
        "import sys; sys.path.insert(0, %r); import inspect, disd, disd.binlog, disd.tailer;"
        "from disd.storage import fsio; assert None not in (fsio.OS.create_location, fsio.OS.pwrite_all);"
        "assert disd.__file__.startswith(%r), disd.__file__; print('ok')" % (str(target), str(target))
    )
    r = run_py(code, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout
